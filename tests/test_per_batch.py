"""Wait against compute per batch (dashboard/analysis/per_batch.py), and the window's bars of it.

Expected numbers come from the events the synthetic writer reports, not from the library."""
from __future__ import annotations

import math

import numpy as np
import pytest

import dashboard
from dashboard import synthetic
from dashboard.analysis import per_batch


def independent_batches(written, host: str | None = None):
    """(start, wait, compute) of every training GetNext, from the written events: the compute
    runs to the next GetNext of the same epoch's iterator; the epoch's last has none (NaN)."""
    out = []
    calls = [e for e in written.of_kind("getnext") if e.iterator_class == synthetic.TRAIN_ITER
             and (host is None or e.node.endswith(host))]
    for key in sorted({(e.node, e.epoch) for e in calls}):
        mine = sorted((e for e in calls if (e.node, e.epoch) == key), key=lambda e: e.start_us)
        for this, after in zip(mine, mine[1:] + [None]):
            out.append((this.start_us, this.duration_us,
                        math.nan if after is None else after.start_us - this.end_us))
    return sorted(out)


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("per-batch") / "trial")
    written = synthetic.write_trial(folder, hosts=2, epochs=3, train_batches=25, num_workers=2, val_batches=4,
                                    slow_batches={(1, 7): 50_000})
    return written, dashboard.load_trial(folder)


def test_each_batch_waits_its_getnext_and_computes_until_the_next(two_hosts):
    written, trial = two_hosts
    batches = per_batch.loader_batches(trial.framework, iterator=synthetic.TRAIN_ITER)
    want = independent_batches(written)
    assert len(batches) == len(want) == 2 * 3 * 25
    assert batches.start_us.tolist() == [w[0] for w in want]
    assert batches.wait_us.tolist() == [w[1] for w in want]
    got = batches.compute_us
    expected = np.array([w[2] for w in want], dtype="float64")
    assert np.array_equal(np.isnan(got), np.isnan(expected)) and int(np.isnan(got).sum()) == 2 * 3
    assert np.allclose(got[~np.isnan(got)], expected[~np.isnan(expected)], atol=0)
    # The planted slow batch: a 50 ms wait.
    assert 50_000 in batches.wait_us.tolist()


def test_a_loader_on_one_process_is_that_process_only(two_hosts):
    written, trial = two_hosts
    framework = trial.framework
    second = framework[(framework["pid"] == 20_002)]["process"].astype(str).unique().tolist()
    assert len(second) == 1
    batches = per_batch.loader_batches(framework, iterator=synthetic.TRAIN_ITER, process=second[0])
    want = independent_batches(written, host="algo-2")
    assert batches.start_us.tolist() == [w[0] for w in want]
    # By node: the same batches (one training process on it).
    node = framework[(framework["pid"] == 20_002)]["node"].astype(str).unique().tolist()
    by_node = per_batch.loader_batches(framework, iterator=synthetic.TRAIN_ITER, node=node[0])
    assert by_node.start_us.tolist() == [w[0] for w in want]
    assert len(per_batch.loader_batches(framework, iterator=synthetic.TRAIN_ITER, node="no-such-node")) == 0
    assert len(per_batch.loader_batches(framework, iterator="_NoSuchIter")) == 0


def test_many_batches_are_drawn_in_buckets_of_their_mean(two_hosts):
    written, trial = two_hosts
    batches = per_batch.loader_batches(trial.framework, iterator=synthetic.TRAIN_ITER)
    want = independent_batches(written)
    lo, hi = want[0][0], want[-1][0]
    few = per_batch.buckets(batches, lo, hi, max_bars=1_000)  # all fit: each batch its own bar
    assert few.batches.tolist() == [1] * len(want) and few.wait_us.tolist() == [w[1] for w in want]
    shown = per_batch.buckets(batches, lo, hi, max_bars=10)
    width = (hi - lo) / 10
    expected = {}
    for start, wait, compute in want:
        expected.setdefault(min(int((start - lo) / width), 9), []).append((start, wait, compute))
    assert len(shown.start_us) == len(expected) and shown.batches.sum() == len(want)
    for i, bucket in enumerate(sorted(expected)):
        members = expected[bucket]
        known = [c for _, _, c in members if not math.isnan(c)]
        assert shown.batches[i] == len(members)
        assert shown.start_us[i] == members[0][0]
        assert shown.wait_us[i] == pytest.approx(sum(w for _, w, _ in members) / len(members))
        assert shown.compute_us[i] == pytest.approx(sum(known) / len(known))
    # A window holds the batches that start in it.
    inside = per_batch.buckets(batches, want[10][0], want[20][0], max_bars=100)
    assert inside.start_us.tolist() == [w[0] for w in want[10:21]]


def test_the_window_draws_the_selected_loaders_batches_on_its_own_axis(two_hosts):
    from dashboard.web import views

    written, trial = two_hosts
    view = views.trial_view(trial, "algo-1")
    want = independent_batches(written, host="algo-1")
    lo, hi = want[30][0], want[40][0] + want[40][1]
    spec = views.window_payload(view, lo, hi)["window_figure"]
    wait = next(t for t in spec["data"] if t.get("meta") == "batch-wait")
    compute = next(t for t in spec["data"] if t.get("meta") == "batch-compute")
    unit_name = spec["layout"][f"yaxis{wait['yaxis'][1:]}"]["title"]["text"]
    scale = {"µs": 1, "ms": 1e3, "s": 1e6}[unit_name]
    assert [round(y * scale) for y in wait["y"]] == [w[1] for w in want[30:41]]
    assert [round(y * scale) for y in compute["y"]] == [0 if math.isnan(w[2]) else w[2] for w in want[30:41]]
    # It shares the timeline's x axis (matched to the first) and its window.
    axis = spec["layout"][f"xaxis{wait['xaxis'][1:]}"]
    assert axis["matches"] == "x" and axis["range"] == [lo / 1000, hi / 1000]
    title = next(a["text"] for a in spec["layout"]["annotations"] if "Wait against compute" in a["text"])
    assert synthetic.TRAIN_ITER in title
