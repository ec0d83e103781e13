"""`app.py analyze` and reading the same trial from a real S3 API server on loopback."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

import dashboard
from dashboard.synthetic import write_trial
from dashboard.trial.errors import NotATrialError, TrialNotFoundError
from tests.conftest import ROOT, CountingStore, upload_folder


def run_app(*args, env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def trial_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("cli"))
    return folder, write_trial(folder, hosts=2, slow_batches={(0, 4): 60_000})


def test_analyze_json_schema_and_numbers(trial_dir):
    folder, synthetic = trial_dir
    done = run_app("analyze", folder, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # exactly one JSON object
    assert done.stdout.count("\n") == 1
    assert {"trial", "nodes", "files", "lines_skipped", "initialization", "workers", "getnext",
            "batchtime"} <= set(data)
    calls = synthetic.of_kind("getnext")
    assert data["getnext"]["count"] == len(calls)
    assert data["getnext"]["median_us"] == statistics.median(e.duration_us for e in calls)
    assert data["getnext"]["max_us"] == 60_000
    outlier = data["getnext"]["outliers"][0]
    assert set(outlier) == {"start_us", "end_us", "duration_us", "worker_id", "pid", "node", "rank"}
    slow = [e for e in calls if e.duration_us == 60_000]
    # node is the host: the synthetic node id `<pid>-algo-N` names the process on it
    assert {(o["start_us"], o["worker_id"], o["node"], o["pid"], o["rank"]) for o in data["getnext"]["outliers"]} >= {
        (e.start_us, e.worker_id, e.node.split("-", 1)[1], e.pid, None) for e in slow}
    assert data["nodes"] == ["algo-1", "algo-2"]
    assert sorted((p["node"], p["id"], p["pid"], p["rank"]) for p in data["processes"]) == sorted(
        {(e.node.split("-", 1)[1], e.node, e.pid, None) for e in calls})
    assert data["workers"]["count"] == len(synthetic.of_kind("worker"))
    assert data["initialization"]["count"] == len(synthetic.of_kind("init"))
    assert {(i["type"], i["num_workers"], i["count"]) for i in data["initialization"]["iterators"]} == {
        ("_MultiProcessingDataLoaderIter", 2, 6), ("_SingleProcessDataLoaderIter", 0, 6)}
    assert data["files"] == {"read": len(synthetic.framework_files) + len(synthetic.system_files),
                             "skipped": []}
    assert data["batchtime"]["count"] == 2 * 3 * (20 - 1 + 5 - 1)


def test_analyze_node_and_text(trial_dir):
    folder, synthetic = trial_dir
    done = run_app("analyze", folder, "--json", "--node", "algo-1")
    data = json.loads(done.stdout)
    assert data["getnext"]["count"] == len([e for e in synthetic.of_kind("getnext") if e.node.endswith("-algo-1")])
    text = run_app("analyze", folder)
    assert text.returncode == 0 and "GetNext calls: 150" in text.stdout


def test_analyze_errors_are_one_line(tmp_path):
    done = run_app("analyze", str(tmp_path / "missing"), "--json")
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "missing" in done.stderr and "Traceback" not in done.stderr


def test_a_node_or_rank_the_trial_lacks_is_an_error_and_no_kept_answer(trial_dir, tmp_path):
    # A mistyped host printed "no verdict: no GetNext events" with exit 0, and --cache-dir kept
    # that as the answer. compare already refused it; analyze does the same now.
    folder, _ = trial_dir
    cache = str(tmp_path / "cache")
    for scope in (("--node", "algo-9"), ("--rank", "3"), ("--node", "algo-1", "--rank", "3")):
        done = run_app("analyze", folder, "--json", "--cache-dir", cache, *scope)
        assert done.returncode == 2 and done.stdout == "", (scope, done.stdout)
        assert done.stderr == f"error: {folder}: no events of {' '.join(scope)}\n", done.stderr
    kept = os.path.join(cache, "results")  # (dashboard/result_cache.py's folder of answers)
    assert not os.path.isdir(kept) or not os.listdir(kept), os.listdir(kept)
    done = run_app("analyze", folder, "--json", "--cache-dir", cache, "--node", "algo-2")
    assert done.returncode == 0 and json.loads(done.stdout)["nodes"] == ["algo-2"], done.stderr


@pytest.mark.parametrize("command", ["analyze", "compare"])
def test_an_empty_node_is_refused_not_read_as_the_whole_job(trial_dir, command):
    # `--node "$HOST"` with HOST unset analyzed every host, exit 0, as if no --node were given.
    folder, _ = trial_dir
    done = run_app(command, folder, *([folder] if command == "compare" else []), "--node", " ")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert "--node: no host given" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("factor", ["nan", "inf", "0", "-1", "1", "x"])
def test_an_outlier_factor_that_flags_all_or_nothing_is_refused(trial_dir, factor):
    folder, _ = trial_dir
    done = run_app("analyze", folder, "--outlier-factor", factor)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert "--outlier-factor" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_s3_gives_identical_results(trial_dir, s3_client, s3_endpoint):
    folder, _ = trial_dir
    upload_folder(s3_client, folder, "trials", "job-1/profiler-output")
    local = dashboard.analyze(folder).to_dict()
    remote = dashboard.analyze("s3://trials/job-1/profiler-output").to_dict()
    local.pop("trial"), remote.pop("trial")
    assert remote == local
    # and through the command line, with the endpoint from AWS_ENDPOINT_URL_S3
    done = run_app("analyze", "s3://trials/job-1/profiler-output", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["getnext"] == local["getnext"]


def test_s3_errors(s3_client, s3_endpoint):
    with pytest.raises(TrialNotFoundError, match="no-such-bucket"):
        dashboard.load_trial("s3://no-such-bucket/x")
    s3_client.create_bucket(Bucket="empty")
    s3_client.put_object(Bucket="empty", Key="job/readme.txt", Body=b"hi")
    with pytest.raises(NotATrialError, match="s3://empty/job"):
        dashboard.load_trial("s3://empty/job")
    done = run_app("analyze", "s3://no-such-bucket/x")
    assert done.returncode != 0 and "no-such-bucket" in done.stderr and "Traceback" not in done.stderr


def test_s3_listing_is_paginated(s3_client, s3_endpoint, tmp_path):
    # More than 1000 keys: list_objects_v2 needs several pages.
    synthetic = write_trial(str(tmp_path), epochs=60, train_batches=10, val_batches=0, rotate_s=0.0001,
                            system=False)
    assert len(synthetic.framework_files) > 1000
    upload_folder(s3_client, str(tmp_path), "many", "p")
    trial = dashboard.load_trial("s3://many/p")
    assert trial.report.files_read == len(synthetic.framework_files)
    assert (trial.framework["kind"] == "getnext").sum() == len(synthetic.of_kind("getnext"))


def test_s3_reload_downloads_only_new_and_changed_objects(s3_client, s3_endpoint, tmp_path):
    """The file cache keys S3 objects by ETag: a reload after the job uploads more reads only
    the new objects and the ones rewritten."""
    from dashboard.trial.load import load_trial
    from dashboard.trial.store import open_store

    folder = str(tmp_path / "trial")
    first = write_trial(folder, epochs=2, train_batches=20, val_batches=0, rotate_s=0.05)
    upload_folder(s3_client, folder, "live", "job/profiler-output")
    path = "s3://live/job/profiler-output"

    def fresh_store():
        return CountingStore(open_store(path))

    file_cache: dict = {}
    store = fresh_store()
    loaded = load_trial(path, store=store, file_cache=file_cache)
    assert len(store.reads) == len(store.list())
    store = fresh_store()
    assert len(load_trial(path, store=store, file_cache=file_cache).framework) == len(loaded.framework)
    assert store.reads == []

    etags = {info.key: info.version for info in store.list()}
    write_trial(folder, epochs=1, train_batches=15, val_batches=0, main_pid=40_000, rotate_s=0.05,
                start_us=first.events[-1].end_us + 1_000_000)
    upload_folder(s3_client, folder, "live", "job/profiler-output")  # every file again: same ETag if unchanged
    changed = {info.key for info in store.list() if etags.get(info.key) != info.version}
    assert changed and len(changed) < len(store.list())
    store = fresh_store()
    grown = load_trial(path, store=store, file_cache=file_cache)
    assert set(store.reads) == changed
    fresh = load_trial(path)
    assert sorted(grown.framework["start_us"]) == sorted(fresh.framework["start_us"])
    assert len(grown.system) == len(fresh.system)
