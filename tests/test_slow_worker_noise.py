"""Whether a late worker is slow, and whether a late batch is a slow sample, from a
torch.profiler trace (no fetch times): two real recordings (tests/recordings/README.md),
checked against the loop's own books."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import dashboard
from dashboard.analysis.diagnosis import budget

RECORDINGS = Path(__file__).parent / "recordings"


def books(name: str) -> tuple[float, float]:
    """From the loop's own timing: how much later worker 1's steady batches came than worker
    0's (medians; batch i is worker i mod 2's, the first round and the StopIteration call left
    out), and the spread (interquartile range) of the loop's compute between next() calls."""
    calls = np.array(json.loads((RECORDINGS / name / "books.json").read_text()))
    waits = calls[:, 1] - calls[:, 0]
    steady = np.arange(2, len(calls) - 1)
    lead = np.median(waits[steady[steady % 2 == 1]]) - np.median(waits[steady[steady % 2 == 0]])
    gaps = calls[1:, 0] - calls[:-1, 1]
    q75, q25 = np.percentile(gaps, [75, 25])
    return float(lead), float(q75 - q25)


def test_a_worker_late_by_what_the_hosts_load_spreads_is_not_named_slow():
    lead, spread = books("busy_host_alike_workers")
    # The books: worker 1's batches did come late, round after round, by less than the rule's
    # factor times what the host's load spread the loop's own compute.
    assert 0.003 < lead < budget.SLOW_WORKER_SPREAD_FACTOR * spread
    result = dashboard.analyze(str(RECORDINGS / "busy_host_alike_workers"))
    found = result.assessment.budget[0]
    assert found.evidence["num_workers"] == 2  # the rounds were placed: the question was asked
    # The trace's compute is the books' gaps as the profiler saw them (0.03 ms apart here).
    assert found.evidence["compute_spread_s"] == pytest.approx(spread, abs=2e-4)
    assert found.slow_worker is None and found.parts["imbalance"] == 0
    assert "slow_worker" not in {r.id for r in result.recommendations}


def test_a_mildly_slow_worker_of_a_steady_loop_is_named():
    lead, spread = books("mildly_slow_worker")
    assert lead > budget.SLOW_WORKER_SPREAD_FACTOR * spread  # (1.1 ms against 0.2 ms)
    result = dashboard.analyze(str(RECORDINGS / "mildly_slow_worker"))
    found = result.assessment.budget[0]
    assert found.evidence["compute_spread_s"] == pytest.approx(spread, abs=2e-4)
    assert found.slow_worker == 1 and found.parts["imbalance"] > 0
    items = {r.id: r for r in result.recommendations}
    assert items["slow_worker"].evidence["worker_id"] == 1
    # No sample was slow: worker 1's waits spread round to round (its books: 0.5-5.4 ms), and
    # 2x its median wait, the reference's outlier rule, lies inside that spread.
    assert "slow_samples" not in items and found.parts["tail"] == 0
