"""The code's shape: each package is a stack of stages that import only downwards, with no import
circle between files, and every module in its stage's folder (so the next one lands in its room).

Imports are read from the source (every ``import``, inside functions and ``TYPE_CHECKING`` too),
not from what Python happens to load.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

STAGES = {
    "hgpo_train": {
        "advantage": 0,  # credit, a library of its own: imports nothing else of hgpo_train
        "config": 1,
        "rollout": 2,
        "update": 3,
        "run": 4,
        "evaluation": 5,
        "local": 6,
        "openrlhf": 6,
        "cli": 7,
        "__main__": 7,
    },
    "hgpo_env": {
        "contract": 0,
        "prompting": 1,
        "textenv": 2,
        "tools": 3,
        "envs": 3,
        "serve": 3,
        "vector": 4,
        "__main__": 5,
    },
}
"""Each package's sub-packages (and top-level command modules) by floor: a module imports its
own floor or lower ones."""

ROOT_FLOOR = {"hgpo_train": 0, "hgpo_env": 3}
"""The floor of a package's own ``__init__``: hgpo_env's names the contract, prompting and
text-env names it re-exports, so only the envs, the server and higher floors may import it."""

MOVED = {"hgpo_train": {"eval", "compare", "stopping", "tiny_model"}}
"""Old command paths that only say where the command went, kept for one release."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    where = ROOT.joinpath(*name.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def imports(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` -> the modules of hgpo_env and hgpo_train it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        me = module_name(path)
        found = graph.setdefault(me, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [
                    f"{node.module}.{alias.name}" if is_module(f"{node.module}.{alias.name}") else node.module
                    for alias in node.names
                ]
            else:
                continue
            found.update(n for n in names if n.split(".")[0] in STAGES and n != me)
    return graph


def floor(package: str, module: str) -> int | None:
    parts = module.split(".")
    return ROOT_FLOOR[package] if len(parts) == 1 else STAGES[package].get(parts[1])


@pytest.mark.parametrize("package", sorted(STAGES))
def test_no_import_circle_between_files(package: str) -> None:
    graph = {m: {d for d in deps if d.startswith(package)} for m, deps in imports(package).items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"an import circle: {' -> '.join(error.args[1])}")


@pytest.mark.parametrize("package", sorted(STAGES))
def test_no_stage_imports_a_higher_one(package: str) -> None:
    upward = [
        f"{module} (floor {floor(package, module)}) imports {target} (floor {floor(package, target)})"
        for module, targets in imports(package).items()
        for target in sorted(targets)
        if target.split(".")[0] == package
        and not target.startswith(module + ".")  # a package's __init__ re-exporting its own modules
        and floor(package, target) is not None
        and floor(package, module) is not None
        and floor(package, target) > floor(package, module)
    ]
    assert not upward, "\n".join(upward)


def test_the_env_package_never_imports_the_trainer() -> None:
    trainer = [
        f"{m} imports {t}" for m, ts in imports("hgpo_env").items() for t in ts if t.startswith("hgpo_train")
    ]
    assert not trainer, "\n".join(trainer)


@pytest.mark.parametrize("package", sorted(STAGES))
def test_every_module_is_in_its_stages_folder(package: str) -> None:
    allowed = {"__init__", "__main__", *STAGES[package], *MOVED.get(package, ())}
    loose = sorted(p.stem for p in (ROOT / package).glob("*.py") if p.stem not in allowed)
    folders = sorted(p.name for p in (ROOT / package).iterdir() if (p / "__init__.py").is_file())
    assert not loose, f"{package}: modules outside a stage's folder: {loose}; give each a room"
    assert set(folders) <= set(STAGES[package]), f"{package}: a folder with no floor: {folders}"


@pytest.mark.parametrize("name", sorted(MOVED["hgpo_train"]))
def test_a_moved_command_path_says_where_it_went_in_one_line(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"hgpo_train.{name}", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and not done.stdout
    assert done.stderr.count("\n") == 1 and " is now python -m hgpo_train " in done.stderr, done.stderr
