"""``hapi upload model --weights FILE`` refuses a file that is no checkpoint: exit 2, one line.

The file is checked before the command connects to Swift, so no stack is needed here: a file
that passed would fail next on the connection (an unreachable auth URL), not on the checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hapi_cli.main import main

# Nothing listens here: a file that passed the check would fail on connecting instead.
_NO_SWIFT = ["--auth-url", "http://127.0.0.1:9/auth/v1.0", "--retries", "0", "--timeout", "2"]


def _upload(weights: Path | str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["upload", "model", "--arch", "resnet18", "--weights", str(weights), *_NO_SWIFT])
    return code, capsys.readouterr().err


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_a_text_file_named_pth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "resnet18.pth"
    path.write_text("hello world\n")
    code, err = _upload(path, capsys)
    assert code == 2
    assert _one_line(err) == (
        f"hapi: error: {path}: not a PyTorch or safetensors checkpoint: found text 'hello world\\n'"
    )


def test_a_fake_safetensors_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "resnet18.safetensors"
    path.write_bytes(b"PNG? no, just bytes: " + bytes(range(256)))
    code, err = _upload(path, capsys)
    assert code == 2
    assert f"{path}: not a PyTorch or safetensors checkpoint: found binary" in _one_line(err)


def test_a_safetensors_header_declaring_2_gib(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "resnet18.safetensors"
    path.write_bytes((2 * 2**30).to_bytes(8, "little") + b'{"a": 1}')
    code, err = _upload(path, capsys)
    assert code == 2
    assert "a safetensors header declaring 2147483648 bytes of JSON" in _one_line(err)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_dev_zero_a_fifo_and_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "pipe.pth"
    os.mkfifo(fifo)
    for path, found in [
        ("/dev/zero", "a character device"),
        (fifo, "a FIFO"),
        (tmp_path, "a directory"),
    ]:
        code, err = _upload(path, capsys)
        assert code == 2
        assert _one_line(err) == (
            f"hapi: error: {path}: not a PyTorch or safetensors checkpoint: found {found}, "
            "not a regular file"
        )


def test_a_real_checkpoint_passes_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    path = tmp_path / "ok.pth"
    torch.save({"fc.weight": torch.zeros(2, 2)}, path)
    code, err = _upload(path, capsys)
    assert code == 2  # the connection fails, not the file
    assert "checkpoint" not in _one_line(err) and "127.0.0.1:9" in err
