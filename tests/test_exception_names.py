"""One name per exception class across the project's packages.

Two classes both called ``SwiftUnavailableError`` (the client's and one of ``hapi_client.datasets``)
meant that ``except SwiftUnavailableError`` caught one of them depending on the import. The
sources are read with :mod:`ast` (nothing is imported), and every class whose name ends in
``Error`` must be defined once; a package re-exporting another's class is fine.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.project import PACKAGES

ROOT = Path(__file__).resolve().parent.parent


def error_classes() -> dict[str, list[str]]:
    """Class name ending in ``Error`` -> where each class of that name is defined."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES.values():
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                    found[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_packages_are_there() -> None:
    for package in PACKAGES.values():
        assert (ROOT / package / "__init__.py").is_file(), package
    assert "HapiClientError" in error_classes()


def test_every_exception_name_is_defined_once() -> None:
    twice = {name: where for name, where in error_classes().items() if len(where) > 1}
    assert not twice, "exception classes sharing a name: " + "; ".join(
        f"{name} at {', '.join(where)}" for name, where in sorted(twice.items())
    )
