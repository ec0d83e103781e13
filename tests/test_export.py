"""Exports: `app.py export` (a window as a Chrome/Perfetto JSON trace) and the page's
downloads (every outlier table as CSV, the analysis as the `analyze --json` object, the window
as a trace), through dcc.Download in headless Chromium.

The trial is the bundled sample, a real CPU training run recorded by the collector. Expected
events and samples are read here straight from its files (the reference format's JSON), not
through the reader or the code under test.
"""
from __future__ import annotations

import csv
import glob
import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

SAMPLE = os.path.join(ROOT, "examples", "sample-trial", "trial")
pytestmark = pytest.mark.skipif(not os.path.isdir(SAMPLE), reason="the bundled sample trial is not recorded yet")
TRACE_KEYS = {"traceEvents", "displayTimeUnit"}


# --- what the trial's files hold, read here ------------------------------------------------------

def raw_framework_events(folder: str) -> list[dict]:
    """Every complete event of the framework files: name, absolute start (us), duration, the
    recording OS pid (args.pid) and the phase (the file's process_name of its pid)."""
    events = []
    for path in glob.glob(os.path.join(folder, "framework", "**", "*.json"), recursive=True):
        with open(path) as handle:
            records = json.load(handle)
        start = next(r["args"]["start_time_since_epoch_in_micros"] for r in records
                     if r.get("ph") == "M" and "start_time_since_epoch_in_micros" in r.get("args", {}))
        phases = {r["pid"]: r["args"]["name"] for r in records if r.get("ph") == "M" and "name" in r.get("args", {})}
        for r in records:
            if r.get("ph") == "X":
                events.append({"name": r["name"], "ts": start + int(r["ts"]), "dur": int(r["dur"]),
                               "pid": int(r["args"]["pid"]), "phase": phases[r["pid"]]})
    return events


def raw_system_samples(folder: str) -> list[dict]:
    samples = []
    for path in glob.glob(os.path.join(folder, "system", "**", "*.json"), recursive=True):
        with open(path) as handle:
            samples += [json.loads(line) for line in handle if line.strip()]
    return samples


def sample_us(sample: dict) -> int:
    return round(sample["Timestamp"] * 1e6)


def middle_window(events: list[dict]) -> tuple[int, int]:
    """A window over the middle third of the run: events cross both of its edges."""
    lo = min(e["ts"] for e in events)
    hi = max(e["ts"] + e["dur"] for e in events)
    third = (hi - lo) // 3
    return lo + third, lo + 2 * third


def run_app(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), *args], capture_output=True, text=True,
                          timeout=120)


# --- the trace, as Perfetto's JSON importer reads it -------------------------------------------

def check_trace_schema(trace: dict) -> dict:
    """The Trace Event Format's JSON object as Perfetto's importer (and chrome://tracing) reads
    it: every event has a phase; "X" a name, ts and dur in microseconds (numbers, dur >= 0),
    integer pid and tid; "C" a name, ts, pid and numeric args (one counter track per arg);
    "M" process_name / thread_name / thread_sort_index with their args. Every pid an event uses
    is named, every thread of a slice too, and slices of one thread nest (Perfetto drops a
    slice that ends inside another one without containing it). Returns the names."""
    assert set(trace) == TRACE_KEYS and trace["displayTimeUnit"] in ("ms", "ns")
    processes, threads = {}, {}
    for event in trace["traceEvents"]:
        assert event["ph"] in ("X", "C", "M"), event
        assert isinstance(event["pid"], int) and not isinstance(event["pid"], bool), event
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name", "thread_sort_index"), event
            if event["name"] == "process_name":
                processes[event["pid"]] = event["args"]["name"]
            elif event["name"] == "thread_name":
                threads[(event["pid"], event["tid"])] = event["args"]["name"]
            else:
                assert isinstance(event["args"]["sort_index"], int)
            continue
        assert isinstance(event["name"], str) and event["name"], event
        assert isinstance(event["ts"], (int, float)), event
        if event["ph"] == "X":
            assert isinstance(event["dur"], (int, float)) and event["dur"] >= 0, event
            assert isinstance(event["tid"], int), event
            assert isinstance(event.get("args", {}), dict)
        else:
            assert event["args"] and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                         for v in event["args"].values()), event
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert {e["pid"] for e in slices + counters} <= set(processes)
    assert {(e["pid"], e["tid"]) for e in slices} <= set(threads)
    by_thread: dict = {}
    for event in slices:
        by_thread.setdefault((event["pid"], event["tid"]), []).append((event["ts"], event["ts"] + event["dur"]))
    for spans in by_thread.values():
        open_ends = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], "slices of one thread overlap without nesting"
            open_ends.append(end)
    return {"processes": processes, "threads": threads}


def check_window(trace: dict, start: int, end: int) -> None:
    """The trace holds exactly the sample trial's events overlapping the window (whole), and its
    system samples inside it, as counters."""
    names = check_trace_schema(trace)
    raw = raw_framework_events(SAMPLE)
    want = sorted((e["name"], e["ts"], e["dur"], e["pid"]) for e in raw
                  if e["ts"] + e["dur"] >= start and e["ts"] <= end)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    got = sorted((e["name"], e["ts"], e["dur"], e["args"]["pid"]) for e in slices)
    assert got == want
    assert want and any(e["ts"] < start for e in slices) and any(e["ts"] + e["dur"] > end for e in slices)
    # One process per OS process, one thread per phase in it.
    phases = {(e["pid"], e["phase"]) for e in raw if e["ts"] + e["dur"] >= start and e["ts"] <= end}
    assert {(e["args"]["pid"], e["cat"]) for e in slices} == phases
    assert all(names["threads"][(e["pid"], e["tid"])] == e["cat"] for e in slices)
    assert len({e["pid"] for e in slices}) == len({p for p, _ in phases})
    # Counters: every system sample inside the window, and nothing else, by node.
    samples = [s for s in raw_system_samples(SAMPLE) if start <= sample_us(s) <= end]
    want_counters = sorted((s["NodeId"], sample_us(s), f"{s['Type']} {s['Dimension']}".strip(), s["Name"],
                            float(s["Value"])) for s in samples)
    got_counters = sorted((names["processes"][e["pid"]].removesuffix(" system metrics"), e["ts"], e["name"], name,
                           value) for e in trace["traceEvents"] if e["ph"] == "C" for name, value in e["args"].items())
    assert len(got_counters) == len(want_counters) > 0
    for got_one, want_one in zip(got_counters, want_counters):
        assert got_one[:4] == want_one[:4] and got_one[4] == pytest.approx(want_one[4])


def test_export_writes_the_window_as_a_perfetto_trace(tmp_path):
    start, end = middle_window(raw_framework_events(SAMPLE))
    out = tmp_path / "window.json"
    done = run_app("export", SAMPLE, "--start-us", str(start), "--end-us", str(end), "-o", str(out))
    assert done.returncode == 0 and done.stdout == "", done.stderr
    with open(out) as handle:
        trace = json.load(handle)  # the standard library reads it
    check_window(trace, start, end)
    # `-o -`: the same trace on stdout.
    to_stdout = run_app("export", SAMPLE, "--start-us", str(start), "--end-us", str(end), "-o", "-")
    assert to_stdout.returncode == 0 and json.loads(to_stdout.stdout) == trace


def test_export_errors_are_one_line(tmp_path):
    for args, words in ((("export", SAMPLE, "--start-us", "10", "--end-us", "5", "-o", "-"), "--end-us"),
                        (("export", str(tmp_path / "missing"), "--start-us", "0", "--end-us", "5", "-o", "-"),
                         "missing"),
                        (("export", SAMPLE, "--start-us", "0", "--end-us", "5", "-o",
                          str(tmp_path / "no-such-folder" / "x.json")), "no-such-folder")):
        done = run_app(*args)
        assert done.returncode == 2 and done.stdout == "", done
        assert done.stderr.count("\n") == 1 and words in done.stderr and "Traceback" not in done.stderr


# --- the page's downloads -------------------------------------------------------------------------

def _allow_downloads(driver, folder) -> None:
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(folder)})


def _downloaded(folder, pattern: str, timeout: float = 30) -> str:
    end = time.time() + timeout
    while time.time() < end:
        found = [p for p in glob.glob(os.path.join(str(folder), pattern)) if not p.endswith(".crdownload")]
        if found:
            time.sleep(0.2)  # written whole
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no download {pattern} in {folder}: {os.listdir(str(folder))}")


@pytest.mark.browser
def test_the_page_downloads_tables_analysis_and_window(dash_duo, tmp_path):
    import dashboard
    from dashboard.report import to_dict
    from dashboard.web.server import ServerOptions, create_app
    from test_web_browser import ISO, iso_us, scroll_to, table_rows, text, wait_loaded, window_range
    from tests.conftest import free_port

    raw = raw_framework_events(SAMPLE)
    getnext = [e for e in raw if e["name"].endswith("::GetNext")]
    app = create_app(ServerOptions(cache_dir=str(tmp_path / "cache")))  # the bundled sample by default
    dash_duo.start_server(app, port=free_port())
    wait_loaded(dash_duo, len(getnext))
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    driver = dash_duo.driver
    _allow_downloads(driver, downloads)

    # The GetNext outliers as CSV: the rows the table shows, in its order, with their values.
    shown = table_rows(dash_duo, "getnext-outliers")
    button = dash_duo.find_element("#getnext-outliers-csv")
    scroll_to(driver, button)
    button.click()
    with open(_downloaded(downloads, "*getnext-outliers.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == int(text(dash_duo, "getnext-outlier-count"))  # every outlier (under 500 here)
    page_size = len(shown)  # the table's first page
    for row, element in zip(rows[:page_size], shown):
        cells = {c.get_attribute("col-id"): c.text for c in element.find_elements("css selector", ".ag-cell")}
        assert cells["start"] == row["start"] and cells["duration"] == row["duration"]
        assert cells["pid"] == row["pid"] and cells["node"] == row["node"] and cells["worker_id"] == row["worker_id"]
        assert ISO.fullmatch(row["start"]) and iso_us(row["start"]) == int(row["start_us"])
    # The outliers are the trial's GetNexts longer than twice their median, longest first.
    durations = sorted(e["dur"] for e in getnext)
    median = (durations[(len(durations) - 1) // 2] + durations[len(durations) // 2]) / 2
    want = sorted((e for e in getnext if e["dur"] > 2 * median), key=lambda e: -e["dur"])
    assert [int(r["duration_us"]) for r in rows] == [e["dur"] for e in want]
    assert {(int(r["start_us"]), int(r["pid"])) for r in rows} == {(e["ts"], e["pid"]) for e in want}

    # The whole analysis: the `analyze --json` object of the trial.
    button = dash_duo.find_element("#export-analysis-json")
    scroll_to(driver, button)
    button.click()
    with open(_downloaded(downloads, "*analysis.json")) as handle:
        analysis = json.load(handle)
    assert analysis == json.loads(json.dumps(to_dict(dashboard.analyze(SAMPLE))))

    # The window as a trace: drag the window to the middle third, then download it.
    start, end = middle_window(raw)
    query = f"?trial={SAMPLE}&start={start}&end={end}"
    driver.get(f"{dash_duo.server_url}/{query}")
    wait_loaded(dash_duo, len(getnext))
    assert window_range(dash_duo) == (start, end)
    _allow_downloads(driver, downloads)
    button = dash_duo.find_element("#export-window-trace")
    scroll_to(driver, button)
    button.click()
    with open(_downloaded(downloads, f"*window-{start}-{end}.json")) as handle:
        trace = json.load(handle)
    check_window(trace, start, end)
