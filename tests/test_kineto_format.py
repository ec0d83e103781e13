"""PyTorch profiler (Kineto) traces as trials, from real torch.profiler runs.

Each run counts, in the training loop itself, every `next()` it makes on its loaders
(the StopIteration call included: DataLoader records it too) and the profiler step at
that moment; expected counts are those made inside the recorded windows.
"""
from __future__ import annotations

import base64
import gzip
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import orjson
import pytest
import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile, record_function, schedule
from torch.profiler import tensorboard_trace_handler
from torch.utils.data import DataLoader, Dataset

import dashboard
from dashboard import format as fmt
from dashboard.collector.writer import TraceWriter
from dashboard.analysis.diagnosis import loaders
from dashboard.report import to_dict, to_text
from dashboard.trial import kineto_format
from dashboard.trial.kineto_format import parse_kineto_file
from dashboard.trial.load import load_trial
from dashboard.trial.errors import NotATrialError
from dashboard.trial.load import classify_key

from tests.conftest import ROOT, upload_folder

pytestmark = pytest.mark.torch
MP_NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
SP_NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
HOST = socket.gethostname()


class Squares(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((8,), float(i)), i % 3


def counted(loader, log: list, prof=None):
    """Iterates `loader`, logging the profiler step at every next() call, StopIteration's too."""
    it = iter(loader)
    while True:
        log.append(prof.step_num if prof is not None else None)
        try:
            batch = next(it)
        except StopIteration:
            return
        yield batch


def train_step(model, batch):
    x, y = batch
    torch.nn.functional.cross_entropy(model(x), y).backward()


def gets(trial, name=None):
    fw = trial.framework
    calls = fw[fw["kind"] == fmt.KIND_GETNEXT]
    return calls if name is None else calls[calls["name"].astype(str) == name]


@pytest.fixture(scope="module")
def two_loaders(tmp_path_factory):
    """No schedule, plain JSON: 2 epochs of a 2-worker train loader and a 1-process val loader."""
    folder = tmp_path_factory.mktemp("two_loaders")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    train = DataLoader(Squares(40), batch_size=4, num_workers=2)
    val = DataLoader(Squares(12), batch_size=4, num_workers=0)
    train_log, val_log = [], []
    t0 = time.time_ns() // 1000
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            for batch in counted(train, train_log):
                train_step(model, batch)
            with torch.no_grad():
                for batch in counted(val, val_log):
                    model(batch[0])
    t1 = time.time_ns() // 1000
    prof.export_chrome_trace(str(folder / f"{HOST}_{os.getpid()}.1.pt.trace.json"))
    return {"folder": str(folder), "train": len(train_log), "val": len(val_log), "t0": t0, "t1": t1}


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory):
    """A schedule with two cycles, gzip through tensorboard_trace_handler, prof.step() per batch."""
    folder = tmp_path_factory.mktemp("scheduled")
    sched = schedule(wait=1, warmup=1, active=2, repeat=2)
    model = torch.nn.Linear(8, 3)
    loader = DataLoader(Squares(48), batch_size=4, num_workers=2)
    log = []
    with profile(activities=[ProfilerActivity.CPU], schedule=sched,
                 on_trace_ready=tensorboard_trace_handler(str(folder), use_gzip=True)) as prof:
        for _ in range(2):
            for batch in counted(loader, log, prof):
                train_step(model, batch)
                prof.step()
    recorded = {ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE}
    active_steps = sorted({s for s in range(max(log) + 1) if sched(s) in recorded})
    return {"folder": str(folder), "expected": sum(1 for s in log if sched(s) in recorded),
            "active_steps": active_steps}


def test_a_plain_trace_with_two_loaders_is_a_trial(two_loaders):
    trial = dashboard.load_trial(two_loaders["folder"])
    assert trial.format == "kineto"
    # One host; the process is named by its pid (the trace has no distributedInfo: no rank).
    assert trial.nodes == [HOST]
    [process] = trial.processes
    assert process.rank is None and process.id == f"{process.pid}-{HOST}"
    assert trial.kineto_processes == (process.id,)
    assert trial.report.files_read == 1 and not trial.report.files_skipped
    assert len(gets(trial, MP_NEXT)) == two_loaders["train"] == 2 * (10 + 1)
    assert len(gets(trial, SP_NEXT)) == two_loaders["val"] == 2 * (3 + 1)
    # nothing else is kept: no cpu_op, no step events (no schedule, no prof.step()); but each
    # loader's creation, from its seed draw (test_an_iterator_seen_created_is_marked_at_its_seed_draw)
    assert set(trial.framework["kind"].astype(str)) == {fmt.KIND_GETNEXT, fmt.KIND_CREATED}
    # wall clock from baseTimeNanoseconds: inside the profiled block
    calls = gets(trial)
    assert calls["start_us"].min() >= two_loaders["t0"] and calls["end_us"].max() <= two_loaders["t1"]
    assert (calls["pid"] == os.getpid()).all()
    # what Kineto does not record is unknown, not zero
    multi, single = gets(trial, MP_NEXT), gets(trial, SP_NEXT)
    assert multi["worker_id"].isna().all() and multi["num_workers"].isna().all()
    assert (single["worker_id"] == -1).all() and (single["num_workers"] == 0).all()
    data = to_dict(dashboard.analyze(trial))
    assert data["format"] == "kineto"
    assert data["not_recorded"] == ["initialization", "workers", "worker_id"]
    assert data["initialization"]["count"] is None and data["workers"]["count"] is None
    assert data["getnext"]["count"] == two_loaders["train"] + two_loaders["val"]
    # A single-process batch's worker is the main process (-1); a multi-process one's is not
    # recorded (null: it was -1, "main process", in the JSON and the text report).
    single_starts = set(single["start_us"].tolist())
    outliers = data["getnext"]["outliers"]
    assert outliers and all(row["worker_id"] == (-1 if row["start_us"] in single_starts else None)
                            for row in outliers), outliers
    text = to_text(dashboard.analyze(trial))
    assert "Iterator initializations: not recorded" in text and "Worker processes: not recorded" in text
    assert text.index("Not recorded") < text.index("Trial ")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "analyze", two_loaders["folder"],
                          "--json"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    cli = json.loads(out)
    assert cli["format"] == "kineto" and cli["initialization"]["count"] is None
    assert set(cli["verdict"]) == {"input_percent", "class", "basis", "getnext_s", "training_s"}
    assert cli["verdict"]["class"] in ("highly", "moderately", "not")
    assert list(cli["nodes_verdict"]) == [HOST]
    assert [p["id"] for p in cli["processes"]] == list(cli["processes_verdict"]) == [trial.processes[0].id]
    assert all(set(r) == {"id", "text", "evidence", "saving_s", "change", "predicted"} for r in cli["recommendations"])


def test_times_match_an_independent_read_of_the_trace(two_loaders):
    path = os.path.join(two_loaders["folder"], os.listdir(two_loaders["folder"])[0])
    with open(path, "rb") as handle:
        doc = json.load(handle)
    base_ns = doc["baseTimeNanoseconds"]
    expected = sorted(round(base_ns / 1000 + e["ts"]) for e in doc["traceEvents"]
                      if e.get("ph") == "X" and str(e.get("name")).startswith("enumerate(DataLoader)#"))
    trial = dashboard.load_trial(two_loaders["folder"])
    got = sorted(gets(trial)["start_us"].tolist())
    assert len(got) == len(expected)
    assert max(abs(a - b) for a, b in zip(got, expected)) <= 1


def test_an_iterator_seen_created_is_marked_at_its_seed_draw(two_loaders, scheduled):
    # Read here with json: the last aten::random_ of the thread after its previous __next__ and
    # before the first of each run of one loader's (torch's _BaseDataLoaderIter.__init__ draws
    # the iterator's seed with random_, and a shuffling sampler would draw again as it starts).
    path = os.path.join(two_loaders["folder"], os.listdir(two_loaders["folder"])[0])
    with open(path, "rb") as handle:
        doc = json.load(handle)
    base_us = doc["baseTimeNanoseconds"] / 1000
    events = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    draws = [e for e in events if e["name"] == "aten::random_"]
    expected, previous = [], None
    for call in (e for e in events if e["name"] in (MP_NEXT, SP_NEXT)):
        if previous is None or call["name"] != previous["name"]:  # train, val, train, val
            after = previous["ts"] + previous["dur"] if previous else -float("inf")
            before = [d["ts"] for d in draws if d["tid"] == call["tid"] and after <= d["ts"]
                      and d["ts"] + d["dur"] <= call["ts"]]
            assert before, f"no seed draw before {call['name']} at {call['ts']}"
            expected.append((call["name"].removesuffix(".__next__") + ".created", base_us + max(before)))
        previous = call
    assert len(expected) == 4
    trial = load_trial(two_loaders["folder"])
    fw = trial.framework
    created = fw[fw["kind"] == fmt.KIND_CREATED].sort_values("start_us")
    assert created["name"].astype(str).tolist() == [name for name, _ in expected]
    for start, (_, expected_us) in zip(created["start_us"], expected):
        assert abs(start - expected_us) <= 1  # the importer's rounding of ts to microseconds
    assert (created["duration_us"] == 0).all() and (created["pid"] == os.getpid()).all()
    assert set(created["phase"].astype(str)) == {fmt.PHASE_CREATED}
    # Each of the four iterators' first batch comes after it: the diagnosis may place the rounds
    # of all of its segments.
    [process] = loaders.processes(fw, trial.system)
    assert sorted((loader.name, len(loader.seen_from_start), loader.segments) for loader in process.loaders) == [
        ("_MultiProcessingDataLoaderIter", 2, 2), ("_SingleProcessDataLoaderIter", 2, 2)]
    # The timeline draws each creation as a tick (a bar of no length would not show).
    from dashboard.web import views

    view = views.trial_view(trial)
    window = views.window_payload(view, *view.span)["window_figure"]
    [ticks] = [t for t in window["data"] if t["name"] == fmt.PHASE_CREATED and t["mode"] == "markers"]
    x = ticks["x"]
    x = np.frombuffer(base64.b64decode(x["bdata"]), dtype=x["dtype"]) if isinstance(x, dict) else np.asarray(x)
    assert np.round(x * 1000).astype(int).tolist() == created["start_us"].tolist()
    # A schedule's recordings begin mid-epoch here (steps 2-3 and 6-7 of a 12-batch epoch): the
    # iterator began before them, and nothing says it did not.
    scheduled_fw = load_trial(scheduled["folder"]).framework
    assert not (scheduled_fw["kind"] == fmt.KIND_CREATED).any()


def test_scheduled_gzip_cycles_merge_into_one_trial(scheduled):
    names = sorted(os.listdir(scheduled["folder"]))
    assert len(names) == 2 and all(n.endswith(".pt.trace.json.gz") for n in names)
    trial = dashboard.load_trial(scheduled["folder"])
    assert trial.format == "kineto" and trial.report.files_read == 2
    calls = gets(trial)
    assert len(calls) == scheduled["expected"] > 0
    steps = trial.framework[trial.framework["kind"] == fmt.KIND_STEP]
    assert sorted(steps["step"].tolist()) == scheduled["active_steps"]
    assert sorted(steps["name"].astype(str)) == sorted(f"ProfilerStep#{s}" for s in scheduled["active_steps"])
    assert set(steps["phase"].astype(str)) == {fmt.PHASE_STEP_TRAIN}
    # each GetNext knows its step; each cycle is its own recording: batch times never span two
    assert set(calls["step"].tolist()) <= set(scheduled["active_steps"])
    assert calls["iterator_id"].nunique() == 2
    result = dashboard.analyze(trial)
    assert result.batchtime.count == len(calls) - 2
    assert "training steps" in result.verdict.basis


def test_chunked_gzip_scan_equals_the_plain_scan(two_loaders, monkeypatch):
    path = os.path.join(two_loaders["folder"], os.listdir(two_loaders["folder"])[0])
    with open(path, "rb") as handle:
        data = handle.read()
    plain = parse_kineto_file(data, "t.pt.trace.json")
    packed = gzip.compress(data)
    for chunk in (97, 4096, 65_537):  # event and name boundaries fall anywhere
        monkeypatch.setattr(kineto_format, "CHUNK_BYTES", chunk)
        parsed = parse_kineto_file(packed, "t.pt.trace.json.gz")
        assert parsed.error is None and parsed.lines_skipped == 0
        # the same rows; the recording id is the file's, so it differs by name
        assert parsed.table.drop(["iterator_id"]).equals(plain.table.drop(["iterator_id"]))
        # the calls, and the creation of each loader's two iterators (test_an_iterator_seen_created_...)
        assert plain.table.num_rows == two_loaders["train"] + two_loaders["val"] + 4


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_trace_read_in_pieces_is_never_read_whole(two_loaders, tmp_path, gz):
    """Traces run to GBs: the loader reads them through iter_chunks, piece by piece, and the
    rows are those of the whole file, wherever the pieces cut it."""
    from dashboard.trial.store import LocalStore
    from tests.conftest import CountingStore

    name = os.listdir(two_loaders["folder"])[0]
    with open(os.path.join(two_loaders["folder"], name), "rb") as handle:
        data = handle.read()
    folder = tmp_path / "trace"
    folder.mkdir()
    key = "rank0.pt.trace.json" + (".gz" if gz else "")
    (folder / key).write_bytes(gzip.compress(data) if gz else data)
    whole = parse_kineto_file(data, "rank0.pt.trace.json")

    for size in (97, 4096, 1 << 20):
        store = CountingStore(LocalStore(str(folder)), chunk_bytes=size)
        trial = load_trial(str(folder), store=store)
        assert store.reads == []  # never read() whole
        assert len(store.pieces) == -(-(folder / key).stat().st_size // size)
        got = trial.framework[["name", "start_us", "end_us", "pid"]].astype(str).to_numpy().tolist()
        want = whole.table.select(["name", "start_us", "end_us", "pid"]).to_pandas().astype(str).to_numpy().tolist()
        assert sorted(map(tuple, got)) == sorted(map(tuple, want))
        assert trial.report.files_read == 1 and trial.report.lines_skipped == 0


def test_a_trace_grown_since_its_listing_is_read_as_listed(two_loaders, tmp_path):
    """A trace still being written is read no further than its listing saw: the version the
    listing's fingerprint names, and within the size the listing passed against the limit (the
    whole file is twice the limit here)."""
    from dashboard.trial.store import FileInfo, LocalStore
    from tests.conftest import CountingStore

    name = os.listdir(two_loaders["folder"])[0]
    size = os.path.getsize(os.path.join(two_loaders["folder"], name))
    store = CountingStore(LocalStore(two_loaders["folder"]), chunk_bytes=4096)
    listed = [FileInfo(info.key, size // 2, info.version) for info in store.list()]
    trial = load_trial(two_loaders["folder"], store=store, files=listed, max_bytes=size // 2, threads=1)
    assert sum(store.pieces) == size // 2  # as listed: not a byte past it
    assert trial.report.lines_skipped == 1
    assert "the trace ends early" in trial.report.files_with_skipped_lines[0].reason


@pytest.mark.parametrize("after", ["an event", "its arguments"])
def test_a_trace_cut_just_after_a_closing_brace_is_truncated(two_loaders, tmp_path, after):
    """A cut that leaves the file ending in "}" (an event's, or its arguments') is no whole
    trace: once it passed for one (the check was the last byte), and the test above, whose cut
    falls where it falls, failed about 1 run in 50."""
    [name] = os.listdir(two_loaders["folder"])
    with open(os.path.join(two_loaders["folder"], name), "rb") as handle:
        data = handle.read()
    middle = len(data) // 2
    if after == "an event":
        cut = data.index(b"\n  },", middle) + len(b"\n  }")
    else:
        cut = data.index(b"}", data.index(b'"args": {', middle)) + 1
    (tmp_path / name).write_bytes(data[:cut])
    trial = load_trial(str(tmp_path))
    assert trial.report.lines_skipped == 1
    assert "the trace ends early" in trial.report.files_with_skipped_lines[0].reason
    whole = load_trial(two_loaders["folder"])
    assert whole.report.lines_skipped == 0 and not whole.report.files_with_skipped_lines


def test_ranks_from_distributed_info_become_nodes(tmp_path):
    script = textwrap.dedent(f"""
        import json, os, sys, torch
        import torch.distributed as dist
        from torch.profiler import profile, ProfilerActivity, tensorboard_trace_handler
        from torch.utils.data import DataLoader, TensorDataset
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://{tmp_path}/rendezvous", rank=rank, world_size=2)
        loader = DataLoader(TensorDataset(torch.randn(8 * (rank + 2), 4)), batch_size=4, num_workers=0)
        calls = 0
        with profile(activities=[ProfilerActivity.CPU],
                     on_trace_ready=tensorboard_trace_handler("{tmp_path}/trial",
                                                              worker_name=f"rank{{rank}}")):
            it = iter(loader)
            while True:
                calls += 1
                try:
                    next(it)
                except StopIteration:
                    break
        dist.barrier()
        dist.destroy_process_group()
        print(json.dumps({{"rank": rank, "calls": calls}}))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(rank)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for rank in (0, 1)]
    outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    trial = dashboard.load_trial(str(tmp_path / "trial"))
    # One host, two ranks under it (distributedInfo.rank).
    assert trial.nodes == [HOST]
    assert [(p.node, p.rank, p.id) for p in trial.processes] == [(HOST, 0, f"0-{HOST}"), (HOST, 1, f"1-{HOST}")]
    calls = gets(trial)
    for out in outs:
        on_rank = (calls["rank"] == out["rank"]).sum()
        assert on_rank == out["calls"] == (out["rank"] + 2) * 2 + 1  # batches + StopIteration
    result = dashboard.analyze(trial)
    assert set(result.nodes_verdict) == {HOST}
    assert set(result.processes_verdict) == {f"0-{HOST}", f"1-{HOST}"}


def test_a_folder_may_mix_both_formats(two_loaders, tmp_path):
    folder = tmp_path / "mixed"
    os.makedirs(folder / "profiler")
    src = os.path.join(two_loaders["folder"], os.listdir(two_loaders["folder"])[0])
    with open(src, "rb") as handle:
        (folder / "profiler" / "host_1.2.pt.trace.json").write_bytes(handle.read())
    node = fmt.framework_node_id(777, 1)
    writer = TraceWriter(str(folder), node, start_time_us=1_795_986_600_000_000)
    writer.complete(fmt.PHASE_INIT, fmt.init_event_name("_MultiProcessingDataLoaderIter"),
                    1_795_986_600_000_000, 1_795_986_600_050_000, {"pid": 777, "num_workers": 2})
    writer.complete(fmt.PHASE_ITER, fmt.getnext_event_name("_MultiProcessingDataLoaderIter"),
                    1_795_986_600_060_000, 1_795_986_600_061_000, {"pid": 777, "worker_id": 0})
    writer.close()
    trial = dashboard.load_trial(str(folder))
    assert trial.format == "mixed"
    assert trial.nodes == sorted({"algo-1", HOST})
    kineto = [p.id for p in trial.processes if p.id != node]
    assert len(kineto) == 1 and trial.kineto_processes == tuple(kineto)
    assert len(gets(trial)) == two_loaders["train"] + two_loaders["val"] + 1
    data = to_dict(dashboard.analyze(trial))
    assert data["format"] == "mixed" and data["not_recorded_processes"] == kineto
    assert data["not_recorded_nodes"] == [HOST]
    assert data["initialization"]["count"] == 1  # recorded where the format records it
    # one node of it alone is a Kineto node
    only = to_dict(dashboard.analyze(trial, node=kineto[0]))
    assert only["initialization"]["count"] is None


def test_s3_trial_of_kineto_traces(scheduled, s3_client):
    upload_folder(s3_client, scheduled["folder"], "kineto-bucket", "job/tb")
    remote = dashboard.load_trial("s3://kineto-bucket/job/tb", s3_client=s3_client)
    local = dashboard.load_trial(scheduled["folder"])
    assert remote.format == "kineto" and remote.report.files_read == 2
    assert remote.framework.astype(str).equals(local.framework.astype(str))


def test_datapipe_events_count_once_and_gpu_copies_are_ignored(tmp_path):
    pipe, inner = "enumerate(DataPipe)#IterableWrapperIterDataPipe", "enumerate(DataPipe)#MapperIterDataPipe"

    class Piped(Squares):
        def __getitem__(self, i):
            with record_function(inner):  # a pipe inside a single-process DataLoader's __next__
                return super().__getitem__(i)

    loader = DataLoader(Piped(12), batch_size=4, num_workers=0)
    log = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in counted(loader, log):
            pass
        for i in range(5):  # a pipe chain iterated directly: the outer event counts once
            with record_function(pipe):
                with record_function(inner):
                    torch.ones(2).sum()
    path = tmp_path / "a.pt.trace.json"
    prof.export_chrome_trace(str(path))
    trial = dashboard.load_trial(str(tmp_path))
    assert len(gets(trial, SP_NEXT)) == len(log) == 4
    assert len(gets(trial, pipe)) == 5 and len(gets(trial, inner)) == 0

    # Kineto copies an annotation onto the GPU timeline as gpu_user_annotation: not a second call
    doc = json.loads(path.read_bytes())
    doc["traceEvents"] += [dict(e, cat="gpu_user_annotation", pid=0, tid=7) for e in doc["traceEvents"]
                           if str(e.get("name")) == SP_NEXT]
    path.write_bytes(orjson.dumps(doc))
    assert len(gets(dashboard.load_trial(str(tmp_path)), SP_NEXT)) == 4


def test_string_pids_and_layout_variants(two_loaders):
    path = os.path.join(two_loaders["folder"], os.listdir(two_loaders["folder"])[0])
    with open(path, "rb") as handle:
        doc = json.load(handle)
    pid = os.getpid()
    for event in doc["traceEvents"]:
        if event.get("pid") == pid:
            event["pid"], event["tid"] = str(pid), str(event.get("tid"))
    compact = orjson.dumps(doc)  # one line, no spaces, keys in another order than Kineto's
    parsed = parse_kineto_file(compact, "x.pt.trace.json")
    # the calls and the 4 iterators' creations (their seed draws matched to the calls by thread:
    # string ids as numbers)
    assert parsed.error is None and parsed.table.num_rows == two_loaders["train"] + two_loaders["val"] + 4
    assert set(parsed.table.column("pid").to_pylist()) == {pid}


def test_bad_files_are_reported_and_lose_nothing_valid(two_loaders, tmp_path):
    path = os.path.join(two_loaders["folder"], os.listdir(two_loaders["folder"])[0])
    with open(path, "rb") as handle:
        data = handle.read()
    cut = data.index(MP_NEXT.encode(), len(data) // 2)  # inside an event, half way through
    complete = data[:cut].count(b"enumerate(DataLoader)#")  # events wholly before the cut
    (tmp_path / "cut.pt.trace.json").write_bytes(data[:cut])
    (tmp_path / "cut2.pt.trace.json.gz").write_bytes(gzip.compress(data)[: len(gzip.compress(data)) // 2])
    (tmp_path / "notjson.pt.trace.json").write_bytes(b"<html>not a trace</html>")
    (tmp_path / "badgz.pt.trace.json.gz").write_bytes(b"not gzip at all")
    (tmp_path / "empty.pt.trace.json").write_bytes(b"")
    (tmp_path / "nodataloader.pt.trace.json").write_bytes(
        b'{"baseTimeNanoseconds": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", '
        b'"pid": 1, "tid": 1, "ts": 5.0, "dur": 1.0}]}')
    trial = dashboard.load_trial(str(tmp_path))
    skipped = {s.path: s.reason for s in trial.report.files_skipped}
    assert skipped == {"notjson.pt.trace.json": "not a PyTorch profiler trace (no traceEvents)",
                       "badgz.pt.trace.json.gz": skipped["badgz.pt.trace.json.gz"],
                       "empty.pt.trace.json": "empty file"}
    assert skipped["badgz.pt.trace.json.gz"].startswith("not a valid gzip file")
    assert trial.report.files_read == 3
    with_lines = {s.path: s.reason for s in trial.report.files_with_skipped_lines}
    assert "truncated" in with_lines["cut.pt.trace.json"]
    assert "breaks off" in with_lines["cut2.pt.trace.json.gz"]
    calls = gets(trial)
    assert (calls["iterator_id"] == kineto_format.recording_id("cut.pt.trace.json")).sum() == complete > 0


def test_classify_key_finds_traces_anywhere():
    assert classify_key("a/b/host_1.123.pt.trace.json") == ("kineto", "a/b/host_1.123.pt.trace.json")
    assert classify_key("host_1.123.pt.trace.json.gz")[0] == "kineto"
    assert classify_key("framework/x.pt.trace.json")[0] == "kineto"
    # Any other JSON file is looked at: its content decides (see the not-a-trace tests).
    assert classify_key("notes.json") == ("kineto", "notes.json")
    assert classify_key("notes.txt") is None


def _trace_of(two_loaders) -> dict:
    """The real export_chrome_trace trace of the two-loaders run, as a dict."""
    [name] = os.listdir(two_loaders["folder"])
    with open(os.path.join(two_loaders["folder"], name), "rb") as handle:
        return orjson.loads(handle.read())


def _with_rank(trace: dict, rank: int, world_size: int) -> bytes:
    """The trace as a rank of a distributed job writes it: Kineto's distributedInfo added."""
    return orjson.dumps({**trace, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world_size}})


def test_traces_are_recognised_by_content_under_any_json_name(two_loaders, tmp_path):
    trace = _trace_of(two_loaders)
    expected = two_loaders["train"] + two_loaders["val"]
    # export_chrome_trace's own output under the tutorials' name
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "trace.json").write_bytes(orjson.dumps(trace))
    trial = dashboard.load_trial(str(plain))
    assert trial.format == "kineto" and len(gets(trial)) == expected
    assert trial.nodes == [HOST] and [p.rank for p in trial.processes] == [None]
    # a gzip trace named as Holistic Trace Analysis names them, rank 3 of 8
    hta = tmp_path / "hta"
    hta.mkdir()
    (hta / "rank-3.json.gz").write_bytes(gzip.compress(_with_rank(trace, 3, 8)))
    trial = dashboard.load_trial(str(hta))
    assert len(gets(trial)) == expected
    assert [(p.node, p.rank, p.id) for p in trial.processes] == [(HOST, 3, f"3-{HOST}")]
    # the single file given as the path: a trial of one file, from the API and the CLI
    single = dashboard.load_trial(str(hta / "rank-3.json.gz"))
    assert single.report.files_read == 1 and len(gets(single)) == expected
    out = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "analyze", str(plain / "trace.json"),
                          "--json"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["getnext"]["count"] == expected


def test_two_ranks_traces_in_one_folder_are_one_job(two_loaders, tmp_path):
    trace = _trace_of(two_loaders)
    for rank in (0, 1):
        (tmp_path / f"rank-{rank}.json").write_bytes(_with_rank(trace, rank, 2))
    result = dashboard.analyze(str(tmp_path))
    assert result.trial.nodes == [HOST]
    assert [(p.node, p.rank) for p in result.trial.processes] == [(HOST, 0), (HOST, 1)]
    calls = gets(result.trial)
    assert [(calls["rank"] == rank).sum() for rank in (0, 1)] == [two_loaders["train"] + two_loaders["val"]] * 2
    assert set(result.processes_verdict) == {f"0-{HOST}", f"1-{HOST}"}
    one = dashboard.analyze(result.trial, rank=1)
    assert one.getnext.count == two_loaders["train"] + two_loaders["val"]


def test_json_files_that_are_not_traces_are_not_a_trial_and_the_message_names_every_format(tmp_path):
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    (tmp_path / "events.json").write_text('{"traceEvents": [{"name": "x", "ph": "X", "ts": 1, "dur": 2}]}')
    with pytest.raises(NotATrialError) as caught:
        dashboard.load_trial(str(tmp_path))
    message = str(caught.value)
    for words in ("SageMaker Debugger", "framework/pevents", "system/incremental", "PyTorch profiler",
                  ".pt.trace.json", "traceEvents", "Kineto"):
        assert words in message
    # beside a real trial they are skipped, with the reason
    (tmp_path / "trace.pt.trace.json").write_bytes(orjson.dumps({"schemaVersion": 1, "traceEvents": [
        {"name": "ProfilerStep#1", "ph": "X", "pid": 1, "tid": 1, "ts": 1_795_986_600_000_000, "dur": 10}]}))
    trial = dashboard.load_trial(str(tmp_path))
    reasons = {s.path: s.reason for s in trial.report.files_skipped}
    assert reasons["config.json"].endswith("not a PyTorch profiler trace (no traceEvents))")
    assert "traceEvents without Kineto's" in reasons["events.json"]


def test_a_single_trace_object_in_s3_is_a_trial(two_loaders, s3_client):
    trace = _trace_of(two_loaders)
    s3_client.create_bucket(Bucket="one-trace")
    s3_client.put_object(Bucket="one-trace", Key="runs/a/rank-2.json.gz", Body=gzip.compress(_with_rank(trace, 2, 4)))
    trial = dashboard.load_trial("s3://one-trace/runs/a/rank-2.json.gz", s3_client=s3_client)
    assert len(gets(trial)) == two_loaders["train"] + two_loaders["val"]
    assert [(p.node, p.rank) for p in trial.processes] == [(HOST, 2)]
