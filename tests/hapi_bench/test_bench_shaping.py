"""The link shaping helper measures the rate it was set to (within 10 %) on a short transfer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hapi_bench import TOLERANCE, ByteSource, ThrottleLink, measure_rate, run_job, shaping_support


def test_token_bucket_link_holds_its_rate_on_a_short_transfer() -> None:
    link = ThrottleLink()
    link.set_rate(80.0)
    source = ByteSource("127.0.0.1")
    try:
        nbytes, seconds = measure_rate(source.address, seconds=1.0, consume=link.bucket.consume)
    finally:
        source.close()
    measured = nbytes * 8 / seconds / 1e6
    assert abs(measured - 80.0) / 80.0 <= TOLERANCE, measured


@pytest.mark.slow
def test_tc_link_between_namespaces_holds_its_rate(tmp_path: Path) -> None:
    reason = shaping_support()
    if reason is not None:
        pytest.skip(f"tc shaping in network namespaces is not available here: {reason}")
    out = tmp_path / "checks.json"
    code = run_job("hapi_bench.testbed:link_check_job",
                   {"rates": [100.0, 400.0], "out": str(out), "seconds": 1.0}, tmp_path / "state", shaping=True)
    assert code == 0
    data = json.loads(out.read_text())
    assert data["testbed"]["link"] == "netns"
    for check in data["checks"]:
        assert not check["flagged"], check
        assert abs(check["measured_mbit"] - check["target_mbit"]) / check["target_mbit"] <= TOLERANCE
