"""PEP 562 lazy package attributes, declared once as the imports of an ``if TYPE_CHECKING:`` block.

A package ``__init__`` writes its public names as ordinary imports, for readers and type
checkers, and lets this module resolve them on first use::

    from typing import TYPE_CHECKING
    from hapi_contract.lazy import attach

    if TYPE_CHECKING:
        from .aggregators import Krum

    __getattr__, __dir__ = attach(__name__, __file__)

So ``import hapi_client`` or ``import hapi_client.robust.names`` loads no submodule (and no
torch) until a name that lives in one is used: ``hapi --help`` reads the rule names that way.
As ``lazy_loader.attach_stub`` does with a ``.pyi``, the block is read with :mod:`ast`, so the
list of names exists once.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["attach"]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def attach(package: str, init_file: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` from its ``if TYPE_CHECKING:`` imports."""
    where: dict[str, tuple[str, str]] = {}  # public name -> (relative module, name there)
    for node in ast.parse(Path(init_file).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    module = "." * statement.level + (statement.module or "")
                    for alias in statement.names:
                        where[alias.asname or alias.name] = (module, alias.name)

    def __getattr__(name: str) -> object:
        try:
            module, original = where[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module, package), original)
        setattr(sys.modules[package], name, value)  # later reads skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | where.keys())

    return __getattr__, __dir__
