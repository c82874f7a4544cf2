"""docs/server.md stays true: its settings table matches ``ServerSettings`` and its snippets run.

The snippets (marked ``<!-- snippet: NAME -->`` before their code block) run as written against
the session's Swift and a real server; only the default URLs are swapped for the test ports.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hapi_server import ServerSettings
from hapi_stack import RunningStack

from .conftest import ServerProcess

DOC = Path(__file__).resolve().parents[2] / "docs" / "server.md"
TABLE_START, TABLE_END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"


def _default(name: str, value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    text = f"`{value}`"
    if name.endswith("_bytes") and isinstance(value, int):
        for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
            if value >= size and value % size == 0:
                return f"{text} ({value // size} {unit})"
    return text


def settings_table() -> str:
    """The markdown table of every ``HAPI_*`` setting, generated from ``ServerSettings``."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in ServerSettings.model_fields.items():
        assert field.description, f"ServerSettings.{name} has no description"
        rows.append(
            f"| `HAPI_{name.upper()}` | {_default(name, field.default)} | {field.description} |"
        )
    return "\n".join(rows)


def snippet(name: str) -> str:
    text = DOC.read_text()
    match = re.search(rf"<!-- snippet: {name} -->\s*```\w+\n(.*?)```", text, re.S)
    assert match, f"no snippet {name!r} in {DOC}"
    return match.group(1)


def test_settings_table_is_generated_from_server_settings() -> None:
    text = DOC.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    assert text[start:end].strip() == settings_table(), (
        "docs/server.md's settings table is stale; replace it with:\n" + settings_table()
    )


def test_every_error_code_is_documented() -> None:
    import hapi_core

    text = DOC.read_text()
    for name in hapi_core.__all__:
        cls = getattr(hapi_core, name)
        if isinstance(cls, type) and issubclass(cls, hapi_core.HapiCoreError):
            if cls is not hapi_core.HapiCoreError:
                assert f"`{cls.code}`" in text and str(cls.status) in text, cls


@pytest.fixture
def doc_env(swift_stack: RunningStack, tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["ST_AUTH"] = swift_stack.auth_url  # what the CLI reads instead of its default URL
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_bash(code: str, cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(  # noqa: S603
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.slow
def test_curl_and_python_snippets_work(
    hapi_server: ServerProcess,
    swift_stack: RunningStack,
    doc_env: dict[str, str],
    tmp_path: Path,
) -> None:
    run_bash(snippet("upload"), tmp_path, doc_env)
    curl = snippet("curl")
    assert "http://127.0.0.1:8080" in curl and "http://127.0.0.1:8090" in curl
    curl = curl.replace("http://127.0.0.1:8080", swift_stack.proxy_url).replace(
        "http://127.0.0.1:8090", hapi_server.url
    )
    run_bash(curl, tmp_path, doc_env)
    assert (tmp_path / "features.hapi").stat().st_size > 0

    code = snippet("decode")
    assert "iter_frames" in code
    proc = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    # 100 Fashion-MNIST samples through resnet18's first 4 layers at 64 px: 64 x 16 x 16.
    assert "torch.Size([100, 64, 16, 16])" in proc.stdout, proc.stdout
    labels = re.search(r"labels \[([\d, ]+)\]", proc.stdout)
    assert labels and all(0 <= int(v) < 10 for v in labels.group(1).split(","))
