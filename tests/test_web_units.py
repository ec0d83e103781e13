"""The dashboard's parts without a browser: decimation, figures, ranges, the trial cache, options."""
from __future__ import annotations

import base64
import os
import statistics

import numpy as np
import pandas as pd
import pytest

from dashboard import synthetic
from dashboard.analysis import dataloader, decimate
from dashboard.trial.errors import NotATrialError, TrialAccessError, TrialNotFoundError
from dashboard.web import figures, views
from dashboard.web.cache import TrialCache


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
    titles = [a["text"] for a in layout["annotations"]]
    for title in ("CPU utilization", "I/O wait", "GPU utilization", "GPU memory", "Memory used",
                  "I/O operations", "I/O throughput", "Network", "Framework events"):
        assert any(title in t for t in titles), (title, titles)
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
    titles = [a["text"] for a in spec["layout"]["annotations"]]
    # cpu0 names both of its dimensions: utilization and I/O wait.
    assert len(titles) == 3 and "CPU utilization" in titles[0] and "I/O wait" in titles[1]
    assert "Framework" in titles[2]
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


def test_window_payload_refines_the_overview_inside_the_window(big_trial):
    written, trial = big_trial
    view = views.trial_view(trial)
    g = written.of_kind("getnext")
    lo, hi = g[5000].start_us, g[5400].end_us
    whole = views.window_payload(view, *view.span)
    zoomed = views.window_payload(view, lo, hi)
    assert zoomed["window_range"] == f"{views.iso_utc(lo)} – {views.iso_utc(hi)}"

    def inside(spec):
        trace = next(t for t in spec["data"] if t["name"] == "GetNext (ms)")
        x = _decoded(trace["x"]) * 1000
        return int(((x >= lo) & (x <= hi)).sum())

    assert inside(zoomed["overview_figure"]) > inside(whole["overview_figure"])
    assert inside(zoomed["overview_figure"]) == 401  # few enough to send each of them
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


def test_plain_numbers():
    assert views.plain_number(1000.0, 1) == "1000"
    assert views.plain_number(1000.5, 1) == "1000.5"
    assert views.plain_number(0.0123450, 7) == "0.012345"
    assert views.plain_number(None, 1) == "-"


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
    assert f"analysis:{key}:algo-2:2" in cache.disk


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

    calls = []
    monkeypatch.setattr(dash.Dash, "run", lambda self, **kwargs: calls.append(kwargs))
    assert entry.main(["--cache-dir", str(tmp_path / "c"), "--port", "8123"]) == 0
    assert calls == [{"host": "127.0.0.1", "port": 8123, "debug": False}]
    assert entry.main(["serve", "--cache-dir", str(tmp_path / "c"), "--dev-debug"]) == 0
    assert calls[-1]["debug"] is True


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
    assert float(panel["batchtime"]["median_s"]) == pytest.approx(statistics.median(gaps), abs=1e-7)
    assert panel["getnext"]["count"] == str(len(written.of_kind("getnext")))
