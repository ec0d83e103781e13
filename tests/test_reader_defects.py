"""Reader defects a review reproduced, on a real torch.profiler recording and the bundled
reference-format trial: a GetNext whose wrong duration swallowed its thread's others, copies of
one trace compressed differently read twice, a reference-format gzip cut short losing all its
events, and a trace whose keys come in another order than Kineto's read as no events."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zlib

import pytest

import dashboard.format as fmt
from dashboard.trial import kineto_format
from dashboard.trial.errors import TrialTooLargeError
from dashboard.trial.kineto_format import parse_kineto_file
from dashboard.trial.load import load_trial
from dashboard.trial.smdebug_format import decompress
from dashboard.trial.store import LocalStore
from tests.conftest import CountingStore

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDING = os.path.join(HERE, "recordings", "mildly_slow_worker", "run.pt.trace.json.gz")
SAMPLE = os.path.join(os.path.dirname(HERE), "examples", "sample-trial", "trial")
LOADER = "enumerate(DataLoader)#"


@pytest.fixture(scope="module")
def recording() -> dict:
    with open(RECORDING, "rb") as handle:
        packed = handle.read()
    raw = gzip.decompress(packed)
    doc = json.loads(raw)
    calls = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(LOADER)]
    return {"packed": packed, "raw": raw, "doc": doc, "calls": calls}


def getnext_starts(table) -> list[int]:
    rows = table.to_pylist()
    return sorted(r["start_us"] for r in rows if r["phase"] == fmt.PHASE_ITER)


def wall_us(doc: dict, ts: float) -> int:
    return (doc["baseTimeNanoseconds"] + round(ts * 1000) + 500) // 1000


# --- 1. one GetNext's wrong duration swallowed the others of its thread --------------------

@pytest.mark.parametrize("which", [0, 12])
def test_a_getnext_with_a_wrong_duration_does_not_swallow_its_threads_others(recording, which):
    doc = json.loads(recording["raw"])
    calls = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(LOADER)]
    assert len(calls) == 25 and len({(e["pid"], e["tid"]) for e in calls}) == 1
    bad = sorted(calls, key=lambda e: e["ts"])[which]
    bad["dur"] = 100_000_000_000  # 28 hours: within the 31 days an event may lie from the file's time
    parsed = parse_kineto_file(json.dumps(doc).encode(), "run.pt.trace.json")
    assert parsed.error is None
    # the other 24 calls, each at its own time; the one that spans the next calls is skipped, said so
    assert getnext_starts(parsed.table) == sorted(wall_us(doc, e["ts"]) for e in calls if e is not bad)
    assert parsed.lines_skipped == 1
    assert any("span the next call of their loader" in p for p in parsed.problems), parsed.problems


def test_the_swallowed_getnexts_are_loaded_and_the_skip_reported(recording, tmp_path):
    doc = json.loads(recording["raw"])
    calls = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(LOADER)),
                   key=lambda e: e["ts"])
    calls[3]["dur"] = 100_000_000_000
    (tmp_path / "run.pt.trace.json").write_bytes(json.dumps(doc).encode())
    trial = load_trial(str(tmp_path))
    assert int((trial.framework["kind"] == fmt.KIND_GETNEXT).sum()) == 24
    assert trial.report.lines_skipped == 1
    [with_skips] = trial.report.files_with_skipped_lines
    assert with_skips.path == "run.pt.trace.json" and "wrong duration" in with_skips.reason


def _event(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 5, "tid": tid, "ts": ts, "dur": dur}


def test_nesting_is_still_counted_once(tmp_path):
    """What _outermost is for: a pipe chain's events nest (each pipe records its own __next__) and
    so do pipes inside a single-process DataLoader's __next__: one wait, the outermost, silently;
    a loader's call inside another loader's is counted once too, and said."""
    base_ns = 1_780_000_000_000_000_000
    outer, inner = "enumerate(DataPipe)#IterableWrapperIterDataPipe", "enumerate(DataPipe)#MapperIterDataPipe"
    single = f"{LOADER}_SingleProcessDataLoaderIter.__next__"
    other = f"{LOADER}_MultiProcessingDataLoaderIter.__next__"
    events = []
    for i in range(4):  # a pipe chain of one class twice: the same name nests in itself
        t = 1_000.0 + i * 1_000.0
        events += [_event(outer, t, 500.0), _event(inner, t + 10, 400.0), _event(inner, t + 20, 300.0)]
    for i in range(4):  # a single-process loader whose dataset runs a pipe
        t = 10_000.0 + i * 1_000.0
        events += [_event(single, t, 500.0), _event(inner, t + 10, 400.0)]
    events += [_event(single, 20_000.0, 500.0), _event(other, 20_010.0, 100.0)]
    doc = {"traceEvents": events, "baseTimeNanoseconds": base_ns, "schemaVersion": 1}
    parsed = parse_kineto_file(json.dumps(doc).encode(), "t.pt.trace.json")
    names = sorted(parsed.table.column("name").to_pylist())
    assert names == sorted([outer] * 4 + [single] * 5)
    assert parsed.lines_skipped == 1  # the other loader's call inside the last __next__, and no pipe
    assert len(parsed.problems) == 1 and "inside another GetNext" in parsed.problems[0]


# --- 2. copies of one trace, compressed otherwise -------------------------------------------

@pytest.mark.parametrize("chunk_bytes", [None, 4096])
def test_copies_of_a_trace_compressed_otherwise_are_read_once(recording, tmp_path, chunk_bytes):
    raw = recording["raw"]
    (tmp_path / "run.pt.trace.json").write_bytes(raw)
    (tmp_path / "run.pt.trace.json.gz").write_bytes(recording["packed"])
    other = gzip.compress(raw, compresslevel=1, mtime=12345)  # another header, other bytes
    assert other != recording["packed"] and gzip.decompress(other) == raw
    (tmp_path / "run2.pt.trace.json.gz").write_bytes(other)
    store = CountingStore(LocalStore(str(tmp_path)), chunk_bytes=chunk_bytes)
    trial = load_trial(str(tmp_path), store=store)
    assert store.reads == []  # still read piece by piece
    assert int((trial.framework["kind"] == fmt.KIND_GETNEXT).sum()) == len(recording["calls"]) == 25
    assert trial.report.read_paths == ["run.pt.trace.json"]
    assert sorted((s.path, s.reason) for s in trial.report.files_skipped) == [
        ("run.pt.trace.json.gz", "duplicate of run.pt.trace.json"),
        ("run2.pt.trace.json.gz", "duplicate of run.pt.trace.json")]
    # the digest is of the trace's content, as a reference-format file's
    assert set(trial.report.digests.values()) == {hashlib.sha256(raw).digest()}


# --- 3. a reference-format gzip cut short ---------------------------------------------------

def _sample_with(tmp_path, kind: str, packed_of) -> tuple[str, str, bytes]:
    """The sample trial with its first file of `kind` gzipped by packed_of(text): (folder, key,
    text of the file)."""
    folder = str(tmp_path / "trial")
    shutil.copytree(SAMPLE, folder)
    top = os.path.join(folder, kind)
    path = sorted(os.path.join(d, n) for d, _, names in os.walk(top) for n in names)[0]
    with open(path, "rb") as handle:
        text = handle.read()
    os.remove(path)
    with open(path + ".gz", "wb") as handle:
        handle.write(packed_of(text))
    return folder, os.path.relpath(path + ".gz", folder), text


def _whole_lines(prefix: bytes) -> list[bytes]:
    return prefix.split(b"\n")[:-1]  # the last: the line the cut ended in


@pytest.mark.parametrize("kind", ["framework", "system"])
@pytest.mark.parametrize("cut", [100, "half"])
def test_a_gzip_file_cut_short_keeps_its_events_before_the_cut(tmp_path, kind, cut):
    def cut_short(text: bytes) -> bytes:
        packed = gzip.compress(text)
        return packed[:len(packed) // 2] if cut == "half" else packed[:-cut]

    folder, key, text = _sample_with(tmp_path, kind, cut_short)
    with open(os.path.join(folder, key), "rb") as handle:
        prefix = zlib.decompressobj(31).decompress(handle.read())  # what the cut left
    assert 0 < len(prefix) < len(text) and not prefix.endswith(b"\n")
    whole = load_trial(SAMPLE)
    trial = load_trial(folder)
    assert trial.report.files_skipped == []
    if kind == "framework":
        def lost(what: bytes) -> int:
            return text.count(what) - sum(line.count(what) for line in _whole_lines(prefix))

        assert 0 < lost(b'"ph": "X"') < text.count(b'"ph": "X"')
        assert len(trial.framework) == len(whole.framework) - lost(b'"ph": "X"')
        assert int((trial.framework["kind"] == fmt.KIND_GETNEXT).sum()) == 288 - lost(b"::GetNext")
        assert cut == 100 or lost(b"::GetNext") > 0
    else:
        lost = text.count(b"\n") + (not text.endswith(b"\n")) - len(_whole_lines(prefix))
        assert 0 < lost and len(trial.system) == len(whole.system) - lost
    assert trial.report.lines_skipped == 1  # the line the cut ended in
    [with_skips] = trial.report.files_with_skipped_lines
    assert with_skips.path == key
    assert "the gzip stream breaks off (Compressed file ended before the end-of-stream marker was reached)" \
        in with_skips.reason, with_skips.reason


def test_a_gzip_file_cut_between_lines_reports_the_cut(tmp_path):
    """A stream flushed at a line's end and cut there: no line is broken, every event before the
    cut is kept, and the cut still counts (what came after it is lost)."""
    def flushed(text: bytes) -> bytes:
        packer = zlib.compressobj(wbits=31)
        return packer.compress(text[:text.index(b"\n", len(text) // 2) + 1]) + packer.flush(zlib.Z_SYNC_FLUSH)

    folder, key, text = _sample_with(tmp_path, "framework", flushed)
    kept = text[:text.index(b"\n", len(text) // 2) + 1].count(b"::GetNext")
    trial = load_trial(folder)
    assert int((trial.framework["kind"] == fmt.KIND_GETNEXT).sum()) == 288 - text.count(b"::GetNext") + kept
    assert trial.report.lines_skipped == 1
    assert "breaks off" in trial.report.files_with_skipped_lines[0].reason


def test_a_gzip_file_cut_short_is_still_held_to_the_size_limit(tmp_path):
    folder, key, text = _sample_with(tmp_path, "framework", lambda text: gzip.compress(text)[:-100])
    with open(os.path.join(folder, key), "rb") as handle:
        cut = handle.read()
    prefix = zlib.decompressobj(31).decompress(cut)
    assert decompress(key, cut, max_size=len(prefix))[0] == prefix
    with pytest.raises(TrialTooLargeError):
        decompress(key, cut, max_size=len(prefix) - 1)
    with pytest.raises(TrialTooLargeError):
        decompress(key, cut, max_size=1000)
    # a load's limit counts what the cut file decompresses to
    listed = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(folder) for n in names)
    with pytest.raises(TrialTooLargeError):
        load_trial(folder, max_bytes=listed + len(prefix) - len(cut) - 1)
    assert load_trial(folder, max_bytes=listed + len(prefix) - len(cut)).report.lines_skipped == 1


def test_a_gzip_file_cut_inside_its_header_is_skipped(tmp_path):
    folder, key, _ = _sample_with(tmp_path, "framework", lambda text: gzip.compress(text)[:6])
    trial = load_trial(folder)
    assert [s.path for s in trial.report.files_skipped] == [key]
    assert trial.report.files_skipped[0].reason.startswith("not a valid gzip file")


# --- 4. keys in another order than Kineto's -------------------------------------------------

@pytest.mark.parametrize("indent", [None, 2])
def test_a_trace_with_its_keys_sorted_reads_as_kinetos(recording, indent, monkeypatch):
    plain = parse_kineto_file(recording["raw"], "run.pt.trace.json")
    assert len(getnext_starts(plain.table)) == 25 and plain.lines_skipped == 0
    data = json.dumps(recording["doc"], sort_keys=True, indent=indent).encode()
    assert data.index(b'"args"') < data.index(b'"name": "enumerate(DataLoader)#')  # args first
    parsed = parse_kineto_file(data, "run.pt.trace.json")
    assert parsed.error is None and parsed.lines_skipped == 0 and parsed.problems == []
    assert parsed.table.equals(plain.table)
    # read in chunks: an event's start may lie before the nearest "{" a chunk keeps
    packed = gzip.compress(data)
    for chunk in (97, 4096, 65_537):
        monkeypatch.setattr(kineto_format, "CHUNK_BYTES", chunk)
        parsed = parse_kineto_file(packed, "run.pt.trace.json")  # (gzip by its first bytes)
        assert parsed.lines_skipped == 0 and parsed.table.equals(plain.table)


def test_a_broken_event_among_sorted_keys_is_counted_and_the_rest_kept(recording):
    data = json.dumps(recording["doc"], sort_keys=True).encode()
    name = data.index(b'"name": "enumerate(DataLoader)#')
    broken = data[:name] + b'"dur": nope, ' + data[name:]  # the event of the first call, no longer JSON
    parsed = parse_kineto_file(broken, "run.pt.trace.json")
    others = recording["calls"][1:]  # (in the file's order)
    assert getnext_starts(parsed.table) == sorted(wall_us(recording["doc"], e["ts"]) for e in others)
    assert parsed.lines_skipped == 1
    assert parsed.problems == ["1 DataLoader/step event(s) are not valid events"]


# --- 5. values not of their field's type were read as missing, unsaid -----------------------

def _lines_of(path: str) -> list[str]:
    with open(path) as handle:
        return handle.read().splitlines()


def _rewrite(path: str, lines: list[str]) -> None:
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")


def _copy_of_sample(tmp_path) -> tuple[str, str, list[str], list[int], str]:
    """A copy of the bundled trial: its folder, its first framework file, that file's lines and
    those of its GetNexts with a worker id, and its first system file."""
    folder = str(tmp_path / "trial")
    shutil.copytree(SAMPLE, folder)

    def first(kind):
        return sorted(os.path.join(d, n) for d, _, names in os.walk(os.path.join(folder, kind)) for n in names)[0]

    framework = first("framework")
    lines = _lines_of(framework)
    getnexts = [i for i, line in enumerate(lines) if "::GetNext" in line and '"worker_id"' in line]
    return folder, framework, lines, getnexts, first("system")


def _sample_with_wrong_types(tmp_path) -> tuple[str, str, str]:
    """The bundled trial with 6 values of kept events and samples not of their field's type:
    in its first framework file, a worker id as text, an iterator id beyond int64, a step
    number that is no whole number and an event whose args are a number; in its first system
    file, a Dimension and a NodeId that are no text."""
    folder, framework, lines, getnexts, system = _copy_of_sample(tmp_path)
    changes = [("worker_id", "one"), ("iterator_id", 10**20), ("step_num", "x7")]
    for at, (key, value) in zip(getnexts, changes):
        event = json.loads(lines[at].rstrip(","))
        event["args"][key] = value
        lines[at] = json.dumps(event) + ","
    event = json.loads(lines[getnexts[3]].rstrip(","))
    event["args"] = 5
    lines[getnexts[3]] = json.dumps(event) + ","
    _rewrite(framework, lines)
    records = [json.loads(line) for line in _lines_of(system)]
    records[0]["Dimension"], records[1]["NodeId"] = 5, [1]
    _rewrite(system, [json.dumps(r) for r in records])
    return folder, os.path.relpath(framework, folder), os.path.relpath(system, folder)


def _events(trial) -> list:
    fw = trial.framework
    return sorted(zip(fw["process"].astype(str), fw["name"].astype(str), fw["start_us"].tolist(),
                      fw["end_us"].tolist()))


def test_values_not_of_their_fields_type_are_counted_and_their_events_kept(tmp_path):
    folder, framework, system = _sample_with_wrong_types(tmp_path)
    clean, trial = load_trial(SAMPLE), load_trial(folder)
    assert _events(trial) == _events(clean) and len(trial.system) == len(clean.system)
    report = trial.report
    assert report.lines_skipped == clean.report.lines_skipped == 0
    assert report.values_ignored_by_path == {framework: 4, system: 2}
    reasons = {s.path: s.reason for s in report.files_with_skipped_lines}
    assert set(reasons) == {framework, system}
    for field_name in ("args.worker_id 1", "args.iterator_id 1", "args.step_num 1", "args 1"):
        assert field_name in reasons[framework], reasons[framework]
    assert "Dimension 1" in reasons[system] and "NodeId 1" in reasons[system], reasons[system]
    # Read as missing: the worker id and the step of those GetNexts, the sample's node as host.
    fw = trial.framework
    getnext = fw[fw["name"].astype(str).str.endswith("::GetNext")]
    assert int(getnext["worker_id"].isna().sum()) == int(clean.framework.loc[getnext.index, "worker_id"].isna().sum()) + 2
    assert set(trial.system["node"].astype(str)) == set(clean.system["node"].astype(str))


def test_values_ignored_are_in_the_report_the_cache_and_the_workers(tmp_path):
    from dashboard.report import to_dict, to_text
    from dashboard.trial.columnar_cache import ColumnarFileCache
    from dashboard.web import layout, views
    from dashboard.api import analyze
    from tests.forked_load import kept

    folder, framework, system = _sample_with_wrong_types(tmp_path)
    result = analyze(folder)
    data = to_dict(result)
    assert data["values_ignored"] == 6 and data["lines_skipped"] == 0
    assert {item["path"] for item in data["lines_skipped_in"]} == {framework, system}
    text = to_text(result)
    assert "lines skipped 0, values ignored 6" in text
    assert f"values ignored in {framework}: 4 value(s)" in text
    summary = views.summary(result.trial)
    assert summary["values_ignored"] == 6
    assert "Values ignored" in str(layout.facts_component(summary))
    # A clean trial says nothing of them.
    assert "values ignored" not in to_text(analyze(SAMPLE)) and to_dict(analyze(SAMPLE))["values_ignored"] == 0

    cache = ColumnarFileCache(str(tmp_path / "columns"))
    first = load_trial(folder, file_cache=cache)
    store = CountingStore(LocalStore(folder))
    again = load_trial(folder, file_cache=ColumnarFileCache(str(tmp_path / "columns")), store=store)
    assert store.reads == []  # (each file's parse from the columns kept)
    assert first.report.values_ignored_by_path == again.report.values_ignored_by_path == {framework: 4, system: 2}
    assert again.report.files_with_skipped_lines == first.report.files_with_skipped_lines

    forked = subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "tests", "forked_load.py"),
                             folder], capture_output=True, text=True, timeout=120)
    assert forked.returncode == 0, forked.stderr
    forked_kept = json.loads(forked.stdout)
    assert forked_kept.pop("forked") == [2]
    assert forked_kept == json.loads(json.dumps(kept(result.trial)))


def test_a_traces_values_not_of_their_type_are_counted_and_their_events_kept(recording, tmp_path):
    doc = json.loads(recording["raw"])
    calls = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(LOADER)]
    calls[3]["pid"], calls[4]["tid"] = "main", [1]  # a process id as text, a thread id as a list
    clean = parse_kineto_file(recording["raw"], "run.pt.trace.json")
    far = sorted(calls, key=lambda e: e["ts"])[-1]
    far["pid"], far["ts"] = "x", far["ts"] + 40 * 86_400e6  # skipped (far from the others): not counted
    parsed = parse_kineto_file(json.dumps(doc).encode(), "run.pt.trace.json")
    assert clean.values_ignored == 0 and parsed.values_ignored == 2
    assert parsed.lines_skipped == 1 and clean.lines_skipped == 0
    assert getnext_starts(parsed.table) == getnext_starts(clean.table)[:-1]
    assert "pid 1" in parsed.problems[-1] and "tid 1" in parsed.problems[-1], parsed.problems
    (tmp_path / "run.pt.trace.json").write_text(json.dumps(doc))
    report = load_trial(str(tmp_path)).report
    assert report.values_ignored_by_path == {"run.pt.trace.json": 2}
    assert [s.path for s in report.files_with_skipped_lines] == ["run.pt.trace.json"]


def test_values_of_events_that_are_not_kept_are_not_counted(tmp_path):
    """An event skipped (no time), an instant event, the end half of a begin/end pair and a
    system record out of range are no kept events: their values are not counted as ignored,
    where the begin half's, now the pair's event, is."""
    folder, framework, lines, getnexts, system = _copy_of_sample(tmp_path)
    event = json.loads(lines[getnexts[0]].rstrip(","))
    del event["ts"]
    event["args"]["worker_id"] = "one"  # of a skipped event
    lines[getnexts[0]] = json.dumps(event) + ","
    base = json.loads(lines[getnexts[1]].rstrip(","))
    instant = dict(base, ph="i", name="marker", args={"iterator_id": "seven"})
    begin = dict(base, ph="B", name="pair", args={"worker_id": "two"})
    end = dict(base, ph="E", name="pair", ts=base["ts"] + 5, args={"worker_id": "three"})
    for extra in (end, begin, instant):  # (each inserted before the one inserted last)
        lines.insert(getnexts[1], json.dumps({k: v for k, v in extra.items() if k != "dur"}) + ",")
    _rewrite(framework, lines)
    records = [json.loads(line) for line in _lines_of(system)]
    records[0]["NodeId"], records[0]["Timestamp"] = 5, -1.0  # a record skipped: out of range
    _rewrite(system, [json.dumps(r) for r in records])

    report = load_trial(folder).report
    assert report.lines_skipped == 2  # the GetNext without its time, the system record
    assert report.values_ignored_by_path == {os.path.relpath(framework, folder): 1}  # the pair's begin
    reason = {s.path: s.reason for s in report.files_with_skipped_lines}[os.path.relpath(framework, folder)]
    assert "args.worker_id 1)" in reason and "iterator_id" not in reason, reason


def test_a_file_whose_events_all_lie_far_from_the_trial_has_no_values_ignored(tmp_path):
    folder, framework, _ = _sample_with_wrong_types(tmp_path)
    later = os.path.join(folder, framework)
    lines = _lines_of(later)
    meta = json.loads(lines[1].rstrip(","))
    shift = 40 * 86_400_000_000  # 40 days: the file's events and its name's time alike
    meta["args"]["start_time_since_epoch_in_micros"] += shift
    lines[1] = json.dumps(meta) + ","
    name = os.path.basename(later)
    moved = os.path.join(os.path.dirname(later), f"{int(name.split('_')[0]) + shift}_{name.split('_', 1)[1]}")
    os.remove(later)
    _rewrite(moved, lines)
    report = load_trial(folder).report
    moved_key = os.path.relpath(moved, folder)
    assert report.lines_skipped_by_path[moved_key] > 100  # every event: far from the trial's time
    assert moved_key not in report.values_ignored_by_path and report.values_ignored == 2  # the system file's


# --- 6. an independent tester's corpus: events lost unsaid, a trace read as of 1970, a stall ---

def _sample_events(tmp_path) -> tuple[str, str, list[dict]]:
    """A copy of the bundled trial, its first framework file, and that file's events (read here
    with json, the oracle the reader is held to)."""
    folder, framework, lines, _, _ = _copy_of_sample(tmp_path)
    with open(framework) as handle:
        return folder, framework, json.load(handle)


def _getnexts(events: list[dict]) -> int:
    return sum(e.get("ph") == "X" and str(e.get("name", "")).endswith("::GetNext") for e in events)


def _loaded_getnexts(folder: str):
    trial = load_trial(folder)
    fw = trial.framework
    return int(fw["name"].astype(str).str.endswith("::GetNext").sum()), trial.report


@pytest.mark.parametrize("form", ["object", "bom", "bom-one-line", "gzip-named-json", "gzip-then-bytes",
                                  "gzip-then-newline", "gzip-then-a-broken-member"])
def test_a_framework_file_in_another_layout_keeps_every_event(tmp_path, form):
    # Chrome's {"traceEvents": [...]} was read as one event of no phase (every event lost, none
    # reported); a BOM cost a line, or on one line the file; gzip under a .json name was read as
    # text; bytes after a whole gzip stream cost the file.
    folder, framework, events = _sample_events(tmp_path)
    whole = _loaded_getnexts(SAMPLE)[0]
    lines = [json.dumps(e) for e in events]
    text = {"object": '{"traceEvents": [\n' + ",\n".join(lines) + '\n], "displayTimeUnit": "ms"}\n',
            "bom": "\ufeff[\n" + ",\n".join(lines) + "\n]\n",
            "bom-one-line": "\ufeff" + json.dumps(events),
            "gzip-named-json": None}.get(form)
    array = ("[\n" + ",\n".join(lines) + "\n]\n").encode()
    after = {"gzip-then-bytes": b"trailing bytes\n", "gzip-then-newline": b"\n",  # (echo >> file)
             "gzip-then-a-broken-member": b"\x1f\x8b\x63 a member whose method is no deflate"}.get(form, b"")
    data = text.encode() if text is not None else gzip.compress(array) + after
    os.remove(framework)
    with open(framework + (".gz" if after else ""), "wb") as handle:
        handle.write(data)
    count, report = _loaded_getnexts(folder)
    assert count == whole and _getnexts(events) > 0, (count, whole)
    assert not report.files_skipped
    if after:  # said: the bytes that follow, as one skipped line
        [said] = report.files_with_skipped_lines
        assert report.lines_skipped == 1 and "bytes after the gzip stream are not gzip" in said.reason, said
        assert "breaks off" not in said.reason and "lost" not in said.reason, said
    else:
        assert report.lines_skipped == 0, report.files_with_skipped_lines


def test_a_gzip_file_that_is_no_gzip_after_its_name_is_still_refused(tmp_path):
    folder, framework, _ = _sample_events(tmp_path)
    os.rename(framework, framework + ".gz")  # plain JSON named .gz
    report = load_trial(folder).report
    [skipped] = report.files_skipped
    assert "not a valid gzip file" in skipped.reason and "Not a gzipped file" in skipped.reason, skipped


@pytest.mark.parametrize("phase", [None, 88, "missing"])
def test_an_event_of_no_phase_is_counted_as_skipped(tmp_path, phase):
    # Only X rows were counted when bad: an event of no phase (or one not of text) vanished.
    folder, framework, events = _sample_events(tmp_path)
    getnexts = [e for e in events if e.get("ph") == "X" and e["name"].endswith("::GetNext")]
    for event in getnexts[:3]:
        if phase == "missing":
            del event["ph"]
        else:
            event["ph"] = phase
    with open(framework, "w") as handle:
        handle.write("[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]\n")
    count, report = _loaded_getnexts(folder)
    assert count == _loaded_getnexts(SAMPLE)[0] - 3
    assert report.lines_skipped == 3
    [said] = report.files_with_skipped_lines
    assert "3 event(s) without a phase (ph) of text" in said.reason, said


def _trace_with(recording, change) -> bytes:
    doc = json.loads(recording["raw"])
    change(doc)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("which", [0, 12, -3, -1])
def test_a_trace_event_with_bytes_that_are_not_utf8_is_skipped_alone(recording, which):
    # orjson names no text for bytes that are not UTF-8: the event was taken for one cut short,
    # the scan ran on to the buffer's end and stopped, the events after it lost unsaid.
    raw = recording["raw"]
    at = [i for i in range(len(raw)) if raw.startswith(b'"name": "enumerate(DataLoader)#', i)][which]
    cat = raw.rfind(b'"cat": "user_annotation"', 0, at)
    assert 0 < at - cat < 200
    bad = raw[:cat] + b'"cat": "user_annotation\xff"' + raw[cat + len(b'"cat": "user_annotation"'):]
    parsed = parse_kineto_file(bad, "run.pt.trace.json")
    calls = sorted(recording["calls"], key=lambda e: e["ts"])
    assert len(getnext_starts(parsed.table)) == len(calls) - 1
    assert parsed.lines_skipped == 1 and any("not valid events" in p for p in parsed.problems), parsed.problems


def test_a_trace_base_time_written_as_a_float_places_the_events(recording):
    # json.dumps of a float writes 1.790857026e+18: its leading "1" was read, every event in 1970.
    exact = parse_kineto_file(recording["raw"], "run.pt.trace.json")
    as_float = parse_kineto_file(_trace_with(recording, lambda d: d.update(
        baseTimeNanoseconds=float(d["baseTimeNanoseconds"]))), "run.pt.trace.json")
    assert b"e+18" in _trace_with(recording, lambda d: d.update(baseTimeNanoseconds=float(d["baseTimeNanoseconds"])))
    starts, exact_starts = getnext_starts(as_float.table), getnext_starts(exact.table)
    assert len(starts) == len(exact_starts)
    # A float holds the time to 256 ns: each start within 1 us of the exact one.
    assert max(abs(a - b) for a, b in zip(starts, exact_starts)) <= 1
    as_text = parse_kineto_file(_trace_with(recording, lambda d: d.update(
        baseTimeNanoseconds=str(d["baseTimeNanoseconds"]))), "run.pt.trace.json")
    assert getnext_starts(as_text.table) == exact_starts
    negative = parse_kineto_file(_trace_with(recording, lambda d: d.update(baseTimeNanoseconds=-5)),
                                 "run.pt.trace.json")
    assert negative.error == "baseTimeNanoseconds -5 is no time in nanoseconds: event times cannot be placed"


def test_braces_in_an_events_strings_cost_one_parse_not_one_per_brace(recording):
    # Each "}" after the name was tried as the event's end, a parse of the slice each: 20 events
    # of a 60 KB string of "}" took 34 s. Their ends are now found by the structure; every event
    # is kept, as are those whose strings hold quotes, escapes and braces of both kinds.
    def braces(doc):
        calls = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(LOADER)]
        for at, event in enumerate(calls):
            event["args"]["note"] = "}" * 60_000 if at % 2 else 'a "{quoted}" \\ {"x": [}]} \\"'

    started = time.perf_counter()
    parsed = parse_kineto_file(_trace_with(recording, braces), "run.pt.trace.json")
    took = time.perf_counter() - started
    assert getnext_starts(parsed.table) == getnext_starts(parse_kineto_file(recording["raw"], "run.pt.trace.json").table)
    assert parsed.lines_skipped == 0, parsed.problems
    print(f"25 events with braces in their strings: {took:.2f} s")  # (34 s for 20 before; not asserted: bench/)


def test_a_trace_getnext_of_no_phase_is_counted_and_its_flow_events_are_not(recording):
    def strip_phase(doc):
        calls = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(LOADER)),
                       key=lambda e: e["ts"])
        del calls[4]["ph"]
        doc["traceEvents"].append(dict(calls[5], ph="f", bp="e"))  # a flow event carries the op's name

    parsed = parse_kineto_file(_trace_with(recording, strip_phase), "run.pt.trace.json")
    assert len(getnext_starts(parsed.table)) == len(recording["calls"]) - 1
    assert parsed.lines_skipped == 1, parsed.problems


@pytest.mark.parametrize("layout", ["one-line-one-bad", "indented-cut-short"])
def test_a_framework_file_not_one_event_per_line_keeps_its_valid_events(tmp_path, layout):
    # Read line by line, a file of one line lost every event to one bad one, and an indented
    # file cut short lost them all to its cut (each of its lines a fragment): 0 GetNexts.
    folder, framework, events = _sample_events(tmp_path)
    whole = _loaded_getnexts(SAMPLE)[0]
    last = max(i for i, e in enumerate(events) if e.get("ph") == "X" and e["name"].endswith("::GetNext"))
    if layout == "one-line-one-bad":
        items = [json.dumps(e) for e in events]
        text, expected = "[" + ", ".join(items[:3] + ['{"name": "x", "ph": }'] + items[3:]) + "]", whole
    else:
        kept = events[:last + 1]  # the last GetNext, cut inside
        indented = json.dumps(kept, indent=2)
        text, expected = indented[:indented.rindex('"dur"')], whole - 1
    with open(framework, "w") as handle:
        handle.write(text)
    count, report = _loaded_getnexts(folder)
    assert count == expected
    assert report.lines_skipped == 1
    [said] = report.files_with_skipped_lines
    assert "read by their braces" in said.reason, said


def test_metric_records_written_two_on_a_line_are_kept(tmp_path):
    folder, _, _, _, system = _copy_of_sample(tmp_path)
    clean = load_trial(folder)
    lines = _lines_of(system)
    lines[3:5] = [lines[3] + lines[4]]  # a newline lost between two records
    _rewrite(system, lines)
    trial = load_trial(folder)
    assert len(trial.system) == len(clean.system) and trial.report.lines_skipped == 0


def test_a_trace_event_with_its_name_written_twice_is_one_event(recording):
    # Each "name" was a candidate: the event was taken twice, then reported as one that spans
    # its loader's next call (a bad event, in a file that has none).
    raw = recording["raw"]
    found = re.search(rb'"name": "enumerate\(DataLoader\)#[^"]*",', raw)
    twice = raw[:found.end()] + b" " + found.group() + raw[found.end():]
    parsed = parse_kineto_file(twice, "run.pt.trace.json")
    assert getnext_starts(parsed.table) == getnext_starts(parse_kineto_file(raw, "run.pt.trace.json").table)
    assert parsed.lines_skipped == 0, parsed.problems


def test_a_trace_event_whose_pid_is_a_word_stays_its_processes_loader(recording, tmp_path):
    # Its pid read as missing made it a loader of its own: two budgets for one DataLoader, the
    # verdict over 2 iterators, a batch time lost (23 of 24), the process's pid unknown.
    import dashboard

    doc = json.loads(recording["raw"])
    calls = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(LOADER)),
                   key=lambda e: e["ts"])
    for event in calls[5:7]:
        event["pid"] = "main"
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "run.pt.trace.json").write_bytes(recording["raw"])
    (tmp_path / "word").mkdir()
    (tmp_path / "word" / "run.pt.trace.json").write_text(json.dumps(doc))
    clean, word = dashboard.analyze(str(tmp_path / "clean")), dashboard.analyze(str(tmp_path / "word"))
    assert word.trial.report.values_ignored == 2
    assert [b.loader for b in word.budget] == [b.loader for b in clean.budget] and len(clean.budget) == 1
    assert word.batchtime.count == clean.batchtime.count
    assert word.trial.processes == clean.trial.processes
    assert set(word.trial.framework["pid"].dropna().astype(int)) == set(clean.trial.framework["pid"].dropna().astype(int))


def test_a_trace_event_broken_after_braces_in_its_string_is_skipped_alone(recording):
    # Found by its braces, an event broken after 8 of them (a stray quote) looked open to the
    # buffer's end: taken for one cut by the end, the final chunk's scan stopped there and lost
    # the 5 GetNexts after it, unsaid.
    doc = json.loads(recording["raw"])
    calls = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith(LOADER)),
                   key=lambda e: e["ts"])
    calls[19].setdefault("args", {})["note"] = "MARK"
    text = json.dumps(doc).replace('"MARK"', '"}}}}}}}}}}"oops"')
    parsed = parse_kineto_file(text.encode(), "run.pt.trace.json")
    clean = getnext_starts(parse_kineto_file(recording["raw"], "run.pt.trace.json").table)
    assert len(getnext_starts(parsed.table)) == len(clean) - 1
    assert parsed.lines_skipped == 1 and any("not valid events" in p for p in parsed.problems), parsed.problems


def test_a_trace_gzip_followed_by_a_newline_keeps_its_events_and_says_so(recording, tmp_path):
    # One byte after the stream (echo >> trace.json.gz) was said as a stream that breaks off,
    # "events after it are lost", where no event followed.
    (tmp_path / "run.pt.trace.json.gz").write_bytes(recording["packed"] + b"\n")
    trial = load_trial(str(tmp_path))
    assert int((trial.framework["kind"] == fmt.KIND_GETNEXT).sum()) == len(recording["calls"])
    [said] = trial.report.files_with_skipped_lines
    assert "bytes after the gzip stream are not gzip" in said.reason and "lost" not in said.reason, said
