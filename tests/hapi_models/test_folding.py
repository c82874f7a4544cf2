"""Batch norms folded into the convolutions before them: the same features to float rounding,
the other tensors shared, and a fold that would change a layer's output never made."""

from __future__ import annotations

from typing import Any

import hapi_models
import pytest
import torch
from hapi_models import BatchNormFolder, fold_batch_norms, folded_parameter_bytes
from torch import nn

# Folding reorders a few float32 products per output; a wrong fold moves features by > 1e-2.
CLOSE: dict[str, Any] = {"rtol": 1e-4, "atol": 1e-4}


def _x(n: int = 2, size: int = 64) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def _norms(module: nn.Module) -> int:
    return sum(isinstance(m, nn.BatchNorm2d) for m in module.modules())


@pytest.mark.parametrize(
    ("arch", "split"),
    [("efficientnet_lite0", 9), ("resnet18", 6), ("mobilenet_v3_small", 8)],
)
def test_a_folded_head_gives_the_same_features_with_fewer_norms(arch: str, split: int) -> None:
    torch.manual_seed(0)
    model = hapi_models.get_model(arch, num_classes=10).eval()
    x = _x()
    with torch.inference_mode():
        folded = BatchNormFolder().layers(model.layers[:split], x)
        torch.testing.assert_close(folded(x), model.head(split)(x), **CLOSE)
    assert _norms(folded) < _norms(model.head(split))


def test_the_copy_shares_every_tensor_it_does_not_fold() -> None:
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))
    layer.eval()
    folded = fold_batch_norms(layer, _x(1))
    assert folded is not layer and _norms(folded) == 0
    assert folded[3].weight is layer[3].weight  # not followed by a norm: shared
    assert folded[0].weight is not layer[0].weight and layer[1].running_mean is not None
    with torch.no_grad():
        torch.testing.assert_close(folded(_x()), layer(_x()), **CLOSE)


class _ConvUsedTwice(nn.Module):
    """The convolution's output feeds the norm and, unnormalised, the sum."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.bn(y) + y


class _ChangedInPlace(nn.Module):
    """The convolution's output is changed in place before the norm reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y.mul_(-1)
        return self.bn(y)


def _trained_stats(module: nn.Module) -> nn.Module:
    """Non-trivial running statistics (a fresh norm's are the identity), then eval mode."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 2)
    return module.eval()


@pytest.mark.parametrize("cls", [_ConvUsedTwice, _ChangedInPlace])
def test_a_fold_that_would_change_the_output_is_not_made(cls: type[nn.Module]) -> None:
    torch.manual_seed(0)
    layer = _trained_stats(cls())
    assert fold_batch_norms(layer, _x(1)) is layer
    folder = BatchNormFolder()
    with torch.no_grad():
        run = folder.layers([layer], _x())
        assert run[0] is layer
        torch.testing.assert_close(run(_x()), layer(_x()), rtol=0, atol=0)


def test_norms_in_training_mode_are_not_folded() -> None:
    layer = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    assert fold_batch_norms(layer, _x(1)) is layer
    assert BatchNormFolder().layers([layer], _x())[0] is layer


def test_each_layer_is_folded_once_and_again_after_its_weights_change() -> None:
    torch.manual_seed(0)
    layer = _trained_stats(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    folder = BatchNormFolder()
    first = folder.layers([layer], _x())[0]
    assert folder.layers([layer], _x())[0] is first
    new_state = {k: v * 2 if k.endswith("weight") else v for k, v in layer.state_dict().items()}
    layer.load_state_dict(new_state)  # copies into the same tensors
    again = folder.layers([layer], _x())[0]
    assert again is not first
    with torch.no_grad():
        torch.testing.assert_close(again(_x()), layer(_x()), **CLOSE)


def test_an_unfolded_layer_is_not_kept_alive_by_the_folder() -> None:
    import gc
    import weakref

    folder = BatchNormFolder()
    layer = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    folder.layers([layer], _x())
    gone = weakref.ref(layer)
    del layer
    gc.collect()
    assert gone() is None


def test_a_fold_made_in_inference_mode_runs_with_grad_enabled() -> None:
    """A client's frozen layers run in its training step, where inference tensors are refused."""
    torch.manual_seed(0)
    layer = _trained_stats(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    folder = BatchNormFolder()
    with torch.inference_mode():
        folder.layers([layer], _x())
    x = _x().requires_grad_()
    folder.layers([layer], x)(x).sum().backward()
    assert x.grad is not None


def test_off_runs_the_layers_as_built() -> None:
    layer = _trained_stats(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    assert BatchNormFolder(enabled=False).layers([layer], _x())[0] is layer


def test_the_folded_bytes_are_the_folded_convolutions_on_the_meta_device() -> None:
    with torch.device("meta"):
        layers = [
            nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval(),
            nn.Sequential(nn.Conv2d(8, 4, 1), nn.ReLU()).eval(),
        ]
        x = torch.empty(1, 3, 16, 16)
    assert folded_parameter_bytes(layers, x) == (8 * 3 * 3 * 3 + 8) * 4


def test_a_convolution_layer_and_the_norm_layer_after_it_fold_together() -> None:
    """ResNet's stem: the convolution and its norm are layers of their own."""
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1)]
    _trained_stats(nn.Sequential(*layers))
    folder = BatchNormFolder()
    x = _x()
    with torch.no_grad():
        run = folder.layers(layers, x)
        torch.testing.assert_close(run(x), nn.Sequential(*layers)(x), **CLOSE)
    assert _norms(run) == 0 and not layers[1].training  # the layers' own modes are untouched
    assert folder.layers(layers, x)[0] is run[0]  # kept
    with torch.device("meta"):
        meta = [nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4).eval(), nn.ReLU()]
        assert folded_parameter_bytes(meta, torch.empty(1, 3, 8, 8)) == (4 * 3 * 3 * 3 + 4) * 4


def test_folds_made_while_other_threads_run_the_layers_leave_them_alone() -> None:
    """The first requests of a model arrive together: some fold the layers while others run
    them in inference mode. Seen on a server: hooks on the shared modules fired in the other
    requests' forwards (KeyError, 'Inference tensors do not track version counter')."""
    import threading

    torch.manual_seed(0)
    model = hapi_models.get_model("efficientnet_lite0", num_classes=10).eval()
    layers = list(model.layers[:9])
    folder = BatchNormFolder()
    errors: list[BaseException] = []
    heads: list[nn.Module] = []
    start = threading.Barrier(4)

    def fold() -> None:
        try:
            start.wait()
            with torch.inference_mode():
                heads.append(folder.layers(layers, _x(1)))
        except BaseException as exc:  # noqa: BLE001 - the thread's failure is the test's
            errors.append(exc)

    def run() -> None:
        try:
            start.wait()
            with torch.inference_mode():
                for _ in range(3):
                    nn.Sequential(*layers)(_x(1))
        except BaseException as exc:  # noqa: BLE001 - the thread's failure is the test's
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (fold, fold, run, run)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert all(a is b for a, b in zip(heads[0], heads[1], strict=True))  # folded once
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_hook_on_the_original_does_not_run_on_the_folded_copy() -> None:
    torch.manual_seed(0)
    layer = _trained_stats(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()))
    calls: list[int] = []
    layer[2].register_forward_hook(lambda *_: calls.append(1))
    folded = fold_batch_norms(layer, _x(1))
    assert folded is not layer
    calls.clear()
    with torch.no_grad():
        folded(_x())
    assert calls == []
