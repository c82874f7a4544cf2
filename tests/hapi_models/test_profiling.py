"""The profile's byte counts are those of the real tensors."""

from __future__ import annotations

import hapi_models as hm
import pytest
import torch


@pytest.mark.parametrize("name", ["alexnet", "resnet18", "efficientnet_lite0", "densenet121"])
def test_byte_counts_match_the_actual_tensors(name: str) -> None:
    model = hm.get_model(name, num_classes=10)
    prof = hm.profile(model, (3, 64, 64))
    assert len(prof.layers) == model.num_layers
    x = torch.randn(3, 3, 64, 64)
    with torch.inference_mode():
        for split in range(1, model.num_layers + 1):
            out = model.head(split)(x)
            layer = prof.layers[split - 1]
            assert layer.output_bytes_per_sample * 3 == out.numel() * out.element_size()
            assert layer.output_shape == tuple(out.shape[1:])
            assert prof.output_bytes(split) == layer.output_bytes_per_sample
            assert layer.activation_bytes_per_sample >= layer.output_bytes_per_sample
    assert prof.output_bytes(0) == prof.input_bytes_per_sample == 3 * 64 * 64 * 4
    assert prof.weight_bytes == sum(p.numel() * 4 for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )


def test_meta_and_real_passes_agree() -> None:
    model = hm.get_model("resnet18", num_classes=10)
    meta = hm.profile(model, (3, 96, 96))
    real = hm.profile(model, (3, 96, 96), device="cpu")
    assert meta.layers == real.layers
    assert model.training is False


def test_alexnet_output_bytes_at_224() -> None:
    prof = hm.profile(hm.get_model("alexnet", num_classes=1000))
    # conv1 output 64x55x55 floats; the avgpool layer flattens 256x6x6.
    assert prof.layers[0].output_bytes_per_sample == 64 * 55 * 55 * 4
    assert prof.layers[13].output_shape == (256 * 6 * 6,)
    assert prof.layers[-1].output_bytes_per_sample == 1000 * 4


def test_bad_input_shape() -> None:
    with pytest.raises(ValueError, match="input_shape"):
        hm.profile(hm.get_model("alexnet", num_classes=2), (3, 0, 5))  # type: ignore[arg-type]


class _Attention(torch.nn.Module):
    """Self-attention written with functional ops only: no leaf module for a hook to see."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.flatten(2).transpose(1, 2)  # a view: [1, 16, C]
        scores = tokens @ tokens.transpose(1, 2)  # [1, 16, 16]
        return (scores.softmax(-1) @ tokens).transpose(1, 2).reshape(x.shape)  # reshape copies


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_functional_computation_counts_every_tensor_alive_at_once(device: str) -> None:
    model = hm.SplittableModel(
        "toy",
        [("attn", _Attention())],
        default_freeze_index=0,
        transform=hm.InputTransform(resize=4, crop=4),
        num_classes=1,
    )
    layer = hm.profile(model, (8, 4, 4), device=device).layers[0]
    x, scores = 8 * 16 * 4, 16 * 16 * 4
    # At softmax@tokens: the input, the scores, their softmax and the product are alive; the
    # old leaf-hook figure saw only the input and the output (2 * x).
    assert layer.activation_bytes_per_sample == x + 2 * scores + x
    assert layer.output_bytes_per_sample == x


@pytest.mark.parametrize(("arch", "split"), [("vit_b_16", 6), ("swin_t", 4)])
def test_transformer_blocks_count_their_attention(arch: str, split: int) -> None:
    """Measured on the CPU (batch 8, every tensor mmapped, steady state): an encoder block of
    vit_b_16 peaks at 4.87 MB per sample and swin_t's first block at 12.7 MB; module hooks see
    1.8 MB and 3.6 MB, this profile 4.84 MB and 12.7 MB."""
    with torch.device("meta"):
        model = hm.get_spec(arch).builder(10, False)
    prof = hm.profile(model)
    assert prof.head_activation_bytes_per_sample(split) > 4.5e6
    assert prof.seconds < 5


def test_an_input_size_the_network_cannot_take_is_a_named_refusal() -> None:
    # DeiT's position embedding fixes its input at 224 pixels: at 64 the profile used to raise
    # torch's "Attempting to broadcast ... 197" RuntimeError, which the client showed as an
    # unexpected crash; the server words the same refusal as a 422 from this error.
    model = hm.get_model("timm/deit_tiny_patch16_224", num_classes=3)
    with pytest.raises(hm.InputSizeError, match=r"cannot run on 64x64 inputs .*crops 224x224"):
        hm.profile(model, (3, 64, 64))
