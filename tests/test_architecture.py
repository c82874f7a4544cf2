"""The package map of ``docs/architecture.md`` holds: no import crosses an arrow it forbids.

The arrows are read from the document itself, so the map and this check cannot drift apart.
Every ``import`` and ``from ... import`` counts, inside functions too, and so does a string
literal handed to ``importlib.import_module`` or ``find_spec``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.project import PACKAGES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"

FOLDERS = PACKAGES


def allowed_arrows() -> dict[str, set[str]]:
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"<!-- arrows -->\s*```text\n(.*?)```", text, re.S)
    assert block, f"no arrows block in {DOC}"
    arrows: dict[str, set[str]] = {}
    for line in block.group(1).strip().splitlines():
        source, _, targets = line.partition("->")
        arrows[source.strip()] = {t.strip() for t in targets.split(",") if t.strip()}
    return arrows


def _imported(tree: ast.AST) -> list[tuple[str, int]]:
    """(module, line) of every absolute import in ``tree``, dynamic ones by literal included."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("import_module", "find_spec")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.args[0].value, node.lineno))
    return found


def crossings() -> list[str]:
    arrows = allowed_arrows()
    bad = []
    for package, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for module, line in _imported(tree):
                top = module.split(".")[0]
                if top in FOLDERS and top != package and top not in arrows[package]:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {package} -> {top}")
    return bad


def test_the_map_names_every_package() -> None:
    assert set(allowed_arrows()) == set(FOLDERS)
    for targets in allowed_arrows().values():
        assert targets <= set(FOLDERS), targets


def test_no_import_crosses_a_forbidden_arrow() -> None:
    bad = crossings()
    assert not bad, "imports the map in docs/architecture.md forbids:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("statement", "absent"),
    [
        # The proxy loads the filter at start: no web framework, no torch, not the server.
        ("import swift_middleware", ("fastapi", "torch", "hapi_server", "hapi_core.engine")),
        # The core's errors and settings are what the filter needs before a request.
        ("import hapi_core.errors, hapi_core.settings", ("fastapi", "torch", "hapi_server")),
        ("import hapi_core", ("fastapi", "torch")),
    ],
)
def test_imports_stay_light(statement: str, absent: tuple[str, ...]) -> None:
    check = f"import sys; {statement}; print([m for m in {absent!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]", out.stdout
