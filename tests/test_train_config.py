"""Run configs: defaults, env presets, YAML files, dotted overrides and their errors, the CLI help."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from hgpo_train.cli import build_parser, main
from hgpo_train.config import Config, ConfigError, load_config
from hgpo_train.config.keys import describe_options
from hgpo_train.run.resume import config_changes

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted(
    p for p in (REPO / "configs").glob("*.yaml") if not p.name.startswith("openrlhf_")
)  # those add an openrlhf: section (tests/test_openrlhf.py)


def test_defaults_are_the_papers_alfworld_setting():
    config = load_config()
    assert config.env.name == "alfworld" and config.env.max_steps == 50
    assert (config.env.num_groups, config.env.group_size) == (16, 8)
    assert config.advantage.gamma == 0.95 and config.advantage.mode == "mean_std_norm"
    assert (
        config.update.lr,
        config.update.kl_coef,
        config.update.clip_ratio,
        config.update.entropy_coef,
    ) == (1e-6, 0.01, 0.2, 0.001)
    assert config.train.iterations == 160


def test_webshop_preset_then_overrides_win():
    config = load_config(env="webshop")
    assert config.env.max_steps == 30 and config.advantage.mode == "mean_norm"
    config = load_config(env="webshop", overrides=["env.max_steps=15", "advantage.estimator=gigpo"])
    assert config.env.max_steps == 15 and config.advantage.estimator == "gigpo"


def test_override_types_are_checked_and_coerced():
    config = load_config(
        overrides=[
            "update.lr=1e-5",  # YAML 1.1 reads this as a string: still a float
            "env.kwargs.min_rooms=2",
            "model.lora_target_modules=q_proj,v_proj",
            "env.max_prompt_tokens=null",
            "model.name_or_path=123",  # a str field keeps the text
            "eval.tasks=[3, 4]",
        ]
    )
    assert config.update.lr == 1e-5
    assert config.env.kwargs == {"min_rooms": 2}
    assert config.model.lora_target_modules == ["q_proj", "v_proj"]
    assert config.env.max_prompt_tokens is None
    assert config.model.name_or_path == "123"
    assert config.eval.tasks == [3, 4]


@pytest.mark.parametrize(
    "override, message",
    [
        ("update.lrr=1", "unknown config key 'update.lrr'; did you mean lr"),
        ("updat.lr=1", "unknown config key 'updat'"),
        ("update.lr=fast", "update.lr: input should be a valid number"),
        ("env.max_steps=2.5", "env.max_steps: input should be a valid integer"),
        ("generation.constrained=3", "generation.constrained: input should be a valid boolean"),
        # no silent casts: a flag is no count, quoted digits are text, a number no flag
        ("train.eval_every=true", "train.eval_every: input should be a valid integer (got True)"),
        ("train.iterations='3'", "train.iterations: input should be a valid integer (got '3')"),
        ("advantage.alpha=true", "advantage.alpha: input should be a valid number (got True)"),
        ("advantage.base_group=1", "advantage.base_group: input should be a valid boolean (got 1)"),
        ("advantage.estimator=ppo", "advantage.estimator: input should be 'grpo', 'gigpo'"),
        ("env.max_steps=0", "env.max_steps: input should be greater than 0 (got 0)"),
        ("update", "must look like section.field=value"),
        ("update=3", "update is a section"),
        ("update.micro_batch_size=512", "micro_batch_size cannot exceed"),
        ("update.off_policy_correction=true", "update.off_policy_correction: input should be 'off', 'tis'"),
        ("update.off_policy_bounds=[2, 1]", "off_policy_bounds must be [low, high] with low < high"),
    ],
)
def test_bad_overrides_fail_with_clear_errors(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(overrides=[override])


def test_yaml_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("update:\n  lr: [1, 2]\n")
    with pytest.raises(ConfigError, match="update.lr: input should be a valid number"):
        load_config(bad)
    bad.write_text("trainer:\n  lr: 1\n")
    with pytest.raises(ConfigError, match="unknown config key 'trainer'; did you mean train"):
        load_config(bad)


def test_resolved_config_round_trips_through_yaml(tmp_path):
    config = load_config(env="rooms", overrides=["update.lr=3e-4", "env.kwargs.max_rooms=3"])
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    assert load_config(path) == config


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_load(path):
    config = load_config(path)
    family = config.env.name.removeprefix("HGPO-").removesuffix("-v0").lower()
    assert family in path.name.replace("_", "")


def test_shipped_configs_cover_the_paper_settings():
    names = {p.name for p in CONFIGS}
    for env in ("alfworld", "webshop"):
        for model in ("qwen2.5-1.5b", "qwen2.5-7b"):
            for k in (2, 4):
                assert f"{env}_{model}_k{k}.yaml" in names
    for path in CONFIGS:
        if path.name.startswith(("alfworld_qwen", "webshop_qwen")) and "_k" in path.name:  # HGPO's paper
            config = load_config(path)
            assert (
                config.train.iterations == 160 and config.env.group_size == 8 and config.env.num_groups == 16
            )
            assert config.env.max_steps == (50 if config.env.name == "alfworld" else 30)
            assert config.advantage.mode == (
                "mean_std_norm" if config.env.name == "alfworld" else "mean_norm"
            )


def test_graphgpo_configs_are_the_recipes_scripts():
    """verl-agent's recipe/GraphGPO run_qwen2.5_1.5b_{alfworld,webshop}_train.sh."""
    for env, gamma, steps, mini_batch in (("alfworld", 0.10, 50, 256), ("webshop", 0.20, 15, 64)):
        config = load_config(REPO / "configs" / f"{env}_qwen2.5-1.5b_graphgpo.yaml")
        a = config.advantage
        assert (a.estimator, a.gamma, a.mode, a.step_weight, a.episode_weight) == (
            "graphgpo",
            gamma,
            "mean_std_norm",
            1.0,
            1.0,
        )
        assert not a.normalize_distance and a.returns == "graph"
        assert (config.env.history_length, config.env.max_steps, config.update.mini_batch_size) == (
            2,
            steps,
            mini_batch,
        )
        assert (config.env.num_groups, config.env.group_size, config.train.iterations) == (16, 8, 150)


def test_g2po_configs_are_its_scripts():
    """Nala-YN/G2PO examples/g2po_trainer/run_{alfworld,webshop}.sh."""
    for env, mode, steps, mini_batch, split in (
        ("alfworld", "mean_std_norm", 50, 256, "valid_seen"),
        ("webshop", "mean_norm", 15, 64, "test"),
    ):
        config = load_config(REPO / "configs" / f"{env}_qwen2.5-1.5b_g2po.yaml")
        a = config.advantage
        assert (a.estimator, a.gamma, a.mode, a.step_weight, a.invalid_penalty, a.success_reward) == (
            "g2po",
            0.95,
            mode,
            1.0,
            0.1,
            10.0,
        )
        assert (config.env.history_length, config.env.max_steps, config.update.mini_batch_size) == (
            2,
            steps,
            mini_batch,
        )
        assert (config.env.num_groups, config.env.group_size, config.train.iterations) == (16, 8, 100)
        assert (config.eval.env_kwargs["split"], config.eval.temperature) == (split, 0.4)


def test_help_explains_every_key():
    text = build_parser().format_help()
    for line in describe_options(Config).splitlines():
        if line.startswith("  "):
            key = line.split()[0]
            assert key in text
            assert ":" in line.split(")", 1)[1], f"{key} has no explanation"


def test_cli_reports_config_errors(capsys):
    assert main(["--env", "rooms", "update.lrr=1"]) == 2
    assert "did you mean lr" in capsys.readouterr().err


def test_cli_print_config(capsys):
    assert main(["--env", "rooms", "--print-config", "advantage.estimator=grpo"]) == 0
    out = capsys.readouterr().out
    assert "estimator: grpo" in out and "name: rooms" in out


PAPER_CONFIGS = sorted(
    p for p in (Path(__file__).resolve().parents[1] / "configs").glob("*.yaml") if "qwen" in p.name
)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=[p.name for p in PAPER_CONFIGS])
def test_every_paper_config_prints_the_papers_protocol_and_evaluation(path, capsys):
    backend = ["--backend", "openrlhf"] if path.name.startswith("openrlhf_") else []
    assert main([*backend, "--config", str(path), "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["env"]["protocol"] == "verl-agent"
    evaluation = printed["eval"]
    assert evaluation["temperature"] == 0.4 and evaluation["seeds"] == [123, 456, 789]
    assert evaluation["min_episodes"] >= 512 and evaluation["tasks"] is None  # whole passes


def test_one_key_switches_the_protocol():
    config = load_config(PAPER_CONFIGS[0], overrides=["env.protocol=strict"])
    assert config.env.protocol == "strict"
    with pytest.raises(ConfigError, match="protocol"):
        load_config(overrides=["env.protocol=papers"])


def test_any_registered_env_id_or_module_path_is_an_env_name():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))  # byo_envs registers TestDial-v0 when imported
    config = load_config(env="byo_envs:TestDial-v0")
    assert config.env.env_id == "byo_envs:TestDial-v0" and config.env.max_steps == 50  # no preset: defaults
    config = load_config(env="HGPO-ScienceWorld-v0")
    assert config.eval.env_kwargs == {"split": "test"}
    assert load_config(env="HGPO-WebShop-v0").env.max_steps == 30  # the short name's preset applies to the id
    with pytest.raises(ConfigError, match="did you mean 'HGPO-BabyAI-v0'"):
        load_config(env="HGPO-BabyA-v0")
    with pytest.raises(ConfigError, match="cannot import 'no_such_module'"):
        load_config(env="no_such_module:Env-v0")


def test_env_servers_go_with_the_openenv_backend():
    config = load_config(
        env="rooms", overrides=["env.backend=openenv", "env.servers=[http://127.0.0.1:8000]"]
    )
    assert config.env.servers == ["http://127.0.0.1:8000"]
    with pytest.raises(ConfigError, match="needs env.servers"):
        load_config(env="rooms", overrides=["env.backend=openenv"])
    with pytest.raises(ConfigError, match="needs env.servers"):
        load_config(env="rooms", overrides=["env.servers=[http://127.0.0.1:8000]"])


def test_a_missing_env_extra_is_one_line(tmp_path, monkeypatch, capsys):
    """Without the webshop extra, the trainer says which extra to install, in one line."""
    monkeypatch.setitem(sys.modules, "bm25s", None)  # as if the extra were missing
    for name in [m for m in sys.modules if m.startswith("hgpo_env.envs.webshop")]:
        monkeypatch.delitem(sys.modules, name)
    code = main(["--env", "webshop", f"train.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "needs the webshop extra" in err and 'pip install -e ".[webshop]"' in err


RESOLVED = json.loads((REPO / "tests" / "data" / "resolved_configs.json").read_text())
"""Every shipped config as both backends resolved it before the config became one pydantic model
(the hand-written loader's ``--print-config``, openrlhf: section from ``--backend openrlhf``)."""


@pytest.mark.parametrize("backend", ["local", "openrlhf"])
@pytest.mark.parametrize("path", sorted(RESOLVED))
def test_every_shipped_config_resolves_as_before_on_both_backends(path, backend, capsys):
    assert main(["--backend", backend, "--config", str(REPO / path), "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == RESOLVED[path]


def test_the_backends_share_one_command_line(capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    outputs = {}
    for backend in ("local", "openrlhf"):
        command = ["--backend", backend, "--config", "configs/openrlhf_rooms_cpu.yaml"]
        assert main([*command, "--print-config", "--update.lr", "3e-4", "--env.kwargs.max_rooms=4"]) == 0
        printed = capsys.readouterr().out
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        assert main([*command, "update.lrr=1"]) == 2
        outputs[backend] = (printed, capsys.readouterr())
    (local_config, local_rest), (openrlhf_config, openrlhf_rest) = outputs.values()
    assert local_config == openrlhf_config and local_rest.out == openrlhf_rest.out  # config and --help
    assert (
        local_rest.err
        == openrlhf_rest.err
        == "config error: unknown config key 'update.lrr'; did you mean lr?\n"
    )
    resolved = yaml.safe_load(local_config)
    assert resolved["update"]["lr"] == 3e-4 and resolved["env"]["kwargs"]["max_rooms"] == 4


@pytest.mark.parametrize(
    "argv, key, value",
    [
        (["--update.lr", "1e-5"], ("update", "lr"), 1e-5),
        (["--update.lr=1e-5"], ("update", "lr"), 1e-5),
        (["--advantage.gamma", "-0"], ("advantage", "gamma"), 0.0),  # a negative-looking value is a value
        (["--generation.constrained"], ("generation", "constrained"), True),  # a bare flag is true
        (["--generation.constrained", "--print-config"], ("generation", "constrained"), True),
        (["--eval.tasks", "[1, 2]"], ("eval", "tasks"), [1, 2]),
        (
            ["--openrlhf.extra_args=--ds.use_liger_kernel"],
            ("openrlhf", "extra_args"),
            ["--ds.use_liger_kernel"],
        ),
    ],
)
def test_dotted_flags_are_overrides(argv, key, value, capsys):
    assert main(["--env", "rooms", "--print-config", *argv]) == 0
    section, name = key
    assert yaml.safe_load(capsys.readouterr().out)[section][name] == value


def test_options_of_the_openrlhf_backend_are_refused_locally(capsys):
    with pytest.raises(SystemExit):
        main(["--env", "rooms", "--dry-run"])
    assert "options of --backend openrlhf" in capsys.readouterr().err


def test_a_config_error_in_a_file_is_one_line_on_both_backends(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    for text in ("env: [unclosed\n", "openrlhf:\n  vllm_num_engines: two\n", "train: 3\n"):
        bad.write_text(text)
        for backend in ("local", "openrlhf"):
            assert main(["--backend", backend, "--config", str(bad)]) == 2
            err = capsys.readouterr().err
            assert err.startswith("config error: ") and err.count("\n") == 1, err


def test_a_resumed_run_may_move_to_another_cluster():
    """The openrlhf: section says where a run goes, not what it computes: resuming may change it."""
    config = load_config(env="rooms").to_dict()
    moved = {**config, "openrlhf": {**config["openrlhf"], "num_nodes": 4}}
    before_the_section = {k: v for k, v in config.items() if k != "openrlhf"}  # run folders of older versions
    assert config_changes(config, moved) == config_changes(before_the_section, config) == []
    assert config_changes(config, {**config, "update": {**config["update"], "lr": 1.0}}) == [
        "update.lr: 1e-06 -> 1.0"
    ]


def test_one_reader_for_key_value_on_every_command_line():
    """``python -m hgpo_env serve ... k=v`` and the trainer's ``env.kwargs.k=v`` read a value alike, and
    as a YAML file holds it (before, serve read Python literals: ``True`` and ``true`` differed)."""
    from hgpo_env.__main__ import parse_env_kwargs

    texts = {
        "a": "true",
        "b": "True",
        "c": "3",
        "d": "1e-5",
        "e": "[0, 1]",
        "f": "{x: 1}",
        "g": "null",
        "h": "eval",
    }
    served = parse_env_kwargs([f"{key}={text}" for key, text in texts.items()])
    trained = load_config(overrides=[f"env.kwargs.{key}={text}" for key, text in texts.items()]).env.kwargs
    in_a_file = yaml.safe_load("\n".join(f"{key}: {text}" for key, text in texts.items()))
    expected = {"a": True, "b": True, "c": 3, "d": 1e-5, "e": [0, 1], "f": {"x": 1}, "g": None, "h": "eval"}
    assert served == trained == expected
    assert {key: value for key, value in in_a_file.items() if key != "d"} == {
        key: value for key, value in expected.items() if key != "d"
    }  # PyYAML's YAML 1.1 reads 1e-5 as text; ours reads it as the number YAML 1.2 and users mean
