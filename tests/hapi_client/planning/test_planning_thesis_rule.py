"""The thesis' split rule (Algorithm 2, readings R1 and R2 of docs/references.md) on real profiles (thesis Table 5.3 and Figure 5.12 in direction)."""

from __future__ import annotations

import hapi_models
import pytest

from hapi_client import ConfigurationError
from hapi_client.planning import choose_split_index

MBIT = 1e6 / 8
JPEG = 110_000  # ImageNet-sized stored JPEG, bytes per sample


@pytest.fixture(scope="module")
def alexnet_profile() -> hapi_models.ModelProfile:
    return hapi_models.profile(hapi_models.get_model("alexnet", num_classes=1000))


def test_alexnet_follows_table_5_3(alexnet_profile: hapi_models.ModelProfile) -> None:
    splits = [
        choose_split_index(alexnet_profile, JPEG, 1000, mbit * MBIT, 17).split_index
        for mbit in (50, 100, 500, 1000, 5000, 15000)
    ]
    outs = [layer.output_bytes_per_sample for layer in alexnet_profile.layers]
    # Limited bandwidth: where the least is shipped (split 16, the earlier of the two 16 KB
    # outputs up to the freeze index), not the freeze index Algorithm 2 falls back to.
    assert splits[0] == 16 and outs[15] == min(outs[:17]) < outs[14]
    assert all(s <= 17 for s in splits)
    assert splits == sorted(splits, reverse=True)  # earlier splits as bandwidth grows
    assert splits[-1] < 17


def test_larger_batch_never_moves_the_split_earlier(
    alexnet_profile: hapi_models.ModelProfile,
) -> None:
    for mbit in (100, 1000, 10000):
        splits = [
            choose_split_index(alexnet_profile, JPEG, b, mbit * MBIT, 17).split_index
            for b in (100, 500, 1000, 2000, 4000, 8000)
        ]
        assert splits == sorted(splits), (mbit, splits)


def test_earliest_candidate_below_budget(alexnet_profile: hapi_models.ModelProfile) -> None:
    d = choose_split_index(alexnet_profile, JPEG, 100, 1e12, 17)
    outs = [layer.output_bytes_per_sample for layer in alexnet_profile.layers]
    first = next(s for s in range(1, 18) if outs[s - 1] < JPEG)
    assert d.split_index == first
    assert d.output_bytes_per_batch == outs[first - 1] * 100


def test_fallback_ships_the_least_not_the_freeze_index() -> None:
    """The issue's case: ResNet18-like sizes where the freeze layer ships more than an earlier one."""
    prof = hapi_models.profile(hapi_models.get_model("efficientnet_lite0", num_classes=10))
    outs = [layer.output_bytes_per_sample for layer in prof.layers]
    freeze = 13
    d = choose_split_index(prof, 10 * max(outs), 50, 1.0, freeze)  # 1 byte/s: nothing fits
    best = min(range(1, freeze + 1), key=lambda s: (outs[s - 1], s))
    assert d.split_index == best and outs[best - 1] < outs[freeze - 1]
    assert d.output_bytes_per_batch == outs[best - 1] * 50 and "least is shipped" in d.reason


def test_tiny_stored_images_push_nothing_down() -> None:
    """Fashion-MNIST's PNGs (~300 B) are smaller than any layer output: split 0."""
    prof = hapi_models.profile(hapi_models.get_model("efficientnet_lite0", num_classes=10))
    d = choose_split_index(prof, 300, 64, 100 * MBIT, 18)
    assert d.split_index == 0 and "split 0" in d.reason


def test_wire_dtype_halves_sizes(alexnet_profile: hapi_models.ModelProfile) -> None:
    f32 = choose_split_index(alexnet_profile, JPEG, 1000, 1000 * MBIT, 17)
    f16 = choose_split_index(alexnet_profile, JPEG, 1000, 1000 * MBIT, 17, wire_bytes_per_element=2)
    assert f16.split_index <= f32.split_index


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"freeze_index": 30}, "freeze"),
        ({"batch_size": 0}, "batch"),
        ({"bandwidth_bytes_per_s": 0}, "bandwidth"),
    ],
)
def test_bad_arguments(
    alexnet_profile: hapi_models.ModelProfile, kwargs: dict[str, float], match: str
) -> None:
    args = {
        "input_bytes_per_sample": JPEG,
        "batch_size": 10,
        "bandwidth_bytes_per_s": 1e6,
        "freeze_index": 17,
    }
    args.update(kwargs)
    with pytest.raises(ConfigurationError, match=match):
        choose_split_index(alexnet_profile, **args)  # type: ignore[arg-type]
