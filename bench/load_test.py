"""Load test: the app under gunicorn, concurrent clients driving real Dash callbacks.

Starts `gunicorn --worker-class dashboard.serving.BufferingWorker -w 3 --threads 4 -b
127.0.0.1:<free port> app:server` (as README's Serving runs it; `--worker-class gthread` for
gunicorn's own) on a synthetic trial
with a fresh cache folder, waits for it to answer, then runs CLIENTS concurrent clients.
Each is one page load driven over HTTP as the browser's renderer drives it (tests/dash_http.py):
open the page, request the load from the URL, run the background load (start, then poll
every `interval` as the renderer does), draw the panels and the first window, then alternate
dragging the window on the overview and clicking GetNext outliers (each a window change
and a redraw) until it has made REQUESTS requests. Every answer is checked (status, counts,
the window it chose, no error message); any failure is an error.

Bounded: CLIENTS x REQUESTS requests, plus the load's polls (at most MAX_POLLS per client, as
many as the load takes at the renderer's interval), every request with a 30 s timeout, the
clients stopped at --time-limit seconds; traffic goes to 127.0.0.1 only. Exits non-zero on any
error (a failed request or check, a client over the limit, an error in the server's log).

    python3 bench/load_test.py [--clients 20] [--requests 25] [--runs 3] [--worker-class gthread] [--json]

Reports per run and, over several runs, the median and the range (min-max) of:
throughput (requests/s over the clients' wall time), p50/p99 latency per callback kind,
the load's end-to-end time, and errors.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from dashboard.synthetic import write_trial  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.dash_http import CallbackFailed, DashSession, text_of  # noqa: E402

HOST = "127.0.0.1"
MAX_POLLS = 240  # per load: 60 s at the load's 250 ms interval
REQUEST_TIMEOUT_S = 30
# Outliers are shown with half their length on each side, at least 1 ms (views.outlier_window):
# restated here so the check does not use the code under test.
OUTLIER_MARGIN, MIN_MARGIN_US = 0.5, 1_000
KINDS = ["page", "request_load", "load_start", "load_poll", "show_trial", "first_window", "drag_window",
         "click_outlier", "show_window"]


def plotly_date(us: int) -> str:
    """A date as plotly's relayoutData gives it (UTC, no zone)."""
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


# --- the trial and what the page must show ----------------------------------------------------

def make_trial(folder: str, batches: int) -> dict:
    hosts, epochs = 2, 5
    per_epoch = max(10, batches // (hosts * epochs))
    slow = {(0, 7): 60_000, (1, 20): 90_000, (2, 3): 75_000, (3, 11): 50_000, (4, 5): 120_000}
    written = write_trial(folder, hosts=hosts, epochs=epochs, train_batches=per_epoch, val_batches=5,
                          num_workers=4, gpus=1, slow_batches=slow, seed=7)
    getnext = written.of_kind("getnext")
    median = statistics.median(e.duration_us for e in getnext)
    outliers = [e for e in getnext if e.duration_us > 2 * median]
    return {"getnext": len(getnext), "outliers": len(outliers),
            "start_us": min(e.start_us for e in written.events), "end_us": max(e.end_us for e in written.events)}


# --- the server --------------------------------------------------------------------------------

class Gunicorn:
    def __init__(self, trial: str, cache_dir: str, log_path: str, workers: int, threads: int, worker_class: str):
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}/"
        env = dict(os.environ, DASHBOARD_TRIAL=trial, DASHBOARD_CACHE_DIR=cache_dir,
                   DASHBOARD_DATA_ROOTS=os.path.dirname(trial))
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--worker-class", worker_class, "-w", str(workers),
             "--threads", str(threads),
             "-b", f"{HOST}:{self.port}", "--timeout", "120", "--no-control-socket", "app:server"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 90) -> float:
        import requests

        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited ({self.process.returncode}); see {self.log_path}")
            try:
                if requests.get(self.url, timeout=2).status_code == 200:
                    return time.monotonic() - started
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"gunicorn did not answer within {timeout_s} s; see {self.log_path}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # the master stops its workers
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:  # and whatever is left of its session: workers, background-load processes
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.process.poll() is None:
            self.process.wait(timeout=10)
        self.log.close()

    def log_problems(self) -> list[str]:
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
        return [line for line in lines if "Traceback" in line or "[ERROR]" in line or " ERROR " in line
                or "WORKER TIMEOUT" in line]


# --- one client --------------------------------------------------------------------------------

class Client:
    """One page load's scripted session; records every request as (kind, seconds, status)."""

    def __init__(self, index: int, url: str, trial: str, want: dict, budget: int, deadline: float,
                 callbacks, records: list, errors: list, lock: threading.Lock):
        self.index, self.trial, self.want, self.budget, self.deadline = index, trial, want, budget, deadline
        self.records, self.errors, self.lock = records, errors, lock
        self.made = 0
        self.page = DashSession(url, timeout=REQUEST_TIMEOUT_S, on_request=self._record)
        self.callbacks = callbacks
        self.rng = random.Random(1000 + index)
        self.load_s: float | None = None

    def _record(self, kind: str, seconds: float, status) -> None:
        if kind != "load_poll":
            self.made += 1
        with self.lock:
            self.records.append((kind, seconds, status))

    def fail(self, message: str) -> None:
        with self.lock:
            self.errors.append(f"client {self.index}: {message}")

    def left(self) -> int:
        return self.budget - self.made

    def run(self) -> None:
        try:
            self._session()
        except CallbackFailed as exc:
            self.fail(f"{exc} {exc.text[:200]!r}")
        except Exception as exc:  # noqa: BLE001 - a client's failure is an error of the run, reported
            self.fail(f"{type(exc).__name__}: {exc}")

    def _session(self) -> None:
        page = self.page.open(self.callbacks)
        request_load, load = page.find("load-request.data"), page.find("trial-store.data")
        show_trial, set_window = page.find("getnext-count.children"), page.find("window-store.data")
        show_window = page.find("window-range.children")

        # The page opens with the trial in its URL.
        asked = page.call(request_load, {"url.search": f"?trial={self.trial}"}, ["url.search"],
                          kind="request_load").values["load-request.data"]
        started = time.perf_counter()
        loaded = page.call_background(load, {"load-request.data": asked}, ["load-request.data"],
                                      kind="load", timeout_s=min(MAX_POLLS * 0.25, self.deadline - time.monotonic()))
        self.load_s = time.perf_counter() - started
        if loaded.values.get("error-message.children"):
            return self.fail(f"load: {loaded.values['error-message.children']!r}")
        store = loaded.values.get("trial-store.data")
        if not store or not store.get("key"):
            return self.fail(f"load gave no trial: {loaded.text[:200]!r}")

        panels = page.call(show_trial, {"trial-store.data": store, "node-select.value": ""}, ["trial-store.data"],
                           kind="show_trial").values
        if panels.get("getnext-count.children") != str(self.want["getnext"]):
            return self.fail(f"getnext-count {panels.get('getnext-count.children')!r}, not {self.want['getnext']}")
        rows = panels.get("getnext-outliers.rowData") or []
        if len(rows) != self.want["outliers"]:
            return self.fail(f"{len(rows)} GetNext outlier rows, not {self.want['outliers']}")

        values = {"trial-store.data": store, "select-events.value": ".*",
                  "select-dimensions.value": ".*", "node-select.value": ""}
        # The first window is the whole job: the framework events' span and the system samples
        # that may run on a little after them.
        if store["start_us"] != self.want["start_us"] or store["end_us"] < self.want["end_us"]:
            return self.fail(f"trial span {store['start_us']}..{store['end_us']} does not hold the events' "
                             f"{self.want['start_us']}..{self.want['end_us']}")
        window = self._set_window(page, set_window, values, ["trial-store.data"], "first_window",
                                  (store["start_us"], store["end_us"]))
        if window is None:
            return
        self._draw(page, show_window, values, window)

        step = 0
        while self.left() >= 2 and time.monotonic() < self.deadline:
            if step % 2 == 0:  # a zoom drag on the overview
                span = self.want["end_us"] - self.want["start_us"]
                lo = self.want["start_us"] + self.rng.randrange(0, span * 3 // 4)
                hi = lo + self.rng.randrange(span // 100, span // 4)
                values["overview-graph.relayoutData"] = {"xaxis.range[0]": plotly_date(lo),
                                                         "xaxis.range[1]": plotly_date(hi)}
                window = self._set_window(page, set_window, values, ["overview-graph.relayoutData"],
                                          "drag_window", (lo, hi))
            else:  # a click on an outlier row (each click another row)
                row = rows[(step // 2) % len(rows)]
                values["getnext-outliers.selectedRows"] = [row]
                margin = max(int((row["end_us"] - row["start_us"]) * OUTLIER_MARGIN), MIN_MARGIN_US)
                window = self._set_window(page, set_window, values, ["getnext-outliers.selectedRows"],
                                          "click_outlier", (row["start_us"] - margin, row["end_us"] + margin))
            if window is None:
                return
            self._draw(page, show_window, values, window)
            step += 1

    def _set_window(self, page, callback, values, triggered, kind, want):
        result = page.call(callback, values, triggered, kind=kind)
        window = result.values.get("window-store.data")
        if not window or (window["start_us"], window["end_us"]) != tuple(want):
            self.fail(f"{kind}: window {window and (window['start_us'], window['end_us'])}, not {want}")
            return None
        values["window-store.data"] = window
        return window

    def _draw(self, page, callback, values, window) -> None:
        drawn = page.call(callback, values, ["window-store.data"], kind="show_window").values
        if drawn.get("window-error.children"):
            self.fail(f"show_window: {drawn['window-error.children']!r}")
        elif not text_of(drawn.get("window-range.children")) or "window-graph.figure" not in drawn:
            self.fail(f"show_window drew nothing for {window['start_us']}..{window['end_us']}")


# --- a run -------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def quantiles(values: list[float]) -> dict:
    return {"n": len(values), "p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}


def one_run(args, work: str, trial: str, want: dict, run: int) -> dict:
    cache = os.path.join(work, f"cache-{run}")
    server = Gunicorn(trial, cache, os.path.join(work, f"gunicorn-{run}.log"), args.workers, args.threads,
                      args.worker_class)
    records, errors, lock = [], [], threading.Lock()
    try:
        ready_s = server.wait_ready()
        callbacks = DashSession(server.url).open().callbacks
        deadline = time.monotonic() + args.time_limit
        clients = [Client(i, server.url, trial, want, args.requests, deadline, callbacks, records, errors, lock)
                   for i in range(args.clients)]
        gate = threading.Barrier(args.clients + 1)

        def body(client):
            gate.wait()
            client.run()

        threads = [threading.Thread(target=body, args=(c,), daemon=True) for c in clients]
        for thread in threads:
            thread.start()
        gate.wait()
        started = time.perf_counter()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()) + REQUEST_TIMEOUT_S)
        wall = time.perf_counter() - started
        if any(t.is_alive() for t in threads):
            errors.append(f"clients still running after the {args.time_limit} s limit")
    finally:
        server.stop()
    errors += [f"server log: {line}" for line in server.log_problems()]
    bad_status = [(kind, status) for kind, _, status in records if status not in (200, 204)]
    errors += [f"{kind}: HTTP {status}" for kind, status in bad_status]  # also failed their client
    shutil.rmtree(cache, ignore_errors=True)

    by_kind = defaultdict(list)
    for kind, seconds, _ in records:
        by_kind[kind].append(seconds * 1000)
    loads = [c.load_s * 1000 for c in clients if c.load_s is not None]
    return {
        "requests": len(records), "wall_s": wall, "throughput_rps": len(records) / wall, "server_ready_s": ready_s,
        "errors": len(errors), "error_samples": errors[:10],
        "latency_ms": {kind: {**quantiles(v), "max": max(v)}
                       for kind, v in sorted(by_kind.items(), key=lambda kv: KINDS.index(kv[0])
                                             if kv[0] in KINDS else 99)},
        "all_callbacks_ms": quantiles([s * 1000 for k, s, _ in records if k != "page"]),
        "load_end_to_end_ms": quantiles(loads) if loads else None,
    }


def print_run(number: int, result: dict) -> None:
    print(f"run {number}: {result['requests']} requests in {result['wall_s']:.2f} s = "
          f"{result['throughput_rps']:.1f} req/s, errors {result['errors']} "
          f"(server ready in {result['server_ready_s']:.1f} s)")
    for kind, stats in result["latency_ms"].items():
        print(f"  {kind:<14} n={stats['n']:<4} p50 {stats['p50']:8.1f} ms  p99 {stats['p99']:8.1f} ms  "
              f"max {stats['max']:8.1f} ms")
    if result["load_end_to_end_ms"]:
        e2e = result["load_end_to_end_ms"]
        print(f"  load (start to response, polls included) p50 {e2e['p50']:.0f} ms  p99 {e2e['p99']:.0f} ms")
    for line in result["error_samples"]:
        print(f"  ERROR {line}")


def summary(results: list[dict]) -> dict:
    def spread(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    out = {"runs": len(results), "throughput_rps": spread([r["throughput_rps"] for r in results]),
           "errors": sum(r["errors"] for r in results), "latency_ms": {}}
    kinds = [k for k in KINDS if all(k in r["latency_ms"] for r in results)]
    for kind in kinds:
        out["latency_ms"][kind] = {q: spread([r["latency_ms"][kind][q] for r in results]) for q in ("p50", "p99")}
    out["latency_ms"]["all callbacks"] = {q: spread([r["all_callbacks_ms"][q] for r in results])
                                          for q in ("p50", "p99")}
    if all(r["load_end_to_end_ms"] for r in results):
        out["load_end_to_end_ms"] = {q: spread([r["load_end_to_end_ms"][q] for r in results]) for q in ("p50", "p99")}
    return out


def print_summary(s: dict) -> None:
    def fmt(v, unit=""):
        return f"{v['median']:.1f}{unit} ({v['min']:.1f}-{v['max']:.1f})"

    print(f"\nover {s['runs']} runs, median (min-max): throughput {fmt(s['throughput_rps'], ' req/s')}, "
          f"errors {s['errors']}")
    for kind, stats in s["latency_ms"].items():
        print(f"  {kind:<14} p50 {fmt(stats['p50'], ' ms'):<28} p99 {fmt(stats['p99'], ' ms')}")
    if "load_end_to_end_ms" in s:
        e2e = s["load_end_to_end_ms"]
        print(f"  {'load e2e':<14} p50 {fmt(e2e['p50'], ' ms'):<28} p99 {fmt(e2e['p99'], ' ms')}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--requests", type=int, default=25,
                        help="requests per client, the load's polls not counted (they are bounded apart)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--worker-class", default="dashboard.serving.BufferingWorker",
                        help="gunicorn's worker class (gthread: gunicorn's own threaded worker)")
    parser.add_argument("--batches", type=int, default=5_000, help="GetNext calls in the synthetic trial")
    parser.add_argument("--time-limit", type=float, default=120, help="seconds for all clients of a run")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (trial, server logs)")
    args = parser.parse_args(argv)
    if args.requests < 8:
        parser.error("--requests must be at least 8 (a load, the panels, a window and one move)")

    work = tempfile.mkdtemp(prefix="dashboard-load-")
    try:
        trial = os.path.join(work, "trial")
        want = make_trial(trial, args.batches)
        print(f"trial: {want['getnext']} GetNext calls, {want['outliers']} outliers; "
              f"gunicorn --worker-class {args.worker_class} -w {args.workers} --threads {args.threads}; "
              f"{args.clients} clients x "
              f"{args.requests} requests; limit {args.time_limit:.0f} s per run", flush=True)
        results = []
        for run in range(1, args.runs + 1):
            results.append(one_run(args, work, trial, want, run))
            print_run(run, results[-1])
        overall = summary(results)
        if args.runs > 1:
            print_summary(overall)
        if args.json:
            print(json.dumps({"runs": results, "summary": overall}))
        return 1 if overall["errors"] else 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
