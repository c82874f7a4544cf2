"""The roofline scenario's in-process parts: the stages it times and the features' difference."""

from __future__ import annotations

import pytest
from hapi_bench import scenario_roofline as roofline
from hapi_bench.scenarios import ORDER, SCENARIOS


@pytest.fixture(scope="module")
def photos() -> list[bytes]:
    return roofline._photos(1)[:2]


def test_the_stages_are_timed_per_image_for_both_paths(photos: list[bytes]) -> None:
    stages = roofline.measure_stages(photos, batch=2, repeats=1)
    assert set(stages) == {
        "decode_fast_s",
        "decode_pil_s",
        "head_contiguous_s",
        "head_channels_last_s",
    }
    assert all(0 < seconds < 60 for seconds in stages.values())


def test_the_demo_photos_give_the_same_features_on_both_decode_paths(photos: list[bytes]) -> None:
    # 500x375 photos are under twice the resize: libjpeg-turbo decodes them whole, as PIL does.
    assert roofline.feature_difference(photos) < 1e-6


def test_the_scenario_is_in_make_bench() -> None:
    assert "roofline" in ORDER and SCENARIOS["roofline"].testbed
