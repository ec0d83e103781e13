"""The reader against wrong times and against events of the DataLoaderIter phase that are not
GetNexts.

Trials are written with the collector's own writers (the reference format), then a few
lines are planted in them; every expected number is computed here from what was written.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from dashboard import format as fmt
from dashboard.collector.writer import SystemMetricsWriter, TraceWriter
from dashboard.trial.frames import classify
from dashboard.trial.kineto_format import parse_kineto_file
from dashboard.trial.load import MAX_EVENT_FROM_TRIAL_US, load_trial
from dashboard.trial.smdebug_format import (MAX_EVENT_AFTER_FILE_US, MAX_EVENT_BEFORE_FILE_US,
                                            MAX_SAMPLE_FROM_FILE_US)
from tests.conftest import ROOT

START_US = 1_795_986_600_000_000  # 2026-11-29 21:10 UTC
YEAR_9999_US = 253_386_403_200_000_000  # 9999-07-01T00:00:00Z
BEFORE_1970_US = -86_400_000_000  # 1969-12-31T00:00:00Z
MAIN_PID = 4242
NODE = fmt.framework_node_id(MAIN_PID)
HOST = fmt.system_node_id()
MP = "_MultiProcessingDataLoaderIter"
GETNEXT = fmt.getnext_event_name(MP)
SAMPLE_US = 100_000
DAY_US = 86_400_000_000
HOUR_US = 3_600_000_000


def write_job(folder: str, batches: int = 30, getnext_us: int = 4_000, step_us: int = 20_000) -> dict:
    """One training loop: GetNext then a train step per batch, and system metrics every 100 ms.
    Returns what was written: events (node, name, start, end), samples, training seconds."""
    writer = TraceWriter(folder, NODE, start_time_us=START_US, rotate_s=3600)
    events, t = [], START_US
    for batch in range(batches):
        writer.complete(fmt.PHASE_ITER, GETNEXT, t, t + getnext_us,
                        {fmt.ARG_PID: MAIN_PID, fmt.ARG_WORKER_ID: batch % 2, fmt.ARG_STEP: str(batch)})
        events.append((NODE, GETNEXT, t, t + getnext_us))
        t += getnext_us
        writer.complete(fmt.PHASE_STEP_TRAIN, fmt.PHASE_STEP_TRAIN, t, t + step_us,
                        {fmt.ARG_PID: MAIN_PID, fmt.ARG_STEP: str(batch)})
        events.append((NODE, fmt.PHASE_STEP_TRAIN, t, t + step_us))
        t += step_us
    writer.close()
    metrics = SystemMetricsWriter(folder, HOST, rotate_s=60)
    samples = []
    ts = START_US
    while ts <= t:
        metrics.write([("cpu", "cpu0", "CPUUtilization", 50.0, ts / 1e6)])
        samples.append(ts)
        ts += SAMPLE_US
    metrics.close()
    # training: from the first GetNext to the end of the last step (one iterator, one epoch)
    return {"events": events, "samples": samples, "training_s": (t - START_US) / 1e6,
            "getnext_s": batches * getnext_us / 1e6, "framework": writer.closed_keys,
            "system": metrics.closed_keys}


def event_line(trace_pid: int, name: str, start_us: int, end_us: int, base_us: int = START_US) -> str:
    return json.dumps({"name": name, "pid": trace_pid, "ph": "X", "ts": start_us - base_us,
                       "dur": end_us - start_us, "args": {fmt.ARG_PID: MAIN_PID}}) + ","


def trace_pid_of(lines: list[str], phase: str) -> int:
    for line in lines:
        event = json.loads(line.rstrip(",")) if line.startswith("{") else None
        if event and event["ph"] == "M" and event["args"].get("name") == phase:
            return event["pid"]
    raise AssertionError(f"no {phase} phase")


def plant_lines(folder: str, key: str, lines: list[str]) -> None:
    """Adds lines before the closing bracket of a closed framework file (its name unchanged)."""
    path = os.path.join(folder, key)
    text = open(path, encoding="utf-8").read().split("\n")
    end = text.index("]")
    open(path, "w", encoding="utf-8").write("\n".join(text[:end] + lines + text[end:]))


def read_events(trial) -> list[tuple]:
    fw = trial.framework
    return sorted(zip(fw["process"].astype(str), fw["name"].astype(str), fw["start_us"].tolist(),
                      fw["end_us"].tolist()))


def reasons(trial) -> dict[str, str]:
    return {s.path: s.reason for s in trial.report.files_with_skipped_lines}


def run_analyze(folder: str) -> dict:
    done = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "analyze", folder, "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def training_seconds(verdict: dict) -> float:
    return verdict["training_s"]


# --- 1. events far from their file's time -------------------------------------------------

def test_events_far_outside_the_trial_are_skipped_reported_and_do_not_stretch_it(tmp_path):
    clean, broken = str(tmp_path / "clean"), str(tmp_path / "broken")
    job = write_job(clean)
    shutil.copytree(clean, broken)
    [key] = job["framework"]
    lines = open(os.path.join(broken, key), encoding="utf-8").read().split("\n")
    # a GetNext in year 9999 (inside what the reader accepted before) and a step before 1970
    plant_lines(broken, key, [
        event_line(trace_pid_of(lines, fmt.PHASE_ITER), GETNEXT, YEAR_9999_US, YEAR_9999_US + 4_000),
        event_line(trace_pid_of(lines, fmt.PHASE_STEP_TRAIN), fmt.PHASE_STEP_TRAIN,
                   BEFORE_1970_US, BEFORE_1970_US + 20_000)])
    [system_key] = job["system"]
    with open(os.path.join(broken, system_key), "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"Type": "cpu", "Name": "cpu0", "Dimension": "CPUUtilization", "Value": 99.0,
                                 "NodeId": HOST, "Timestamp": YEAR_9999_US / 1e6}) + "\n")

    trial = load_trial(broken)
    # every valid event and sample is read
    assert read_events(trial) == sorted(job["events"])
    assert trial.system["timestamp_us"].tolist() == job["samples"]
    # the span is the valid one
    assert trial.start_us == START_US
    assert trial.end_us == max(max(e for *_, e in job["events"]), max(job["samples"]))
    # each skip is counted in its file, with its reason
    assert trial.report.lines_skipped == 3
    assert trial.report.files_skipped == []
    why = reasons(trial)
    assert set(why) == {key, system_key}
    assert "1 event(s) with a time outside 1970..9999" in why[key]
    assert re.search(r"1 event\(s\) more than 31 days before or 1 hour after the file's time "
                     r"\(2026-11-29T\d\d:\d\d:\d\d\.\d{6}Z, from its name\)", why[key]), why[key]
    assert re.search(r"1 record\(s\) more than 1 hour before or 1 hour after the file's time "
                     r"\(2026-11-29T21:10:00\.000000Z, from its name\)", why[system_key]), why[system_key]

    # the verdict is the clean trial's: training is not stretched
    clean_result, broken_result = run_analyze(clean), run_analyze(broken)
    assert broken_result["verdict"] == clean_result["verdict"]
    assert training_seconds(broken_result["verdict"]) == pytest.approx(job["training_s"], abs=1e-3)
    assert broken_result["verdict"]["input_percent"] == pytest.approx(
        100 * job["getnext_s"] / job["training_s"], abs=0.01)
    assert broken_result["getnext"]["count"] == clean_result["getnext"]["count"] == 30
    assert broken_result["lines_skipped"] == 3
    assert {item["path"] for item in broken_result["lines_skipped_in"]} == {key, system_key}


def test_the_bound_follows_the_file_name_time(tmp_path):
    # A worker that lived as long as a long job is written when it exits: its event starts up to
    # MAX_EVENT_BEFORE_FILE_US before its file's time and is kept; one more is not, nor an end
    # more than MAX_EVENT_AFTER_FILE_US after it.
    folder = str(tmp_path)
    job = write_job(folder, batches=4)
    [key] = job["framework"]
    file_us = int(os.path.basename(key).split("_", 1)[0])
    lines = open(os.path.join(folder, key), encoding="utf-8").read().split("\n")
    phase = trace_pid_of(lines, fmt.PHASE_ITER)
    worker = fmt.worker_event_name(MP)
    kept = [(NODE, worker, file_us - MAX_EVENT_BEFORE_FILE_US, file_us),
            (NODE, worker, file_us - 1_000, file_us + MAX_EVENT_AFTER_FILE_US)]
    far = [(NODE, worker, file_us - MAX_EVENT_BEFORE_FILE_US - 1, file_us),
           (NODE, worker, file_us - 1_000, file_us + MAX_EVENT_AFTER_FILE_US + 1)]
    plant_lines(folder, key, [event_line(phase, name, s, e) for _, name, s, e in kept + far])
    assert MAX_EVENT_BEFORE_FILE_US >= 28 * DAY_US  # a SageMaker job may run 28 days
    trial = load_trial(folder)
    assert read_events(trial) == sorted(job["events"] + kept)
    assert trial.report.lines_skipped == 2
    assert reasons(trial)[key].startswith("2 event(s) more than 31 days before or 1 hour after")

    # system samples: within MAX_SAMPLE_FROM_FILE_US of the minute in the file's name
    [system_key] = job["system"]
    minute_us = int(os.path.basename(system_key).split(".", 1)[0]) * 1_000_000
    planted = {minute_us - MAX_SAMPLE_FROM_FILE_US: True, minute_us + MAX_SAMPLE_FROM_FILE_US: True,
               minute_us - MAX_SAMPLE_FROM_FILE_US - 1: False, minute_us + MAX_SAMPLE_FROM_FILE_US + 1: False}
    with open(os.path.join(folder, system_key), "a", encoding="utf-8") as handle:
        for ts in planted:
            handle.write(json.dumps({"Type": "cpu", "Name": "cpu1", "Dimension": "CPUUtilization",
                                     "Value": 1.0, "NodeId": HOST, "Timestamp": ts / 1e6}) + "\n")
    trial = load_trial(folder)
    cpu1 = trial.system[trial.system["name"].astype(str) == "cpu1"]["timestamp_us"].tolist()
    assert cpu1 == sorted(ts for ts, keep in planted.items() if keep)
    assert reasons(trial)[system_key].startswith("2 record(s) more than 1 hour before or 1 hour after")


def test_a_file_named_after_its_wrong_event_is_placed_by_its_other_events(tmp_path):
    # The collector's writer names a file after its latest event end: one event in year 9999
    # puts that year in the name, which then places none of the file's other events.
    folder = str(tmp_path)
    writer = TraceWriter(folder, NODE, start_time_us=START_US, rotate_s=3600)
    trace_pid = writer.phase_pid(fmt.PHASE_ITER)
    good = [(NODE, GETNEXT, START_US + i * 10_000, START_US + i * 10_000 + 3_000) for i in range(20)]
    bad = (NODE, GETNEXT, YEAR_9999_US, YEAR_9999_US + 3_000)
    text = "".join(",\n" + event_line(trace_pid, n, s, e).rstrip(",") for _, n, s, e in good + [bad])
    writer.write_events(text, START_US, bad[3])
    writer.close()
    [key] = writer.closed_keys
    assert os.path.basename(key).startswith(f"{bad[3]}_")
    trial = load_trial(folder)
    assert read_events(trial) == good
    assert trial.end_us == good[-1][3]
    assert trial.report.lines_skipped == 1
    assert re.search(r"^1 event\(s\) more than 31 days from the file's median event time \(2026-11-29T.*"
                     r"its name's time, 9999-07-01T00:00:00\.\d{6}Z, is the end of one of the events far from it",
                     reasons(trial)[key]), reasons(trial)[key]


def test_a_file_wholly_at_a_wrong_time_is_skipped_against_the_trial(tmp_path):
    # Written one event at a time, a year-9999 event closes the file before it (the hour
    # changes) and gets a file of its own, named after it: the file agrees with itself, and
    # only the rest of the trial shows it is wrong. Same for a system sample (a minute's file).
    folder = str(tmp_path)
    job = write_job(folder)
    writer = TraceWriter(folder, NODE, start_time_us=START_US, rotate_s=3600)
    writer.complete(fmt.PHASE_ITER, GETNEXT, YEAR_9999_US, YEAR_9999_US + 4_000, {fmt.ARG_PID: MAIN_PID})
    writer.close()
    metrics = SystemMetricsWriter(folder, HOST, rotate_s=60)
    metrics.write([("cpu", "cpu0", "CPUUtilization", 1.0, YEAR_9999_US / 1e6)])
    metrics.close()
    [far_key], [far_system_key] = writer.closed_keys, metrics.closed_keys
    trial = load_trial(folder)
    assert read_events(trial) == sorted(job["events"])
    assert trial.system["timestamp_us"].tolist() == job["samples"]
    valid_end = max(max(e for *_, e in job["events"]), job["samples"][-1])
    assert (trial.start_us, trial.end_us) == (START_US, valid_end)
    assert trial.report.lines_skipped == 2
    why = reasons(trial)
    assert set(why) == {far_key, far_system_key}
    assert why[far_key].startswith("1 event(s) more than 31 days from the trial's median time (2026-11-29")
    assert why[far_system_key].startswith("1 record(s) more than 31 days from the trial's median time")
    assert MAX_EVENT_FROM_TRIAL_US == 31 * DAY_US
    result = run_analyze(folder)
    assert training_seconds(result["verdict"]) == pytest.approx(job["training_s"], abs=1e-3)


def test_a_file_being_written_is_placed_by_its_median_event(tmp_path):
    # A .tmp file has no time in its name: the median of its events places it.
    folder = str(tmp_path)
    job = write_job(folder, batches=4)
    base = job["events"][-1][3] + 1_000
    tmp = [(NODE, GETNEXT, base + i * 5_000, base + i * 5_000 + 2_000) for i in range(5)]
    bad = [(NODE, GETNEXT, YEAR_9999_US, YEAR_9999_US + 2_000),
           (NODE, GETNEXT, base - 40 * DAY_US, base - 40 * DAY_US + 2_000)]
    key = fmt.framework_tmp_key(NODE)
    meta = [{"name": "process_name", "ph": "M", "pid": 0, "args": {fmt.ARG_START_TIME: base}},
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": fmt.PHASE_ITER}}]
    lines = ["["] + [json.dumps(m) + "," for m in meta]
    lines += [event_line(1, name, s, e, base) for _, name, s, e in tmp[:2] + bad[:1] + tmp[2:] + bad[1:]]
    lines.append(event_line(1, GETNEXT, base + DAY_US, base + DAY_US + 1, base)[:30])  # being written
    with open(os.path.join(folder, key), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    trial = load_trial(folder)
    assert read_events(trial) == sorted(job["events"] + tmp)
    assert trial.end_us == tmp[-1][3]
    assert trial.report.lines_skipped == 3  # the cut line, the two far events
    assert re.search(r"2 event\(s\) more than 31 days from the file's median event time \(2026-11-29T",
                     reasons(trial)[key]), reasons(trial)[key]


def test_kineto_traces_skip_far_and_impossible_times(tmp_path):
    base_ns = START_US * 1000
    name = f"enumerate(DataLoader)#{MP}.__next__"

    def event(ts, dur=3_000.0):
        return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 7, "tid": 7, "ts": ts, "dur": dur}

    good = [event(1_000.0 + i * 10_000.0) for i in range(9)]
    bad = [event((YEAR_9999_US - START_US) * 1.0),  # year 9999
           event(-START_US - 1e9),  # before 1970
           event(1e308),  # overflowed the reader's integer times before
           event(20_000.0, 1e19)]  # swallowed the events nested in it before
    doc = {"traceEvents": good[:4] + bad + good[4:], "baseTimeNanoseconds": base_ns,
           "distributedInfo": {"rank": 0}}
    (tmp_path / "w.pt.trace.json").write_bytes(json.dumps(doc).encode())
    parsed = parse_kineto_file((tmp_path / "w.pt.trace.json").read_bytes(), "w.pt.trace.json")
    assert parsed.error is None
    starts = parsed.table.column("start_us").to_pylist()
    assert starts == [START_US + int(e["ts"]) for e in good]
    assert parsed.lines_skipped == 4
    assert "3 DataLoader/step event(s) with a time outside 1970..9999" in parsed.problems
    assert any(p.startswith("1 DataLoader/step event(s) more than 31 days from the file's median event time")
               for p in parsed.problems), parsed.problems
    trial = load_trial(str(tmp_path))
    assert (trial.start_us, trial.end_us) == (starts[0], starts[-1] + 3_000)
    assert trial.report.lines_skipped == 4


# --- 2. the DataLoaderIter phase holds more than GetNexts ---------------------------------

def test_only_getnext_names_of_the_iter_phase_count_as_batches(tmp_path):
    folder = str(tmp_path)
    job = write_job(folder, batches=12)
    [key] = job["framework"]
    lines = open(os.path.join(folder, key), encoding="utf-8").read().split("\n")
    phase = trace_pid_of(lines, fmt.PHASE_ITER)
    t = job["events"][-1][3]
    # GetNexts as each producer names them, and events of the phase that are not batches
    getnexts = [fmt.getnext_event_name("_BaseDataLoaderIter"), fmt.getnext_event_name("MyLoaderIter"),
                f"enumerate(DataLoader)#{MP}.__next__", "enumerate(DataPipe)#MapperIterDataPipe"]
    others = ["prefetch_stats", f"{MP}._shutdown_workers", f"{MP}.__init__"]
    planted = [(name, t + 1_000 * (i + 1), t + 1_000 * (i + 1) + 300)
               for i, name in enumerate(getnexts + others)]
    plant_lines(folder, key, [event_line(phase, name, s, e) for name, s, e in planted])
    trial = load_trial(folder)
    fw = trial.framework
    kinds = dict(zip(fw["name"].astype(str), fw["kind"].astype(str)))
    assert {name: kinds[name] for name in getnexts} == {name: fmt.KIND_GETNEXT for name in getnexts}
    assert {name: kinds[name] for name in others} == {name: fmt.KIND_OTHER for name in others}
    # the framework frame still holds them, in their phase
    held = fw[fw["name"].astype(str).isin(others)]
    assert sorted(zip(held["name"].astype(str), held["start_us"])) == sorted(
        (n, s) for n, s, _ in planted if n in others)
    assert set(held["phase"].astype(str)) == {fmt.PHASE_ITER}
    assert (fw["kind"] == fmt.KIND_GETNEXT).sum() == 12 + len(getnexts)
    # one rule, row by row and per category
    assert all(classify(fmt.PHASE_ITER, name) == kinds[name] for name in getnexts + others)
    assert classify(fmt.PHASE_ITER, GETNEXT) == fmt.KIND_GETNEXT
    # the analysis counts batches only
    assert run_analyze(folder)["getnext"]["count"] == 12 + len(getnexts)
