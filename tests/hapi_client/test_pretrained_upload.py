"""A user's torchvision checkpoint: `hapi upload model --weights FILE`, then fine-tuning on it."""

from __future__ import annotations

from pathlib import Path

import hapi_models
import pytest
import torch
from torchvision import models as tvm

from hapi_cli.main import main as hapi
from hapi_client import SwiftSession, download_model, resolve_model
from hapi_client.options import ExtractOptions, TrainOptions

from .conftest import ClientEnv

SMALL = hapi_models.InputTransform(resize=64, crop=64, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _upload(env: ClientEnv, *args: str) -> int:
    stack = env.stack
    return hapi(
        [
            "upload",
            "model",
            "--auth-url",
            stack.auth_url,
            "--user",
            stack.admin_user,
            "--key",
            stack.admin_key,
            "--container",
            "pretrained",
            *args,
        ]
    )


def test_torchvision_checkpoint_uploads_loads_and_finetunes(
    client_env: ClientEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(11)
    native = tvm.resnet18()  # what torchvision's resnet18-f37072fd.pth holds: 1000 classes
    path = tmp_path / "resnet18-f37072fd.pth"
    torch.save(native.state_dict(), path)
    assert _upload(client_env, "--arch", "resnet18", "--weights", str(path)) == 0
    out = capsys.readouterr().out
    assert "model pretrained/resnet18: resnet18, 1000 classes" in out
    swift = SwiftSession(client_env.credentials)
    model = download_model(swift, resolve_model(swift, "pretrained/resnet18"))
    x = torch.randn(2, 3, 64, 64)
    with torch.inference_mode():
        torch.testing.assert_close(model(x), native.eval()(x), rtol=1e-5, atol=1e-5)

    with client_env.client() as client:
        result = client.finetune(
            model="pretrained/resnet18",
            container=client_env.train,
            train=TrainOptions(batch_size=8, lr=0.01, momentum=0.9, seed=3),
            mode="hapi",
            extract=ExtractOptions(split="freeze"),
            transform=SMALL,
            progress=False,
        )
    assert result.history[0].split_index == 11
    # Frozen layers keep the checkpoint's weights; the classifier is the dataset's.
    trained = result.model.state_dict()
    for key, value in model.state_dict().items():
        if key.startswith("layers.4."):  # layer1.0, frozen
            torch.testing.assert_close(trained[key], value, rtol=0, atol=0)
    with client_env.client() as client:
        assert result.model.num_classes == len(client.manifest(client_env.train).classes) < 1000


def test_a_checkpoint_that_does_not_fit_is_refused_before_upload(
    client_env: ClientEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "alexnet.pth"
    torch.save(tvm.alexnet().state_dict(), path)
    assert _upload(client_env, "--arch", "resnet18", "--weights", str(path)) == 2
    assert "does not fit resnet18" in capsys.readouterr().err
