"""The server under faults and hostile input, driven over HTTP as the browser's renderer drives
it (tests/dash_http.py), with the app in processes of its own (`python app.py ...`):

- two server processes sharing one cache folder load the same trial at the same moment;
- the S3 server (a moto server of this module's own) stops in the middle of a server-side load;
- every broken trial of tests/test_bad_input.py loads with its skip report; garbage callback
  payloads get a message or a no-op, never a 500 or a traceback, and the server keeps answering;
- the default bind is 127.0.0.1 and the debugger is off unless --dev-debug asks for it;
- credentials in the server's environment never reach its log or a response.

Expected numbers come from the events the synthetic writer reports, never from the server.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

import diskcache
import psutil
import pytest
import requests

from dashboard.synthetic import SyntheticTrial, write_trial
from tests.conftest import ROOT
from tests.dash_http import CallbackFailed, DashSession, Result, text_of

APP = os.path.join(ROOT, "app.py")
HOST = "127.0.0.1"
TRACEBACK = re.compile(r"Traceback|File \"|line \d+, in |Werkzeug Debugger|__debugger__|werkzeug\.debug")
POLL_S = 0.1  # faster than the renderer's 250 ms: the tests wait less


# --- servers ---------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def server_env(tmp_path, **extra) -> dict:
    """The test process's environment without any AWS setting (another test's S3 fixture may
    have set some), with a private cache home; plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg-cache"), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


class AppServer:
    """`python app.py ARGS --port P` in a process of its own; its stdout and stderr in a file."""

    def __init__(self, log_path: str, *args: str, env: dict, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}/"
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, APP, *args, "--port", str(self.port)], cwd=ROOT,
                                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 90) -> "AppServer":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the server exited ({self.process.returncode}):\n{self.log()}"
            try:
                if requests.get(self.url, timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the server did not answer within {timeout_s} s:\n{self.log()}")

    def alive(self) -> bool:
        if self.process.poll() is not None:
            return False
        try:
            return requests.get(self.url, timeout=10).status_code == 200
        except requests.RequestException:
            return False

    def page(self) -> DashSession:
        return DashSession(self.url, timeout=60).open()

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        # Background loads run in processes of their own (forked); end any that outlived it.
        for child in psutil.process_iter(["pid", "ppid"]):
            if child.info["ppid"] == self.process.pid:
                child.kill()


def start_servers(tmp_path, count: int, *args: str, env: dict | None = None) -> list[AppServer]:
    servers = [AppServer(str(tmp_path / f"server-{i}.log"), *args, env=env or server_env(tmp_path))
               for i in range(count)]
    return [server.wait_ready() for server in servers]


# --- the page's requests ---------------------------------------------------------------------------

def request_load(page: DashSession, path: str) -> dict:
    """The load request the page makes when opened with ?trial=PATH."""
    search = "?" + urlencode({"trial": path})
    return page.call(page.find("load-request.data"), {"url.search": search}, ["url.search"]).values[
        "load-request.data"]


def start_load(page: DashSession, path: str) -> tuple[dict, dict]:
    """Starts the background load; (the load request, the job's handles)."""
    asked = request_load(page, path)
    callback = page.find("trial-store.data")
    response = page.post(callback.body({"load-request.data": asked}, ["load-request.data"]))
    assert response.status_code == 200, response.text[:500]
    return asked, response.json()


def load(page: DashSession, path: str, timeout_s: float = 60, on_progress=None) -> Result:
    """Loads a trial as the page does (URL, then the background load, polled to its end)."""
    asked = request_load(page, path)
    return page.call_background(page.find("trial-store.data"), {"load-request.data": asked}, ["load-request.data"],
                                poll_s=POLL_S, timeout_s=timeout_s, on_progress=on_progress)


def show(page: DashSession, store: dict) -> dict:
    """The panels of a loaded trial: outputs by 'id.prop'."""
    result = page.call(page.find("getnext-count.children"), {"trial-store.data": store, "node-select.value": ""},
                       ["trial-store.data"])
    assert result.status == 200, result.text[:500]
    return result.values


def loaded_store(result: Result) -> dict:
    store = result.values.get("trial-store.data")
    assert store and store.get("key"), f"no trial loaded; error-message: {result.values.get('error-message.children')!r}"
    assert not result.values.get("error-message.children")
    return store


def counts(written: SyntheticTrial) -> dict:
    return {"getnext-count.children": str(len(written.of_kind("getnext"))),
            "workers-count.children": str(len(written.of_kind("worker"))),
            "init-count.children": str(len(written.of_kind("init")))}


def shown_counts(panels: dict) -> dict:
    return {k: panels.get(k) for k in ("getnext-count.children", "workers-count.children", "init-count.children")}


def cached_trials(cache_dir) -> dict:
    """{trial path: [(key, trial)]} of the trials in a server's cache folder."""
    out: dict = {}
    with diskcache.Cache(os.path.join(str(cache_dir), "trials")) as disk:
        for key in list(disk):
            if isinstance(key, str) and key.startswith("trial:"):
                trial = disk[key]
                out.setdefault(trial.path, []).append((key, trial))
    return out


def event_tuples(frame) -> list:
    return sorted(zip(frame["node"].astype(str), frame["name"].astype(str), frame["start_us"].tolist(),
                      frame["end_us"].tolist()))


def written_tuples(written: SyntheticTrial) -> list:
    return sorted((e.node, e.name, e.start_us, e.end_us) for e in written.events)


# --- two server processes, one cache ---------------------------------------------------------------

def test_two_server_processes_load_the_same_trial_at_once_and_share_one_cache_entry(tmp_path):
    data = tmp_path / "data"
    trial = str(data / "trial")
    written = write_trial(trial, hosts=2, epochs=6, train_batches=150, rotate_s=0.05)  # ~370 files
    cache = tmp_path / "cache"
    servers = start_servers(tmp_path, 2, "serve", "--cache-dir", str(cache), "--data-root", str(data))
    try:
        pages = [server.page() for server in servers]
        gate = threading.Barrier(2)

        def at_once(page):
            asked = request_load(page, trial)
            gate.wait()
            return page.call_background(page.find("trial-store.data"), {"load-request.data": asked},
                                        ["load-request.data"], poll_s=POLL_S, timeout_s=90)

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(at_once, pages))
        stores = [loaded_store(r) for r in results]
        assert stores[0]["key"] == stores[1]["key"]
        # Both read the trial (neither found it cached): the loads really ran at the same time.
        assert [s["from_cache"] for s in stores] == [False, False]
        want = counts(written)
        for page, store in zip(pages, stores):
            assert shown_counts(show(page, store)) == want

        # One entry for the trial, whole and readable by a third process.
        entries = cached_trials(cache)
        assert list(entries) == [trial] and len(entries[trial]) == 1
        _, cached = entries[trial][0]
        assert event_tuples(cached.framework) == written_tuples(written)
        assert len(cached.system) == written.system_samples

        # Loaded again through either server: served from the shared cache.
        again = [loaded_store(load(page, trial)) for page in pages]
        assert [s["key"] for s in again] == [stores[0]["key"]] * 2 and all(s["from_cache"] for s in again)
        assert all(server.alive() for server in servers)
        for server in servers:
            assert not TRACEBACK.search(server.log()), server.log()
    finally:
        for server in servers:
            server.stop()


def test_a_load_starting_while_another_request_holds_the_job_store_completes(tmp_path):
    """Background loads are forked from the server process. A fork while another thread of it
    is inside an SQLite transaction of the shared job store leaves the child with that lock
    held forever (SQLite's lock state is per process and copied by fork): the child cannot
    report progress or its result, and the load never ends (diskcache gives up after 60 s;
    the page then just stops, without a message).

    The poll that collects a job forked by *another* server process (another gunicorn worker)
    holds the job store's lock for a second (Dash's DiskcacheManager.terminate_job waits for
    the job process, inside a transaction, and cannot reap another process's child). A load
    started on that server during that second must still complete.
    """
    data = tmp_path / "data"
    trial = str(data / "trial")
    written = write_trial(trial, epochs=1)
    cache = tmp_path / "cache"
    first, second = start_servers(tmp_path, 2, "serve", "--cache-dir", str(cache), "--data-root", str(data))
    try:
        page_a = first.page()
        asked, handles = start_load(page_a, trial)
        time.sleep(3)  # the job (on the first server) finishes; its result waits in the job store
        # The page's next poll reaches the second server (as it may behind gunicorn).
        collector = DashSession(second.url, timeout=60)
        collector.end_id, collector.callbacks = page_a.end_id, page_a.callbacks
        load_callback = page_a.find("trial-store.data")
        polled = {}

        def collect():
            started = time.monotonic()
            response = collector.post(load_callback.body({}, ["load-request.data"]),
                                      params={"cacheKey": handles["cacheKey"], "job": handles["job"]})
            polled.update(status=response.status_code, seconds=time.monotonic() - started, text=response.text)

        poller = threading.Thread(target=collect)
        poller.start()
        time.sleep(0.3)  # inside the poll's second
        page_b = second.page()
        result = load(page_b, trial, timeout_s=20)  # a small trial: a second or two
        poller.join(30)
        assert polled.get("status") == 200 and "trial-store" in polled.get("text", ""), polled
        store = loaded_store(result)
        assert shown_counts(show(page_b, store)) == counts(written)
    except CallbackFailed as exc:
        raise AssertionError(f"a load started during the other poll never completed: {exc}") from None
    finally:
        first.stop()
        second.stop()
