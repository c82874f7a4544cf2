"""Every code block of the README and of ``docs/`` runs as pasted, or says why it is not run here.

A block of shell or Python is preceded by ``<!-- snippet: NAME -->`` (a test runs it: the
README's and ``docs/datasets.md``'s here, ``docs/server.md``'s in
``tests/hapi_server/test_server_docs.py``) or by ``<!-- shown: REASON -->``. The README's blocks,
then ``docs/datasets.md``'s, run in order against a stack of their own, as a new user pastes
them; only addresses and paths are substituted (the stack runs on free ports, in a temporary
state directory, from a temporary working directory). The blocks see no Swift or HAPI variable
(``ST_AUTH``, ``HAPI_ENDPOINT``, ...) that a new user's shell would not have: only the ``hapi``
command is pointed at the stack's ports, through the variables its defaults read.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hapi_stack import PORT_SETTINGS, pick_free_ports

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
CODE = {"bash", "sh", "shell", "python", "console"}

#: The snippets each test runs, per document.
RUN = {
    "README.md": ["quickstart", "weights", "cli", "own-loop", "reload", "vit-upload", "vit-loop"]
    + ["recipe", "workers"],
    "docs/datasets.md": ["index", "index-finetune"],
    "docs/server.md": ["upload", "curl", "decode"],  # tests/hapi_server/test_server_docs.py
}

_BLOCK = re.compile(r"(?:<!-- (snippet|shown): ([^>]*?) -->\n)?```(\w*)\n(.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    doc: str
    mark: str | None  # "snippet", "shown" or None
    label: str  # the snippet's name, or why it is shown only
    language: str
    code: str


def blocks(path: Path) -> list[Block]:
    doc = str(path.relative_to(ROOT))
    return [
        Block(doc, mark, (label or "").strip(), language, code)
        for mark, label, language, code in _BLOCK.findall(path.read_text(encoding="utf-8"))
    ]


def snippet(doc: str, name: str) -> Block:
    [block] = [b for b in blocks(ROOT / doc) if b.mark == "snippet" and b.label == name]
    return block


def test_the_readme_is_under_250_lines() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < 250, f"README.md has {lines} lines: move detail into docs/"


def test_the_readme_says_what_make_and_compose_need() -> None:
    """What a new user plans by (issue 28, case 15): the install row lints only where the target
    does, ``make test``'s duration is stated, and ``docker compose`` names the engine it needs."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    install_lints = re.search(r"^install:.*\blint\b", makefile, re.M) is not None
    assert ("`make install` in a fresh clone (torch from local wheels; no lint" in text) != (
        install_lints
    )
    assert re.search(r"`make test` \(lint included\) takes about \d+ minutes on a 2-core", text)
    assert "Compose v2" in text and "`make compose-check` installs podman" in text


def test_every_code_block_is_run_or_says_why() -> None:
    unmarked, named = [], {}
    for path in DOCS:
        for block in blocks(path):
            if block.language in CODE and (block.mark is None or not block.label):
                unmarked.append(f"{block.doc}: {block.code.splitlines()[0][:80]}")
            if block.mark == "snippet":
                named.setdefault(block.doc, []).append(block.label)
    assert not unmarked, "code blocks without <!-- snippet: NAME --> or <!-- shown: WHY -->:\n" + (
        "\n".join(unmarked)
    )
    assert {doc: sorted(names) for doc, names in named.items()} == {
        doc: sorted(names) for doc, names in RUN.items()
    }


@pytest.fixture
def own_stack(tmp_path: Path) -> dict[str, str]:
    """Where the README's stack goes: a state directory and a free port per service."""
    # Distinct: ports picked one at a time, each socket closed before the next, can repeat.
    ports = dict(zip(PORT_SETTINGS, pick_free_ports(len(PORT_SETTINGS)), strict=True))
    flags = " ".join(f"--{s.replace('_', '-')} {p}" for s, p in ports.items())
    return {
        "up": f"hapi stack up --state-dir {tmp_path / 'state'} {flags}",
        "down": f"{ROOT}/.venv/bin/hapi stack down --state-dir {tmp_path / 'state'}",
        "auth": f"http://127.0.0.1:{ports['proxy_port']}/auth/v1.0",
        "endpoint": f"http://127.0.0.1:{ports['hapi_port']}",
        "cwd": str(tmp_path),
    }


#: Variables a new user's shell does not have: the blocks run without them.
_USER_UNSET = ("ST_", "OS_", "HAPI_", "SWIFTCLIENT_")


def _pasting_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_USER_UNSET)}


def _addresses(code: str, stack: dict[str, str]) -> str:
    return code.replace("http://127.0.0.1:8080/auth/v1.0", stack["auth"]).replace(
        "http://127.0.0.1:8090", stack["endpoint"]
    )


def _run_bash(code: str, stack: dict[str, str]) -> str:
    # The stack listens on free ports: `hapi` alone is told them, through the variables that its
    # defaults (`--auth-url`, `--endpoint`) read; `swift` and Python see the user's environment.
    hapi = f"env ST_AUTH={stack['auth']} HAPI_ENDPOINT={stack['endpoint']} {ROOT}/.venv/bin/hapi "
    code = (
        _addresses(code, stack)
        .replace("make install", f"make -C {ROOT} install")
        .replace(".venv/bin/", f"{ROOT}/.venv/bin/")
        .replace(f"{ROOT}/.venv/bin/hapi ", hapi)
        .replace("hapi stack up", stack["up"])
    )
    env = _pasting_env()
    proc = subprocess.run(  # noqa: S603
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=stack["cwd"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, f"{code}\n--- stdout\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def _run_python(code: str, stack: dict[str, str]) -> str:
    code = _addresses(code, stack)
    proc = subprocess.run(  # noqa: S603
        [sys.executable, "-c", code],
        cwd=stack["cwd"],
        env=_pasting_env(),
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_the_readme_and_docs_datasets_run_as_pasted(own_stack: dict[str, str]) -> None:
    try:
        out = _run_bash(snippet("README.md", "quickstart").code, own_stack)
        assert "eval acc" in out and "split index" in out
        out = _run_bash(snippet("README.md", "weights").code, own_stack)
        assert "resnet18" in out
        out = _run_bash(snippet("README.md", "cli").code, own_stack)
        assert "finetune" in out and "--batch-size" in out
        out = _run_python(snippet("README.md", "own-loop").code, own_stack)
        assert re.search(r"^split \d+: ", out, re.M) and "epoch 2: loss" in out
        # Reloads what own-loop saved (in the same working directory) and evaluates it.
        out = _run_python(snippet("README.md", "reload").code, own_stack)
        assert re.search(r"^held-out accuracy [\d.]+ on 100 images$", out, re.M), out
        out = _run_bash(snippet("README.md", "vit-upload").code, own_stack)
        assert "timm/vit_tiny_patch16_224" in out
        out = _run_python(snippet("README.md", "vit-loop").code, own_stack)
        assert "epoch 3: loss" in out and "0 KB received" in out
        out = _run_python(snippet("README.md", "recipe").code, own_stack)
        assert "held-out accuracy" in out
        out = _run_bash(snippet("README.md", "workers").code, own_stack)
        assert "eval acc" in out, out[-3000:]
        out = _run_bash(snippet("docs/datasets.md", "index").code, own_stack)
        assert "dataset 'photos-idx' (folder layout, data in 'photos'): 200 samples" in out, out
        out = _run_bash(snippet("docs/datasets.md", "index-finetune").code, own_stack)
        assert "split index" in out and "train acc" in out, out[-3000:]
    finally:
        subprocess.run(own_stack["down"].split(), cwd=own_stack["cwd"], check=False)  # noqa: S603
