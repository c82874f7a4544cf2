"""The README's Python snippets run verbatim, in every mode, against the real stack.

Only the addresses (the test stack runs on free ports) and the stored model's container are
substituted; everything else is the text a user pastes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import ClientEnv

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def _snippets() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Fine-tuning from Python") : text.index("## The model zoo")]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def _localised(code: str, env: ClientEnv) -> str:
    stack = env.stack
    for old, new in (
        ("http://127.0.0.1:8080/auth/v1.0", stack.auth_url),
        ("http://127.0.0.1:8090", env.server.url),
        ('"test:tester", "testing"', f'"{stack.admin_user}", "{stack.admin_key}"'),
        ('"models/efficientnet_lite0"', f'"{env.models["efficientnet_lite0"].name}"'),
        ('"photos-train"', f'"{env.train}"'),
        ('"photos-test"', f'"{env.test}"'),
    ):
        assert old in code or old.startswith('"photos-test"') or old.startswith('"test:')
        code = code.replace(old, new)
    return code


def test_the_readme_has_the_own_loop_first_then_the_recipe() -> None:
    own, recipe = _snippets()
    assert "FeatureDataset" in own and "client.finetune(" in recipe


def test_own_loop_snippet_runs(client_env: ClientEnv, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(_localised(_snippets()[0], client_env), "README.md", "exec"), {})  # noqa: S102
    out = capsys.readouterr().out
    assert "split 18:" in out or "split " in out
    assert "epoch 2: loss" in out


@pytest.mark.parametrize("mode", ["hapi", "baseline", "all_in_cos"])
def test_recipe_snippet_runs_in_every_mode(
    client_env: ClientEnv, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _localised(_snippets()[1], client_env).replace('mode="hapi"', f'mode="{mode}"')
    exec(compile(code, "README.md", "exec"), {})  # noqa: S102
    out = capsys.readouterr().out
    assert "held-out accuracy" in out
