"""The tree stays lint-clean and formatted, with the ruff version and rules of pyproject.toml."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command: list[str]) -> None:
    pytest.importorskip("ruff", reason="ruff comes with the dev extra")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def folder_imports(package: str) -> dict[tuple[str, str], set[str]]:
    """(importing folder, imported folder) -> the modules that import across, for every absolute
    import inside ``package``. A command line (``__main__`` or ``cli``) is left out: it is where
    the folders are put together, so it imports the subpackages whose commands it offers."""
    edges: dict[tuple[str, str], set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.name in ("__main__.py", "cli.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                folders = [
                    Path(*parts[:n]) for n in range(len(parts), 0, -1) if (ROOT / Path(*parts[:n])).is_dir()
                ]
                here = path.parent.relative_to(ROOT)
                if folders and parts[0] == package and folders[0] != here:
                    edges.setdefault((str(here), str(folders[0])), set()).add(str(path.relative_to(ROOT)))
    return edges


@pytest.mark.parametrize("package", ["hgpo_env", "hgpo_train"])
def test_no_folder_imports_a_folder_that_imports_it(package: str) -> None:
    edges = folder_imports(package)
    cycles = [
        f"{a} -> {b} ({', '.join(sorted(edges[a, b]))}) and back ({', '.join(sorted(edges[b, a]))})"
        for a, b in edges
        if a < b and (b, a) in edges
    ]
    assert not cycles, "\n".join(cycles)
