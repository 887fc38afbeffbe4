"""python -m hgpo_train compare: the table of methods over training runs, on one panel."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hgpo_train.evaluation.compare import bootstrap_interval, main

SETTINGS = {"seeds": [123, 456, 789], "temperature": 0.4, "passes": 4, "constrained": False}


def write(tmp_path, method, seed, success, panel="a" * 64, settings=SETTINGS, method_settings=None, **types):
    path = tmp_path / f"{method}_{seed}_k{(method_settings or {}).get('history_length', '')}.json"
    metrics = {
        "success_rate": success,
        "score": success / 2,
        "pass@2": min(1.0, 1.5 * success),
        **{f"success_rate/{t}": v for t, v in types.items()},
    }
    run = {"method": method, "train_seed": seed}
    if method_settings is not None:  # files of older runs have none
        run["method_settings"] = method_settings
    result = {"run": run, "metrics": metrics, "panel": {"sha256": panel}}
    path.write_text(json.dumps({**result, "settings": settings}))
    return str(path)


def test_the_table_is_mean_and_sd_over_runs_with_paired_differences(tmp_path, capsys):
    grpo = {0: 0.50, 1: 0.60, 2: 0.40}
    hgpo = {0: 0.70, 1: 0.65, 2: 0.55}
    files = [write(tmp_path, "grpo", s, v, pick=v) for s, v in grpo.items()]
    files += [write(tmp_path, "hgpo", s, v, pick=v + 0.1) for s, v in hgpo.items()]
    assert main([*files, "--baseline", "grpo"]) == 0
    table = json.loads(capsys.readouterr().out)
    row = table["methods"]["hgpo"]
    assert row["success_rate"]["mean"] == pytest.approx(np.mean(list(hgpo.values())))
    assert row["success_rate"]["sd"] == pytest.approx(np.std(list(hgpo.values()), ddof=1))
    assert row["success_rate/pick"]["mean"] == pytest.approx(np.mean(list(hgpo.values())) + 0.1)
    differences = [hgpo[s] - grpo[s] for s in range(3)]
    paired = row["paired_difference"]
    assert paired["mean"] == pytest.approx(np.mean(differences)) and paired["seeds"] == [0, 1, 2]
    assert min(differences) <= paired["low"] <= paired["mean"] <= paired["high"] <= max(differences)
    assert "paired_difference" not in table["methods"]["grpo"]
    assert main([*files, "--markdown"]) == 0
    text = capsys.readouterr().out
    assert "| method | runs | success | pass@2 | score |" in text and "| method | pick |" in text
    assert "| hgpo | 3 | 0.633 ± 0.076 | 0.933 ± 0.095 | 0.317 ± 0.038 |" in text  # pass@2: 1, .975, .825


def test_bootstrap_interval_of_a_constant_is_the_constant():
    assert bootstrap_interval([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2, 0.2))


@pytest.mark.parametrize(
    ("other", "said"),
    [
        ({"panel": "b" * 64}, "was evaluated on another panel"),
        ({"settings": {**SETTINGS, "temperature": 1.0}}, "was sampled with other settings"),
    ],
)
def test_results_that_do_not_compare_are_refused(tmp_path, capsys, other, said):
    files = [write(tmp_path, "grpo", 0, 0.5), write(tmp_path, "hgpo", 0, 0.6, **other)]
    assert main(files) == 2
    assert said in capsys.readouterr().err


def test_a_file_that_is_not_a_result_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not an evaluation result" in err and len(err.strip().splitlines()) == 1


def test_runs_of_one_method_with_other_settings_are_rows_of_their_own(tmp_path, capsys):
    """HGPO at K = 2 and K = 4 (same seeds) used to be refused as duplicates."""
    shared = {"gamma": 0.95, "mode": "mean_std_norm"}
    files = [
        write(tmp_path, "grpo", s, 0.5, method_settings={"history_length": 2, **shared}) for s in range(3)
    ]
    for k, success in ((2, 0.6), (4, 0.7)):
        files += [
            write(tmp_path, "hgpo", s, success + 0.01 * s, method_settings={"history_length": k, **shared})
            for s in range(3)
        ]
    assert main([*files, "--baseline", "grpo"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert list(table["methods"]) == ["grpo", "hgpo (history_length=2)", "hgpo (history_length=4)"]
    for k, success in ((2, 0.6), (4, 0.7)):
        row = table["methods"][f"hgpo (history_length={k})"]
        assert row["runs"] == 3 and row["paired_difference"]["mean"] == pytest.approx(success + 0.01 - 0.5)
    assert main([*files, "--baseline", "hgpo"]) == 2  # two rows: which one?
    assert "is 2 rows: name one of" in capsys.readouterr().err
    assert main([*files, "--baseline", "hgpo (history_length=4)"]) == 0
    assert json.loads(capsys.readouterr().out)["baseline"] == "hgpo (history_length=4)"
    (tmp_path / "again").mkdir()
    twice = write(tmp_path / "again", "hgpo", 0, 0.1, method_settings={"history_length": 4, **shared})
    assert main([*files, twice]) == 2  # the same row and seed twice is still refused
    assert "are both hgpo (history_length=4) seed 0" in capsys.readouterr().err


def test_a_nested_estimator_setting_names_its_row(tmp_path, capsys):
    """CRBC's settings are a section of their own (advantage.crbc): a results file records them as
    dotted keys, so CRBC at depth 0 and at the closure are two rows named by the one that differs."""
    from hgpo_train.config import load_config
    from hgpo_train.evaluation.evaluate import EpisodeResult, EvalResult, results_json

    files = []
    for depth, success in (("inf", 0.6), (0, 0.5)):
        config = load_config(
            env="rooms", overrides=["advantage.estimator=crbc", f"advantage.crbc.depth={depth}"]
        )
        played = EvalResult([EpisodeResult(0, 123, "task", None, True, 1.0, 3, "1")], settings=SETTINGS)
        run = results_json(config, played, checkpoint="none")["run"]
        assert run["method_settings"]["crbc.depth"] == depth and "crbc" not in run["method_settings"]
        folder = tmp_path / f"depth{depth}"
        folder.mkdir()
        files += [write(folder, "crbc", s, success, method_settings=run["method_settings"]) for s in range(2)]
    assert main(files) == 0
    assert list(json.loads(capsys.readouterr().out)["methods"]) == [
        "crbc (crbc.depth=inf)",
        "crbc (crbc.depth=0)",
    ]


def test_asynchronous_runs_are_a_row_of_their_own_against_the_synchronous_ones(tmp_path, capsys):
    """``train.async_staleness`` is recorded with the method's settings: the async runs of HGPO get
    a row beside the sync ones, and the paired difference per training seed against them."""
    from hgpo_train.config import load_config
    from hgpo_train.evaluation.evaluate import EpisodeResult, EvalResult, results_json

    files = []
    for staleness, success in ((0, 0.5), (1, 0.75)):
        config = load_config(env="rooms", overrides=[f"train.async_staleness={staleness}"])
        played = EvalResult([EpisodeResult(0, 123, "task", None, True, 1.0, 3, "1")], settings=SETTINGS)
        settings = results_json(config, played, checkpoint="none")["run"]["method_settings"]
        assert settings["async_staleness"] == staleness and settings["off_policy_correction"] == "off"
        folder = tmp_path / f"async{staleness}"
        folder.mkdir()
        files += [write(folder, "hgpo", s, success, method_settings=settings) for s in range(3)]
    assert main([*files, "--baseline", "hgpo (async_staleness=0)"]) == 0
    methods = json.loads(capsys.readouterr().out)["methods"]
    assert list(methods) == ["hgpo (async_staleness=0)", "hgpo (async_staleness=1)"]
    assert methods["hgpo (async_staleness=1)"]["paired_difference"]["mean"] == pytest.approx(0.25)
