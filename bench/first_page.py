"""Benchmark: the dashboard's first page of a large trial, cold and warm, in server time.

A new `app.py serve` process on a new cache folder opens the trial (cold: the parse, the
analyses, the page drawn), then RUNS new server processes on the same folder open it again
(warm: what a second server process, a restart or another gunicorn worker does). Each page is
driven over HTTP as the browser's renderer drives it (tests/dash_http.py): the load (the
background job, polled every 0.1 s), the panels, the first window (the whole job), the ranks.
Times are the server's answers as the client sees them on loopback; RSS is the server
process's after the page. The trial is bench/diagnosis.py's 3M-GetNext one unless --size says.
Target (issue "Trials of any size"): the first page of a warm 3M trial in <= 2 s of server time.
Then drags (a hundredth of the job, its middle third, the whole job again), with the server's RSS
after each: the first steps that need the trial's events. Warm servers run with the default event
budget (--event-budget-mb 1024: a window reads only its files) and without one (the whole trial
read back), alternating.

    python3 bench/first_page.py [--runs 3] [--size 3000000]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
from diagnosis import SIZES, make_trial  # noqa: E402  (bench/, the script's own folder)
from stats import spread  # noqa: E402
from tests.test_server_hardening import AppServer, loaded_store, request_load, server_env  # noqa: E402
from tests.dash_http import DashSession  # noqa: E402

STEPS = ("load", "panels", "window", "ranks", "what-if")


def first_page(url: str, trial: str, rss_mb) -> dict:
    """Seconds of each step of one page's first view of `trial`, then of a drag; rss_mb(): the
    server's RSS, read after the first page."""
    page = DashSession(url, timeout=900).open()
    times = {}
    started = time.perf_counter()
    loaded = page.call_background(page.find("trial-store.data"), {"load-request.data": request_load(page, trial)},
                                  ["load-request.data"], poll_s=0.1, timeout_s=900)
    times["load"] = time.perf_counter() - started
    store = loaded_store(loaded)
    calls = {
        "panels": ("getnext-count.children", {"trial-store.data": store, "node-select.value": ""}, "trial-store.data"),
        "window": ("window-store.data", {"trial-store.data": store}, "trial-store.data"),
    }
    for step, (output, values, trigger) in calls.items():
        started = time.perf_counter()
        result = page.call(page.find(output), values, [trigger])
        assert result.status == 200, result.text[:300]
        if step == "window":  # the window store, then the figures of that window
            window = result.values["window-store.data"]
            result = page.call(page.find("window-graph.figure"),
                               {"window-store.data": window, "select-events.value": ".*",
                                "select-dimensions.value": ".*", "node-select.value": "",
                                "what-if-loader.value": "", "trial-store.data": store}, ["window-store.data"])
            assert result.status == 200 and not result.values.get("window-error.children"), result.text[:300]
        times[step] = time.perf_counter() - started
    started = time.perf_counter()
    result = page.call(page.find("rank-heatmap.figure"),
                       {"trial-store.data": store, "rank-order.value": "host", "window-store.data": window},
                       ["trial-store.data"])
    assert result.status == 200, result.text[:300]
    times["ranks"] = time.perf_counter() - started
    # The what-if fires on every load as well (today's bars), as the browser's page asks it.
    started = time.perf_counter()
    result = page.call(page.find("what-if-graph.figure"),
                       {"what-if-num-workers.value": None, "what-if-prefetch-factor.value": None,
                        "what-if-in-order.value": "", "what-if-persistent-workers.value": "",
                        "what-if-loader.value": "", "trial-store.data": store, "node-select.value": ""},
                       ["trial-store.data"])
    assert result.status == 200 and not result.values.get("what-if-error.children"), result.text[:300]
    times["what-if"] = time.perf_counter() - started
    times["all"] = sum(times[step] for step in STEPS)
    times["rss_mb"] = rss_mb()
    # Then drags: a hundredth of the job in its middle, its middle third, and the whole job again
    # (the first window's own range, redrawn with another events filter: not a kept page part).
    # The first steps that need the trial's events: without an event budget (or within it), a
    # warm server reads the whole trial back for them; over it, each reads its window's files.
    span = window["end_us"] - window["start_us"]
    middle = window["start_us"] + span // 2
    drags = {"hundredth": (middle - span // 200, middle + span // 200, ".*"),
             "third": (window["start_us"] + span // 3, window["end_us"] - span // 3, ".*"),
             "whole": (window["start_us"], window["end_us"], "GetNext|Step")}
    for name, (lo, hi, events) in drags.items():
        started = time.perf_counter()
        result = page.call(page.find("window-graph.figure"),
                           {"window-store.data": dict(window, start_us=lo, end_us=hi), "select-events.value": events,
                            "select-dimensions.value": ".*", "node-select.value": "",
                            "what-if-loader.value": "", "trial-store.data": store}, ["window-store.data"])
        assert result.status == 200, result.text[:300]
        error = result.values.get("window-error.children") or ""
        assert not error or "event budget" in error, error
        times[f"drag_{name}"] = time.perf_counter() - started
        times[f"drag_{name}_refused"] = bool(error)
        times[f"drag_{name}_rss_mb"] = rss_mb()
    return times


def one_server(work: str, cache: str, trial: str, name: str, budget_mb: int | None) -> dict:
    import psutil

    budget = [] if budget_mb is None else ["--event-budget-mb", str(budget_mb)]
    server = AppServer(os.path.join(work, f"{name}.log"), "serve", "--cache-dir", cache, "--data-root",
                       os.path.dirname(trial), "--max-trial-mb", "100000", *budget, env=server_env(pathlib.Path(work)))
    server.wait_ready()
    try:
        return first_page(server.url, trial, lambda: psutil.Process(server.process.pid).memory_info().rss / 2**20)
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="warm server processes after the cold one, of each kind")
    parser.add_argument("--size", default="3000000", choices=sorted(SIZES))
    args = parser.parse_args()
    trial = make_trial(args.size)
    work = tempfile.mkdtemp(prefix="first-page-")
    # Warm servers with the default event budget (1 GB) and without one, alternating: the drags'
    # memory both ways, in one run.
    kinds = {"budget": None, "no budget": 0}
    try:
        cache = os.path.join(work, "cache")
        cold = one_server(work, cache, trial, "cold", None)
        warm = {kind: [] for kind in kinds}
        for i in range(args.runs):
            for kind, budget in kinds.items():
                warm[kind].append(one_server(work, cache, trial, f"warm{i}-{budget}", budget))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"trial {os.path.relpath(trial, ROOT)}")
    print("cold: " + ", ".join(f"{k} {cold[k]:.2f} s" for k in (*STEPS, "all")) + f"; server RSS {cold['rss_mb']:.0f} MB")
    for kind in kinds:
        runs = warm[kind]
        print(f"warm, {kind}:")
        for key in (*STEPS, "all"):
            print(f"  {key}: {spread([w[key] for w in runs], 2)} s")
        print(f"  server RSS after the first page: {spread([w['rss_mb'] for w in runs], 0)} MB")
        for drag in ("hundredth", "third", "whole"):
            refused = sum(w[f"drag_{drag}_refused"] for w in runs)
            print(f"  then a drag over the job's {drag}: {spread([w[f'drag_{drag}'] for w in runs], 2)} s, "
                  f"server RSS after it {spread([w[f'drag_{drag}_rss_mb'] for w in runs], 0)} MB"
                  + (f" (refused: over the event budget, {refused} of {len(runs)})" if refused else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
