"""The collector's parts: writer, stream, sink, node ids, system metrics, the API's edges.

The end-to-end behaviour on real training is in test_collector.py; here each part is
checked on inputs whose expected output the test computes itself.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
import time
from array import array

import pytest

import dashboard
from dashboard import format as fmt
from dashboard.collector import protocol
from dashboard.collector.identity import identify
from dashboard.collector.sink import SinkConfig, run_sink
from dashboard.collector.writer import SystemMetricsWriter, TraceWriter
from tests.conftest import ROOT

T0 = 1_795_986_600_000_000  # epoch us, 2026-11-29 21:50 UTC


# --- writer -------------------------------------------------------------------------------

def test_closed_framework_files_are_strict_json_and_phases_stay_put(tmp_path):
    writer = TraceWriter(str(tmp_path), "7-algo-1", start_time_us=T0, rotate_s=10,
                         phases=[fmt.PHASE_INIT, fmt.PHASE_ITER])
    assert writer.phase_pid(fmt.PHASE_ITER) == 2
    writer.complete(fmt.PHASE_INIT, "X.__init__", T0 + 5, T0 + 50, {"pid": 7})
    text = ',\n{"name": "X::GetNext", "pid": 2, "ph": "X", "ts": %d, "dur": 10, "args": {"pid": 7}}'
    writer.write_events(text % 60 + text % 80, T0 + 60, T0 + 90)
    writer.flush()
    # While open: the .tmp is every event so far, readable by this project's reader.
    partial = dashboard.load_trial(str(tmp_path))
    assert len(partial.framework) == 3
    writer.rotate_if_due(T0 + 11_000_000)  # 11 s later: the file closes
    assert writer.phase_pid("Other") == 3  # a new phase keeps the old ones' pids
    writer.complete("Other", "o", T0 + 11_000_000, T0 + 11_000_100)
    writer.close()
    assert len(writer.closed_keys) == 2
    first = json.loads((tmp_path / writer.closed_keys[0]).read_text())
    second = json.loads((tmp_path / writer.closed_keys[1]).read_text())
    assert first[0]["args"][fmt.ARG_START_TIME] == T0
    assert [e["ts"] for e in first if e["ph"] == "X"] == [5, 60, 80]
    assert writer.closed_keys[0].endswith(f"/{T0 + 90}_7-algo-1_pythontimeline.json")
    phases = {e["pid"]: e["args"]["name"] for e in second if e["ph"] == "M" and "name" in e["args"]}
    assert phases == {1: fmt.PHASE_INIT, 2: fmt.PHASE_ITER, 3: "Other"}
    assert not glob.glob(str(tmp_path / "**" / "*.tmp"), recursive=True)
    trial = dashboard.load_trial(str(tmp_path))
    assert sorted(trial.framework["start_us"] - T0) == [5, 60, 80, 11_000_000]


def test_write_events_rotates_on_size(tmp_path):
    writer = TraceWriter(str(tmp_path), "1-algo-1", start_time_us=T0, max_bytes=2_000)
    line = ',\n{"name": "n", "pid": 1, "ph": "X", "ts": %d, "dur": 1, "args": {}}'
    for i in range(100):
        writer.write_events(line % i, T0 + i, T0 + i + 1)
    writer.close()
    assert len(writer.closed_keys) > 1
    events = [e for key in writer.closed_keys for e in json.loads((tmp_path / key).read_text()) if e["ph"] == "X"]
    assert [e["ts"] for e in events] == list(range(100))


# --- the stream -----------------------------------------------------------------------------

def test_frames_survive_any_split():
    records = array("q", [T0 * 1000, T0 * 1000 + 5, protocol.source(3, -1),
                          T0 * 1000 + 9, T0 * 1000 + 20, protocol.source(3, 1)])
    stream = (protocol.getnext_frame(records) + protocol.frame(protocol.CONTROL, b'{"t":"init"}')
              + protocol.frame(protocol.QUIT))
    for cut in range(len(stream) + 1):
        reader = protocol.FrameReader()
        frames = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert [k for k, _ in frames] == [protocol.GETNEXT, protocol.CONTROL, protocol.QUIT]
        assert list(protocol.getnext_records(frames[0][1])) == list(records)
        assert reader.pending == 0


def test_buffer_keeps_control_records_in_order():
    from dashboard.collector.collector import _Buffer

    buffer = _Buffer()
    buffer.control({"t": "init", "iid": 1})
    buffer.add([1, 2, protocol.source(1, -1)])
    buffer.add([3, 4, protocol.source(1, -1)])
    buffer.control({"t": "init", "iid": 2})
    buffer.add([5, 6, protocol.source(2, 0)])
    first = protocol.FrameReader().feed(buffer.drain())
    buffer.add([7, 8, protocol.source(2, 1)])
    buffer.control({"t": "init", "iid": 3})
    second = protocol.FrameReader().feed(buffer.drain())
    assert buffer.drain() == b""

    def decode(frames):
        out = []
        for kind, payload in frames:
            if kind == protocol.GETNEXT:
                values = list(protocol.getnext_records(payload))
                out += [(values[i], values[i + 1], *protocol.split_source(values[i + 2]))
                        for i in range(0, len(values), 3)]
            else:
                out.append(json.loads(payload)["iid"])
        return out

    assert decode(first) == [1, (1, 2, 1, -1), (3, 4, 1, -1), 2, (5, 6, 2, 0)]
    assert decode(second) == [(7, 8, 2, 1), 3]
    assert protocol.split_source(protocol.source(2**40, protocol.MAX_WORKER_ID)) == (2**40, 65533)
    assert protocol.split_source(protocol.source(7, protocol.WORKER_UNKNOWN)) == (7, -2)


# --- node ids -------------------------------------------------------------------------------

@pytest.mark.parametrize("env, node, system_node", [
    ({}, "4242-algo-1", "algo-1"),
    ({"RANK": "3", "LOCAL_RANK": "1"}, "3-algo-1", None),
    ({"RANK": "8", "LOCAL_RANK": "0", "GROUP_RANK": "1"}, "8-algo-2", "algo-2"),
    ({"RANK": "5", "SM_CURRENT_HOST": "algo-3", "LOCAL_RANK": "1"}, "5-algo-3", None),
    ({"SM_CURRENT_HOST": "algo-2"}, "4242-algo-2", "algo-2"),
    ({"RANK": "2"}, "2-algo-1", None),  # no local rank known: rank 0 records the host
    ({"RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, "0-algo-1", "algo-1"),
])
def test_node_ids_follow_the_format(env, node, system_node):
    identity = identify(env, pid=4242)
    assert (identity.node, identity.system_node) == (node, system_node)


# --- system metrics -----------------------------------------------------------------------

def test_system_sample_has_the_reference_schema():
    import psutil

    from dashboard.collector.system import SystemSampler

    sampler = SystemSampler(lambda records: None, interval_s=0.1, gpu=True)
    assert sampler.sample() == []  # the baseline
    busy_until = time.perf_counter() + 0.2
    while time.perf_counter() < busy_until:
        pass
    records = sampler.sample()
    cpus = len(psutil.cpu_times(percpu=True))
    by_key = {(r[0], r[1], r[2]): r[3] for r in records}
    for i in range(cpus):
        assert 0 <= by_key[("cpu", f"cpu{i}", "CPUUtilization")] <= 100
        assert 0 <= by_key[("cpu", f"cpu{i}", "I/OWaitPercentage")] <= 100
    assert sum(by_key[("cpu", f"cpu{i}", "CPUUtilization")] for i in range(cpus)) > 0  # we were busy
    assert 0 < by_key[("memory", "MemoryUsedPercent", "")] <= 100
    assert ("network", "ReceiveBytesPerSecond", "Algorithm") in by_key
    assert all(value >= 0 for value in by_key.values())
    assert len({r[4] for r in records}) == 1  # one timestamp per sample
    # No GPU here: none reported, nothing raised.
    assert not [r for r in records if r[0] == "gpu"] or _has_nvidia()


def _has_nvidia() -> bool:
    return os.path.exists("/dev/nvidiactl")


def test_system_metrics_writer_rotates_per_minute(tmp_path):
    writer = SystemMetricsWriter(str(tmp_path), "algo-1")
    for second in (0.5, 30.0, 59.9, 60.1, 125.0):
        writer.write([("cpu", "cpu0", "CPUUtilization", 1.0, T0 / 1e6 + second)])
    writer.close()
    assert len(writer.closed_keys) == 3
    lines = [json.loads(line) for key in writer.closed_keys for line in (tmp_path / key).read_text().splitlines()]
    assert len(lines) == 5 and {line["NodeId"] for line in lines} == {"algo-1"}


# --- the sink, fed by hand ------------------------------------------------------------------------

def _sink_config(tmp_path, **overrides):
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    values = dict(out=str(tmp_path / "trial"), node="99-algo-1", system_node=None, start_us=T0,
                  main_pid=99, spool_dir=str(spool), system_interval_s=None, tick_s=0.05)
    values.update(overrides)
    return SinkConfig(**values)


def test_sink_turns_records_and_spool_files_into_events(tmp_path):
    config = _sink_config(tmp_path)
    ns = T0 * 1000
    # A worker that ended, with two fetches; its last line is written in two pieces.
    end_line = f"E {ns + 20_000_000} exit\n"
    (tmp_path / "spool" / "501.w").write_text(
        f"S 501 0 2 1 {ns + 1_000_000} {ns + 3_000_000}\n"
        f"F {ns + 4_000_000} {ns + 6_000_000} 500000\nF {ns + 7_000_000} {ns + 8_000_000} 0\n" + end_line[:9])
    # A worker still running when the stream ends (this process stands in for it), and
    # one that died without an end record (a reaped child): it ends at its file's last write.
    running, lost = os.getpid(), subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                                                capture_output=True, text=True).stdout.strip()
    (tmp_path / "spool" / f"{running}.w").write_text(f"S {running} 1 2 1 {ns + 1_000_000} {ns + 1_000_000}\n")
    (tmp_path / "spool" / f"{lost}.w").write_text(f"S {lost} 1 2 1 {ns + 1_000_000} {ns + 1_000_000}\n")
    os.utime(tmp_path / "spool" / f"{lost}.w", ns=(ns + 30_000_000, ns + 30_000_000))
    read_fd, write_fd = os.pipe()
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("status", run_sink(config, read_fd)))
    thread.start()
    init = {"t": "init", "iid": 1, "cls": "_MultiProcessingDataLoaderIter", "lid": 1, "t0": ns, "t1": ns + 2_000_000,
            "pid": 99, "nw": 2, "pin": False, "pers": False, "pf": 2}
    getnext = array("q", [ns + 2_500_000, ns + 9_000_000, protocol.source(1, 0),
                          ns + 9_500_000, ns + 9_600_000, protocol.source(1, 1),
                          ns + 9_700_000, ns + 9_800_000, protocol.source(1, protocol.WORKER_UNKNOWN)])
    os.write(write_fd, protocol.frame(protocol.CONTROL, protocol.control_payload(init)))
    os.write(write_fd, protocol.getnext_frame(getnext))
    time.sleep(0.2)  # a tick reads the spool's complete lines
    with open(tmp_path / "spool" / "501.w", "a") as spool:
        spool.write(end_line[9:])
    os.write(write_fd, protocol.frame(protocol.QUIT))
    os.close(write_fd)
    thread.join(10)
    os.close(read_fd)
    assert result["status"] == 0
    assert not os.path.exists(config.spool_dir)
    trial = dashboard.load_trial(config.out)
    fw = trial.framework.set_index("name")
    init_event = fw.loc["_MultiProcessingDataLoaderIter.__init__"]
    assert (init_event["start_us"], init_event["duration_us"], init_event["iterator_id"]) == (T0, 2000, 1)
    getnexts = trial.framework[trial.framework["kind"] == fmt.KIND_GETNEXT]
    assert list(getnexts["duration_us"]) == [6500, 100, 100]
    assert list(getnexts["step"]) == [0, 1, 2]
    assert getnexts["worker_id"].iloc[:2].tolist() == [0, 1]
    assert getnexts["worker_id"].isna().tolist() == [False, False, True]  # unknown: no worker_id
    workers = trial.framework[trial.framework["kind"] == fmt.KIND_WORKER].set_index("pid")
    assert sorted(workers.index) == sorted([501, running, int(lost)])
    assert (workers["start_us"] - T0).tolist() == [1000, 1000, 1000]
    assert workers.loc[501, "end_us"] - T0 == 20_000 and workers.loc[int(lost), "end_us"] - T0 == 30_000
    assert workers.loc[running, "end_us"] >= time.time_ns() // 1000 - 60_000_000  # ended at the stop
    fetches = trial.framework[trial.framework["kind"] == fmt.KIND_FETCH]
    assert list(fetches["duration_us"]) == [2000, 1000] and set(fetches["worker_id"]) == {0}
    first = fw.loc["_MultiProcessingDataLoaderIter.first_batch"]
    assert (first["start_us"], first["end_us"]) == (T0, T0 + 9000)
    raw = [json.loads(line.rstrip(",\n")) for path in glob.glob(config.out + "/framework/pevents/*/*.json")
           for line in open(path) if ".worker" in line]
    assert {event["args"]["pid"]: event["args"]["exit"] for event in raw} == {
        501: "exit", running: "running", int(lost): "lost"}


def test_sink_that_cannot_write_drains_the_stream(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    config = _sink_config(tmp_path, out=str(blocker / "trial"))
    read_fd, write_fd = os.pipe()
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("status", run_sink(config, read_fd)))
    thread.start()
    for _ in range(50):  # more than a pipe holds: it must be read, never block the writer
        os.write(write_fd, protocol.getnext_frame(array("q", [1, 2, 3] * 1000)))
    os.close(write_fd)
    thread.join(10)
    os.close(read_fd)
    assert result["status"] == 1


# --- the API's edges, in this process ------------------------------------------------------------

def _loop(loader) -> int:
    return sum(1 for _ in loader)


def test_in_process_sink_and_an_iterator_from_before_the_start(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from dashboard.collector import Collector, profile_dataloaders

    loader = DataLoader(TensorDataset(torch.arange(20.0)), batch_size=4)
    early = iter(loader)
    next(early)  # one batch before recording: not recorded
    with profile_dataloaders(str(tmp_path / "trial"), sidecar=False, system_interval_s=None) as collector:
        assert isinstance(collector, Collector) and collector.active
        assert sum(1 for _ in early) == 4  # adopted on first use
        assert _loop(loader) == 5
        assert _loop(loader) == 5
    assert not collector.active and collector.sink_returncode == 0
    assert _loop(loader) == 5  # after stop: torch as it was
    trial = dashboard.load_trial(str(tmp_path / "trial"))
    getnexts = trial.framework[trial.framework["kind"] == fmt.KIND_GETNEXT]
    inits = trial.framework[trial.framework["kind"] == fmt.KIND_INIT]
    assert len(getnexts) == 14 and len(inits) == 2
    assert getnexts.groupby("iterator_id").size().sort_index().tolist() == [4, 5, 5]
    assert list(getnexts["step"]) == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    from torch.utils.data import dataloader as torch_dataloader

    assert not hasattr(DataLoader.__iter__, "__wrapped__")
    assert not hasattr(torch_dataloader._BaseDataLoaderIter.__next__, "__wrapped__")
    assert not hasattr(torch_dataloader._MultiProcessingDataLoaderIter._process_data, "__wrapped__")


def test_second_collector_and_unwritable_output_warn_and_record_nothing(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from dashboard.collector import CollectorWarning, profile_dataloaders

    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)
    with profile_dataloaders(str(tmp_path / "a"), sidecar=False, system_interval_s=None):
        with pytest.warns(CollectorWarning, match="already recording"):
            with profile_dataloaders(str(tmp_path / "b"), sidecar=False) as second:
                assert not second.active
                assert _loop(loader) == 2
    assert not (tmp_path / "b").exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.warns(CollectorWarning, match="not recording"):
        with profile_dataloaders(str(blocker / "trial"), sidecar=False) as third:
            assert not third.active
            assert _loop(loader) == 2


@pytest.mark.parametrize("kwargs", [{"out": ""}, {"out": "s3://"}, {"out": "x", "rotate_s": 0},
                                    {"out": "x", "system_interval_s": 0.01}])
def test_wrong_arguments_are_errors_before_training(kwargs):
    from dashboard.collector import Collector

    with pytest.raises(ValueError):
        Collector(**kwargs)


def test_command_line_needs_a_script(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "dashboard.collector", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert done.returncode == 2 and "no script" in done.stderr
    done = subprocess.run([sys.executable, "-m", "dashboard.collector", "--out", str(tmp_path), "--",
                           str(tmp_path / "missing.py")], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert done.returncode == 2 and "no such file" in done.stderr


def test_collector_imports_neither_pandas_nor_dash():
    code = ("import sys; import dashboard.collector as c; from dashboard.collector import collector, hooks, "
            "sink, system, worker, writer; import dashboard.trial.store; "
            "print(sorted(m for m in ('pandas', 'dash', 'pyarrow', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), check=True)
    assert done.stdout.strip() == "[]"


def test_gpu_metrics_through_nvml(monkeypatch):
    """NVML answers as the real library does (nvidia-ml-py's `pynvml` module)."""
    import types

    from dashboard.collector.system import SystemSampler

    memory = types.SimpleNamespace(used=3 * 2**30, total=12 * 2**30)
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: f"gpu-{i}",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=40 if h == "gpu-0" else 90, memory=5),
        nvmlDeviceGetMemoryInfo=lambda h: memory)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = SystemSampler(lambda records: None, interval_s=0.1, gpu=True)
    from dashboard.collector.system import _Gpus

    sampler._gpus = _Gpus()
    sampler.sample()
    gpus = {(r[1], r[2]): r[3] for r in sampler.sample() if r[0] == "gpu"}
    assert gpus == {("gpu0", "GPUUtilization"): 40.0, ("gpu0", "GPUMemoryUtilization"): 25.0,
                    ("gpu1", "GPUUtilization"): 90.0, ("gpu1", "GPUMemoryUtilization"): 25.0}


def test_s3_output_without_a_bucket_keeps_the_files(tmp_path, s3_endpoint, capfd):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from dashboard.collector import profile_dataloaders

    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4)
    with profile_dataloaders("s3://no-such-bucket/job", sidecar=False, system_interval_s=None) as collector:
        assert _loop(loader) == 2  # training goes on
    assert collector.sink_returncode == 0
    message = capfd.readouterr().err
    assert "cannot upload framework/pevents/" in message and "does not exist" in message
    kept = message.split("kept at ")[1].split()[0]
    events = json.loads(open(kept).read())
    assert len([e for e in events if e.get("ph") == "X" and "GetNext" in e["name"]]) == 2
    import shutil

    shutil.rmtree(kept[:kept.index("/framework/")])


def test_a_job_shorter_than_the_interval_still_gets_one_sample():
    from dashboard.collector.system import SystemSampler

    samples = []
    sampler = SystemSampler(samples.append, interval_s=60, gpu=False)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    assert len(samples) == 1  # the last one, taken at stop, with rates over the 0.3 s
    assert {r[0] for r in samples[0]} >= {"cpu", "memory"}


def test_a_job_stopped_at_once_still_gets_one_sample():
    """The sink can be told to quit before its sampling thread first runs (a short job
    on a loaded host): the baseline is taken at start, so stop still sends a sample."""
    from dashboard.collector.system import SystemSampler

    for _ in range(20):
        samples = []
        sampler = SystemSampler(samples.append, interval_s=60, gpu=False)
        sampler.start()
        sampler.stop()
        assert len(samples) == 1
        assert {r[0] for r in samples[0]} >= {"cpu", "memory"}


# --- uploads to an S3 that never answers ----------------------------------------------------------

UPLOAD_TIMEOUT_S = 2.0
# Past the upload timeout: closing the files and the thread's own steps, on a loaded machine.
FINISH_MARGIN_S = 10.0


def hanging_s3_env(monkeypatch, server) -> None:
    for name in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_sink_gives_up_uploads_to_a_hanging_s3_on_time_and_names_what_stayed_local(tmp_path, monkeypatch, capfd):
    from tests.conftest import SilentServer

    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the staging folder: removed with tmp_path
    with SilentServer(lifetime_s=60) as server:
        hanging_s3_env(monkeypatch, server)
        config = _sink_config(tmp_path, out="s3://hanging/job", upload_timeout_s=UPLOAD_TIMEOUT_S)
        read_fd, write_fd = os.pipe()
        result = {}
        thread = threading.Thread(target=lambda: result.setdefault("status", run_sink(config, read_fd)), daemon=True)
        thread.start()
        ns = T0 * 1000
        os.write(write_fd, protocol.getnext_frame(array("q", [ns, ns + 1000, protocol.source(1, 0)])))
        os.write(write_fd, protocol.frame(protocol.QUIT))
        os.close(write_fd)
        quit_at = time.monotonic()
        thread.join(UPLOAD_TIMEOUT_S + FINISH_MARGIN_S)
        finished_s = time.monotonic() - quit_at
        assert not thread.is_alive(), f"the sink still waits {finished_s:.0f} s after the end of the stream"
        os.close(read_fd)
        assert server.accepted >= 1  # the upload did reach the endpoint, and hung there
    assert result["status"] == 0 and finished_s >= UPLOAD_TIMEOUT_S
    message = capfd.readouterr().err
    assert f"did not finish in {UPLOAD_TIMEOUT_S:g} s" in message, message
    staging = message.split("stayed local in ")[1].split(":")[0]
    assert os.path.dirname(staging) == str(tmp_path)
    named = message.split("stayed local in ")[1].split(": ", 1)[1].strip().split(", ")
    assert named and all(key.startswith("framework/pevents/") for key in named)
    for key in named:
        events = json.loads(open(os.path.join(staging, key)).read())
        getnexts = [e for e in events if e.get("ph") == "X" and e["name"].endswith("::GetNext")]
        assert len(getnexts) == 1 and getnexts[0]["dur"] == 1  # the one written, 1 us long


def test_the_upload_timeout_must_be_positive():
    from dashboard.collector import Collector

    for bad in (0, -1):
        with pytest.raises(ValueError, match="upload_timeout_s"):
            Collector("x", upload_timeout_s=bad)
