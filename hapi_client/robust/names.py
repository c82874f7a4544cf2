"""Where rules, pre-aggregation steps and attacks get their names: one place, torch-free.

A class is registered by naming itself where it is defined; nothing else lists it::

    class Krum(MultiKrum, name="krum"): ...
    class Average(Aggregator, name="average", aliases=("mean",)): ...

The bases (:class:`~.aggregators.Aggregator`, :class:`~.preaggregation.PreAggregator`,
:class:`~.attacks.Attack`) derive from :class:`Registered` and say which :class:`Kind` they
fill; its ``__init_subclass__`` hands the class keywords to :meth:`Kind.add`, which fills the
tables that :mod:`.registry` looks names up in.

``hapi --help`` lists the names without importing torch, which every module that defines a rule
does. So :meth:`Kind.names` reads the same class statements from this package's sources with
:mod:`ast`, without running them, and :meth:`Kind.load` imports exactly the modules that declare
a name of the kind. ``tests/hapi_client/robust/test_robust_names.py`` checks that the read and
the imported tables agree. Names are case-insensitive and ``-`` equals ``_``.
"""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from .errors import UnknownNameError

if TYPE_CHECKING:
    from .aggregators import Aggregator
    from .attacks import Attack
    from .preaggregation import PreAggregator

__all__ = ["AGGREGATORS", "ATTACKS", "PREAGGREGATORS", "Kind", "Registered", "normalise"]

T = TypeVar("T")

#: The base class names of the kinds, for :func:`_declared`.
_ROOTS: list[str] = []


def normalise(name: str) -> str:
    """The table key of ``name``: lower case, ``-`` and spaces read as ``_``."""
    return name.strip().lower().replace("-", "_").replace(" ", "_")


class Kind(Generic[T]):
    """The named subclasses of one base class (``root``), e.g. every aggregation rule."""

    def __init__(self, label: str, root: str) -> None:
        self.label = label
        self.root = root
        _ROOTS.append(root)
        self._classes: dict[str, type[T]] = {}
        self._aliases: dict[str, str] = {}

    def add(self, cls: type[T], name: str, aliases: tuple[str, ...] = ()) -> None:
        """Register ``cls`` under ``name`` and ``aliases`` (called by the base's hook)."""
        for key in (name, *aliases):
            if normalise(key) != key:
                raise ValueError(f"{self.label} name {key!r} must be written {normalise(key)!r}")
            taken = self._classes.get(self._aliases.get(key, key))
            if taken is not None and taken.__qualname__ != cls.__qualname__:
                raise ValueError(f"{self.label} name {key!r} is taken by {taken.__qualname__}")
        self._classes[name] = cls
        self._aliases.update(dict.fromkeys(aliases, name))

    def names(self) -> list[str]:
        """The registered names, sorted, read from the sources (nothing is imported)."""
        return sorted(_declared()[self.root])

    def load(self) -> dict[str, type[T]]:
        """Import the modules that declare this kind; the table of name -> class."""
        for module in sorted(set(_declared()[self.root].values())):
            importlib.import_module(f"{__package__}.{module}")
        return self._classes

    def lookup(self, name: object) -> type[T]:
        """The class registered as ``name`` or one of its aliases."""
        if not isinstance(name, str):
            raise UnknownNameError(f"{self.label} name must be a string, got {type(name).__name__}")
        table = self.load()
        key = normalise(name)
        try:
            return table[self._aliases.get(key, key)]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.label} {name!r}; known: {', '.join(sorted(table))}"
            ) from None


class Registered:
    """Base of the named kinds: ``class X(Base, name="x", aliases=(...))`` registers X.

    A base sets :attr:`registry` to its :class:`Kind` (``class Aggregator(Registered):
    registry = AGGREGATORS``); a subclass statement with a ``name`` keyword adds the class to
    it and sets :attr:`name` and :attr:`aliases`, and one without stays unregistered (an
    intermediate base).
    """

    registry: ClassVar[Kind[Any]]
    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(
        cls, *, name: str | None = None, aliases: tuple[str, ...] = (), **kwargs: object
    ) -> None:
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.name, cls.aliases = name, aliases
            cls.registry.add(cls, name, aliases)


AGGREGATORS: Kind[Aggregator] = Kind("aggregator", "Aggregator")
PREAGGREGATORS: Kind[PreAggregator] = Kind("pre-aggregator", "PreAggregator")
ATTACKS: Kind[Attack] = Kind("attack", "Attack")


@functools.cache
def _declared() -> dict[str, dict[str, str]]:
    """Base class name -> {registered name: module}, from this package's class statements."""
    bases: dict[str, list[str]] = {}
    named: dict[str, tuple[str, str]] = {}  # class -> (registered name, module)
    for path in sorted(Path(__file__).parent.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
            for keyword in node.keywords:
                if keyword.arg == "name":
                    named[node.name] = (ast.literal_eval(keyword.value), path.stem)

    def roots(cls: str) -> set[str]:
        parents = bases.get(cls, [])
        return {cls}.union(*(roots(p) for p in parents)) if parents else {cls}

    table: dict[str, dict[str, str]] = {root: {} for root in _ROOTS}
    for cls, (name, module) in named.items():
        for root in roots(cls) & table.keys():
            table[root][name] = module
    return table
