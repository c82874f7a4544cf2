"""The package map of ``docs/architecture.md`` holds: no import crosses an arrow it forbids.

The arrows are read from the document itself, so the map and this check cannot drift apart.
Every ``import`` and ``from ... import`` counts, inside functions too, and so does a string
literal handed to ``import_module``, ``find_spec`` or ``__import__``, by attribute or by bare
name. The third-party rules and the "imports torch" column of the package table are read from
the same document and checked too.
"""

from __future__ import annotations

import ast
import functools
import graphlib
import re
import subprocess
import sys
from collections.abc import Iterator
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


def third_party_rules() -> dict[str, set[str]]:
    """Third-party top-level module -> the only packages that may import it."""
    text = DOC.read_text(encoding="utf-8")
    block = re.search(r"<!-- third-party -->\s*```text\n(.*?)```", text, re.S)
    assert block, f"no third-party block in {DOC}"
    rules: dict[str, set[str]] = {}
    for line in block.group(1).strip().splitlines():
        modules, _, owners = line.partition("->")
        for module in modules.split(","):
            rules[module.strip()] = {o.strip() for o in owners.split(",") if o.strip()}
    return rules


def torch_column() -> dict[str, str]:
    """Package -> its "imports torch" cell in the table of packages."""
    cells = re.findall(r"^\| `(\w+)`[^|]*\|[^|]*\| ([^|]+) \|$", DOC.read_text("utf-8"), re.M)
    return dict(cells)


_DYNAMIC = ("import_module", "find_spec", "__import__")


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):  # ``from importlib import import_module`` then a bare call
        return func.id
    return None


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
            and _called_name(node.func) in _DYNAMIC
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.args[0].value, node.lineno))
    return found


@functools.cache
def _imports_by_package() -> list[tuple[str, Path, str, int]]:
    """(package, file, top-level module, line) of every import in the project's packages."""
    found = []
    for package, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            found += [(package, path, m.split(".")[0], line) for m, line in _imported(tree)]
    return found


def crossings() -> list[str]:
    arrows = allowed_arrows()
    return [
        f"{path.relative_to(ROOT)}:{line}: {package} -> {top}"
        for package, path, top, line in _imports_by_package()
        if top in FOLDERS and top != package and top not in arrows[package]
    ]


def third_party_crossings() -> list[str]:
    rules = third_party_rules()
    return [
        f"{path.relative_to(ROOT)}:{line}: {package} -> {top}"
        for package, path, top, line in _imports_by_package()
        if top in rules and package not in rules[top]
    ]


def _modules(package: str) -> list[str]:
    folder = ROOT / FOLDERS[package]
    names = []
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join([package, *parts]))
    return names


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` without the bodies of ``if TYPE_CHECKING:`` blocks."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
        else:
            todo += ast.iter_child_nodes(node)


def module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (lazily too), relative ones resolved.

    Package ``__init__`` files are left out: a submodule reading a name from its parent package
    is how a package re-exports, not a circle a reader has to untangle. So are imports under
    ``if TYPE_CHECKING:``: they never run.
    """
    folder = ROOT / FOLDERS[package]
    files = [path for path in sorted(folder.rglob("*.py")) if path.name != "__init__.py"]
    names = {f: ".".join([package, *f.relative_to(folder).with_suffix("").parts]) for f in files}
    graph: dict[str, set[str]] = {}
    for path, name in names.items():
        here = name.split(".")[:-1]
        targets: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                targets |= {module, *(f"{module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        graph[name] = (targets & set(names.values())) - {name}
    return graph


def _loaded(statement: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter holds after running ``statement``."""
    check = f"import sys; {statement}; print([m for m in {modules!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_the_map_names_every_package() -> None:
    assert set(allowed_arrows()) == set(FOLDERS)
    for targets in allowed_arrows().values():
        assert targets <= set(FOLDERS), targets


def test_no_import_crosses_a_forbidden_arrow() -> None:
    bad = crossings()
    assert not bad, "imports the map in docs/architecture.md forbids:\n" + "\n".join(bad)


# Circles that predate the check (issue 29 names the CLI's only): each mark goes when its
# circle is broken, or the strict xfail fails.
_KNOWN_CIRCLES = {"hapi_models", "hapi_bench"}


@pytest.mark.parametrize(
    "package",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="a circle predates the check"))
        if p in _KNOWN_CIRCLES
        else p
        for p in FOLDERS
    ],
)
def test_modules_of_a_package_import_each_other_without_a_circle(package: str) -> None:
    # A circle closed by an import inside a function works until someone moves that import to
    # the top; then the package fails to import. Put the shared piece in a module both use.
    try:
        tuple(graphlib.TopologicalSorter(module_graph(package)).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"{package}'s modules import in a circle: {' -> '.join(exc.args[1])}")


@pytest.mark.parametrize(
    "source",
    [
        "import importlib\nimportlib.import_module('hapi_server')",
        "from importlib import import_module\nimport_module('hapi_server.app')",
        "from importlib.util import find_spec\nfind_spec('hapi_server')",
        "__import__('hapi_server')",
        "def later():\n    from hapi_server import app",
    ],
)
def test_every_spelling_of_an_import_is_seen(source: str) -> None:
    assert "hapi_server" in {m.split(".")[0] for m, _ in _imported(ast.parse(source))}


def test_the_third_party_rules_name_known_packages() -> None:
    rules = third_party_rules()
    assert {"fastapi", "uvicorn", "pydantic_settings", "swift", "eventlet"} <= set(rules)
    for owners in rules.values():
        assert owners and owners <= set(FOLDERS), owners


def test_third_party_imports_stay_in_their_package() -> None:
    bad = third_party_crossings()
    assert not bad, "third-party imports docs/architecture.md forbids:\n" + "\n".join(bad)


def test_the_torch_column_names_every_package() -> None:
    column = torch_column()
    assert set(column) == set(FOLDERS), column
    assert all(cell.startswith(("no", "yes", "only")) for cell in column.values()), column


@pytest.mark.parametrize(
    "package", [p for p, cell in torch_column().items() if cell.startswith("no")]
)
def test_a_package_the_map_says_is_torch_free_loads_no_torch(package: str) -> None:
    # Every module, not only the package: a submodule that imports torch at its top (as the
    # frame codec once did) is what a host pays for when it imports the codec.
    statement = "import " + ", ".join(_modules(package))
    assert _loaded(statement, ("torch",)) == []


@pytest.mark.parametrize("package", [p for p, cell in torch_column().items() if "lazily" in cell])
def test_a_lazy_package_loads_no_torch_on_import(package: str) -> None:
    assert _loaded(f"import {package}", ("torch",)) == []


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
    assert _loaded(statement, absent) == []
