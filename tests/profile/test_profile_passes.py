"""A profile measured in several launches is the profile of all their passes (the demo spreads them over its
rounds of runs)."""

import pytest
from synthetic import SIZES, TINY, synthetic_raw

from uniap.errors import UniapError
from uniap.profile.collect import assemble, merge_raw
from uniap.demo import passes_before_rounds

SPEC = {"micro_batch_sizes": SIZES, "warmup": 1, "reps": 3, "passes": 2, "rep_seconds": 0.05}


def test_two_launches_merge_into_the_profile_of_both():
    slow, fast = synthetic_raw(TINY, 32, 4, rate=10e9, reps=3), synthetic_raw(TINY, 32, 4, rate=30e9, reps=2)
    merged = merge_raw(slow, fast)
    assert merged["seconds"] == 2.0
    for a, b, m in zip(slow["layers"], fast["layers"], merged["layers"]):
        assert (m["d"], m["strategy"]) == (a["d"], a["strategy"])
        for ra, rb, rm in zip(a["rows"], b["rows"], m["rows"]):
            assert rm["fwd_bwd_s"] == ra["fwd_bwd_s"] + rb["fwd_bwd_s"]  # 3 + 2 repetitions
        assert len(m["optimizer_s"]) == 5
    assert all(len(row["times_s"]) == 5 for c in merged["collectives"] for row in c["rows"])
    assert all(len(p["step_s"]) == 5 for p in merged["pipeline"])
    assert len(merged["chain"]["chain_s"]) == 5 and len(merged["chain"]["synced_s"]) == 5
    doc = assemble(merged, TINY, 32, 4, SPEC)
    one = assemble(slow, TINY, 32, 4, SPEC)
    # the median of 5 repetitions, 3 of them from the slow launch: the slow launch's figure
    assert doc["layers"][0]["fwd_bwd_s"] == pytest.approx(one["layers"][0]["fwd_bwd_s"])
    assert doc["method"]["passes"] == 2
    fewer = dict(fast, layers=fast["layers"][:-1])
    with pytest.raises(UniapError, match="different layers"):
        merge_raw(slow, fewer)


def test_passes_are_spread_over_the_rounds_with_one_before_the_first():
    assert passes_before_rounds(3, 3) == [1, 1, 1]
    assert passes_before_rounds(2, 3) == [1, 1, 0]
    assert passes_before_rounds(5, 2) == [3, 2]
    assert passes_before_rounds(1, 1) == [1]
    for passes in range(1, 7):
        for rounds in range(1, 5):
            chunks = passes_before_rounds(passes, rounds)
            assert sum(chunks) == passes and chunks[0] >= 1 and len(chunks) == rounds
    with pytest.raises(UniapError, match="--passes"):
        passes_before_rounds(0, 3)
