"""Build a source from a spec string, as the CLI takes it."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl

from ._digits import DigitsSource
from ._fashion_mnist import FASHION_MNIST_DIR, FashionMNISTSource
from ._folder import FolderSource
from ._photos import PHOTO_DEFAULT_QUALITY, PhotoSource
from ._source import ImageSource
from .errors import SourceError, SourceSpecError

__all__ = ["SOURCE_SPEC_HELP", "get_source", "list_sources"]

SOURCE_SPEC_HELP = f"""\
A source spec is NAME[:ARG][?KEY=VALUE&KEY=VALUE...]:
  fashion-mnist:train|test          Debian's Fashion-MNIST, 28x28 PNG, 10 classes
                                    keys: limit, root (default {FASHION_MNIST_DIR})
  digits[:all|train|test]           scikit-learn digits, 8x8 PNG, 10 classes (default all)
                                    keys: test_fraction (0.2), seed (0), limit
  folder:PATH                       an ImageFolder tree PATH/<class>/**/*.jpg|jpeg|png
                                    keys: shuffle (true), seed (0), limit
  photos[:train|test]               ImageNet-sized JPEG views of sklearn/skimage photos,
                                    10 classes (default train); keys: per_class (100),
                                    size (500x375), seed (0), quality ({PHOTO_DEFAULT_QUALITY}),
                                    classes (comma list), workers
Examples: fashion-mnist:test?limit=500  digits:train?seed=1  folder:/data/pets?shuffle=false
          photos:train?per_class=200  photos:test?per_class=20&size=320x240
A PATH cannot contain '?' (everything after the first '?' is read as keys)."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class _Params:
    """Typed access to the ``?key=value`` part; unknown or repeated keys are errors."""

    def __init__(self, spec: str, query: str, allowed: tuple[str, ...]) -> None:
        self._spec = spec
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
        except ValueError as exc:
            raise SourceSpecError(f"source {spec!r}: malformed keys {query!r}") from exc
        self._values: dict[str, str] = {}
        for key, value in pairs:
            if key not in allowed:
                accepted = ", ".join(allowed) if allowed else "none"
                raise SourceSpecError(
                    f"source {spec!r}: unknown key {key!r} (accepted: {accepted})"
                )
            if key in self._values:
                raise SourceSpecError(f"source {spec!r}: key {key!r} given twice")
            self._values[key] = value

    def _fail(self, key: str, value: str, expected: str) -> SourceSpecError:
        return SourceSpecError(f"source {self._spec!r}: {key}={value!r} is not {expected}")

    def get_int(self, key: str, default: int | None, minimum: int = 0) -> int | None:
        if key not in self._values:
            return default
        value = self._values[key]
        try:
            number = int(value)
        except ValueError:
            raise self._fail(key, value, "an integer") from None
        if number < minimum:
            raise self._fail(key, value, f"an integer >= {minimum}")
        return number

    def get_float(self, key: str, default: float) -> float:
        value = self._values.get(key)
        if value is None:
            return default
        try:
            return float(value)
        except ValueError:
            raise self._fail(key, value, "a number") from None

    def get_bool(self, key: str, default: bool) -> bool:
        value = self._values.get(key)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise self._fail(key, value, "a boolean (true/false)")

    def get_str(self, key: str) -> str | None:
        return self._values.get(key)

    def get_size(self, key: str, default: tuple[int, int]) -> tuple[int, int]:
        value = self._values.get(key)
        if value is None:
            return default
        width, sep, height = value.lower().partition("x")
        if not (sep and width.isdigit() and height.isdigit()):
            raise self._fail(key, value, "WIDTHxHEIGHT")
        return int(width), int(height)


def _required(value: int | None) -> int:
    assert value is not None  # a default was given
    return value


def _split(spec: str, arg: str | None, allowed: tuple[str, ...], default: str | None) -> str:
    if arg is None or arg == "":
        if default is None:
            raise SourceSpecError(f"source {spec!r}: give a split, one of {', '.join(allowed)}")
        return default
    if arg not in allowed:
        raise SourceSpecError(
            f"source {spec!r}: unknown split {arg!r} (choose {', '.join(allowed)})"
        )
    return arg


def _fashion_mnist(spec: str, arg: str | None, query: str) -> ImageSource:
    split = _split(spec, arg, ("train", "test"), None)
    params = _Params(spec, query, ("limit", "root"))
    return FashionMNISTSource(
        "train" if split == "train" else "test",
        limit=params.get_int("limit", None, minimum=1),
        root=params.get_str("root") or FASHION_MNIST_DIR,
    )


def _digits(spec: str, arg: str | None, query: str) -> ImageSource:
    split = _split(spec, arg, ("all", "train", "test"), "all")
    params = _Params(spec, query, ("test_fraction", "seed", "limit"))
    return DigitsSource(
        "all" if split == "all" else "train" if split == "train" else "test",
        test_fraction=params.get_float("test_fraction", 0.2),
        seed=_required(params.get_int("seed", 0)),
        limit=params.get_int("limit", None, minimum=1),
    )


def _folder(spec: str, arg: str | None, query: str) -> ImageSource:
    if not arg:
        raise SourceSpecError(f"source {spec!r}: give the folder, as folder:/path/to/images")
    params = _Params(spec, query, ("shuffle", "seed", "limit"))
    return FolderSource(
        arg,
        shuffle=params.get_bool("shuffle", True),
        seed=_required(params.get_int("seed", 0)),
        limit=params.get_int("limit", None, minimum=1),
    )


def _photos(spec: str, arg: str | None, query: str) -> ImageSource:
    split = _split(spec, arg, ("train", "test"), "train")
    params = _Params(spec, query, ("per_class", "size", "seed", "quality", "classes", "workers"))
    classes = params.get_str("classes")
    return PhotoSource(
        "train" if split == "train" else "test",
        per_class=_required(params.get_int("per_class", 100, minimum=1)),
        size=params.get_size("size", (500, 375)),
        seed=_required(params.get_int("seed", 0)),
        quality=_required(params.get_int("quality", PHOTO_DEFAULT_QUALITY, minimum=1)),
        classes=classes.split(",") if classes else None,
        workers=params.get_int("workers", None, minimum=1),
    )


_FACTORIES: dict[str, Callable[[str, str | None, str], ImageSource]] = {
    "fashion-mnist": _fashion_mnist,
    "digits": _digits,
    "folder": _folder,
    "photos": _photos,
}


def list_sources() -> list[str]:
    """The source names ``get_source`` knows."""
    return sorted(_FACTORIES)


def get_source(spec: str) -> ImageSource:
    """Build the source a spec string names (syntax in ``SOURCE_SPEC_HELP``).

    Examples::

        get_source("fashion-mnist:train")
        get_source("digits:test?seed=1")
        get_source("folder:/data/pets?shuffle=false")
        get_source("photos:train?per_class=200&size=500x375")

    Raises:
        SourceSpecError: the spec cannot be parsed (unknown name, split or key, bad value).
        SourceError: the spec is fine but the source cannot be built (e.g. missing folder).
    """
    head, _, query = spec.strip().partition("?")
    name, colon, arg = head.partition(":")
    factory = _FACTORIES.get(name.strip().lower())
    if factory is None:
        raise SourceSpecError(
            f"unknown source {name!r} in {spec!r}; known sources: {', '.join(list_sources())}"
        )
    try:
        return factory(spec, arg if colon else None, query)
    except SourceError:
        raise
    except ValueError as exc:  # defensive: a constructor's own argument check
        raise SourceSpecError(f"source {spec!r}: {exc}") from exc
