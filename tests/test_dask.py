"""The Dask mode on real dask.distributed clusters on loopback, reading a trial from the real S3
API server (moto, tests/conftest.py): a LocalCluster of 2 worker processes, and a scheduler and
a worker started as separate processes (`dask scheduler`, `dask worker`), as a team runs them.

The workers read the files themselves: the caller's store (a CountingStore) reads none. The
results must be identical to the local path's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from dashboard.synthetic import write_trial
from dashboard.trial.load import load_trial
from dashboard.trial.store import open_store
from tests.conftest import ROOT, CountingStore, free_port, upload_folder

distributed = pytest.importorskip("distributed")

BUCKET, PREFIX = "dask-trials", "job/profiler-output"
PATH = f"s3://{BUCKET}/{PREFIX}"


@pytest.fixture
def s3_trial(s3_client, tmp_path):
    folder = str(tmp_path / "trial")
    written = write_trial(folder, hosts=2, epochs=2, train_batches=20, val_batches=3, rotate_s=0.05)
    # One broken line: its report must come back from the workers as the local path writes it.
    for key in sorted(written.framework_files)[1:]:
        full = os.path.join(folder, *key.split("/"))
        with open(full) as handle:
            lines = handle.read().split("\n")
        if any("::GetNext" in line for line in lines):
            break
    broken = next(i for i, line in enumerate(lines) if "::GetNext" in line)
    lines[broken] = lines[broken][:25]
    with open(full, "w") as handle:
        handle.write("\n".join(lines))
    upload_folder(s3_client, folder, BUCKET, PREFIX)
    return written


def _same_as_local(client, written) -> None:
    store = CountingStore(open_store(PATH))
    remote = load_trial(PATH, store=store, dask_client=client)
    assert store.reads == []  # every file read by a worker
    local = load_trial(PATH)
    pd.testing.assert_frame_equal(remote.framework, local.framework)
    pd.testing.assert_frame_equal(remote.system, local.system)
    assert remote.report.to_dict() == local.report.to_dict()
    assert remote.report.lines_skipped == local.report.lines_skipped == 1
    assert [(s.path, s.reason) for s in remote.report.files_with_skipped_lines] == \
        [(s.path, s.reason) for s in local.report.files_with_skipped_lines]
    # And what the writer wrote, less the one GetNext whose line was broken.
    assert (remote.framework["kind"] == "getnext").sum() == len(written.of_kind("getnext")) - 1


def test_a_local_cluster_of_two_worker_processes_reads_the_trial_from_s3(s3_trial, monkeypatch):
    from distributed import Client, LocalCluster

    from dashboard.trial import load

    received = []  # the columns of each table a worker sent back

    def whole_again(table):
        received.append(table.schema.names)
        return with_null_columns(table)

    with_null_columns = load.with_null_columns
    monkeypatch.setattr(load, "with_null_columns", whole_again)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        _same_as_local(client, s3_trial)
        # Their columns of nulls alone stayed with the workers (the reference's files have no
        # iterator id, nor this project's collector's measures): made again here.
        framework = [names for names in received if "phase" in names]
        assert framework and all({"iterator_id", "cpu_us", "runq_us"}.isdisjoint(names) for names in framework)
        # The tasks ran in the workers' processes, not this one.
        pids = set(client.run(os.getpid).values())
        assert len(pids) == 2 and os.getpid() not in pids


def test_per_rank_work_runs_on_the_cluster_and_gives_the_local_answers(s3_trial, monkeypatch):
    # Each rank's files read, summarised and assessed by a worker: this process reads none of
    # them (a load here would fail), and the report is the local analysis's.
    from distributed import Client, LocalCluster

    from dashboard import analyze, by_rank
    from dashboard.report import to_dict

    local = to_dict(analyze(PATH))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        def no_load_here(*args, **kwargs):
            raise AssertionError("a rank's files were read by the caller")

        monkeypatch.setattr(by_rank, "load_trial", no_load_here)
        ranked = to_dict(by_rank.analyze_by_rank(PATH, client=client))
    assert ranked["lines_skipped"] == local["lines_skipped"] == 1
    assert ranked["getnext"] == local["getnext"] and ranked["verdict"] == local["verdict"]
    assert ranked == local


def _wait_for_workers(address: str, count: int, timeout_s: float = 60):
    from distributed import Client

    client = Client(address, timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while len(client.scheduler_info()["workers"]) < count:
        assert time.monotonic() < deadline, "the worker never joined"
        time.sleep(0.2)
    return client


def test_a_scheduler_and_a_worker_started_as_processes(s3_trial, tmp_path):
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": ROOT}
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    command = [dask] if os.path.exists(dask) else [sys.executable, "-m", "distributed.cli.dask_spec"]
    scheduler = subprocess.Popen(command + ["scheduler", "--host", "127.0.0.1", "--port", str(port),
                                            "--no-dashboard"], env=env, cwd=str(tmp_path),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        worker = subprocess.Popen(command + ["worker", address, "--nworkers", "1", "--nthreads", "2",
                                             "--host", "127.0.0.1", "--no-dashboard"],
                                  env=env, cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with _wait_for_workers(address, 1) as client:
            _same_as_local(client, s3_trial)
        # The command line: `analyze --dask-scheduler` prints what it prints without it.
        analyze = [sys.executable, os.path.join(ROOT, "app.py"), "analyze", PATH, "--json"]
        here = subprocess.run(analyze, capture_output=True, text=True, timeout=300, env=env)
        there = subprocess.run(analyze + ["--dask-scheduler", address], capture_output=True, text=True,
                               timeout=300, env=env)
        assert here.returncode == there.returncode == 0, there.stderr
        assert json.loads(there.stdout) == json.loads(here.stdout)
    finally:
        for process in (worker, scheduler):
            if process is not None:
                process.terminate()
        for process in (worker, scheduler):
            if process is not None:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()


def test_an_unreachable_scheduler_is_a_clear_error(tmp_path):
    folder = str(tmp_path / "trial")
    write_trial(folder, epochs=1, train_batches=5, val_batches=0)
    address = f"tcp://127.0.0.1:{free_port()}"  # nobody serves it
    done = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "analyze", folder, "--dask-scheduler",
                           address], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("error: cannot reach the Dask scheduler at " + address)
    assert "Traceback" not in done.stderr
