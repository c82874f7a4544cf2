"""The split by predicted time (``hapi_client.planning.time_rule``) on made-up costs: pure arithmetic."""

from __future__ import annotations

import pytest

from hapi_client import ConfigurationError
from hapi_client.planning import (
    ClientCosts,
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
