"""Bad inputs end in one line naming the argument, the problem and the fix, within seconds:
no traceback, no wait on a network, no run folder left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import hgpo_env
from hgpo_env.vector import GroupedEnvPool

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert time.monotonic() - started < 60, "took too long for a bad input"
    return done


def one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip() and "Warning" not in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def train(model: str, out: Path, *overrides: str) -> subprocess.CompletedProcess:
    small = ["env.num_groups=1", "env.group_size=2", "env.num_workers=1", f"train.output_dir={out}"]
    return run("-m", "hgpo_train", "--env", "rooms", "--model", model, *small, *overrides)


def test_a_model_path_that_does_not_exist(tmp_path):
    out = tmp_path / "run"
    line = one_line(train("/no/such/path", out))
    assert "model '/no/such/path': no such path" in line and not out.exists()


def test_a_folder_without_a_model(tmp_path):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "run"
    line = one_line(train(str(tmp_path / "empty"), out))
    assert "a folder without a model in it (no config.json)" in line and not out.exists()


def test_a_typo_in_env_kwargs_says_what_was_meant(tmp_path):
    out = tmp_path / "run"
    line = one_line(train("tiny", out, "env.kwargs.min_romos=2"))
    assert "unknown Rooms argument 'min_romos'; did you mean 'min_rooms'?" in line and not out.exists()


def test_eval_of_a_run_folder_that_does_not_exist():
    line = one_line(run("-m", "hgpo_train", "eval", "--run", "/nonexistent"))
    assert line == "error: --run /nonexistent: not a training run folder (no config.yaml)"


def test_the_trainer_on_a_core_only_install_names_its_extra():
    done = run("-c", "import sys; sys.modules['pydantic'] = None; sys.argv = ['x', '--help']; import runpy; "
               "runpy.run_module('hgpo_train', run_name='__main__')")  # fmt: skip
    assert done.returncode == 2 and "no module 'pydantic'" in done.stderr
    assert "pip install -e '.[train]'" in done.stderr and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


def test_pool_arguments_are_checked_before_any_worker_starts():
    with pytest.raises(ValueError, match=r"group_size must be a positive int, got '8'"):
        GroupedEnvPool("HGPO-Rooms-v0", 2, "8")
    with pytest.raises(ValueError, match=r"cannot make 'HGPO-Nope-v0': .*doesn't exist") as error:
        GroupedEnvPool("HGPO-Nope-v0", 1, 2)
    assert "\n" not in str(error.value)


def test_alfworld_data_variable_is_never_ignored(tmp_path, monkeypatch):
    from hgpo_env.envs.alfworld.games import GameDataError

    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nonexistent"))
    with pytest.raises(GameDataError, match=r"\$ALFWORLD_DATA points to .*not a folder"):
        gym.make("HGPO-ALFWorld-v0", split="valid_seen")
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "valid_seen.tgz").write_bytes(b"")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "packed"))
    with pytest.raises(GameDataError, match="missing split 'valid_seen'.*unpack it there first"):
        gym.make("HGPO-ALFWorld-v0", split="valid_seen")


@pytest.mark.parametrize("value", [None, 3, ["a"], b"bytes"])
def test_canonical_text_names_a_wrong_type(value):
    with pytest.raises(TypeError, match=f"canonical_text takes a str, got {type(value).__name__}"):
        hgpo_env.canonical_text(value)


def test_verl_agent_prompts_stay_encodable_and_bounded():
    from hgpo_env.contract.protocol import MAX_SENT_CHARS

    env = gym.make("HGPO-WebShop-v0", protocol="verl-agent", history_length=2)
    env.reset(seed=0)
    for response in (
        "<think>x</think><action>click[\ud800]</action>",
        "<think>x</think><action>" + "a" * 10**6 + "</action>",
    ):
        prompt, _, _, _, info = env.step(response)
        prompt.encode("utf-8")  # no lone surrogate reaches the prompt
        assert len(info["parsed_action"]) <= MAX_SENT_CHARS and len(prompt) < 20_000


def test_a_hub_model_with_no_hub_in_reach_fails_in_seconds(tmp_path):
    """The Hub is pointed at a closed port on 127.0.0.1, so nothing leaves the machine."""
    from serve_helpers import free_port

    out = tmp_path / "run"
    hub = {
        "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "",
    }
    line = one_line(
        run(
            "-m",
            "hgpo_train",
            "--env",
            "rooms",
            "--model",
            "no-org/no-model",
            f"train.output_dir={out}",
            env=hub,
        )
    )
    assert (
        "'no-org/no-model' is not in the local cache and http://127.0.0.1" in line and "unreachable" in line
    )
    assert not out.exists()
