"""The split by predicted time (``hapi_client.planning.time_rule``) on made-up costs: pure arithmetic."""

from __future__ import annotations

import re

import pytest

from hapi_client import ConfigurationError
from hapi_client.planning import (
    ClientCosts,
    JobShape,
    ServerCosts,
    choose_split_by_time,
    predict_stage_times,
)

MBIT = 1e6 / 8

# Four frozen layers: the second one shrinks the features below the stored bytes.
SERVER = ServerCosts(
    decode_s=0.002,
    layer_s=[0.001, 0.004, 0.001, 0.001],
    encode_s=[0.0001] * 4,
    wire_bytes=[400_000.0, 30_000.0, 20_000.0, 60_000.0],
)
CLIENT = ClientCosts(
    decode_s=0.002, layer_s=[0.001, 0.004, 0.001, 0.001], train_s=0.001, step_s=0.01
)
STORED = 100_000.0


def test_stages_follow_their_definitions() -> None:
    times = predict_stage_times(SERVER, CLIENT, STORED, 10, 10 * MBIT, 4)
    assert [t.split for t in times] == [0, 1, 2, 3, 4]
    raw, two = times[0], times[2]
    assert raw.server_s == 0.0
    assert raw.wire_bytes == STORED * 10
    assert raw.wire_s == pytest.approx(STORED * 10 / (10 * MBIT))
    assert raw.client_s == pytest.approx((0.002 + 0.007) * 10 + 0.001 * 10 + 0.01)
    assert two.server_s == pytest.approx((0.002 + 0.005 + 0.0001) * 10)
    assert two.client_s == pytest.approx(0.002 * 10 + 0.001 * 10 + 0.01)
    assert two.iteration_s == max(two.server_s, two.wire_s, two.client_s)


def test_load_shares_the_server() -> None:
    alone = predict_stage_times(SERVER, CLIENT, STORED, 10, 10 * MBIT, 4)
    shared = predict_stage_times(
        ServerCosts(SERVER.decode_s, SERVER.layer_s, SERVER.encode_s, SERVER.wire_bytes, load=2),
        CLIENT,
        STORED,
        10,
        10 * MBIT,
        4,
    )
    for a, b in zip(alone[1:], shared[1:], strict=True):
        assert b.server_s == pytest.approx(3 * a.server_s)


def test_narrow_link_ships_least_and_wide_link_balances_compute() -> None:
    narrow = choose_split_by_time(SERVER, CLIENT, STORED, 10, 1 * MBIT, 4)
    assert narrow.split_index == 3  # the fewest bytes: the wire is the slowest stage
    assert narrow.rule == "time"
    wide = choose_split_by_time(SERVER, CLIENT, STORED, 10, 10_000 * MBIT, 4)
    times = {t.split: t.iteration_s for t in wide.predictions}
    assert times[wide.split_index] <= min(times.values()) * 1.02
    assert "runner-up" in wide.reason and "predicted fastest" in wide.reason


def test_winner_is_the_fastest_prediction_at_every_rate() -> None:
    for mbit in (0.5, 2, 5, 20, 100, 1000, 10_000):
        decision = choose_split_by_time(SERVER, CLIENT, STORED, 10, mbit * MBIT, 4)
        best = min(t.iteration_s for t in decision.predictions)
        chosen = decision.predictions[decision.split_index]
        assert chosen.iteration_s <= best * 1.02
        near = [t for t in decision.predictions if t.iteration_s <= best * 1.02]
        assert chosen.wire_bytes == min(t.wire_bytes for t in near)


def test_costs_must_cover_the_freeze_index() -> None:
    with pytest.raises(ConfigurationError, match="freeze index 5"):
        predict_stage_times(SERVER, CLIENT, STORED, 10, MBIT, 5)
    with pytest.raises(ConfigurationError, match="bandwidth"):
        predict_stage_times(SERVER, CLIENT, STORED, 10, 0.0, 4)


def test_a_short_epoch_weighs_the_fill_of_the_pipeline() -> None:
    """Split 2 is faster per iteration, split 1 gets its first batch through sooner: over a
    long epoch (or the steady state) split 2 wins, over a one-iteration epoch split 1."""
    server = ServerCosts(
        decode_s=0.0,
        layer_s=[0.0, 0.05],
        encode_s=[0.0, 0.0],
        wire_bytes=[100_000.0, 50_000.0],
    )
    client = ClientCosts(decode_s=0.0, layer_s=[0.0, 0.0], train_s=0.05, step_s=0.0)
    # Batches of 10 at 10 Mbit/s: split 1 ships 1 MB (0.8 s) and computes nothing on the
    # server; split 2 ships 0.5 MB (0.4 s) after 0.5 s on the server; the client takes 0.5 s.
    times = {t.split: t for t in predict_stage_times(server, client, 1e6, 10, 10 * MBIT, 2)}
    assert times[1].iteration_s == pytest.approx(0.8)
    assert times[2].iteration_s == pytest.approx(0.5)
    assert times[1].epoch_s(1) == pytest.approx(0.8 + 0.5)
    assert times[2].epoch_s(1) == pytest.approx(0.5 + 0.4 + 0.5)
    one = choose_split_by_time(server, client, 1e6, 10, 10 * MBIT, 2, iterations=1)
    many = choose_split_by_time(server, client, 1e6, 10, 10 * MBIT, 2, iterations=100)
    steady = choose_split_by_time(server, client, 1e6, 10, 10 * MBIT, 2)
    assert (one.split_index, many.split_index, steady.split_index) == (1, 2, 2)
    assert "over an epoch of 1 iterations" in one.reason
    with pytest.raises(ConfigurationError, match="at least one iteration"):
        choose_split_by_time(server, client, 1e6, 10, 10 * MBIT, 2, iterations=0)


# Split 1 leaves the client the heavy layer, split 2 puts it on the slower server: over one
# epoch split 1 is faster, but a cached epoch runs only the client's part, where split 2 is light.
JOB_SERVER = ServerCosts(
    decode_s=0.0, layer_s=[0.0, 0.1], encode_s=[0.0, 0.0], wire_bytes=[1e3, 1e3]
)
JOB_CLIENT = ClientCosts(decode_s=0.0, layer_s=[0.0, 0.05], train_s=0.01, step_s=0.0)
WIDE = 10_000 * MBIT


def _job(epochs: int, cached: bool, planning_s: float = 0.0) -> JobShape:
    return JobShape(iterations=10, epochs=epochs, cached=cached, planning_s=planning_s)


def test_a_cached_multi_epoch_job_can_choose_another_split_than_one_epoch() -> None:
    one = choose_split_by_time(JOB_SERVER, JOB_CLIENT, 2e3, 10, WIDE, 2, job=_job(1, True))
    cached = choose_split_by_time(JOB_SERVER, JOB_CLIENT, 2e3, 10, WIDE, 2, job=_job(5, True))
    assert (one.split_index, cached.split_index) == (1, 2)
    times = {t.split: t for t in cached.predictions}
    # The first epoch through the pipeline, four more on cached features (the client's part).
    assert times[2].job_s(_job(5, True)) == pytest.approx(times[2].epoch_s(10) + 4 * 10 * 0.1)
    # Split 0 is never cached: raw shards are read and decoded every epoch.
    assert times[0].job_s(_job(5, True)) == pytest.approx(5 * times[0].epoch_s(10))
    assert "features cached after the first" in cached.reason
    assert cached.job == _job(5, True)


def test_the_split_whose_features_are_cached_pays_only_cached_epochs() -> None:
    # One epoch left: from scratch split 1 is faster, but split 2's features are in the cache.
    fresh = choose_split_by_time(JOB_SERVER, JOB_CLIENT, 2e3, 10, WIDE, 2, job=_job(1, True))
    held = JobShape(iterations=10, epochs=1, cached=True, cached_split=2)
    kept = choose_split_by_time(JOB_SERVER, JOB_CLIENT, 2e3, 10, WIDE, 2, job=held)
    assert (fresh.split_index, kept.split_index) == (1, 2)
    times = {t.split: t for t in kept.predictions}
    assert times[2].job_s(held) == pytest.approx(times[2].cached_epoch_s(10))
    assert times[1].job_s(held) == pytest.approx(times[1].epoch_s(10))
    assert "split 2's features in the cache" in kept.reason
    # Split 0 is never cached, whatever the job says.
    raw = JobShape(iterations=10, epochs=2, cached=True, cached_split=0)
    assert times[0].job_s(raw) == pytest.approx(2 * times[0].epoch_s(10))


def test_an_uncached_job_is_its_epochs_times_one_epoch_plus_planning() -> None:
    uncached = choose_split_by_time(
        JOB_SERVER, JOB_CLIENT, 2e3, 10, WIDE, 2, job=_job(5, False, planning_s=3.0)
    )
    one = choose_split_by_time(JOB_SERVER, JOB_CLIENT, 2e3, 10, WIDE, 2, job=_job(1, False))
    assert uncached.split_index == one.split_index == 1
    for t in uncached.predictions:
        assert t.job_s(_job(5, False, 3.0)) == pytest.approx(3.0 + 5 * t.epoch_s(10))
    assert "no feature cache" in uncached.reason


def test_baseline_and_the_freeze_index_are_always_candidates() -> None:
    for job in (_job(1, False), _job(7, True)):
        decision = choose_split_by_time(JOB_SERVER, JOB_CLIENT, 2e3, 10, WIDE, 2, job=job)
        assert {0, 2} <= set(decision.candidates)
        assert {0, 2} <= {t.split for t in decision.predictions}


def _figures(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"split \d+: (\d+\.\d+) s", text)]


def test_the_explanation_prints_the_figures_it_ranked() -> None:
    job = _job(5, True)
    decision = choose_split_by_time(JOB_SERVER, JOB_CLIENT, 2e3, 10, WIDE, 2, job=job)
    times = {t.split: t for t in decision.predictions}
    winner, runner = _figures(decision.reason)[:2]
    assert winner == pytest.approx(times[2].job_s(job), abs=0.01)
    assert "s for the job" in decision.reason and "per iteration (" not in decision.reason
    assert winner <= runner
    epoch = choose_split_by_time(JOB_SERVER, JOB_CLIENT, 2e3, 10, WIDE, 2, iterations=10)
    assert _figures(epoch.reason)[0] == pytest.approx(times[1].epoch_s(10), abs=0.01)
    assert "s per epoch" in epoch.reason


def test_the_tie_rule_is_stated_as_applied() -> None:
    """Split 2 is 1 % faster per epoch but ships twice the bytes of split 1: within the
    tolerance, the one shipping fewer bytes wins, and the text says which was faster and why."""
    server = ServerCosts(
        decode_s=0.0, layer_s=[0.0, 0.0], encode_s=[0.0, 0.0], wire_bytes=[1e3, 2e3]
    )
    client = ClientCosts(decode_s=1.0, layer_s=[0.0, 0.0051], train_s=0.01, step_s=0.0)
    # One iteration of 10: split 1's wire 0.05 s (10 kB at 0.2 MB/s) and client 0.151 s, split
    # 2's wire 0.1 s and client 0.1 s: an epoch of one iteration is 0.201 s against 0.2 s.
    d = choose_split_by_time(server, client, 1e5, 10, 200_000.0, 2, iterations=1)
    assert d.split_index == 1
    assert "runner-up split 2: 0.200 s per epoch" in d.reason
    assert "predicted 0.5% faster" in d.reason
    assert "the one shipping fewer bytes wins" in d.reason
    assert "100% more bytes (0.020 MB against 0.010 MB" in d.reason


def test_bytes_within_a_percent_are_the_same_and_the_faster_wins() -> None:
    """The demo's splits 8 and 9 shipped 1.23 MB each, a few hundred bytes apart: the slower one
    won "on fewer bytes" (issue 31). Within 1 % of each other the bytes are the same."""
    server = ServerCosts(
        decode_s=0.0, layer_s=[0.0, 0.0], encode_s=[0.0, 0.0], wire_bytes=[1e3, 1.005e3]
    )
    client = ClientCosts(decode_s=1.0, layer_s=[0.0, 0.0051], train_s=0.01, step_s=0.0)
    d = choose_split_by_time(server, client, 1e5, 10, 200_000.0, 2, iterations=1)
    times = {t.split: t for t in d.predictions}
    assert times[2].epoch_s(1) < times[1].epoch_s(1)
    assert d.split_index == 2 and "fewer bytes" not in d.reason


def test_planning_every_split_shares_does_not_widen_the_tie_band() -> None:
    """Split 2 is 10 % faster per epoch and ships more bytes: beyond the tie band, so it wins
    however long planning took. Planning counted in the band's base (10 s against an epoch
    of 0.2 s) made the two look within 2 % of each other and gave the slower split."""
    server = ServerCosts(
        decode_s=0.0, layer_s=[0.0, 0.0], encode_s=[0.0, 0.0], wire_bytes=[1e3, 2e3]
    )
    # An epoch of one iteration: split 1 0.22 s (wire 0.05 s, client 0.17 s), split 2 0.2 s.
    client = ClientCosts(decode_s=1.0, layer_s=[0.0, 0.007], train_s=0.01, step_s=0.0)
    job = JobShape(iterations=1, planning_s=10.0)
    d = choose_split_by_time(server, client, 1e5, 10, 200_000.0, 2, job=job)
    times = {t.split: t for t in d.predictions}
    assert times[2].epoch_s(1) < times[1].epoch_s(1) / 1.02
    assert d.split_index == 2
    # Within the band, planning aside: bytes decide, and the text says what the band applied to.
    close = ClientCosts(decode_s=1.0, layer_s=[0.0, 0.0051], train_s=0.01, step_s=0.0)
    tie = choose_split_by_time(server, close, 1e5, 10, 200_000.0, 2, job=job)
    assert tie.split_index == 1
    assert "predicted 0.5% faster (planning aside, which every split shares)" in tie.reason


def test_fewer_bytes_is_never_claimed_between_equal_bytes() -> None:
    """Splits 1 and 2 ship the same bytes and are within 2 %: the faster one wins, and the text
    does not say that bytes decided."""
    server = ServerCosts(
        decode_s=0.0, layer_s=[0.0, 0.0], encode_s=[0.0, 0.0], wire_bytes=[1e3, 1e3]
    )
    client = ClientCosts(decode_s=1.0, layer_s=[0.0, 0.0001], train_s=0.01, step_s=0.0)
    d = choose_split_by_time(server, client, 1e5, 10, WIDE, 2, iterations=10)
    assert d.split_index == 2  # 0.1 s per iteration against 0.101 s
    assert "fewer bytes" not in d.reason
    assert "runner-up split 1" in d.reason


def test_folder_image_reads_floor_whoever_reads_them() -> None:
    """A folder dataset's per-image reads bound the client's wire stage at split 0 and the
    server's stage at every other split, whatever the link."""
    times = predict_stage_times(SERVER, CLIENT, STORED, 10, 10_000 * MBIT, 4, 0.05)
    assert times[0].wire_s == pytest.approx(0.5)
    assert all(t.server_s >= 0.5 for t in times[1:])
    with pytest.raises(ConfigurationError, match="read time"):
        predict_stage_times(SERVER, CLIENT, STORED, 10, MBIT, 4, -1.0)


def test_a_job_needs_an_epoch_and_an_iteration() -> None:
    with pytest.raises(ConfigurationError, match="at least one epoch"):
        JobShape(iterations=3, epochs=0)
    with pytest.raises(ConfigurationError, match="at least one iteration"):
        JobShape(iterations=0)
