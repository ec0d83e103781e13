"""The dashboard's parts without a browser: decimation, figures, ranges, the trial cache, options."""
from __future__ import annotations

import base64
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from dashboard import display, synthetic
from dashboard.analysis import dataloader, decimate
from dashboard.trial.errors import NotATrialError, TrialAccessError, TrialNotFoundError
from dashboard.web import figures, views
from dashboard.web.cache import CODE_VERSION, TrialCache
from tests.conftest import ROOT


# --- decimation ----------------------------------------------------------------------------------

def test_minmax_keeps_each_buckets_extremes_and_no_more_than_two_per_bucket():
    rng = np.random.default_rng(1)
    x = np.sort(rng.uniform(0, 1000, 100_000))
    y = rng.normal(size=len(x))
    buckets = 50
    keep = decimate.minmax_indices(x, y, buckets, 0, 1000)
    assert len(keep) <= 2 * buckets
    assert np.all(np.diff(x[keep]) >= 0)
    bucket = np.minimum((x / 20).astype(int), buckets - 1)
    for b in range(buckets):
        ys = y[bucket == b]
        kept = y[keep][bucket[keep] == b]
        assert kept.min() == ys.min() and kept.max() == ys.max()


def test_minmax_keeps_short_series_whole_and_drops_nan():
    x = np.arange(10)
    y = np.array([1, 2, np.nan, 4, 5, 6, 7, 8, 9, 10], dtype=float)
    keep = decimate.minmax_indices(x, y, 100)
    assert keep.tolist() == [0, 1, 3, 4, 5, 6, 7, 8, 9]
    unsorted = decimate.minmax_indices(np.array([3, 1, 2]), np.array([1.0, 2.0, 3.0]), 100)
    assert unsorted.tolist() == [1, 2, 0]  # in time order


def _merge_by_hand(start, end, group, gap):
    out = []
    for g in sorted(set(group)):
        items = sorted((s, e) for s, e, gg in zip(start, end, group) if gg == g)
        cur_s, cur_e, n = items[0][0], items[0][1], 1
        for s, e in items[1:]:
            if s <= cur_e + gap:
                cur_e, n = max(cur_e, e), n + 1
            else:
                out.append((cur_s, cur_e, g, n))
                cur_s, cur_e, n = s, e, 1
        out.append((cur_s, cur_e, g, n))
    return out


def test_merge_intervals_matches_a_plain_merge():
    rng = np.random.default_rng(2)
    start = rng.integers(0, 100_000, 3000)
    end = start + rng.integers(0, 500, 3000)
    group = rng.integers(0, 7, 3000)
    s, e, g, count, first = decimate.merge_intervals(start, end, group, 40)
    assert list(zip(s.tolist(), e.tolist(), g.tolist(), count.tolist())) == _merge_by_hand(
        start.tolist(), end.tolist(), group.tolist(), 40)
    assert count.sum() == 3000
    assert np.all(start[first] == s)


def test_log_histogram_counts_every_value():
    values = np.array([0, 1, 5, 10, 100, 1000, 5000, 5000])
    edges, counts = decimate.log_histogram(values, bins=10)
    assert counts.sum() == len(values)
    assert edges[0] == pytest.approx(1.0) and edges[-1] == pytest.approx(5000)


# --- figures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def big_trial(tmp_path_factory):
    """A trial with enough GetNexts and samples that figures must reduce them."""
    import dashboard

    folder = str(tmp_path_factory.mktemp("big") / "trial")
    written = synthetic.write_trial(folder, epochs=2, train_batches=15_000, num_workers=4, val_batches=100,
                                    getnext_us=(300, 700), step_us=(500, 900), cpus=8, gpus=2,
                                    system_interval_s=0.1)
    return written, dashboard.load_trial(folder)


def _decoded(axis_values):
    if isinstance(axis_values, dict):
        return np.frombuffer(base64.b64decode(axis_values["bdata"]), dtype=axis_values["dtype"])
    return np.asarray(axis_values)


def test_window_figure_stays_under_the_point_budget_and_spans_the_window(big_trial):
    written, trial = big_trial
    getnexts = written.of_kind("getnext")
    assert len(trial.framework) > 60_000  # more than the budget, so reduction is needed
    window = dataloader.window(trial.framework, trial.system, trial.start_us, trial.end_us)
    spec = figures.window_figure_spec(window)
    assert figures.n_points(spec) <= figures.MAX_POINTS * 1.05
    layout = spec["layout"]
    assert layout["xaxis"]["range"] == [trial.start_us / 1000.0, trial.end_us / 1000.0]
    titles = [a["text"] for a in layout["annotations"] if a.get("name") != "flat"]
    for title in ("CPU utilization", "GPU utilization", "GPU memory", "Memory used",
                  "I/O operations", "I/O throughput", "Network", "Framework events"):
        assert any(title in t for t in titles), (title, titles)
    # The synthetic writer's I/O wait is 0.5 % on every core at every sample: one line, no subplot.
    assert not any("I/O wait" in t for t in titles)
    [flat] = [a["text"] for a in layout["annotations"] if a.get("name") == "flat"]
    assert flat == "I/O wait: 0.5 % throughout"
    gantt_axis = layout[f"yaxis{len(titles)}"]
    assert "DataLoaderIter · pid 20001" in gantt_axis["ticktext"]
    # Every GetNext is covered by a drawn DataLoaderIter bar.
    bars = [t for t in spec["data"] if t["name"] == "DataLoaderIter"]
    xs = np.concatenate([_decoded(t["x"]) for t in bars])
    xs = xs[~np.isnan(xs)].reshape(-1, 3)
    lo, hi = xs[:, 0] * 1000, xs[:, 2] * 1000
    order = np.argsort(lo)
    lo, hi = lo[order], hi[order]
    for event in getnexts[::997]:
        i = np.searchsorted(lo, event.start_us + 1, side="right") - 1
        assert lo[i] <= event.start_us + 1 and hi[i] >= event.end_us - 1
    # The compatibility API gets a plotly Figure of the same content.
    fig = figures.window_figure(window)
    assert len(fig.data) == len(spec["data"])


def test_window_of_a_few_batches_keeps_every_event_and_the_samples_around_it(big_trial):
    written, trial = big_trial
    view = views.trial_view(trial)
    getnexts = written.of_kind("getnext")
    lo, hi = getnexts[100].start_us, getnexts[120].end_us
    assert hi - lo < 100_000  # narrower than the sampling interval
    spec = views.window_payload(view, lo, hi, "GetNext", "cpu0")["window_figure"]
    titles = [a["text"] for a in spec["layout"]["annotations"] if a.get("name") != "flat"]
    # cpu0 names both of its dimensions: utilization, and I/O wait (flat: a line of text); the
    # GetNexts bring the training loader's batches.
    assert len(titles) == 3 and "CPU utilization" in titles[0] and "Wait against compute per batch" in titles[1]
    assert "Framework" in titles[2]
    assert [a["text"] for a in spec["layout"]["annotations"] if a.get("name") == "flat"] == [
        "I/O wait: 0.5 % throughout"]
    assert spec["layout"]["xaxis"]["range"] == [lo / 1000.0, hi / 1000.0]
    cpu = [t for t in spec["data"] if t["yaxis"] == "y"]
    assert [t["name"] for t in cpu] == ["cpu0"]
    x = _decoded(cpu[0]["x"]) * 1000
    assert x.min() < lo and x.max() > hi  # the line crosses the window
    bars = [t for t in spec["data"] if t["name"] == "DataLoaderIter"]
    starts = _decoded(bars[0]["x"])[0::4] * 1000
    shown = sorted(int(round(v)) for v in starts if lo - 1 <= v <= hi + 1)
    assert shown == [e.start_us for e in getnexts[100:121]]


def test_window_figure_says_when_nothing_is_in_the_window(big_trial):
    _, trial = big_trial
    window = dataloader.window(trial.framework, trial.system, 1_000, 2_000)
    spec = figures.window_figure_spec(window)
    assert spec["data"] == [] and "No system metrics or framework events" in spec["layout"]["annotations"][0]["text"]


def test_panel_figures_are_bounded(big_trial):
    _, trial = big_trial
    view = views.trial_view(trial)
    payload = views.panels(view)
    for figure in (payload["getnext"]["timeline"], payload["batchtime"]["figure"],
                   payload["getnext"]["histogram"], payload["init"]["figure"], payload["workers"]["figure"]):
        assert 0 < figures.n_points(figure) <= figures.MAX_POINTS
    overview = figures.overview_figure_spec(view.overview, view.span)
    assert 0 < figures.n_points(overview) <= figures.MAX_POINTS


def test_the_overview_shows_the_whole_job_with_the_window_and_the_selected_outlier_on_it(big_trial):
    written, trial = big_trial
    view = views.trial_view(trial)
    g = written.of_kind("getnext")
    lo, hi = g[5000].start_us, g[5400].end_us
    chosen = {"start_us": g[5200].start_us, "end_us": g[5200].end_us, "label": "the one"}
    zoomed = views.window_payload(view, lo, hi, selected=chosen)
    assert zoomed["window_range"] == f"{views.iso_utc(lo)} – {views.iso_utc(hi)}"
    overview = zoomed["overview_figure"]["layout"]
    first, last = min(e.start_us for e in written.events), max(e.end_us for e in written.events)
    # The whole job, however narrow the window; the axis never zooms, a drag box-selects.
    assert overview["xaxis"]["range"][0] <= first / 1000 and overview["xaxis"]["range"][1] >= last / 1000
    assert overview["xaxis"]["fixedrange"] is True and overview["dragmode"] == "select"
    assert "rangeslider" not in overview["xaxis"]
    [band] = [s for s in overview["shapes"] if s["name"] == "window"]
    assert (band["x0"], band["x1"]) == (lo / 1000, hi / 1000)
    # The selected outlier: marked in both figures' data, over its own span.
    for figure in ("overview_figure", "window_figure"):
        [outline] = [t for t in zoomed[figure]["data"] if t.get("meta") == "selected-outlier"]
        assert min(outline["x"]) == chosen["start_us"] / 1000 and max(outline["x"]) == chosen["end_us"] / 1000
    # The whole job as the window: no band.
    assert views.window_payload(view, *view.span)["overview_figure"]["layout"]["shapes"] == []
    with pytest.raises(ValueError, match="invalid regular expression"):
        views.window_payload(view, lo, hi, select_events="(")


# --- ranges and numbers --------------------------------------------------------------------------

def test_relayout_range_reads_zoom_slider_select_and_autorange():
    t0 = "2026-11-29 21:10:08.4312"
    t1 = "2026-11-29 21:10:09"
    us0 = int(pd.Timestamp(t0, tz="UTC").value // 1000)
    us1 = int(pd.Timestamp(t1, tz="UTC").value // 1000)
    assert views.relayout_range({"xaxis.range[0]": t0, "xaxis.range[1]": t1}) == (us0, us1)
    assert views.relayout_range({"xaxis.range": [t1, t0]}) == (us0, us1)
    assert views.relayout_range({"xaxis3.range[0]": t0, "xaxis3.range[1]": t1}) == (us0, us1)
    assert views.relayout_range({"xaxis.range": [us0 / 1000, us1 / 1000]}) == (us0, us1)
    assert views.relayout_range({"selections": [{"type": "rect", "x0": t0, "x1": t1, "y0": 0, "y1": 1}]}) == (us0, us1)
    assert views.relayout_range({"xaxis.autorange": True}) == "full"
    assert views.relayout_range({"autosize": True}) is None
    assert views.relayout_range(None) is None


def test_parse_time_us_reads_iso_and_epoch_microseconds():
    assert views.parse_time_us("2026-11-29T21:10:08.123456Z") == 1795986608123456
    assert views.parse_time_us("1795986608123456") == 1795986608123456
    assert views.parse_time_us(views.iso_utc(1795986608123457)) == 1795986608123457
    assert views.parse_time_us("yesterday-ish") is None
    assert views.parse_time_us(None) is None


def test_outlier_window_has_a_margin_on_both_sides():
    assert views.outlier_window(10_000_000, 10_400_000) == (9_800_000, 10_600_000)
    assert views.outlier_window(10_000_000, 10_000_100) == (9_999_000, 10_001_100)


# --- the trial cache -----------------------------------------------------------------------------

def test_cache_serves_an_unchanged_trial_and_rereads_a_changed_one(tmp_path):
    folder = str(tmp_path / "trial")
    first = synthetic.write_trial(folder, epochs=1, train_batches=10, val_batches=0)
    cache = TrialCache(str(tmp_path / "cache"), 64)
    key, trial, cached = cache.load(folder, roots=[str(tmp_path)])
    assert not cached
    assert (trial.framework["kind"] == "getnext").sum() == len(first.of_kind("getnext"))
    # Another server process (a gunicorn worker) with the same folder gets it from disk.
    other = TrialCache(str(tmp_path / "cache"), 64)
    key2, trial2, cached2 = other.load(folder, roots=[str(tmp_path)])
    assert cached2 and key2 == key
    assert len(trial2.framework) == len(trial.framework)
    # The job writes more: a new listing, a new key, the new events.
    second = synthetic.write_trial(folder, epochs=1, train_batches=7, val_batches=0, main_pid=40_000,
                                   start_us=first.events[-1].end_us + 1_000_000, system=False)
    key3, trial3, cached3 = other.load(folder, roots=[str(tmp_path)])
    assert not cached3 and key3 != key
    assert (trial3.framework["kind"] == "getnext").sum() == len(first.of_kind("getnext")) + len(
        second.of_kind("getnext"))


def test_a_warm_load_finds_its_page_ready_without_reading_the_trial_back(tmp_path, monkeypatch):
    """A load whose trial, analysis and assessment are all on the disk already answers from the
    listing and the trial's span (the page's server process reads what it draws); anything
    missing, changed or unreadable takes the reading path."""
    folder = str(tmp_path / "trial")
    synthetic.write_trial(folder, epochs=1, train_batches=10, val_batches=0)
    cache = TrialCache(str(tmp_path / "cache"), 64)
    key, trial, _ = cache.load(folder, roots=[str(tmp_path)])
    other = TrialCache(str(tmp_path / "cache"), 64)  # another server process
    assert other.ready(key, [None]) is None  # no analyses yet
    cache.analysis(key, trial)
    cache.assessment(key, trial)
    listed_key, _, files = other.listing(folder, roots=[str(tmp_path)])
    assert listed_key == key and files
    assert other.ready(key, [None]) == (trial.start_us, trial.end_us)
    assert other.memory.get(f"trial:{key}") is None  # (not read back)
    assert other.ready(key, [None, trial.nodes[0]]) is None  # a node's analysis: not computed yet
    # A trial entry that cannot be read any more (damaged) leaves the disk: the next load reads.
    real_get = other.disk.get
    monkeypatch.setattr(other.disk, "get", lambda name, *a, **k: (_ for _ in ()).throw(EOFError("damaged"))
                        if name == f"trial:{key}" else real_get(name, *a, **k))
    assert other.trial(key) is None
    assert other.ready(key, [None]) is None
    again_key, again, cached = TrialCache(str(tmp_path / "cache"), 64).load(folder, roots=[str(tmp_path)])
    assert again_key == key and not cached and len(again.framework) == len(trial.framework)


def analysed_trial(tmp_path) -> tuple[TrialCache, str]:
    """A cache (under tmp_path/cache) holding a small trial and its whole-trial analyses; its key."""
    folder = str(tmp_path / "trial")
    synthetic.write_trial(folder, epochs=1, train_batches=10, val_batches=0)
    cache = TrialCache(str(tmp_path / "cache"), 64)
    key, trial, _ = cache.load(folder, roots=[str(tmp_path)])
    cache.analysis(key, trial)
    cache.assessment(key, trial)
    return cache, key


def test_analyses_and_page_parts_made_by_other_code_are_not_served(tmp_path, monkeypatch):
    """Kept analyses and drawn parts of pages are named with the code that made them: a server
    of another version (an upgrade on the same cache folder) makes its own."""
    import dashboard.web.cache as cache_module
    from dashboard.trial.store import fingerprint, open_store

    cache, key = analysed_trial(tmp_path)
    assert cache.page_part(f"panels:{key}:", lambda: "drawn by this code") == "drawn by this code"
    assert TrialCache(str(tmp_path / "cache"), 64).page_part(f"panels:{key}:", lambda: "again") == "drawn by this code"
    assert TrialCache(str(tmp_path / "cache"), 64).ready(key, [None]) is not None
    monkeypatch.setattr(cache_module, "CODE_VERSION", "another")
    upgraded = TrialCache(str(tmp_path / "cache"), 64)
    assert upgraded.ready(key, [None]) is None  # its analyses were made by other code
    assert upgraded.page_part(f"panels:{key}:", lambda: "drawn by the new code") == "drawn by the new code"
    # The trial too: the new code's load names it by another key, and reads it again.
    store = open_store(str(tmp_path / "trial"))
    assert cache_module.trial_key(store.canonical_path, fingerprint(store.list())) != key


def test_a_trial_shown_from_its_page_parts_is_not_the_first_the_culling_takes(tmp_path):
    """A warm page reads its parts, not the trial: the trial and its analyses are marked used
    all the same, or the least-recently-used culling would take them (the largest entries)
    first from a trial people keep opening."""
    cache, key = analysed_trial(tmp_path)
    cache.disk.set("another trial's entry", b"x" * 1_000)  # used after them
    other = TrialCache(str(tmp_path / "cache"), 64)  # another server process, showing the page
    assert other.ready(key, [None]) is not None and other.holds(key)
    import diskcache

    with diskcache.Cache(other.disk.directory) as plain:  # (the cache's own runs no SQL outside its operations)
        culled_first = [name for (name,) in plain._sql("SELECT key FROM Cache ORDER BY access_time").fetchall()]
    used = [f"trial:{key}", f"analysis:{CODE_VERSION}:{key}::2", f"assessment:{CODE_VERSION}:{key}::2"]
    assert all(culled_first.index(name) > culled_first.index("another trial's entry") for name in used), culled_first


def test_loads_of_one_trial_at_once_read_it_once(tmp_path):
    """Four server processes (each its own cache object on the shared folder) asked for the
    same new trial at the same moment: one reads it, the others wait and get its result."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    folder = str(tmp_path / "trial")
    written = synthetic.write_trial(folder, epochs=2, train_batches=30, val_batches=0, rotate_s=0.05)
    gate = threading.Barrier(4)
    events: dict[int, list[str]] = {n: [] for n in range(4)}

    def one(n):
        cache = TrialCache(str(tmp_path / "cache"), 64)

        def progress(done, total):
            events[n].append("read")
            # A slow disk: the read outlasts the others' arrival (however late a loaded
            # machine lets them start), and goes on once all three wait for it.
            deadline = time.monotonic() + 30
            while sum("waited" in events[m] for m in range(4)) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)

        gate.wait()
        return cache.load(folder, roots=[str(tmp_path)], on_progress=progress,
                          on_wait=lambda: events[n].append("waited"))

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    readers = [n for n in range(4) if "read" in events[n]]
    assert len(readers) == 1
    assert [cached for _, _, cached in results] == [n not in readers for n in range(4)]
    assert all(events[n] == ["waited"] for n in range(4) if n not in readers)
    assert len({key for key, _, _ in results}) == 1
    getnext = len(written.of_kind("getnext"))
    assert all((trial.framework["kind"] == "getnext").sum() == getnext for _, trial, _ in results)
    assert not [k for k in TrialCache(str(tmp_path / "cache"), 64).disk if str(k).startswith("computing:")]


def test_a_load_waiting_for_one_that_fails_reads_the_trial_itself(tmp_path):
    import threading

    folder = str(tmp_path / "trial")
    synthetic.write_trial(folder, epochs=1, train_batches=10, val_batches=0)
    first, second = (TrialCache(str(tmp_path / "cache"), 64) for _ in range(2))
    key = first.load(folder, roots=[str(tmp_path)])[0]
    first.disk.clear()  # the trial is new again
    waited = threading.Event()
    result = {}
    with first._computing(f"trial:{key}"):  # a load of another process is reading it ...
        def wait_then_load():
            key, trial, cached = second.load(folder, roots=[str(tmp_path)], on_wait=waited.set)
            result.update(key=key, trial=trial, cached=cached)

        waiter = threading.Thread(target=wait_then_load, daemon=True)
        waiter.start()
        assert waited.wait(30)
        assert waiter.is_alive()
    # ... and fails: nothing cached, the lock let go.
    waiter.join(30)
    assert not waiter.is_alive()
    assert result["key"] == key and result["cached"] is False and len(result["trial"].framework)


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_a_load_whose_process_was_killed_does_not_hold_the_trial(tmp_path, reaped):
    """Killed, as Dash kills a cancelled background load: whether or not its parent has
    reaped it yet (a zombie still has its pid), the lock it left is taken over at once."""
    import signal
    import threading

    import psutil

    folder = str(tmp_path / "trial")
    synthetic.write_trial(folder, epochs=1, train_batches=10, val_batches=0)
    cache_dir = str(tmp_path / "cache")
    key = TrialCache(cache_dir, 64).load(folder, roots=[str(tmp_path)])[0]
    TrialCache(cache_dir, 64).disk.clear()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, %r); from dashboard.web.cache import TrialCache\n"
        "with TrialCache(%r, 64)._computing(%r):\n    print('holding', flush=True); time.sleep(600)")
        % (ROOT, cache_dir, f"trial:{key}")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        holder.send_signal(signal.SIGKILL)
        if reaped:
            holder.wait(30)
        else:
            wait_for = time.time() + 30
            while psutil.Process(holder.pid).status() != psutil.STATUS_ZOMBIE and time.time() < wait_for:
                time.sleep(0.05)
            assert psutil.Process(holder.pid).status() == psutil.STATUS_ZOMBIE
        assert f"computing:trial:{key}" in TrialCache(cache_dir, 64).disk  # left behind by the killed load
        result = {}
        loader = threading.Thread(target=lambda: result.update(
            cached=TrialCache(cache_dir, 64).load(folder, roots=[str(tmp_path)])[2]), daemon=True)
        loader.start()
        loader.join(30)  # not the lock's 600 s expiry
        assert not loader.is_alive() and result["cached"] is False
    finally:
        holder.kill()


def test_cache_stores_nothing_for_a_failed_or_empty_load(tmp_path):
    cache = TrialCache(str(tmp_path / "cache"), 64)
    (tmp_path / "notatrial").mkdir()
    (tmp_path / "notatrial" / "README.txt").write_text("hello")
    with pytest.raises(NotATrialError, match="not a trial"):
        cache.load(str(tmp_path / "notatrial"), roots=[str(tmp_path)])
    empty = tmp_path / "empty" / "framework" / "pevents" / "2026112921"
    empty.mkdir(parents=True)
    (empty / "1795986612928243_1-algo-1_pythontimeline.json").write_text("")
    with pytest.raises(NotATrialError, match="holds no events"):
        cache.load(str(tmp_path / "empty"), roots=[str(tmp_path)])
    with pytest.raises(TrialNotFoundError):
        cache.load(str(tmp_path / "missing"), roots=[str(tmp_path)])
    with pytest.raises(TrialAccessError, match="outside the allowed data roots"):
        cache.load("/", roots=[str(tmp_path)])
    assert len(cache.disk) == 0


def test_cache_analysis_is_computed_once_per_node(tmp_path):
    folder = str(tmp_path / "trial")
    written = synthetic.write_trial(folder, hosts=2, epochs=1, train_batches=12, val_batches=3)
    cache = TrialCache(str(tmp_path / "cache"), 64)
    key, trial, _ = cache.load(folder, roots=[str(tmp_path)])
    both = cache.analysis(key, trial, None)
    second = cache.analysis(key, trial, "algo-2")
    assert both.getnext.count == len(written.of_kind("getnext"))
    assert second.getnext.count == len([e for e in written.of_kind("getnext") if e.node.endswith("algo-2")])
    assert cache.analysis(key, trial, "algo-2") is second
    assert f"analysis:{CODE_VERSION}:{key}:algo-2:2" in cache.disk


# --- the server's options ------------------------------------------------------------------------

def test_options_from_environment(monkeypatch, tmp_path):
    from dashboard.web.server import SAMPLE_TRIAL, options_from_environment

    options = options_from_environment({
        "DASHBOARD_TRIAL": "s3://bucket/job", "DASHBOARD_CACHE_DIR": str(tmp_path),
        "DASHBOARD_DATA_ROOTS": os.pathsep.join(["/data/a", "/data/b"]), "DASHBOARD_S3_BUCKETS": "x, y",
        "DASHBOARD_CACHE_SIZE_MB": "100"})
    assert options.trial == "s3://bucket/job" and options.cache_dir == str(tmp_path)
    assert options.s3_buckets == ["x", "y"] and options.cache_size_mb == 100
    assert options.dev_debug is False
    roots = options.allowed_roots()
    assert roots[:2] == ["/data/a", "/data/b"] and os.path.dirname(SAMPLE_TRIAL) in roots
    defaults = options_from_environment({})
    assert defaults.default_trial == SAMPLE_TRIAL
    assert defaults.allowed_roots()[0] == os.getcwd()
    assert defaults.host == "127.0.0.1"


def test_serve_never_turns_the_debugger_on_by_default(monkeypatch, tmp_path):
    import dash

    import app as entry

    import flask
    import werkzeug.serving

    dash_runs, served = [], []
    monkeypatch.setattr(dash.Dash, "run", lambda self, **kwargs: dash_runs.append(kwargs))

    class Recorded:  # the server make_server returns: serves nothing
        server_port = 8123

        def serve_forever(self):
            pass

        def server_close(self):
            pass

    def make_server(host, port, app, **kwargs):
        served.append((host, port, app, kwargs))
        return Recorded()

    monkeypatch.setattr(werkzeug.serving, "make_server", make_server)
    assert entry.main(["--cache-dir", str(tmp_path / "c"), "--port", "8123"]) == 0
    [(host, port, wsgi, kwargs)] = served
    assert (host, port) == ("127.0.0.1", 8123) and dash_runs == []
    # The Flask app itself: no debugger wrapped round it, Flask's debug off, no reloader.
    assert isinstance(wsgi, flask.Flask) and wsgi.debug is False
    assert set(kwargs) == {"threaded"}
    assert entry.main(["serve", "--cache-dir", str(tmp_path / "c"), "--dev-debug"]) == 0
    assert dash_runs[-1]["debug"] is True and len(served) == 1


def test_gunicorn_server_is_the_flask_app(monkeypatch, tmp_path):
    import flask

    from dashboard.web import server

    monkeypatch.setenv("DASHBOARD_CACHE_DIR", str(tmp_path / "cache"))
    server.server_from_environment.cache_clear()
    try:
        import app as entry

        flask_app = entry.server
        assert isinstance(flask_app, flask.Flask)
        response = flask_app.test_client().get("/")
        assert response.status_code == 200 and b"DataLoader Profiler" in response.data
        assert os.path.isdir(tmp_path / "cache" / "jobs") and os.path.isdir(tmp_path / "cache" / "trials")
    finally:
        server.server_from_environment.cache_clear()


def test_batch_time_median_from_events_matches_the_page_number(tmp_path):
    """The panels' numbers are the analysis's, formatted plainly (checked against the events)."""
    folder = str(tmp_path / "trial")
    written = synthetic.write_trial(folder, epochs=2, train_batches=9, val_batches=4)
    import dashboard

    view = views.trial_view(dashboard.load_trial(folder))
    panel = views.panels(view)
    gaps = []
    for key in {(e.node, e.epoch, e.iterator_class) for e in written.of_kind("getnext")}:
        starts = sorted(e.start_us for e in written.of_kind("getnext") if (e.node, e.epoch, e.iterator_class) == key)
        gaps += [(b - a) / 1e6 for a, b in zip(starts, starts[1:])]
    assert panel["batchtime"]["median_s"] == display.duration_s(statistics.median(gaps))
    assert panel["getnext"]["median_us"] == display.duration_us(
        statistics.median(e.duration_us for e in written.of_kind("getnext")))
    assert panel["getnext"]["count"] == str(len(written.of_kind("getnext")))


# --- the verdict and the findings in the summary ------------------------------------------------

def component_text(component) -> str:
    """The text a Dash component tree shows (what a browser's innerText holds, spacing aside)."""
    if component is None:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    if isinstance(component, (list, tuple)):
        return "".join(component_text(c) for c in component)
    return component_text(getattr(component, "children", None))


def find_components(component, test) -> list:
    """Every component of a tree for which test(component) holds."""
    found = []
    if isinstance(component, (list, tuple)):
        for child in component:
            found += find_components(child, test)
    elif component is not None and not isinstance(component, (str, int, float)):
        if test(component):
            found.append(component)
        found += find_components(getattr(component, "children", None), test)
    return found


def by_id(component, id_):
    found = find_components(component, lambda c: getattr(c, "id", None) == id_)
    assert len(found) == 1, (id_, len(found))
    return found[0]


def summary_page(data: dict, verdict: dict):
    """The summary's filled parts in the page's order (the wait budget and the what-if, fixed
    components of the layout, sit between them)."""
    from dash import html
    from dashboard.web import layout

    parts = layout.summary_parts(data, verdict)
    return html.Div(parts["verdict"] + parts["findings"] + parts["facts"])


def shown_text(item, assessment) -> str:
    """A finding's text as the summary shows it: without the sentence repeating its prediction
    (the what-if it ran), which has a line of its own."""
    from dashboard.analysis.diagnosis.findings.base import predicted_text

    for result in assessment.what_if:
        if (result.node, result.change, result.predicted) == (item.evidence.get("node"), item.change,
                                                                item.predicted):
            sentence = predicted_text(result)
            assert sentence and sentence in item.text
            return item.text.replace(sentence, "", 1).rstrip()
    return item.text


def costly_starts(folder) -> synthetic.SyntheticTrial:
    """Workers re-created every epoch (not persistent) at 0.4 s a start, and a 0.3 s first batch."""
    return synthetic.write_trial(folder, epochs=3, train_batches=12, num_workers=2, val_batches=0,
                                 init_us=(400_000, 450_000), slow_batches={(e, 0): 300_000 for e in range(3)})


def training_percent(written: synthetic.SyntheticTrial) -> float:
    """GetNext time over training time, from the events written: each epoch's training runs from
    its first GetNext to the end of the step its last batch fed (steps follow their GetNext)."""
    waited = spans = 0
    for epoch in sorted({e.epoch for e in written.events}):
        calls = sorted((e for e in written.of_kind("getnext") if e.epoch == epoch and
                        e.iterator_class == synthetic.TRAIN_ITER), key=lambda e: e.start_us)
        steps = [e for e in written.of_kind("step") if e.epoch == epoch and e.name == "Step:ModeKeys.TRAIN"]
        waited += sum(e.duration_us for e in calls)
        spans += max(max(e.end_us for e in steps), calls[-1].end_us) - calls[0].start_us
    return 100.0 * waited / spans


def with_margin(start_us: int, end_us: int) -> tuple[int, int]:
    margin = max(int((end_us - start_us) * 0.5), 1_000)  # as an outlier click shows it
    return start_us - margin, end_us + margin


def test_verdict_summary_leads_with_the_verdict_and_the_findings_with_their_windows(tmp_path):
    import dashboard

    folder = str(tmp_path / "trial")
    written = costly_starts(folder)
    result = dashboard.analyze(folder)
    view = views.trial_view(dashboard.load_trial(folder))
    data = views.verdict_summary(view)
    percent = training_percent(written)
    assert percent > 20  # planted: highly input-bound
    assert data["class"] == result.verdict.class_ == "highly"
    assert data["percent"] == f"{result.verdict.input_percent:.1f}"
    # shown to 0.1 (of the library's 0.01): within 0.06 of the exact share
    assert float(data["percent"]) == pytest.approx(percent, abs=0.06)
    assert data["basis"] == result.verdict.basis and data["nodes"] == []
    # One finding for the one part of the wait that is the cause: start-up, re-created workers.
    assert [f["id"] for f in data["findings"]] == [r.id for r in result.recommendations] == [
        "persistent_workers"]
    for shown, item in zip(data["findings"], result.recommendations):
        assert shown["text"] == shown_text(item, result.assessment)
        assert shown["saving"] == ("" if item.saving_s is None else f"saves about {display.duration_s(item.saving_s)}")
    assert data["findings"][0]["saving"].startswith("saves about ")
    # Each worker start: from its initialization to the end of the first batch after it.
    inits = sorted(written.of_kind("init"), key=lambda e: e.start_us)
    firsts = [min((g for g in written.of_kind("getnext") if g.epoch == e), key=lambda g: g.start_us)
              for e in range(3)]
    starts = [(w["start_us"], w["end_us"]) for w in data["findings"][0]["windows"]]
    assert starts == [with_margin(i.start_us, f.end_us) for i, f in zip(inits, firsts)]
    assert data["findings"][0]["windows"][0]["label"].startswith("start 1 · ")
    # The page: the badge, the number, the findings in order with data-id, a "show" per window.
    page = summary_page(views.summary(view.trial), data)
    assert component_text(by_id(page, "verdict-class")) == "highly"
    assert component_text(by_id(page, "verdict-percent")) == data["percent"]
    items = find_components(by_id(page, "recommendations"),
                            lambda c: "recommendation" in (getattr(c, "className", "") or "").split())
    assert [getattr(c, "data-id") for c in items] == ["persistent_workers"]
    buttons = find_components(items[0], lambda c: isinstance(getattr(c, "id", None), dict)
                              and c.id.get("type") == "show-window")
    assert [(b.id["start_us"], b.id["end_us"]) for b in buttons] == starts
    assert all(component_text(b) == "show" and b.id["type"] == "show-window" for b in buttons)
    text = component_text(page)
    assert text.index("highly") < text.index("Workers are re-created") < text.index(str(tmp_path / "trial"))


def test_a_clean_trial_shows_no_findings(tmp_path):
    import dashboard

    folder = str(tmp_path / "trial")
    written = synthetic.write_trial(folder, epochs=1, train_batches=30, num_workers=2, val_batches=0,
                                    getnext_us=(200, 400))
    view = views.trial_view(dashboard.load_trial(folder))
    data = views.verdict_summary(view)
    assert data["class"] == "not" and data["findings"] == []
    assert float(data["percent"]) == pytest.approx(training_percent(written), abs=0.06)
    page = summary_page(views.summary(view.trial), data)
    assert "no findings" in component_text(by_id(page, "recommendations")).lower()
    assert not find_components(page, lambda c: isinstance(getattr(c, "id", None), dict))


def test_several_nodes_get_a_verdict_table_and_no_getnext_gets_class_none(tmp_path):
    import dashboard

    folder = str(tmp_path / "trial")
    written = synthetic.write_trial(folder, hosts=2, epochs=1, train_batches=20, val_batches=0)
    result = dashboard.analyze(folder)
    view = views.trial_view(dashboard.load_trial(folder))
    data = views.verdict_summary(view)
    nodes = {e.node.split("-", 1)[1] for e in written.events}  # the hosts of the processes
    assert [row["node"] for row in data["nodes"]] == sorted(nodes) == sorted(result.nodes_verdict)
    for row in data["nodes"]:
        verdict = result.nodes_verdict[row["node"]]
        assert row["percent"] == f"{verdict.input_percent:.1f}" and row["class"] == verdict.class_
    page = summary_page(views.summary(view.trial), data)
    table = by_id(page, "verdict-nodes")
    assert [getattr(r, "data-node") for r in find_components(table, lambda c: hasattr(c, "data-node"))] == \
        sorted(nodes)
    # One node selected: its own verdict, no table.
    one = views.verdict_summary(views.trial_view(dashboard.load_trial(folder), "algo-2"))
    assert one["nodes"] == [] and one["node"] == "algo-2"
    assert one["percent"] == f"{result.nodes_verdict['algo-2'].input_percent:.1f}"
    # Without GetNext events there is nothing to judge by.
    bare = str(tmp_path / "bare")
    synthetic.write_trial(bare, epochs=1, train_batches=5, val_batches=0)
    shutil.rmtree(os.path.join(bare, "framework"))
    data = views.verdict_summary(views.trial_view(dashboard.load_trial(bare)))
    assert data["class"] == "none" and data["percent"] == "-" and data["findings"] == []
    page = summary_page(views.summary(views.trial_view(dashboard.load_trial(bare)).trial), data)
    assert component_text(by_id(page, "verdict-class")) == "none"
    assert "no GetNext" in component_text(page)


def test_show_window_clicks_name_their_window_and_new_buttons_do_nothing():
    from dashboard.web.callbacks import _shown_window

    button = {"type": "show-window", "index": "startup:0", "start_us": 10, "end_us": 20}
    assert _shown_window(button, 1) == (10, 20)
    assert _shown_window(button, 0) is None and _shown_window(button, None) is None
    assert _shown_window({"type": "show-window", "start_us": "x", "end_us": 2}, 1) is None


# --- PyTorch profiler (Kineto) traces: what they do not record ----------------------------------

KINETO_RUN = r"""
import os, socket, sys
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, i):
        return torch.full((8,), float(i)), i % 3


model = torch.nn.Linear(8, 3)
loader = DataLoader(Squares(), batch_size=4, num_workers=2)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(2):
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
prof.export_chrome_trace(os.path.join(sys.argv[1], f"{socket.gethostname()}_{os.getpid()}.1.pt.trace.json"))
"""
KINETO_NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def record_kineto_trace(folder) -> int:
    """A real torch.profiler trace of 2 epochs of a 2-worker loader (12 batches each) in
    `folder`; returns the DataLoader next() events in it, read straight off the JSON."""
    os.makedirs(folder, exist_ok=True)
    subprocess.run([sys.executable, "-c", KINETO_RUN, str(folder)], check=True, timeout=180,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    [name] = [n for n in os.listdir(folder) if n.endswith(".pt.trace.json")]
    with open(os.path.join(folder, name)) as handle:
        events = json.load(handle)["traceEvents"]
    return sum(1 for e in events if e.get("ph") == "X" and e.get("name") == KINETO_NEXT)


@pytest.fixture(scope="module")
def kineto_trial(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kineto") / "trace"
    return str(folder), record_kineto_trace(folder)


@pytest.mark.torch
def test_a_kineto_trace_says_not_recorded_instead_of_zero(kineto_trial):
    import dashboard

    folder, calls = kineto_trial
    assert calls == 2 * (12 + 1)  # 12 batches an epoch, and the call that ends each epoch
    trial = dashboard.load_trial(folder)
    view = views.trial_view(trial)
    panel = views.panels(view)
    assert panel["getnext"]["count"] == str(calls)
    for part in ("init", "workers"):
        assert panel[part]["count"] == "not recorded" and panel[part]["outlier_count"] == "-"
        assert panel[part]["note"].startswith("not recorded (PyTorch profiler trace)")
        assert panel[part]["median_us"] == "-" and panel[part]["outliers"] == []
        # Nothing to draw: the panel's figure and tables collapse to its one-line note.
        assert views.panel_body_class(panel[part]) == "panel-body collapsed"
    assert views.panel_body_class(panel["getnext"]) == "panel-body"
    assert "not recorded (PyTorch profiler trace)" in panel["init"]["figure"]["layout"]["annotations"][0]["text"]
    # The first batch of each epoch waits for the workers to start: an outlier, of no known worker.
    rows = panel["getnext"]["outliers"]
    assert rows and all(row["worker_id"] == "not recorded" for row in rows)
    assert all(row["worker_id"] == "not recorded" for row in panel["batchtime"]["outliers"])
    data = views.verdict_summary(view)
    result = dashboard.analyze(folder)
    assert data["class"] == result.verdict.class_ and data["percent"] == f"{result.verdict.input_percent:.1f}"
    assert data["not_recorded"].startswith("Not recorded (PyTorch profiler trace): iterator initialization, "
                                           "worker processes")
    page = summary_page(views.summary(trial), data)
    assert component_text(by_id(page, "not-recorded")) == data["not_recorded"]


@pytest.mark.torch
def test_a_kineto_traces_budget_and_what_if_are_the_librarys(kineto_trial):
    """A torch.profiler trace: its loaders' budgets and what-ifs, replayable or not, as the library
    says (a loader it cannot replay shows today's bar and why there is no prediction)."""
    import dashboard

    folder, _ = kineto_trial
    result = dashboard.analyze(folder)
    view = views.trial_view(dashboard.load_trial(folder))
    rows = views.budget_view(view)["rows"]
    assert [(r["node"], r["loader"]) for r in rows] == [(b.node, b.loader) for b in result.budget]
    for row, item in zip(rows, result.budget):
        assert row["parts"] == {part: item.parts[part] for part in item.parts}
        assert sum(row["parts"].values()) == pytest.approx(item.wait_s, abs=1e-6)
    shown = views.what_if_view(view, {"num_workers": 4})
    for row, want in zip(shown["rows"], result.what_if({"num_workers": 4})):
        if want.predicted is None:
            assert row["predicted"] is None and row["text"] == f"no prediction: {want.note}"
            assert any(a["text"] == "no prediction for this loader" for a in shown["figure"]["layout"]["annotations"])
        else:
            assert row["predicted"]["training_s"] == want.predicted["training_s"]


@pytest.mark.torch
def test_a_mixed_trial_says_where_it_was_not_recorded(kineto_trial, tmp_path):
    import dashboard

    folder, _ = kineto_trial
    mixed = tmp_path / "mixed"
    shutil.copytree(folder, mixed)
    written = synthetic.write_trial(str(mixed), epochs=2, train_batches=10, val_batches=0)
    trial = dashboard.load_trial(str(mixed))
    assert trial.format == "mixed"
    panel = views.panels(views.trial_view(trial))
    [kineto_process] = trial.kineto_processes
    kineto_node = next(p.node for p in trial.processes if p.id == kineto_process)
    assert panel["init"]["count"] == str(len(written.of_kind("init")))  # those recorded
    assert panel["workers"]["count"] == str(len(written.of_kind("worker")))
    assert panel["init"]["note"].startswith(f"not recorded on {kineto_process} (PyTorch profiler trace)")
    for row in panel["getnext"]["outliers"]:
        assert (row["worker_id"] == "not recorded") == (row["node"] == kineto_node)
    # The smdebug node alone: recorded, so nothing to say.
    alone = views.panels(views.trial_view(trial, "algo-1"))
    assert alone["init"]["note"] == "" and alone["init"]["count"] == str(len(written.of_kind("init")))


# --- the trial size limits -----------------------------------------------------------------------

def test_limits_refuse_a_large_trial_with_a_clear_message_and_cache_nothing(tmp_path):
    from dashboard.trial.errors import TrialTooLargeError

    folder = str(tmp_path / "trial")
    written = synthetic.write_trial(folder, epochs=2, train_batches=30, val_batches=0)
    events = len(written.events) + written.system_samples
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(folder) for n in names)
    cache = TrialCache(str(tmp_path / "cache"), 64)
    with pytest.raises(TrialTooLargeError) as error:
        cache.load(folder, roots=[str(tmp_path)], max_events=events // 2)
    message = views.load_error_text(error.value)
    assert folder in message and f"limit of {events // 2:,} events" in message
    assert "--max-events" in message and "DASHBOARD_MAX_EVENTS" in message
    with pytest.raises(TrialTooLargeError, match="over the limit"):
        cache.load(folder, roots=[str(tmp_path)], max_bytes=size // 2)
    assert len(cache.disk) == 0
    key, trial, _ = cache.load(folder, roots=[str(tmp_path)], max_events=events, max_bytes=size)
    assert len(trial.framework) + len(trial.system) == events


def test_size_limit_options_and_their_defaults(monkeypatch, tmp_path):
    import argparse

    import dash

    import app as entry
    from dashboard.web.options import DEFAULT_MAX_EVENTS, DEFAULT_MAX_TRIAL_MB
    from dashboard.web.server import options_from_args, options_from_environment

    parser = entry.build_parser()
    defaults = options_from_args(parser.parse_args(["serve"]))
    assert (defaults.max_trial_mb, defaults.max_events) == (DEFAULT_MAX_TRIAL_MB, DEFAULT_MAX_EVENTS)
    assert defaults.max_bytes == 2048 * 10**6 and defaults.max_events_limit == 50_000_000
    chosen = options_from_args(parser.parse_args(["serve", "--max-trial-mb", "5", "--max-events", "1000"]))
    assert chosen.max_bytes == 5_000_000 and chosen.max_events_limit == 1000
    off = options_from_args(parser.parse_args(["serve", "--max-trial-mb", "0", "--max-events", "0"]))
    assert off.max_bytes is None and off.max_events_limit is None
    for bad in (["--max-events", "-1"], ["--max-trial-mb", "lots"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", *bad])
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    help_text = " ".join(serve.format_help().split())
    assert "default 2048" in help_text and "default 50,000,000" in help_text
    env = options_from_environment({"DASHBOARD_MAX_TRIAL_MB": "7", "DASHBOARD_MAX_EVENTS": "0"})
    assert env.max_bytes == 7_000_000 and env.max_events_limit is None
    assert options_from_environment({}).max_events == DEFAULT_MAX_EVENTS
    with pytest.raises(ValueError, match="DASHBOARD_MAX_EVENTS"):
        options_from_environment({"DASHBOARD_MAX_EVENTS": "many"})
    # The server passes them on to every load.
    contexts = []
    from dashboard.web import server

    monkeypatch.setattr(server, "register_callbacks", lambda app, context: contexts.append(context))
    monkeypatch.setattr(dash.Dash, "run", lambda self, **kwargs: None)
    monkeypatch.setattr(server, "run_server", lambda app, host, port: None)
    assert entry.main(["--cache-dir", str(tmp_path / "c"), "--max-trial-mb", "3", "--max-events", "99"]) == 0
    assert (contexts[-1].max_bytes, contexts[-1].max_events) == (3_000_000, 99)


def test_entries_an_older_version_pickled_are_read_again_not_a_crash(tmp_path, monkeypatch):
    """A server upgraded over an old cache folder: entries that no longer unpickle are misses."""
    import importlib

    import diskcache

    folder = str(tmp_path / "trial")
    written = synthetic.write_trial(folder, epochs=1, train_batches=10, val_batches=0)
    cache_dir = str(tmp_path / "cache")
    key, _, _ = TrialCache(cache_dir, 64).load(folder, roots=[str(tmp_path)])
    # Every entry replaced by an object of a module that is gone by the time it is read.
    (tmp_path / "old_release.py").write_text("class Entry:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    old_release = importlib.import_module("old_release")
    with diskcache.Cache(os.path.join(cache_dir, "trials")) as disk:
        names = list(disk)
        assert f"trial:{key}" in names
        for name in names:
            disk.set(name, old_release.Entry())
    # Each file's parse is kept as Arrow columns: those of an older layout are misses too.
    columns = [os.path.join(cache_dir, "columns", n) for n in os.listdir(os.path.join(cache_dir, "columns"))]
    assert len(columns) == len(written.framework_files) + len(written.system_files)
    for name in columns:
        with open(name, "r+b") as handle:
            handle.write(b"DLPCOL00")  # another version's magic
    (tmp_path / "old_release.py").unlink()
    monkeypatch.delitem(sys.modules, "old_release")
    with pytest.raises(ModuleNotFoundError):
        diskcache.Cache(os.path.join(cache_dir, "trials")).get(f"trial:{key}")  # really unreadable
    key2, trial, cached = TrialCache(cache_dir, 64).load(folder, roots=[str(tmp_path)])
    assert key2 == key and cached is False
    assert (trial.framework["kind"] == "getnext").sum() == len(written.of_kind("getnext"))


# --- the queue of background loads (web/jobs.py) ---------------------------------------------------

def test_a_forked_jobs_writes_outlive_another_server_process_closing_the_store(tmp_path):
    """A background load is forked from a server process whose other thread (the queue's
    dispatcher) had its connection to the job store open. SQLite's books of its locks are per
    process and the fork copies them: the child's connection took its lock from the copy and
    held none the kernel knew of. The other gunicorn worker, closing its connection after a
    poll, found itself the last one, checkpointed and deleted the WAL, and the child's result
    went into the deleted file: "ended without a result" (CI). The result must be read."""
    import multiprocessing
    import threading

    from dashboard.web.cache import ForkSafeCache

    folder = str(tmp_path / "jobs")
    store = ForkSafeCache(folder)
    store.set("warm", 1)  # this thread's connection, as the request that starts the job has it
    opened, release, released = threading.Event(), threading.Event(), threading.Event()

    def dispatcher():  # a dispatch round, its connection open while it sleeps before the next
        store.get("job-queue")
        opened.set()
        release.wait(30)
        store.get("job-queue")  # its next round, on a new connection (the fork closed its own)
        store.close()
        released.set()

    threading.Thread(target=dispatcher, daemon=True).start()
    assert opened.wait(30)
    context = multiprocessing.get_context("fork")  # as Dash starts its jobs
    wrote_first, write_result = context.Event(), context.Event()
    job = context.Process(target=_write_progress_then_result, args=(store, wrote_first, write_result))
    job.start()
    release.set()  # the request ends and the dispatcher stops: this process closes its connections
    assert released.wait(30)
    store.close()
    assert wrote_first.wait(30)
    poll = [sys.executable, "-c", "import sys, diskcache; c = diskcache.Cache(sys.argv[1]); "
            "print(c.get('progress')); c.close()", folder]  # another server process's poll
    assert subprocess.run(poll, capture_output=True, text=True, check=True).stdout.strip() == "1"
    write_result.set()
    job.join(30)
    assert job.exitcode == 0
    poll[2] = poll[2].replace("'progress'", "'result'")
    assert subprocess.run(poll, capture_output=True, text=True, check=True).stdout.strip() == "42"
    assert store.get("result") == 42


def _write_progress_then_result(store, wrote_first, write_result) -> None:
    store.set("progress", 1)
    wrote_first.set()
    write_result.wait(30)
    store.set("result", 42)


def test_the_queue_dispatcher_leaves_no_sqlite_connection_open_and_closes_inside_the_fork_guard(tmp_path,
                                                                                                 monkeypatch):
    """The dispatcher thread ends when no job waits. Its connection to the job store, left to
    the thread's end, was closed outside the fork guard while another thread forked a load: the
    child hung for ever on SQLite's memory mutex (seen by gdb in a loaded burst of loads). (One
    open between its rounds is closed by a fork first: the forked job's lost result above.)"""
    import threading

    import diskcache

    from dashboard.web.cache import FORK_GUARD, ForkSafeCache
    from dashboard.web.jobs import QueueingManager

    manager = QueueingManager(ForkSafeCache(str(tmp_path / "jobs")), limit=1)
    closes, left_open = [], []
    close = diskcache.Cache.close

    def recording_close(self):
        if getattr(self._local, "con", None) is not None:
            closes.append(FORK_GUARD._inside > 0)  # a fork waits while a thread is inside
        close(self)

    monkeypatch.setattr(diskcache.Cache, "close", recording_close)

    def dispatcher():
        manager.handle.get("anything")  # the thread's connection, as a dispatch round opens it
        manager._dispatch_while_pending()  # nothing pending: it ends at once
        left_open.append(getattr(manager.handle._local, "con", None))

    thread = threading.Thread(target=dispatcher)
    thread.start()
    thread.join(30)
    assert left_open == [None] and closes == [True]


def test_a_request_leaves_no_cache_connection_open_and_closes_inside_the_fork_guard(tmp_path, monkeypatch):
    """The development server runs each connection in a thread that ends with it: the same
    hang as the dispatcher's, from every request thread, had a request left one open."""
    import diskcache

    from dashboard.web.cache import FORK_GUARD
    from dashboard.web.cache import JOBS_FOLDER
    from dashboard.web.server import ServerOptions, create_app

    closes = []
    close = diskcache.Cache.close

    def recording_close(self):
        if getattr(self._local, "con", None) is not None:
            closes.append((os.path.basename(self.directory), FORK_GUARD._inside > 0))
        close(self)

    monkeypatch.setattr(diskcache.Cache, "close", recording_close)
    app = create_app(ServerOptions(cache_dir=str(tmp_path / "cache")))
    jobs = app._background_manager.handle
    # A request that reads the job store, as every poll of a background load does.
    app.server.add_url_rule("/probe", "probe", lambda: (str(jobs.get("job-queue")), 200))
    assert app.server.test_client().get("/probe").status_code == 200
    assert (JOBS_FOLDER, True) in closes and all(inside for _, inside in closes), closes
    assert getattr(jobs._local, "con", None) is None  # (the test client runs the request in this thread)


def test_the_last_progress_a_job_reports_reaches_the_page_while_it_polls(tmp_path):
    """A load reports its progress as it reads; the page polls for it. Dash's manager read the
    report and then deleted it, so one written in between was deleted unread, and a load that
    then stopped reporting (every file it waits for hangs on S3) showed the report before it for
    good (the S3 hardening test waited 30 s for "Read N of M files" in CI). Here a job process
    writes 50 reports, the last one last, while this process polls as fast as it can: with
    Dash's read-then-delete, the last one was lost in 38 runs of 40; a poll must get it in each of
    10 runs (an atomic pop cannot lose it: 0 of 40)."""
    import multiprocessing

    from dashboard.web.cache import ForkSafeCache
    from dashboard.web.jobs import QueueingManager

    manager = QueueingManager(ForkSafeCache(str(tmp_path / "jobs")), limit=1)
    progress_key = manager._make_progress_key("load-key")
    context = multiprocessing.get_context("fork")  # as Dash starts its jobs
    for run in range(10):
        writer = context.Process(target=_report_progress, args=(str(tmp_path / "jobs"), progress_key, run))
        writer.start()
        seen = []
        while writer.is_alive():
            if (reported := manager.get_progress("load-key")) is not None:
                seen.append(reported)
        writer.join(30)
        assert writer.exitcode == 0
        if (reported := manager.get_progress("load-key")) is not None:  # written just before it ended
            seen.append(reported)
        assert seen and seen[-1] == [run, 49], (run, seen[-3:])


def _report_progress(folder: str, progress_key: str, run: int) -> None:
    from dashboard.web.cache import ForkSafeCache

    with ForkSafeCache(folder) as reports:
        for done in range(50):
            reports.set(progress_key, [run, done])


def test_a_result_written_as_its_job_ends_between_dashs_two_reads_is_collected(tmp_path):
    """Dash reads a job's result, then asks whether the job runs; "no result, not running" is a
    cancelled job (the page stops waiting). A job that wrote its result and ended in between
    must still be collected."""
    from dashboard.web.cache import ForkSafeCache
    from dashboard.web.jobs import QueueingManager

    manager = QueueingManager(ForkSafeCache(str(tmp_path / "jobs")), limit=1)
    key, job = "result-key", "q7"
    with manager.handle.transact():
        manager.handle.set("job-queue", {7: ["no-such-host:1:x", 0, time.time(), None]})
    reads = []
    real_get = manager.handle.get

    def get(name, default=None, *args, **kwargs):
        if name == key:
            reads.append(name)
            if len(reads) == 1:  # the job writes its result and ends just after Dash's read
                manager.handle.set(key, "the result")
                with manager.handle.transact():
                    manager.handle.set("job-queue", {})
                return default
        return real_get(name, default, *args, **kwargs)

    manager.handle.get = get
    assert manager.get_result(key, job) == "the result"
    manager.terminate_job("q8")  # the page started another load: its poll of this one is answered nothing
    assert manager.get_result("never-written", "q8") is manager.UNDEFINED


def test_a_job_that_writes_its_result_and_ends_just_after_the_read_is_polled_again(tmp_path):
    """Dash reads a job's result, then asks whether the job runs: a job found running at the read
    that wrote its result and ended before that question was answered "not running", and Dash
    answered the page's poll with HTTP 204 ("cancelled"; CI's burst test: 1 page of 50 with
    nothing in the server's log). The answer follows the read: still running, polled again."""
    from dashboard.web import jobs
    from dashboard.web.cache import ForkSafeCache

    manager = jobs.QueueingManager(ForkSafeCache(str(tmp_path / "jobs")), limit=1)
    job = _sleeper()
    try:
        with manager.handle.transact():
            manager.handle.set(jobs.JOB_QUEUE, {2: ["owner", job.pid, time.time(), jobs._identity(job.pid)]})
        assert manager.get_result("key-2", "q2") is manager.UNDEFINED  # Dash's read: running, no result
        manager.handle.set("key-2", "the result")  # the job writes its result and ends
        job.kill()
        job.wait(10)
        assert manager.job_running("q2")  # Dash's question after that read: still running
        assert not manager.job_running("q2")  # (any later question: the truth)
        assert manager.get_result("key-2", "q2") == "the result"  # the page's next poll
    finally:
        job.kill()
        job.wait(10)


def test_a_job_whose_process_ended_without_a_result_is_told_to_its_page(tmp_path):
    """Dash takes "no result, not running" for a cancelled job and answers the poll with nothing:
    a load killed by the out-of-memory killer left its page silent. Only a job ended by
    terminate_job (the page's cancel, or its result taken) stays silent."""
    from dashboard.web import jobs
    from dashboard.web.cache import ForkSafeCache

    manager = jobs.QueueingManager(ForkSafeCache(str(tmp_path / "jobs")), limit=1)
    job = _sleeper()
    identity = jobs._identity(job.pid)
    with manager.handle.transact():
        manager.handle.set(jobs.JOB_QUEUE, {4: ["owner", job.pid, time.time(), identity]})
    assert manager.get_result("key-4", "q4") is manager.UNDEFINED  # running, no result yet
    job.kill()  # (as the out-of-memory killer does: nothing written)
    job.wait(10)
    assert manager.get_result("key-4", "q4") == {"background_callback_error": {"msg": jobs.ENDED_WITHOUT_RESULT,
                                                                              "tb": ""}}
    manager.handle.set("key-5", "the result")
    assert manager.get_result("key-5", "q5") == "the result"  # (a result taken ends its job: terminate_job)
    assert manager.get_result("key-5", "q5") is manager.UNDEFINED  # a poll after that is not told of a failure


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_finished_jobs_place_is_freed_only_once_its_process_is_gone(tmp_path, monkeypatch):
    """Dash terminates a job when it collects its result. Freed before the kill, the place let
    the next load start while this one's process still ran (2 loads at once with a limit of 1,
    with two cores busy)."""
    from dashboard.web import jobs
    from dashboard.web.cache import ForkSafeCache

    job = _sleeper()
    try:
        manager = jobs.QueueingManager(ForkSafeCache(str(tmp_path / "jobs")), limit=1)
        with manager.handle.transact():
            manager.handle.set(jobs.JOB_QUEUE, {3: ["owner", job.pid, time.time(), jobs._identity(job.pid)]})
        held_at_kill = []
        kill = jobs._kill

        def recording_kill(pid, identity):
            held_at_kill.append(3 in (manager.handle.get(jobs.JOB_QUEUE) or {}))
            kill(pid, identity)
            job.wait(10)  # reaped here, as the server reaps the children it forked

        monkeypatch.setattr(jobs, "_kill", recording_kill)
        manager.terminate_job("q3")
        assert held_at_kill == [True]
        assert job.poll() is not None
        assert 3 not in manager.handle.get(jobs.JOB_QUEUE)
    finally:
        job.kill()
        job.wait(10)


def test_a_job_cancelled_while_it_starts_is_killed_once_forked(tmp_path, monkeypatch):
    """terminate_job on a place still "starting" frees it at once; the process forked for it a
    moment later must not run without a place."""
    import dash

    from dashboard.web import jobs
    from dashboard.web.cache import ForkSafeCache

    manager = jobs.QueueingManager(ForkSafeCache(str(tmp_path / "jobs")), limit=1)
    forked = []

    def fork_while_cancelled(self, key, job_fn, args, context):
        manager.terminate_job("q1")  # the page gave up while the fork ran
        forked.append(_sleeper())
        return forked[-1].pid

    monkeypatch.setattr(dash.DiskcacheManager, "call_job_fn", fork_while_cancelled)
    monkeypatch.setattr(manager, "_keep_dispatching", lambda: None)  # this test dispatches itself
    manager._token = "owner-token"
    with manager.handle.transact():
        manager.handle.set(jobs.JOB_QUEUE, {1: [manager._token, 0, time.time(), None]})
    manager._pending[1] = ("key", None, (), None)
    monkeypatch.setattr(jobs, "_process_alive", lambda token: True)
    manager._dispatch()
    try:
        assert len(forked) == 1
        assert forked[0].wait(10) is not None  # killed
        assert 1 not in (manager.handle.get(jobs.JOB_QUEUE) or {})
        assert not manager.job_running("q1")
    finally:
        for process in forked:
            process.kill()
            process.wait(10)


def test_a_running_jobs_place_outlasts_any_age_but_not_its_process(tmp_path):
    """A long load keeps its place (it expired after 10 minutes, and the limit was broken); a
    pid given to a later process is not the job's."""
    from dashboard.web import jobs
    from dashboard.web.cache import ForkSafeCache

    job = _sleeper()
    try:
        manager = jobs.QueueingManager(ForkSafeCache(str(tmp_path / "jobs")), limit=1)
        identity = jobs._identity(job.pid)
        an_hour_ago = time.time() - 3600
        with manager.handle.transact():
            manager.handle.set(jobs.JOB_QUEUE, {5: ["owner", job.pid, an_hour_ago, identity],
                                                6: ["owner", job.pid, an_hour_ago, identity + 1]})
        assert manager.job_running("q5")
        assert not manager.job_running("q6")  # the same pid, another process
        assert sorted(manager._live(manager.handle.get(jobs.JOB_QUEUE))) == [5]
    finally:
        job.kill()
        job.wait(10)


def test_a_running_jobs_place_outlasts_a_step_of_the_wall_clock(tmp_path, monkeypatch):
    """psutil gives a process's start time as the kernel's boot time plus the time since boot,
    and the kernel's boot time moves when the wall clock is stepped (a virtual machine's clock
    set after a pause, NTP). Told by that start time, a running load became "another process":
    its place was freed and its page told that it had been cancelled (CI: 1 page of 50 in a
    burst of loads). Here the boot time psutil reads moves by a second, as the kernel's does."""
    import psutil

    from dashboard.web import jobs
    from dashboard.web.cache import ForkSafeCache

    job = _sleeper()
    try:
        manager = jobs.QueueingManager(ForkSafeCache(str(tmp_path / "jobs")), limit=1)
        with manager.handle.transact():
            manager.handle.set(jobs.JOB_QUEUE, {9: ["owner", job.pid, time.time(), jobs._identity(job.pid)]})
        assert manager.job_running("q9")
        started = psutil.Process(job.pid).create_time()
        booted = psutil._psplatform.boot_time
        monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: booted() + 1.0)
        assert psutil.Process(job.pid).create_time() - started == pytest.approx(1.0, abs=0.01)  # the step
        assert manager.job_running("q9")
        assert sorted(manager._live(manager.handle.get(jobs.JOB_QUEUE))) == [9]
    finally:
        job.kill()
        job.wait(10)


def test_server_processes_of_one_cache_folder_sign_job_handles_alike_even_when_the_store_is_busy(
        monkeypatch, tmp_path):
    """Two server processes (gunicorn's workers) of one cache folder: a load's handles signed by
    one must verify in the other, where the page's next poll may go. Dash looks the secret up at
    a process's first request and, when the jobs' store does not answer then (a busy SQLite
    raises diskcache's Timeout), silently signs with a secret of that process alone."""
    import diskcache

    from dashboard.web.jobs import QueueingManager
    from dashboard.web.server import ServerOptions, create_app

    def busy(self, generate):
        raise diskcache.Timeout("database is locked")

    monkeypatch.setattr(QueueingManager, "get_or_create_signing_secret", busy)
    first = create_app(ServerOptions(cache_dir=str(tmp_path / "cache")))
    second = create_app(ServerOptions(cache_dir=str(tmp_path / "cache")))
    other = create_app(ServerOptions(cache_dir=str(tmp_path / "other")))
    secret = first._get_signing_secret()
    assert len(secret) >= 32 and second._get_signing_secret() == secret
    assert other._get_signing_secret() != secret  # a secret per cache folder, not a constant
    assert os.stat(tmp_path / "cache" / "signing-secret").st_mode & 0o777 == 0o600


def test_a_background_load_parses_a_large_local_trial_on_every_core(tmp_path):
    """A dashboard's load runs in a process of its own (Dash forks one per load), without other
    threads: its files are parsed in as many forked processes as there are cores, and it keeps
    exactly what a load in one process keeps. (The threaded server process itself never forks:
    test_trial_reader's test_a_process_with_other_threads_parses_in_itself_never_forking.)"""
    from dashboard.trial.load import load_trial
    from tests.forked_load import kept

    synthetic.write_trial(tmp_path / "trial", epochs=1)
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "forked_load.py"), "--web",
                           str(tmp_path / "trial"), str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    cores = os.cpu_count() or 1
    assert loaded.pop("forked") == ([cores] if cores > 1 else [])
    assert loaded == json.loads(json.dumps(kept(load_trial(str(tmp_path / "trial")))))


def test_the_cache_pickles_columns_without_a_value_as_their_length(tmp_path):
    """A trial read back from the web cache equals the trial; its columns without a value
    (most settings columns of most events) cost no bytes in the pickle, and the others
    (partly missing, or full) are kept as they are."""
    import pickle

    from dashboard.trial.load import load_trial
    from dashboard.web.cache import compact_pickle

    synthetic.write_trial(tmp_path / "trial", epochs=2)
    trial = load_trial(str(tmp_path / "trial"))
    framework = trial.framework
    empty = [name for name in framework.columns if framework[name].isna().all()]
    partly = [name for name in framework.columns if 0 < framework[name].isna().sum() < len(framework)]
    assert len(empty) >= 5 and partly  # (the reference's events: settings only on inits)
    compact, plain = compact_pickle(trial, pickle.HIGHEST_PROTOCOL), pickle.dumps(trial, pickle.HIGHEST_PROTOCOL)
    back = pickle.loads(compact)
    pd.testing.assert_frame_equal(back.framework, framework, check_exact=True)
    pd.testing.assert_frame_equal(back.system, trial.system, check_exact=True)
    assert back.report == trial.report
    # Each empty Int64/boolean column held 9 or 2 bytes a row in the plain pickle.
    assert len(plain) - len(compact) >= len(empty) * 2 * len(framework)


def test_a_new_server_processes_first_drag_reads_the_loaders_batches_from_the_disk(tmp_path, monkeypatch):
    """The batches a window draws for the loader (every batch of it, computed from the trial's
    events) are kept on the cache's disk: another server process's drag draws the same window
    from them, without computing them again."""
    from dashboard.analysis import per_batch
    from dashboard.web.callbacks import Context, draw_window

    synthetic.write_trial(tmp_path / "trial", epochs=2)
    first = Context(cache=TrialCache(str(tmp_path / "cache")), default_trial="", roots=[str(tmp_path)])
    key, trial, _ = first.cache.load(str(tmp_path / "trial"))
    third = (trial.end_us - trial.start_us) // 3
    window = (trial.start_us + third, trial.end_us - third)
    drawn = draw_window(first, key, None, *window, ".*", ".*", None, None)
    assert drawn["window_figure"]["data"]  # (the batches among them: the figure's own tests)

    def recomputed(*args, **kwargs):
        raise AssertionError("the loader's batches computed again")

    monkeypatch.setattr(per_batch, "loader_batches", recomputed)
    second = Context(cache=TrialCache(str(tmp_path / "cache")), default_trial="", roots=[str(tmp_path)])
    assert draw_window(second, key, None, *window, ".*", ".*", None, None) == drawn


def test_a_failure_a_load_cannot_report_itself_is_said_in_its_error_output():
    """The server's error handler: a failure of a callback that has the page's error output (the
    loads: their job store not answering a poll, their process gone) is said there; the page
    stopped waiting and said nothing before. Another callback's failure leaves its outputs."""
    import dash
    from dash import Input, Output, html

    from dashboard.web.layout import Ids
    from dashboard.web.server import _log_failed_callback

    app = dash.Dash(__name__, on_error=_log_failed_callback)
    app.layout = html.Div([html.Div(id="ask"), html.Div(id=Ids.ERROR), html.Div(id="other"), html.Div(id="note")])

    @app.callback(Output("other", "children"), Output(Ids.ERROR, "children"), Input("ask", "children"))
    def load_like(_):
        raise TimeoutError("the job store did not answer")

    @app.callback(Output("note", "children"), Input("ask", "children"))
    def other(_):
        raise TimeoutError("the job store did not answer")

    def call(outputs: list[tuple[str, str]]):
        output = "...".join(f"{i}.{p}" for i, p in outputs)  # (Dash's id of several outputs)
        return app.server.test_client().post("/_dash-update-component", json={
            "output": f"..{output}.." if len(outputs) > 1 else output,
            "outputs": [{"id": i, "property": p} for i, p in outputs] if len(outputs) > 1
            else {"id": outputs[0][0], "property": outputs[0][1]},
            "inputs": [{"id": "ask", "property": "children", "value": "x"}], "changedPropIds": ["ask.children"]})

    told = call([("other", "children"), (Ids.ERROR, "children")])
    assert told.status_code == 200, told.data
    assert told.get_json()["response"] == {Ids.ERROR: {"children": "This request failed on the server "
                                                                   "(TimeoutError); try again (the server log says more)."}}
    untold = call([("note", "children")])
    assert untold.status_code == 200 and not untold.get_json()["response"], untold.data  # nothing changed


def test_an_outlier_table_names_the_process_that_loaded_each_batch():
    # The format's worker id -1 is a batch loaded in the training process (num_workers=0): the
    # table said "-1"; a Kineto host's missing id says "not recorded"; a worker's, its number.
    frame = pd.DataFrame({"start_us": [1_000, 2_000, 3_000], "end_us": [1_500, 2_700, 3_900],
                          "duration_us": [500, 700, 900], "worker_id": [-1, 3, np.nan], "pid": [10, 10, 11],
                          "node": ["algo-1", "algo-1", "algo-2"]})
    rows = views.outlier_rows(frame, "duration_us", unrecorded_hosts=["algo-2"])
    assert [row["worker_id"] for row in rows] == ["main process", 3, "not recorded"]
    assert views.outlier_csv(rows).splitlines()[1].split(",")[6] == "main process"
