"""The documentation stays true: the site builds with ``mkdocs build --strict`` (broken links,
missing pages, API references to names that no longer exist fail it), every Python example in
the docs and the README runs, and every command they show names files, extras and config keys
that exist."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_helpers import running_server

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

NOT_RUN = {
    (
        "integrations/trl.md",
        1,
    ): "downloads a hub model; tests/integrations/test_trl.py trains these calls on a tiny model",
    (
        "integrations/trl.md",
        2,
    ): "downloads a hub model; tests/integrations/test_trl.py trains these calls on a tiny model",
    (
        "integrations/verl.md",
        1,
    ): "needs verl, which has its own environment; tests/integrations/test_verl.py runs these calls",
    (
        "integrations/verl.md",
        2,
    ): "needs verl, which has its own environment: run by tests/integrations/test_verl.py",
    (
        "integrations/verifiers.md",
        1,
    ): "needs verifiers, which has its own environment: tests/integrations/test_verifiers.py runs it",
    (
        "integrations/verifiers.md",
        2,
    ): "vf.Algorithm is not in verifiers 0.4.0; tests/integrations/test_verifiers.py runs assign_step_credit",
}
"""Python examples not executed here, and why; any other example that is not run fails the test."""
SUBSTITUTIONS = {
    ("integrations/openrlhf.md", 1): [("HGPO-ALFWorld-v0", "HGPO-Rooms-v0")],  # no ALFWorld data needed
}
"""Replacements made before running an example, where it names what this machine lacks."""


class Example(NamedTuple):
    page: str
    number: int  # 1-based among the page's examples of this language
    line: int
    lang: str
    code: str


def examples(lang: str) -> list[Example]:
    found = []
    for path in PAGES:
        text = path.read_text()
        page = path.relative_to(REPO / "docs").as_posix() if path.parent != REPO else path.name
        blocks = [
            m
            for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
            if m[1] == lang
        ]
        for number, block in enumerate(blocks, 1):
            found.append(Example(page, number, text[: block.start()].count("\n") + 1, lang, block[2]))
    return found


def example_id(example: Example) -> str:
    return f"{example.page}:{example.line}"


def test_the_site_builds_strictly(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert api.count("GroupedEnvPool") > 3
    assert not re.search(r":(class|meth|func|mod|attr|data):<code>", api)  # Sphinx roles read as code


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    for target in re.findall(r"\]\((docs/[^)#]+)", "\n".join(lines)):
        assert (REPO / target).is_file(), target


@pytest.mark.parametrize("example", examples("python"), ids=example_id)
def test_python_example_runs(example: Example, tmp_path):
    key = (example.page, example.number)
    if key in NOT_RUN:
        assert NOT_RUN[key]
        return
    code = example.code
    for old, new in SUBSTITUTIONS.get(key, []):
        assert old in code
        code = code.replace(old, new)
    script = tmp_path / "example.py"  # a file, not -c: pool workers are spawned and import __main__
    if "http://127.0.0.1:8000" in code:  # a client example: against a server of its own
        with running_server("HGPO-Rooms-v0", "history_length=2") as (url, _):
            script.write_text(code.replace("http://127.0.0.1:8000", url))
            run = subprocess.run(
                [sys.executable, str(script)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
    else:
        script.write_text(code)
        run = subprocess.run(
            [sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
        )
    assert run.returncode == 0, f"{example_id(example)}:\n{code}\n{run.stderr[-3000:]}"


def test_every_example_not_run_is_still_there():
    present = {(e.page, e.number) for e in examples("python")}
    assert set(NOT_RUN) <= present and set(SUBSTITUTIONS) <= present


def shell_commands() -> list[tuple[str, list[str]]]:
    commands = []
    for example in examples("bash"):
        for line in example.code.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("#"):  # a comment line
                continue
            for part in filter(None, (p.strip() for p in line.split("&&"))):
                commands.append((example_id(example), shlex.split(part)))
    return commands


EXTRAS = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


@pytest.mark.parametrize("where, argv", shell_commands(), ids=lambda v: v if isinstance(v, str) else None)
def test_shell_command_names_what_exists(where: str, argv: list[str]):
    """Extras exist, files exist, and trainer commands resolve their config."""
    if argv[:2] == ["pip", "install"]:
        for spec in argv[2:]:
            if spec.startswith(".["):
                assert set(spec[2:-1].split(",")) <= EXTRAS, f"{where}: unknown extra in {spec}"
        return
    if argv[:1] == ["bash"]:
        assert (REPO / argv[1]).is_file(), f"{where}: {argv[1]} does not exist"
        return
    if not argv or Path(argv[0]).name != "python":  # python, or a virtual environment's
        return
    from hgpo_train.cli import TOOLS, main

    tool = argv[3] if len(argv) > 3 and argv[1:3] == ["-m", "hgpo_train"] else None
    if argv[1:3] == ["-m", "hgpo_train"] and tool not in TOOLS:  # a training run
        assert main([*argv[3:], "--print-config"]) == 0, where
        return
    if argv[1] != "-m" and not argv[1].startswith("-"):
        assert (REPO / argv[1]).is_file(), f"{where}: {argv[1]} does not exist"
    for arg in argv:
        if arg.startswith("configs/"):
            assert (REPO / arg).is_file(), f"{where}: {arg} does not exist"


def test_the_timeline_pages_tables_are_what_the_model_prints():
    """docs/training/timeline.md shows scripts/timeline_model.py's output with its defaults."""
    printed = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "timeline_model.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = [line for line in printed.splitlines() if line.startswith(("| sync", "| async"))]
    page = (REPO / "docs" / "training" / "timeline.md").read_text()
    assert len(rows) == 12 and all(row in page for row in rows)
