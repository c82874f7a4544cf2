"""Where an architecture's listing is kept between processes, and what it is keyed by.

Listing an architecture traces its graph (seconds for the big ones, about 25 s for every
network HAPI lists); its result depends only on the code that builds and cuts it. So each entry
is a JSON file under the user's cache directory, named by the SHA-256 of its key: the versions
of torch, torchvision and timm, a hash of this package's sources, the architecture's name and
family and, for a plugin's, its distribution's version and the source of its module. Any of
these changing gives another file name: a stale entry is never read, it is only left behind.

The directory is ``$HAPI_CACHE_DIR`` when set (the test suite shares one among its servers),
else platformdirs' user cache directory for ``hapi`` when platformdirs is installed, else
``$XDG_CACHE_HOME/hapi`` (``~/.cache/hapi``). A file that cannot be read or does not hold what
its name promises is ignored (one warning per process) and written again; a directory that
cannot be written costs the time of tracing again, never a failure.

Other measurements that depend only on the code and the machine are kept the same way, each
kind in a directory of its own (``kind``): the HAPI host's layout choice per head
(:mod:`.layout`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from importlib import metadata, util
from pathlib import Path
from typing import Any

from .atomic_files import atomic_write

log = logging.getLogger(__name__)

__all__ = ["CACHE_ENV", "cache_dir", "entry_key", "read_entry", "write_entry"]

CACHE_ENV = "HAPI_CACHE_DIR"
#: Bumped when an entry's layout changes: older files are then simply not found.
_FORMAT = 1
_LIBRARIES = ("torch", "torchvision", "timm")
_PLUGIN_GROUP = "hapi.models"

_warned: set[str] = set()


def cache_dir() -> Path:
    """HAPI's cache directory (see the module's documentation for the order)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    try:
        import platformdirs  # noqa: PLC0415 - optional: only its answer for this OS is wanted
    except ImportError:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "hapi"
    return Path(platformdirs.user_cache_dir("hapi"))


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _tree_digest(root: Path) -> str:
    """SHA-256 over the Python sources under ``root`` (relative paths and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def _sources_digest() -> str:
    """This package's sources, hashed once per process."""
    return _tree_digest(Path(__file__).resolve().parent)


def _plugin_key(name: str, distribution: str) -> dict[str, Any]:
    """What a plugin's listing depends on beyond HAPI: its version, entry point and sources.

    The module's sources (its package's, for a package) count too: an editable install changes
    them without a new version.
    """
    values = [e.value for e in metadata.entry_points(group=_PLUGIN_GROUP, name=name)]
    module_digest = None
    if values:
        spec = util.find_spec(values[0].partition(":")[0].strip())
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        if origin is not None and origin.name == "__init__.py":
            module_digest = _tree_digest(origin.parent)  # the whole package the plugin is
        elif origin is not None and origin.is_file():
            module_digest = hashlib.sha256(origin.read_bytes()).hexdigest()
    return {
        "distribution": distribution,
        "version": _version(distribution),
        "entry_points": values,
        "module_sha256": module_digest,
    }


def entry_key(name: str, family: str) -> dict[str, Any]:
    """Everything architecture ``name``'s listing depends on."""
    key: dict[str, Any] = {
        "format": _FORMAT,
        "name": name,
        "family": family,
        "libraries": {lib: _version(lib) for lib in _LIBRARIES},
        "hapi_models_sources": _sources_digest(),
    }
    if family.startswith("plugin:"):
        key["plugin"] = _plugin_key(name, family.removeprefix("plugin:"))
    return key


def _path(key: dict[str, Any], kind: str) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return cache_dir() / kind / f"{digest[:40]}.json"


def _warn_once(what: str, message: str, *args: object) -> None:
    level = logging.WARNING if what not in _warned else logging.DEBUG
    _warned.add(what)
    log.log(level, message, *args)


def read_entry(key: dict[str, Any], *, kind: str = "listing") -> dict[str, Any] | None:
    """The entry of ``kind`` stored under ``key``, or None (absent, unreadable, or not this
    key's). ``key`` must be JSON's own types (lists, not tuples): it is compared as read."""
    path = _path(key, kind)
    try:
        stored = json.loads(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None  # no such entry (or no such directory: the write says so, once)
    except (OSError, ValueError) as exc:
        _warn_once(f"{kind}:corrupt", "%s cache %s ignored and rebuilt: %s", kind, path, exc)
        return None
    if not isinstance(stored, dict) or stored.get("key") != key:
        _warn_once(f"{kind}:corrupt", "%s cache %s ignored and rebuilt: not its key", kind, path)
        return None
    entry = stored.get("entry")
    return entry if isinstance(entry, dict) else None


def write_entry(key: dict[str, Any], entry: dict[str, Any], *, kind: str = "listing") -> None:
    """Store ``entry`` of ``kind`` under ``key``: whole or not at all (temporary file, then
    rename). A directory that cannot be written is logged (once per kind), never raised."""
    path = _path(key, kind)
    data = json.dumps({"key": key, "entry": entry}, sort_keys=True).encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Whole or not at all: the suite's servers share the directory and read each other's.
        atomic_write(path, data)
    except OSError as exc:
        _warn_once(f"{kind}:unwritable", "%s not cached in %s: %s", kind, path.parent, exc)
