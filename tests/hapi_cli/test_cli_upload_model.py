"""``hapi upload model`` says whether it uploaded, replaced a model (and which), or sent nothing.

Swift and the upload are stand-ins: what is checked is what the command says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from swiftclient.exceptions import ClientException

import hapi_cli.model_cmd as model_cmd
import hapi_client
from hapi_cli.main import main
from hapi_client.model_store import StoredModel

_NEW = "b" * 64
_OLD = "a" * 64


@dataclass
class _Conn:
    """A connection whose models container holds ``stored`` (object name -> bytes)."""

    stored: dict[str, bytes] = field(default_factory=dict)
    authurl: str = "http://swift/auth/v1.0"
    user: str = "test:tester"

    def get_object(self, container: str, obj: str) -> tuple[dict[str, str], bytes]:
        if obj not in self.stored:
            raise ClientException("not found", http_status=404)
        return {}, self.stored[obj]

    def close(self) -> None:
        pass


def _run(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    conn: _Conn,
    *,
    uploaded: bool,
    random_seed: int | None = None,
) -> str:
    stored = StoredModel("alexnet", 10, "models", "alexnet.safetensors", _NEW, 1000, random_seed)
    monkeypatch.setattr(model_cmd, "connect", lambda args: conn)
    monkeypatch.setattr(hapi_client, "upload_model", lambda *a, **k: (stored, uploaded))
    assert main(["upload", "model", "--arch", "alexnet"]) == 0
    return capsys.readouterr().out


def test_a_first_upload_says_uploaded(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _run(monkeypatch, capsys, _Conn(), uploaded=True)
    assert "  uploaded in " in out and "replaced" not in out


def test_an_upload_over_another_model_says_it_replaced_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = _Conn({"alexnet.json": json.dumps({"sha256": _OLD}).encode()})
    out = _run(monkeypatch, capsys, conn, uploaded=True)
    assert f"  replaced the model stored before (its sha256 was {_OLD}) in " in out


def test_the_same_model_again_says_nothing_was_sent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    conn = _Conn({"alexnet.json": json.dumps({"sha256": _NEW}).encode()})
    out = _run(monkeypatch, capsys, conn, uploaded=False)
    assert "  already stored, nothing sent in " in out


def test_a_mistyped_timm_name_gets_a_timm_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 28, case 9: the suggestion kept its family ("resnet18" was suggested before).
    assert main(["upload", "model", "--arch", "timm/resnet18dd"]) == 2
    assert "did you mean 'timm/resnet18d'?" in capsys.readouterr().err


def test_random_weights_are_said_in_the_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 28, case 13: "alexnet, 10 classes, 0.0 MB" did not say the weights were random.
    out = _run(monkeypatch, capsys, _Conn(), uploaded=True, random_seed=0)
    assert "  weights RANDOM initialisation (seed 0), not pretrained\n" in out
    assert "RANDOM" not in _run(monkeypatch, capsys, _Conn(), uploaded=True)
