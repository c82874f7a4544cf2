"""Swift's scripts are found wherever pip put them, not only next to ``sys.executable``.

Debian's ``/usr/bin/python3`` with ``pip install swift`` puts ``swift-*-server`` in
``/usr/local/bin`` (its default scheme's scripts directory): the Swift container runs that way.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import pytest

from hapi_stack import MissingBinaryError
from hapi_stack._paths import find_script, script_dirs
from hapi_stack._services import swift_bin_dir, swift_program


def _script(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An interpreter in usr/bin whose default scheme installs scripts to usr/local/bin."""
    dirs = {
        "interpreter": tmp_path / "usr" / "bin",
        "scheme": tmp_path / "usr" / "local" / "bin",
        "user": tmp_path / "home" / ".local" / "bin",
    }
    dirs["interpreter"].mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(dirs["interpreter"] / "python3"))
    real_get_path = sysconfig.get_path

    def get_path(name: str, scheme: str | None = None, *args: object, **kwargs: object) -> str:
        assert name == "scripts"
        if scheme is None:
            return str(dirs["scheme"])
        if scheme == sysconfig.get_preferred_scheme("user"):
            return str(dirs["user"])
        return real_get_path(name, scheme)

    monkeypatch.setattr(sysconfig, "get_path", get_path)
    return dirs


def test_lookup_order_is_interpreter_then_scheme_then_user(layout: dict[str, Path]) -> None:
    assert script_dirs() == (layout["interpreter"], layout["scheme"], layout["user"])


def test_swift_in_the_schemes_scripts_dir_is_found(layout: dict[str, Path]) -> None:
    server = _script(layout["scheme"], "swift-account-server")
    proxy = _script(layout["scheme"], "swift-proxy-server")
    assert swift_program("swift-account-server") == server
    assert swift_bin_dir() == proxy.parent


def test_next_to_the_interpreter_wins(layout: dict[str, Path]) -> None:
    _script(layout["scheme"], "swift-ring-builder")
    beside = _script(layout["interpreter"], "swift-ring-builder")
    assert find_script("swift-ring-builder") == beside


def test_a_user_install_is_found(layout: dict[str, Path]) -> None:
    user = _script(layout["user"], "swift-object-server")
    assert swift_program("swift-object-server") == user


def test_missing_swift_names_every_place_looked(layout: dict[str, Path]) -> None:
    with pytest.raises(MissingBinaryError) as raised:
        swift_program("swift-proxy-server")
    message = str(raised.value)
    for directory in layout.values():
        assert str(directory) in message
    assert "pip install swift" in message
    assert raised.value.program == "swift-proxy-server"
    # Nothing found: the directory next to the interpreter, as before.
    assert swift_bin_dir() == layout["interpreter"]
