"""The roofline scenario's in-process parts: the stages it times and the features' difference."""

from __future__ import annotations

from pathlib import Path

import pytest
from hapi_bench import ResultSet, write_report
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
        "head_new_s",
        "head_new_chunk",
        "head_new_last",
    }
    assert all(0 < v < 60 for k, v in stages.items() if k.endswith("_s"))


def test_the_demo_photos_give_the_same_features_on_both_decode_paths(photos: list[bytes]) -> None:
    # 500x375 photos are under twice the resize: libjpeg-turbo decodes them whole, as PIL does.
    assert roofline.feature_difference(photos) < 1e-6


def test_the_scenario_is_in_make_bench() -> None:
    assert "roofline" in ORDER and SCENARIOS["roofline"].testbed


def test_the_report_gives_both_paths_and_the_goals_ratios(tmp_path: Path) -> None:
    results = ResultSet.start(
        "roofline",
        testbed={"cores_note": "client on core(s) 0, Swift + HAPI server on core(s) 1"},
        quick=True,
        arch="efficientnet_lite0",
        split=9,
        batch=32,
        rounds=2,
        server_cores=[1],
        goals=roofline.GOALS,
        new_over_old=1.38,
        roofline_ratio=0.83,
        feature_relative_difference=0.0,
        feature_relative_difference_large=0.049,
    )
    for path, rate, roof in (("new", 21.2, 25.6), ("old", 15.3, 15.1)):
        results.add(
            {
                "path": path,
                "server_images_per_s": rate,
                "decode_ceiling_images_per_s": 549.0,
                "head_ceiling_images_per_s": 26.8,
                "read_images_per_s": 1388.0,
                "roofline_images_per_s": roof,
                "roofline_ratio": rate / roof,
            }
        )
    results.write(tmp_path)
    text = write_report(tmp_path, tmp_path / "results.md").read_text()
    section = text[text.index("## The server at its roofline (issue 30)") :]
    assert "`hapi bench roofline --quick`: efficientnet_lite0 to split 9" in section
    assert "| new | 21.2 | 549 | 26.8 | 1388 | 25.6 | 0.83 |" in section
    assert "| old | 15.3 | 549 | 26.8 | 1388 | 15.1 | 1.01 |" in section
    assert "**1.38x** the images per second on the server (goal >= 2.0x)" in section
    assert "end to end / roofline **0.83** at worst (goal >= 0.9 for each head)" in section
