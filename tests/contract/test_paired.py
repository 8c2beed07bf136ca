"""Paired rounds: the interval of the per-round ratios and when the agent may stop timing the finalists."""
from __future__ import annotations

import pytest

from kiln_contract.paired import MIN_ROUNDS, RESOLUTION, median_interval, separation, stop_reason

DRIFT = [1.0, 1.6, 0.9, 1.3, 2.0, 1.1, 0.95, 1.7, 1.2, 1.4, 0.8, 1.05]


def test_the_median_interval_uses_order_statistics_and_the_extremes_when_there_are_few():
    assert median_interval([1.0, 2.0, 3.0]) == (2.0, 1.0, 3.0)
    median, low, high = median_interval([float(v) for v in range(1, 21)])
    assert median == 10.5 and (low, high) == (6.0, 15.0)


def test_a_leader_faster_in_every_round_separates_after_the_minimum_rounds_however_the_rounds_swing():
    rounds = [[10.0 * d for d in DRIFT[:MIN_ROUNDS]], [11.0 * d for d in DRIFT[:MIN_ROUNDS]], [15.0 * d for d in DRIFT[:MIN_ROUNDS]]]
    state = separation(rounds)
    assert state.leader == 0 and state.separated
    assert state.rivals[1] == pytest.approx((1.1, 1.1 / (1 + RESOLUTION), 1.1 * (1 + RESOLUTION)))
    assert stop_reason(rounds, max_rounds=30) == "separated"
    assert stop_reason([values[:MIN_ROUNDS - 1] for values in rounds], max_rounds=30) is None  # too few rounds to say


def test_a_rival_that_straddles_the_leader_keeps_the_rounds_going_until_the_cap():
    noise = [1.06, 0.95, 1.04, 0.97, 1.07, 0.96, 1.03, 0.94, 1.05, 0.98, 1.06, 0.95]
    rounds = [[10.0 * d for d in DRIFT], [10.0 * d * n for d, n in zip(DRIFT, noise)]]
    assert not separation(rounds).separated and not separation(rounds).settled
    assert stop_reason([values[:8] for values in rounds], max_rounds=30) is None
    assert stop_reason([values[:8] for values in rounds], max_rounds=8) == "cap"


def test_a_gap_smaller_than_the_timing_resolution_is_a_tie_however_steady():
    rounds = [[10.0 * d for d in DRIFT], [10.1 * d for d in DRIFT]]  # 1% slower in every round
    state = separation(rounds)
    assert not state.separated and state.settled
    assert stop_reason(rounds, max_rounds=30) == "tie settled"


def test_a_tie_within_two_percent_is_settled_without_waiting_for_the_cap():
    noise = [1.005, 0.995, 1.004, 0.997, 1.003, 0.996, 1.002, 0.998]
    rounds = [[10.0 * d for d in DRIFT[:8]], [10.0 * d * n for d, n in zip(DRIFT, noise)]]
    assert stop_reason(rounds, max_rounds=30) == "tie settled"


def test_finalists_need_the_same_rounds():
    with pytest.raises(ValueError, match="same number of rounds"):
        separation([[1.0, 2.0], [1.0]])
