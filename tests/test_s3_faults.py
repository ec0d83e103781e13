"""S3 faults on a real S3 API server of the test's own (moto in server mode on loopback):
the server stops in the middle of a load, the endpoint is dead, connections drop.

A failed load raises a TrialError with a clear message within seconds (retries and timeouts
are the boto3 client's, see store._s3_client) and never returns part of a trial as if it
were whole; a retry once the server is back reads everything.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from moto.server import ThreadedMotoServer

from dashboard.synthetic import write_trial
from dashboard.trial.errors import TrialError
from dashboard.trial.load import load_trial
from dashboard.trial.store import S3Store
from tests.conftest import free_port

FAKE_SECRET = "fAkeSecret/S3Faults+0123456789abcdefghijklmn"
BUCKET, PREFIX = "faults", "job-1/profiler-output"
TRIAL = f"s3://{BUCKET}/{PREFIX}"
# A refused connection is retried twice with at most 1 s, then 2 s of backoff; the rest of
# the bound is slack for a loaded 2-core machine. Minutes would mean a hand-written loop or
# timeouts left at botocore's defaults.
FAIL_WITHIN_S = 12


def use_endpoint(monkeypatch, endpoint: str) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def upload(folder: str, endpoint: str) -> int:
    client = boto3.client("s3", endpoint_url=endpoint)
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    paths = [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names]

    def put(path):
        key = PREFIX + "/" + os.path.relpath(path, folder).replace(os.sep, "/")
        client.upload_file(path, BUCKET, key)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, paths))
    return len(paths)


def count_objects(endpoint: str) -> int:
    client = boto3.client("s3", endpoint_url=endpoint)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX)
    return sum(len(page.get("Contents", [])) for page in pages)


@pytest.fixture
def server(monkeypatch):
    """A moto S3 server of this test's own, so that stopping it disturbs no other test."""
    state = {"server": ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)}
    state["server"].start()
    host, port = state["server"].get_host_and_port()
    state["endpoint"], state["port"] = f"http://{host}:{port}", port
    state["running"] = True
    use_endpoint(monkeypatch, state["endpoint"])
    yield state
    if state["running"]:
        state["server"].stop()


def test_server_stops_mid_load_then_a_retry_reads_everything(server, tmp_path):
    synthetic = write_trial(str(tmp_path), epochs=10, train_batches=10, val_batches=0, rotate_s=0.0001)
    files = len(synthetic.framework_files) + len(synthetic.system_files)
    assert files >= 200
    assert upload(str(tmp_path), server["endpoint"]) == files

    stopped_at = []

    def stop_server(done, total):
        if done == 20 and not stopped_at:
            server["server"].stop()  # refuses connections from here on
            server["running"] = False
            stopped_at.append(time.monotonic())

    with pytest.raises(TrialError) as caught:
        load_trial(TRIAL, on_progress=stop_server)  # a partial trial is never returned
    failed_after = time.monotonic() - stopped_at[0]
    message = str(caught.value)
    assert message.startswith(f"{TRIAL}: cannot reach S3 (EndpointConnectionError: Could not connect "
                              f"to the endpoint URL: \"{server['endpoint']}/{BUCKET}/{PREFIX}/")
    assert "\n" not in message and FAKE_SECRET not in message
    assert failed_after < FAIL_WITHIN_S, f"took {failed_after:.1f} s to fail"

    # The server comes back on the same port; moto keeps its state in the process.
    restarted = ThreadedMotoServer(ip_address="127.0.0.1", port=server["port"], verbose=False)
    restarted.start()
    server.update(server=restarted, running=True)
    if count_objects(server["endpoint"]) != files:  # a moto that forgot: put the trial back
        upload(str(tmp_path), server["endpoint"])
    trial = load_trial(TRIAL)
    assert trial.report.files_read == files and trial.report.files_skipped == []
    fw = trial.framework
    assert sorted(zip(fw["process"].astype(str), fw["name"].astype(str), fw["start_us"].tolist(),
                      fw["end_us"].tolist())) == sorted((e.node, e.name, e.start_us, e.end_us)
                                                        for e in synthetic.events)
    assert len(trial.system) == synthetic.system_samples


def test_dead_endpoint_fails_within_seconds(monkeypatch):
    endpoint = f"http://127.0.0.1:{free_port()}"
    use_endpoint(monkeypatch, endpoint)
    started = time.monotonic()
    with pytest.raises(TrialError) as caught:
        load_trial(TRIAL)
    elapsed = time.monotonic() - started
    assert str(caught.value) == (f"{TRIAL}: cannot reach S3 (EndpointConnectionError: Could not connect "
                                 f"to the endpoint URL: \"{endpoint}/{BUCKET}\")")
    assert elapsed < FAIL_WITHIN_S, f"took {elapsed:.1f} s to fail"


def test_dropped_connections_are_retried_by_the_client(monkeypatch):
    # A server that accepts each connection and closes it at once: the client retries
    # (more than one attempt per request) and then gives up with a clear error.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    accepted, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            accepted.append(time.monotonic())
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}"
    use_endpoint(monkeypatch, endpoint)
    try:
        store = S3Store(TRIAL)
        started = time.monotonic()
        with pytest.raises(TrialError, match=rf"^{TRIAL}: cannot reach S3 \(ConnectionClosedError: "):
            store.list()
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert len(accepted) >= 2, "the client must retry a dropped connection"
    assert elapsed < FAIL_WITHIN_S
