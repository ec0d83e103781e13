"""The server under faults and hostile input, driven over HTTP as the browser's renderer drives
it (tests/dash_http.py), with the app in processes of its own (`python app.py ...`):

- two server processes sharing one cache folder load the same trial at the same moment, and a
  load starts while another request of the same server holds the shared job store's lock;
- the S3 server (a moto server of this module's own) stops in the middle of a server-side load;
- every broken trial of tests/test_bad_input.py loads with its skip report; garbage callback
  payloads get a message or a no-op, never a 500 or a traceback, and the server keeps answering;
- the default bind is 127.0.0.1 and the debugger is off unless --dev-debug asks for it;
- credentials in the server's environment never reach its log or a response;
- the Dockerfile's CMD and HEALTHCHECK, run as written (on loopback).

Expected numbers come from the events the synthetic writer reports, never from the server.
"""
from __future__ import annotations

import contextlib
import json
import operator
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
from tests.conftest import ROOT, free_port
from tests.dash_http import CONFIG, CallbackFailed, DashSession, Result, text_of
from tests.test_bad_input import CASES, Trial as BrokenTrial  # the corpus of broken trials, reused

APP = os.path.join(ROOT, "app.py")
HOST = "127.0.0.1"
TRACEBACK = re.compile(r"Traceback|File \"|line \d+, in |Werkzeug Debugger|__debugger__|werkzeug\.debug")
POLL_S = 0.1  # faster than the renderer's 250 ms: the tests wait less


# --- servers ---------------------------------------------------------------------------------------


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
        """Stops the server and every process it started (background loads are forked; the
        reloader of --dev-debug is a child): its session's process group, which is its own."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.process.poll() is None:
            self.process.wait(timeout=10)


@contextlib.contextmanager
def running(log_path: str, *args: str, env: dict):
    """An AppServer of these arguments, ready; stopped when the block ends, however it ends."""
    server = AppServer(log_path, *args, env=env)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def start_servers(tmp_path, count: int, *args: str, env: dict | None = None) -> list[AppServer]:
    servers = [AppServer(str(tmp_path / f"server-{i}.log"), *args, env=env or server_env(tmp_path))
               for i in range(count)]
    try:
        return [server.wait_ready() for server in servers]
    except BaseException:
        for server in servers:
            server.stop()
        raise


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
    store, message = result.values.get("trial-store.data"), result.values.get("error-message.children")
    assert store and store.get("key"), f"no trial loaded; error-message: {message!r}"
    assert not message
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
    return sorted(zip(frame["process"].astype(str), frame["name"].astype(str), frame["start_us"].tolist(),
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
        # One of them read the trial; the other waited for that read (or came after it).
        assert sorted(s["from_cache"] for s in stores) == [False, True]
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


def first_page(page: DashSession, store: dict) -> dict:
    """What a page shows once a trial is loaded: the panels, the first window, the ranks."""
    shown = dict(show(page, store))
    set_window = page.call(page.find("window-store.data"), {"trial-store.data": store}, ["trial-store.data"])
    assert set_window.status == 200, set_window.text[:300]
    window = set_window.values["window-store.data"]
    assert (window["start_us"], window["end_us"]) == (store["start_us"], store["end_us"])  # the whole job
    drawn = page.call(page.find("window-graph.figure"),
                      {"window-store.data": window, "select-events.value": ".*", "select-dimensions.value": ".*",
                       "node-select.value": "", "what-if-loader.value": "", "trial-store.data": store},
                      ["window-store.data"])
    heatmap = page.call(page.find("rank-heatmap.figure"),
                        {"trial-store.data": store, "rank-order.value": "host", "window-store.data": window},
                        ["trial-store.data"])
    # The what-if fires on every load too (today's bars), and on a change of its settings.
    what_if = {"what-if-num-workers.value": None, "what-if-prefetch-factor.value": None,
               "what-if-in-order.value": "", "what-if-persistent-workers.value": "",
               "what-if-loader.value": "", "trial-store.data": store, "node-select.value": ""}
    today = page.call(page.find("what-if-graph.figure"), what_if, ["trial-store.data"])
    doubled = page.call(page.find("what-if-graph.figure"), {**what_if, "what-if-num-workers.value": 8},
                        ["what-if-num-workers.value"])
    for result in (drawn, heatmap, today):
        assert result.status == 200, result.text[:300]
        shown.update(result.values)
    assert doubled.status == 200 and not doubled.values.get("what-if-error.children"), doubled.text[:300]
    shown["what-if-8-workers"] = doubled.values["what-if-result.children"]
    return {"shown": shown, "window": window}


class Unreadable:
    """A cache value that cannot be unpickled (as one damaged on the disk)."""

    def __reduce__(self):
        return operator.truediv, (1, 0)


def test_a_second_server_shows_a_warm_trials_first_page_without_reading_the_trial(tmp_path):
    """The panels, the first window and the ranks a server drew are kept on the cache's disk: a
    new server process shows the same first page from them. Proof that it reads no trial: the
    trial's own entry is made unreadable after the first server drew the page; only a window
    the first page did not draw (a drag) then needs the trial, and says it is gone."""
    data = tmp_path / "data"
    trial = str(data / "trial")
    write_trial(trial, hosts=2, epochs=2, train_batches=40)
    cache = tmp_path / "cache"
    (first,) = start_servers(tmp_path, 1, "serve", "--cache-dir", str(cache), "--data-root", str(data))
    try:
        page = first.page()
        store = loaded_store(load(page, trial))
        drawn = first_page(page, store)
        errors = {k: v for k, v in drawn["shown"].items() if "error" in k and v}
        assert not errors and drawn["shown"]["getnext-count.children"] != "0", errors
    finally:
        first.stop()
    with diskcache.Cache(os.path.join(str(cache), "trials")) as disk:
        name = f"trial:{store['key']}"
        assert name in disk
        disk[name] = Unreadable()
    (second,) = start_servers(tmp_path, 1, "serve", "--cache-dir", str(cache), "--data-root", str(data))
    try:
        page = second.page()
        again = loaded_store(load(page, trial))
        same = ("key", "path", "start_us", "end_us")
        assert again["from_cache"] and {k: again[k] for k in same} == {k: store[k] for k in same}
        assert first_page(page, again) == drawn
        # A window the first page did not draw reads the trial: gone, and the page says so.
        window = {**drawn["window"], "end_us": drawn["window"]["start_us"] + 1_000_000}
        dragged = page.call(page.find("window-graph.figure"),
                            {"window-store.data": window, "select-events.value": ".*",
                             "select-dimensions.value": ".*", "node-select.value": "",
                             "what-if-loader.value": "", "trial-store.data": again}, ["window-store.data"])
        assert dragged.status == 200 and "no longer in the server's cache" in dragged.values["window-error.children"]
    finally:
        second.stop()


def test_the_load_job_draws_the_first_page_so_the_server_process_never_reads_the_trial(tmp_path):
    """The load job (a process of its own) draws and keeps the first page's parts. Proof that the
    server process reads no trial for them: the trial's own entry is made unreadable as soon as
    the load ends, before the page asks for anything; the panels, the first window and the ranks
    then show, with the numbers written, and no error."""
    data = tmp_path / "data"
    trial = str(data / "trial")
    written = write_trial(trial, hosts=2, epochs=2, train_batches=40)
    cache = tmp_path / "cache"
    (server,) = start_servers(tmp_path, 1, "serve", "--cache-dir", str(cache), "--data-root", str(data))
    try:
        page = server.page()
        store = loaded_store(load(page, trial))
        with diskcache.Cache(os.path.join(str(cache), "trials")) as disk:
            disk[f"trial:{store['key']}"] = Unreadable()
        drawn = first_page(page, store)
        errors = {k: v for k, v in drawn["shown"].items() if "error" in k and v}
        assert not errors, errors
        assert {k: drawn["shown"][k] for k in counts(written)} == counts(written)
        assert drawn["shown"]["window-graph.figure"]["data"] and drawn["shown"]["rank-heatmap.figure"]["data"]
    finally:
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
        _, handles = start_load(page_a, trial)
        wait_jobs_finished(first)  # the job (on the first server) finishes; its result waits in the job store
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
        try:
            result = load(page_b, trial, timeout_s=20)  # a small trial: a second or two
        except CallbackFailed as exc:
            poller.join(30)
            raise AssertionError(f"a load started 0.3 s into a poll of the same server that took "
                                 f"{polled.get('seconds', 0):.1f} s never completed: {exc}") from None
        poller.join(30)
        assert polled.get("status") == 200 and "trial-store" in polled.get("text", ""), polled
        store = loaded_store(result)
        assert shown_counts(show(page_b, store)) == counts(written)
    finally:
        first.stop()
        second.stop()


# --- a burst of loads, within the server's cap ----------------------------------------------------

MAX_LOADS = 2
BURST_TRIALS = 25  # each asked for twice, spelled two ways: 50 load requests at once
QUEUED = re.compile(r"Queued \((\d+) ahead\)")


def running_together(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `processes` that ran at one moment: running when looked at, and still running
    once all had been looked at (an ended one not yet reaped is a zombie: not running). A scan
    looks at them one by one: a job that ended after it was seen and the next job, started
    before it was seen, were both counted though they never ran together (a loaded suite run,
    two servers' six workers scanned, with one place: a sample of 2 jobs)."""
    def running(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:  # it ended meanwhile
            return False

    seen = [process for process in processes if running(process)]
    return [process for process in seen if running(process)]


def load_processes(server: AppServer) -> int:
    """How many background-load processes of the server run now (see running_together)."""
    return len(running_together(psutil.Process(server.process.pid).children(recursive=True)))


def test_a_burst_of_50_loads_runs_at_most_max_loads_at_once(tmp_path):
    """50 load requests at once (two spellings of each of 25 trials) on a server with --max-loads 2:
    never more than two load processes run at a moment; the others wait in line, holding no
    process, and say their place, which only moves forward; a trial asked for twice is read once
    (the second request joins the first's read). Before, each request forked a process at once."""
    data = tmp_path / "data"
    written = {}
    for i in range(BURST_TRIALS):
        path = str(data / f"trial-{i:02d}")
        written[path] = write_trial(path, epochs=2, rotate_s=0.05, seed=i)
    asked = [spelling for path in written for spelling in (path, path + "/")]
    [server] = start_servers(tmp_path, 1, "serve", "--cache-dir", str(tmp_path / "cache"),
                             "--data-root", str(data), "--max-loads", str(MAX_LOADS))
    try:
        http = requests.Session()  # one connection per request thread
        http.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=len(asked)))
        page = DashSession(server.url, timeout=60, http=http).open()
        running, done = [], threading.Event()

        def sample():
            while not done.is_set():
                running.append(load_processes(server))
                time.sleep(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        statuses: dict[str, list[str]] = {path: [] for path in asked}

        def one(path):
            def seen(progress):
                statuses[path].append(progress.get("load-status.children") or "")
            return page.call_background(page.find("trial-store.data"), {"load-request.data": request_load(page, path)},
                                        ["load-request.data"], poll_s=0.1, timeout_s=240, on_progress=seen)

        try:
            with ThreadPoolExecutor(len(asked)) as pool:
                results = dict(zip(asked, pool.map(one, asked)))
        finally:
            done.set()
            sampler.join(10)
        for path, result in results.items():
            if not (result.values.get("trial-store.data") or {}).get("key"):
                raise AssertionError(f"{path}: no trial loaded (HTTP {result.status}, {result.values!r}); "
                                     f"the server's log:\n{server.log()[-8000:]}")
        stores = {path: loaded_store(result) for path, result in results.items()}
        for path, trial in written.items():
            pair = [stores[path], stores[path + "/"]]
            assert pair[0]["key"] == pair[1]["key"], path
            assert sorted(s["from_cache"] for s in pair) == [False, True], path  # one read of it
            assert shown_counts(show(page, pair[0])) == counts(trial)

        assert max(running) == MAX_LOADS, sorted(running)[-10:]
        places = {path: [int(m.group(1)) for text in texts for m in [QUEUED.search(text)] if m]
                  for path, texts in statuses.items()}
        # How deep the queue got depends on how fast the loads ran; 50 requests sent at once to
        # 2 places leave some waiting behind others (a poll sees the place of its moment).
        assert max(p for found in places.values() for p in found) >= 1, places
        for path, found in places.items():
            assert found == sorted(found, reverse=True), (path, found)  # a place only moves forward
        assert server.alive()
        assert not TRACEBACK.search(server.log()), server.log()
    finally:
        server.stop()


# --- an S3 server that can stop in the middle of a load ---------------------------------------------

FAKE_KEY_ID = "AKIAFAKEHARDENING042"
FAKE_SECRET = "fAkeSecret/ServerHardening+0123456789abcdefgh"
FAKE_TOKEN = "FakeSessionToken//ServerHardening0123456789"
BUCKET, PREFIX = "hardening", "job-1/profiler-output"
SIGNATURE_BUCKET = "signature-mismatch"  # every request there is refused as S3 refuses a bad signature
S3_TRIAL = f"s3://{BUCKET}/{PREFIX}"


class S3Server:
    """moto's S3 API server on loopback, in this process. `arm(key)`: every GET of that object
    of the trial, and of every object whose key sorts after it, is held until `die()`, which
    stops the server and drops every connection it holds (as a crashed server would);
    `start()` again serves on the same port, with the objects kept (moto keeps its state in
    this process)."""

    def __init__(self):
        self.port = 0
        self.server = None
        self.endpoint = ""
        self.hold_from: str | None = None  # a path, /bucket/key
        self.hold_under = f"/{BUCKET}/{PREFIX}/"  # the trial whose GETs are held
        self.held = threading.Event()
        self.dead = threading.Event()
        self.let_go = threading.Event()  # held GETs go on: dropped (die) or served (release)
        self.released = threading.Event()

    def start(self) -> "S3Server":
        from moto.server import DomainDispatcherApplication, ThreadedMotoServer, create_backend_app

        outer = self

        class Server(ThreadedMotoServer):
            def _server_entry(self):  # moto's, with the fault-injecting middleware around its app
                from moto.server import MotoRequestHandler
                from werkzeug.serving import make_server

                self._server = make_server(self._ip_address, self._port,
                                           outer._middleware(DomainDispatcherApplication(create_backend_app)),
                                           True, request_handler=MotoRequestHandler)
                self._server_ready_event.set()
                self._server.serve_forever()

        self.hold_from = None
        for event in (self.held, self.dead, self.let_go, self.released):
            event.clear()
        self.server = Server(ip_address=HOST, port=self.port, verbose=False)
        self.server.start()
        host, self.port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{self.port}"
        return self

    def _middleware(self, app):
        def serve(environ, start_response):
            if self.dead.is_set():
                self._drop(environ)
            if environ.get("PATH_INFO", "").startswith(f"/{SIGNATURE_BUCKET}"):
                return self._signature_mismatch(environ, start_response)
            object_path = environ.get("PATH_INFO", "")
            if (self.hold_from is not None and environ["REQUEST_METHOD"] == "GET"
                    and object_path.startswith(self.hold_under) and object_path >= self.hold_from):
                self.held.set()
                self.let_go.wait(60)
                if not self.released.is_set():
                    self._drop(environ)
            return app(environ, start_response)

        return serve

    @staticmethod
    def _signature_mismatch(environ, start_response):
        """AWS's answer to a request it cannot verify: it echoes the access key id, the
        signature and the canonical request (with the session token header)."""
        authorization = environ.get("HTTP_AUTHORIZATION", "")
        key_id = re.search(r"Credential=([^/]+)/", authorization)
        signature = re.search(r"Signature=(\w+)", authorization)
        body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SignatureDoesNotMatch</Code>"
                "<Message>The request signature we calculated does not match the signature you provided. "
                "Check your key and signing method.</Message>"
                f"<AWSAccessKeyId>{key_id.group(1) if key_id else ''}</AWSAccessKeyId>"
                f"<SignatureProvided>{signature.group(1) if signature else ''}</SignatureProvided>"
                f"<CanonicalRequest>GET /\nx-amz-security-token:{environ.get('HTTP_X_AMZ_SECURITY_TOKEN', '')}"
                f"</CanonicalRequest><RequestId>0</RequestId></Error>").encode()
        start_response("403 Forbidden", [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]

    @staticmethod
    def _drop(environ):
        sock = environ.get("werkzeug.socket")
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        raise ConnectionAbortedError("the S3 server died")  # werkzeug: a dropped connection, quietly

    def arm(self, hold_from_key: str, prefix: str = PREFIX) -> None:
        """GETs of `prefix`'s objects from this key on are held (again, after a release)."""
        for event in (self.held, self.let_go, self.released):
            event.clear()
        self.hold_under = f"/{BUCKET}/{prefix}/"
        self.hold_from = f"/{BUCKET}/{hold_from_key}"

    def release(self) -> None:
        """Every held GET goes on, and no other is held: a slow S3, not a dead one."""
        self.hold_from = None
        self.released.set()
        self.let_go.set()

    def die(self) -> None:
        self.server.stop()  # new connections are refused from here on
        self.dead.set()  # and every held or kept-alive one is dropped
        self.let_go.set()

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def create_bucket(self) -> None:
        client = self.client()
        try:
            client.create_bucket(Bucket=BUCKET)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass

    def upload(self, folder: str, prefix: str = PREFIX) -> int:
        self.create_bucket()
        client = self.client()
        paths = [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names]

        def put(path):
            client.upload_file(path, BUCKET, prefix + "/" + os.path.relpath(path, folder).replace(os.sep, "/"))

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, paths))
        return len(paths)

    def count(self, prefix: str = PREFIX) -> int:
        client = self.client()
        try:
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
            return sum(len(page.get("Contents", [])) for page in pages)
        except client.exceptions.NoSuchBucket:
            return 0

    def stop(self) -> None:
        if not self.dead.is_set():
            self.die()


@pytest.fixture(scope="module")
def s3():
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(s3, tmp_path_factory):
    """One server for the S3, broken-input and credential tests: S3 through the module's own
    moto server, with fake credentials in its environment; local trials under `data`."""
    tmp = tmp_path_factory.mktemp("served")
    data, cache = tmp / "data", tmp / "cache"
    data.mkdir()
    env = server_env(tmp, AWS_ENDPOINT_URL_S3=s3.endpoint, AWS_ACCESS_KEY_ID=FAKE_KEY_ID,
                     AWS_SECRET_ACCESS_KEY=FAKE_SECRET, AWS_SESSION_TOKEN=FAKE_TOKEN,
                     AWS_DEFAULT_REGION="us-east-1")
    with running(str(tmp / "server.log"), "serve", "--cache-dir", str(cache), "--data-root", str(data),
                 env=env) as server:
        server.data, server.cache = data, cache
        yield server


def cache_keys(cache) -> set:
    with diskcache.Cache(os.path.join(str(cache), "trials")) as disk:
        return set(disk)


def test_s3_stops_mid_load_the_page_says_so_nothing_is_cached_and_a_retry_reads_everything(s3, served, tmp_path):
    written = write_trial(str(tmp_path / "trial"), epochs=10, train_batches=10, val_batches=0, rotate_s=0.0001)
    files = len(written.framework_files) + len(written.system_files)
    assert files >= 200
    assert s3.upload(str(tmp_path / "trial")) == files
    before = cache_keys(served.cache)
    page = served.page()
    progress, reading = [], threading.Event()
    reads = re.compile(r"Read \d+ of %d files" % files)

    def on_progress(outputs):
        progress.append(outputs)
        if reads.match(outputs.get("load-status.children") or ""):
            reading.set()

    # The 20th file in the load's (key) order and every one after it hang: the 19 before are
    # read, whatever order the load's threads ask in. The server dies once the page has shown
    # that reading progresses (dying at once raced the page's polls on a loaded machine).
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=PREFIX + "/")["Contents"]
    s3.arm(sorted(o["Key"] for o in listed)[19])
    shown_reading = []
    killer = threading.Thread(target=lambda: (s3.held.wait(60), shown_reading.append(reading.wait(30)), s3.die()))
    killer.start()
    started = time.monotonic()
    try:
        failed = load(page, S3_TRIAL, timeout_s=60, on_progress=on_progress)
        took = time.monotonic() - started
    finally:
        killer.join(60)
        reached = s3.held.is_set()
        if not s3.dead.is_set():  # the load ended before the fault played out
            s3.die()
        # The S3 server comes back on the same port (for the retry below, and for the
        # module's other tests whatever happens here).
        s3.start()
    assert reached, "the load never reached the 20th file"
    assert shown_reading == [True], "the page never showed how many files were read"
    message = failed.values.get("error-message.children")
    assert "trial-store.data" not in failed.values, "a failed load must not replace the page's trial"
    assert message and message.startswith(f"{S3_TRIAL}: cannot reach S3"), message
    assert not TRACEBACK.search(failed.text) and "\n" not in message
    print(f"the page said, {took:.1f} s after the load started: {message}")
    assert took < 30, "the error took too long to reach the page"
    assert any(reads.match(p.get("load-status.children") or "") for p in progress), progress
    # Nothing of that load was cached, whole or partial.
    assert cache_keys(served.cache) - before == set()
    assert S3_TRIAL not in cached_trials(served.cache)

    # The S3 server is back: the same load now reads everything.
    if s3.count() != files:
        s3.upload(str(tmp_path / "trial"))  # a moto that forgot its objects
    retried = load(served.page(), S3_TRIAL, timeout_s=60)
    store = loaded_store(retried)
    assert store["from_cache"] is False
    panels = show(page, store)
    assert shown_counts(panels) == counts(written)
    assert f"{files:,} read, 0 skipped" in summary_text(panels)
    (_, cached), = cached_trials(served.cache)[S3_TRIAL]
    assert event_tuples(cached.framework) == written_tuples(written)
    assert len(cached.system) == written.system_samples
    assert served.alive()


def test_a_load_whose_process_is_killed_tells_its_page_and_a_retry_loads(s3, served, tmp_path):
    """The out-of-memory killer ends a load's process: the page is told so (Dash took the job for a
    cancelled one and answered its poll with nothing: the page stopped waiting and said nothing),
    the server lives on, and loading again reads the trial (the killed load's lock on it is
    not waited for)."""
    killed_load_is_told(s3, served, tmp_path, PREFIX + "-killed")


def test_without_a_limit_on_loads_a_killed_load_is_told_too(s3, tmp_path):
    # --max-loads 0: every load starts at once, through the same line as with a limit (it was
    # Dash's own manager's then, and the killed load's page stopped waiting without a word).
    env = server_env(tmp_path, AWS_ENDPOINT_URL_S3=s3.endpoint, AWS_ACCESS_KEY_ID=FAKE_KEY_ID,
                     AWS_SECRET_ACCESS_KEY=FAKE_SECRET, AWS_SESSION_TOKEN=FAKE_TOKEN, AWS_DEFAULT_REGION="us-east-1")
    with running(str(tmp_path / "server.log"), "serve", "--cache-dir", str(tmp_path / "cache"),
                 "--max-loads", "0", env=env) as server:
        killed_load_is_told(s3, server, tmp_path, PREFIX + "-killed-unlimited")


def killed_load_is_told(s3, served, tmp_path, prefix: str) -> None:
    written = write_trial(str(tmp_path / "trial"), epochs=2, train_batches=10, val_batches=0, rotate_s=0.01)
    s3.upload(str(tmp_path / "trial"), prefix=prefix)
    trial = f"s3://{BUCKET}/{prefix}"
    listed = s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")["Contents"]
    s3.arm(sorted(o["Key"] for o in listed)[3], prefix)  # the load hangs on its 4th file, alive
    killed = []

    def kill_the_load():
        if not s3.held.wait(60):
            return
        for child in psutil.Process(served.process.pid).children():
            if child.status() != psutil.STATUS_ZOMBIE:
                child.kill()  # (SIGKILL: nothing of the job's own runs after it)
                killed.append(child.pid)

    killer = threading.Thread(target=kill_the_load)
    killer.start()
    try:
        failed = load(served.page(), trial, timeout_s=60)
    finally:
        killer.join(60)
        s3.release()
    assert killed, "the load never reached S3"
    assert failed.status == 200, (failed.status, served.log()[-3000:])
    message = failed.values.get("error-message.children")
    assert "trial-store.data" not in failed.values or failed.values["trial-store.data"] is None
    assert message == ("The server's process for this request ended without a result (stopped, or out of "
                       "memory); try again (the server log says more)."), message
    assert "background job q" in served.log() and "ended without a result" in served.log()

    store = loaded_store(load(served.page(), trial, timeout_s=60))
    assert store["from_cache"] is False
    assert shown_counts(show(served.page(), store)) == counts(written)
    assert served.alive()
    assert not TRACEBACK.search(served.log()), served.log()


# --- broken trials and garbage payloads -------------------------------------------------------------

def summary_text(panels: dict) -> str:
    """The summary's words: its verdict, findings and facts (three outputs of the page)."""
    parts = (panels[f"{part}.children"] for part in ("summary-verdict", "summary-findings", "summary-facts"))
    return " ".join(" ".join(text_of(part) for part in parts).split())


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_every_broken_trial_loads_with_its_skip_report(served, case):
    folder = served.data / f"broken-{case.__name__}"
    t = BrokenTrial(str(folder))
    intact = [(e.node, e.name, e.start_us, e.end_us) for e in t.synthetic.events]
    broken = case(t)
    events = list(intact)
    for event in broken.lost:
        events.remove(event)
    events += broken.added
    getnext = sum(name.endswith("::GetNext") for _, name, _, _ in events)
    files_read = len(t.synthetic.framework_files) + len(t.synthetic.system_files) + broken.read_delta
    lines_skipped = sum(count for count, _ in broken.lines.values())

    page = served.page()
    result = load(page, str(folder))
    assert result.status == 200 and not TRACEBACK.search(result.text)
    panels = show(page, loaded_store(result))
    assert panels["getnext-count.children"] == str(getnext)
    text = summary_text(panels)
    assert f"{files_read:,} read, {len(broken.files_skipped):,} skipped" in text, text
    assert f"Lines skipped {lines_skipped:,}" in text, text
    # Each skipped file, and each file with skipped lines, is named with its reason.
    for key, pattern in list(broken.files_skipped.items()) + [(k, p) for k, (_, p) in broken.lines.items()]:
        assert key in text, (key, text)
        assert re.search(pattern.lstrip("^").rstrip("$"), text), (pattern, text)
    assert not TRACEBACK.search(json.dumps(panels))
    assert served.alive()


def test_trials_without_a_single_event_are_a_clear_error(served):
    empty_files = served.data / "all-files-empty"
    t = BrokenTrial(str(empty_files))
    for key in t.synthetic.framework_files + t.synthetic.system_files:
        t.write(key, "")
    folders_only = served.data / "folders-only"
    os.makedirs(folders_only / "framework" / "pevents")
    os.makedirs(folders_only / "system" / "incremental")
    page = served.page()
    for path, pattern in ((empty_files, r"holds no events: 0 file\(s\) read, %d skipped \(empty file\)"
                           % len(t.synthetic.framework_files + t.synthetic.system_files)),
                          (folders_only, r"not a trial")):
        result = load(page, str(path))
        message = result.values.get("error-message.children") or ""
        assert "trial-store.data" not in result.values
        assert message.startswith(str(path)) and re.search(pattern, message), message
        assert not TRACEBACK.search(result.text)
    assert served.alive()


@pytest.fixture(scope="module")
def loaded(served):
    """A page with a small trial loaded: what the garbage payloads are sent next to."""
    from types import SimpleNamespace

    trial = str(served.data / "garbage-trial")
    write_trial(trial, epochs=1, slow_batches={(0, 3): 50_000, (0, 9): 70_000})
    page = served.page()
    store = loaded_store(load(page, trial))
    rows = show(page, store)["getnext-outliers.rowData"]
    assert rows
    window = {"key": store["key"], "path": trial, "start_us": store["start_us"], "end_us": store["end_us"]}
    return SimpleNamespace(page=page, trial=trial, store=store, rows=rows, window=window)


def wait_jobs_finished(server, timeout_s: float = 30) -> None:
    """Until the background-load processes a server forked have exited (not yet reaped:
    the server reaps them when their result is collected)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if all(child.status() == psutil.STATUS_ZOMBIE
                   for child in psutil.Process(server.process.pid).children(recursive=True)):
                return
        except psutil.NoSuchProcess:  # a job ended and was reaped while we looked
            pass
        time.sleep(0.1)
    raise AssertionError(f"the server's background jobs still run after {timeout_s} s")


def kill_jobs(server) -> None:
    """Ends the background-load processes a server still runs."""
    for child in psutil.Process(server.process.pid).children(recursive=True):
        child.kill()


# (name, output of the callback, {id.prop: value}, triggered), built from the loaded page `g`.
GARBAGE = [
    ("url-search-a-number", "load-request.data", lambda g: {"url.search": 123}, ["url.search"]),
    ("url-search-a-list", "load-request.data", lambda g: {"url.search": ["?trial=x"]}, ["url.search"]),
    ("url-search-1mb", "load-request.data", lambda g: {"url.search": "?trial=" + "x" * 1_000_000}, ["url.search"]),
    ("url-non-numeric-start-end", "load-request.data",
     lambda g: {"url.search": f"?trial={g.trial}&start=abc&end=1e999&node=%00"}, ["url.search"]),
    ("url-start-after-end", "load-request.data", lambda g: {"url.search": f"?trial={g.trial}&start=200&end=100"},
     ["url.search"]),
    ("typed-path-a-number", "load-request.data", lambda g: {"trial-path.value": 5, "load-trial.n_clicks": 1},
     ["load-trial.n_clicks"]),
    ("refresh-with-a-list-for-trial", "load-request.data",
     lambda g: {"trial-store.data": [1], "refresh-trial.n_clicks": 1}, ["refresh-trial.n_clicks"]),
    ("panels-trial-a-list", "getnext-count.children", lambda g: {"trial-store.data": [1, 2]}, ["trial-store.data"]),
    ("panels-unknown-key", "getnext-count.children", lambda g: {"trial-store.data": {"key": 5}}, ["trial-store.data"]),
    ("panels-node-an-object", "getnext-count.children",
     lambda g: {"trial-store.data": g.store, "node-select.value": {"a": 1}}, ["node-select.value"]),
    ("window-trial-a-list", "window-store.data", lambda g: {"trial-store.data": [1]}, ["trial-store.data"]),
    ("window-trial-start-a-word", "window-store.data", lambda g: {"trial-store.data": dict(g.store, start_us="abc")},
     ["trial-store.data"]),
    ("window-current-a-string", "window-store.data",
     lambda g: {"trial-store.data": g.store, "window-store.data": "zzz", "window-whole-job.n_clicks": 1},
     ["window-whole-job.n_clicks"]),
    ("window-current-without-times", "window-store.data",
     lambda g: {"trial-store.data": g.store, "window-store.data": {"key": g.store["key"]},
                "window-whole-job.n_clicks": 1}, ["window-whole-job.n_clicks"]),
    ("drag-relayout-a-string", "window-store.data",
     lambda g: {"trial-store.data": g.store, "window-store.data": g.window, "overview-graph.relayoutData": "x"},
     ["overview-graph.relayoutData"]),
    ("drag-not-dates", "window-store.data",
     lambda g: {"trial-store.data": g.store, "window-store.data": g.window,
                "overview-graph.relayoutData": {"xaxis.range[0]": "not a date", "xaxis.range[1]": []}},
     ["overview-graph.relayoutData"]),
    ("drag-infinite", "window-store.data",
     lambda g: {"trial-store.data": g.store, "window-store.data": g.window,
                "overview-graph.relayoutData": {"xaxis.range": [1e308, -1e308]}}, ["overview-graph.relayoutData"]),
    ("outlier-selection-a-string", "window-store.data",
     lambda g: {"trial-store.data": g.store, "window-store.data": g.window, "getnext-outliers.selectedRows": "x"},
     ["getnext-outliers.selectedRows"]),
    ("outlier-row-without-times", "window-store.data",
     lambda g: {"trial-store.data": g.store, "window-store.data": g.window,
                "getnext-outliers.selectedRows": [{"id": 0, "start_us": "abc", "end_us": None}]},
     ["getnext-outliers.selectedRows"]),
    ("outlier-rows-of-strings", "window-store.data",
     lambda g: {"trial-store.data": g.store, "window-store.data": g.window,
                "getnext-outliers.selectedRows": ["rows", "more"]}, ["getnext-outliers.selectedRows"]),
    ("outlier-row-of-huge-times", "window-store.data",
     lambda g: {"trial-store.data": g.store, "window-store.data": g.window,
                "getnext-outliers.selectedRows": [dict(g.rows[0], start_us=10**400, end_us=-1)]},
     ["getnext-outliers.selectedRows"]),
    ("draw-window-a-list", "window-range.children", lambda g: {"window-store.data": [1], "trial-store.data": g.store},
     ["window-store.data"]),
    ("draw-start-after-end", "window-range.children",
     lambda g: {"window-store.data": dict(g.window, start_us=g.window["end_us"], end_us=g.window["start_us"]),
                "trial-store.data": g.store}, ["window-store.data"]),
    ("draw-start-a-word", "window-range.children",
     lambda g: {"window-store.data": dict(g.window, start_us="abc"), "trial-store.data": g.store},
     ["window-store.data"]),
    ("draw-invalid-regex", "window-range.children",
     lambda g: {"window-store.data": g.window, "trial-store.data": g.store, "select-events.value": "(",
                "select-dimensions.value": ".*"}, ["select-events.value"]),
    ("draw-regex-a-number", "window-range.children",
     lambda g: {"window-store.data": g.window, "trial-store.data": g.store, "select-events.value": 123},
     ["select-events.value"]),
    ("draw-regex-1mb", "window-range.children",
     lambda g: {"window-store.data": g.window, "trial-store.data": g.store, "select-events.value": "a" * 1_000_000},
     ["select-events.value"]),
    ("draw-invalid-regex-window-without-times", "window-range.children",
     lambda g: {"window-store.data": {"key": g.store["key"]}, "trial-store.data": g.store,
                "select-events.value": "("}, ["select-events.value"]),
    ("draw-node-a-number", "window-range.children",
     lambda g: {"window-store.data": g.window, "trial-store.data": g.store, "node-select.value": 7},
     ["node-select.value"]),
]


@pytest.mark.parametrize("name,output,values,triggered", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage_callback_values_get_a_message_or_a_no_op(served, loaded, name, output, values, triggered):
    page = loaded.page
    response = page.post(page.find(output).body(values(loaded), triggered))
    assert not TRACEBACK.search(response.text)
    assert response.status_code in (200, 204), f"{name}: HTTP {response.status_code} {response.text[:200]!r}"
    if response.status_code == 200:
        answer = response.json()
        shown = json.dumps(answer.get("response", {}))
        if name == "draw-invalid-regex":
            assert "invalid regular expression" in shown
        if name in ("url-non-numeric-start-end", "url-start-after-end"):
            assert answer["response"]["load-request"]["data"]["window"] is None
    assert served.alive()


# Background loads of garbage requests: each gets its answer in time (a message, the trial, or
# a no-op), never a 500 or a load that runs on.
GARBAGE_LOADS = [
    ("request-a-list", lambda g: [1]),
    ("path-a-number", lambda g: {"path": 123}),
    ("path-with-nul", lambda g: {"path": g.trial + "\0"}),
    ("path-1mb", lambda g: {"path": "/x" * 500_000}),
    ("node-a-list", lambda g: {"path": g.trial, "node": [1]}),
    ("window-a-string", lambda g: {"path": g.trial, "window": "abc"}),
]


@pytest.mark.parametrize("name,request_data", GARBAGE_LOADS, ids=[g[0] for g in GARBAGE_LOADS])
def test_garbage_load_requests_get_an_answer(served, loaded, name, request_data):
    page = loaded.page
    try:
        result = page.call_background(page.find("trial-store.data"), {"load-request.data": request_data(loaded)},
                                      ["load-request.data"], poll_s=POLL_S, timeout_s=20)
    except CallbackFailed as exc:
        raise AssertionError(f"{name}: {exc}") from None
    finally:
        kill_jobs(served)  # a load still running (that is the failure) must not burn the CPU on
    assert not TRACEBACK.search(result.text)
    if result.values:  # else a 204 or an empty response: nothing changes on the page
        message = result.values.get("error-message.children")
        store = result.values.get("trial-store.data")
        assert message or (store and store.get("key")), f"{name}: neither a message nor a trial: {result.text[:300]}"
        assert len(message or "") < 2_000, "a message the page can show"
    assert served.alive()


# Requests the renderer never makes: a 4xx or a bare 500, never a traceback; the server stays up.
ENVELOPES = [
    ("no-output", {"json": {"inputs": []}}),
    ("unknown-output", {"json": {"output": "nope.data", "outputs": {"id": "nope", "property": "data"},
                                 "inputs": [], "changedPropIds": []}}),
    ("not-json", {"data": b"{{{", "headers": {"Content-Type": "application/json"}}),
    ("json-null", {"data": b"null", "headers": {"Content-Type": "application/json"}}),
    ("a-form", {"data": b"a=b"}),
    ("inputs-missing", {"json": {"output": "..load-request.data...trial-path.value..",
                                 "outputs": [{"id": "load-request", "property": "data"}]}}),
    ("output-5mb", {"json": {"output": "x" * 5_000_000}}),
]


@pytest.mark.parametrize("name,request_kwargs", ENVELOPES, ids=[e[0] for e in ENVELOPES])
def test_malformed_callback_requests_show_no_traceback(served, loaded, name, request_kwargs):
    response = requests.post(served.url + "_dash-update-component", params={"endId": loaded.page.end_id},
                             timeout=30, **request_kwargs)
    assert response.status_code in (400, 404, 415, 500), response.status_code
    assert not TRACEBACK.search(response.text) and len(response.text) < 2_000
    assert served.alive()


# --- bind address, debugger, credentials ------------------------------------------------------------

def listening(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses a process and its children (the debugger's reloader) listen on."""
    parent = psutil.Process(pid)
    return sorted({(c.laddr.ip, c.laddr.port) for p in [parent, *parent.children(recursive=True)]
                   for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN})


def failing_callback(url: str, end_id: str) -> requests.Response:
    """A callback request that fails inside Dash (an output no callback has)."""
    return requests.post(url + "_dash-update-component", params={"endId": end_id}, timeout=30,
                         json={"output": "nope.data", "outputs": {"id": "nope", "property": "data"},
                               "inputs": [], "changedPropIds": []})


def test_default_bind_is_loopback_and_the_debugger_is_off(tmp_path):
    plain = AppServer(str(tmp_path / "plain.log"), env=server_env(tmp_path))  # `python app.py --port P`
    debug = AppServer(str(tmp_path / "debug.log"), "--dev-debug", env=server_env(tmp_path))
    try:
        plain.wait_ready()
        debug.wait_ready()
        assert listening(plain.process.pid) == [(HOST, plain.port)]
        page = plain.page()
        config = json.loads(CONFIG.search(requests.get(plain.url, timeout=10).text).group(1))
        assert config["ui"] is False and config["props_check"] is False  # Dash's dev tools are off
        answers = {
            "missing page": requests.get(plain.url + "no/such/page", timeout=10),
            "debugger console": requests.get(plain.url + "console", timeout=10),
            "debugger resource": requests.get(plain.url, params={"__debugger__": "yes", "cmd": "resource",
                                                                 "f": "debugger.js"}, timeout=10),
            "failing callback": failing_callback(plain.url, page.end_id),
        }
        # Dash answers any other path with its page (for multi-page apps): the page, not the
        # debugger's console or script.
        for what in ("missing page", "debugger console", "debugger resource"):
            assert answers[what].status_code == 200 and "_dash-config" in answers[what].text, what
        assert answers["failing callback"].status_code == 500
        for what, answer in answers.items():
            assert not TRACEBACK.search(answer.text), (what, answer.text[:500])
        # Its one line (no Dash banner): the URL; never the debugger's "Debug mode: on".
        assert plain.log().startswith(f"DataLoader Profiler on http://{HOST}:{plain.port}/")
        assert "Debug mode: on" not in plain.log()

        # The same requests to a server started with --dev-debug: the debugger answers (so the
        # checks above would see it), and that server too listens on loopback only.
        assert listening(debug.process.pid) == [(HOST, debug.port)]
        debugged = failing_callback(debug.url, debug.page().end_id)
        assert debugged.status_code == 500 and TRACEBACK.search(debugged.text)
        script = requests.get(debug.url, params={"__debugger__": "yes", "cmd": "resource", "f": "debugger.js"},
                              timeout=10)
        assert script.status_code == 200 and "_dash-config" not in script.text  # the debugger's own
        assert "Debug mode: on" in debug.log()
    finally:
        plain.stop()
        debug.stop()


def test_credentials_never_reach_the_log_or_a_response(s3, served):
    """The server runs with (fake) AWS credentials in its environment; S3 errors of every kind,
    one of which echoes the key id, the signature and the session token as S3 does."""
    s3.create_bucket()
    # What S3 sends back for a bad signature holds the credentials (boto3 keeps it all).
    import boto3
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as caught:
        boto3.client("s3", endpoint_url=s3.endpoint, aws_access_key_id=FAKE_KEY_ID, aws_secret_access_key=FAKE_SECRET,
                     aws_session_token=FAKE_TOKEN, region_name="us-east-1").list_objects_v2(Bucket=SIGNATURE_BUCKET)
    assert FAKE_KEY_ID in str(caught.value.response) and FAKE_TOKEN in str(caught.value.response)
    page = served.page()
    answers = []
    for path, pattern in ((f"s3://{SIGNATURE_BUCKET}/job", r"SignatureDoesNotMatch|access denied|signature"),
                          ("s3://no-such-bucket-hardening/job", r"does not exist"),
                          (f"s3://{BUCKET}/no/such/prefix", r"not a trial")):
        result = load(page, path, timeout_s=60)
        message = result.values.get("error-message.children") or ""
        assert message.startswith(path) and re.search(pattern, message, re.I), message
        answers.append(result.text)
    s3.die()
    try:
        result = load(page, f"s3://{BUCKET}/{PREFIX}", timeout_s=60)
        assert "cannot reach S3" in (result.values.get("error-message.children") or ""), result.text[:500]
        answers.append(result.text)
    finally:
        s3.start()
    log = served.log()
    assert "POST /_dash-update-component" in log  # the log is captured
    secrets = [FAKE_SECRET, FAKE_TOKEN, FAKE_KEY_ID, "Signature=", "X-Amz-Signature", "X-Amz-Credential",
               "x-amz-security-token:"]
    for text in answers + [log]:
        for secret in secrets:
            assert secret not in text, (secret, text[text.find(secret) - 300:text.find(secret) + 100])
    assert served.alive()


# --- the container's recipe ---------------------------------------------------------------------------

def dockerfile() -> dict:
    """The Dockerfile's instructions: {INSTRUCTION: [arguments, ...]} (continuations joined)."""
    with open(os.path.join(ROOT, "Dockerfile"), encoding="utf-8") as handle:
        text = re.sub(r"\\\n\s*", " ", handle.read())
    found: dict = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.setdefault(word.upper(), []).append(rest.strip())
    return found


def dockerfile_command(port: int) -> list[str]:
    """The Dockerfile's CMD as written, bound to loopback on `port` instead of 0.0.0.0:8050."""
    command = json.loads(dockerfile()["CMD"][0])
    command = [sys.executable, "-m", *command[:-1], "--no-control-socket", command[-1]]
    command[command.index("0.0.0.0:8050")] = f"{HOST}:{port}"
    return command


@contextlib.contextmanager
def dockerfile_server(tmp_path, **extra_env):
    """The Dockerfile's CMD running (the image's environment: a cache folder, a data root); yields
    its port once /healthz answers."""
    port = free_port()
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    env = server_env(tmp_path, DASHBOARD_CACHE_DIR=str(tmp_path / "cache"), DASHBOARD_DATA_ROOTS=str(data),
                     **extra_env)
    log_path = tmp_path / f"gunicorn-{port}.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(dockerfile_command(port), cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None and time.monotonic() < deadline, log_path.read_text()
            try:
                if requests.get(f"http://{HOST}:{port}/healthz", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):  # (one that failed to start is gone)
            os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_the_dockerfile_serves_app_server_as_its_healthcheck_expects(tmp_path):
    """No engine here: the recipe's parts are checked, and its CMD and HEALTHCHECK are run as
    written (bound to loopback, on a free port, instead of 0.0.0.0:8050)."""
    recipe = dockerfile()
    assert re.fullmatch(r"python:3\.11-slim(@sha256:\w+)?", recipe["FROM"][0])
    assert [r for r in recipe["RUN"] if "pip install" in r] == ["pip install --no-cache-dir -r requirements.txt"]
    with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as handle:
        installed = handle.read()
    for test_only in ("pytest", "moto", "dash[testing]", "torch", "hadolint", "selenium"):
        assert test_only not in installed
    user = recipe["USER"][-1].split(":")[0]
    assert user not in ("root", "0") and re.search(rf"useradd .*--uid {user}\b", " ".join(recipe["RUN"]))
    assert json.loads(recipe["VOLUME"][0]) == ["/cache"]
    assert "DASHBOARD_CACHE_DIR=/cache" in " ".join(recipe["ENV"])
    command = json.loads(recipe["CMD"][0])
    assert command[0] == "gunicorn" and command[-1] == "app:server" and "0.0.0.0:8050" in command
    health = re.fullmatch(r"(?:--\S+\s+)*CMD\s+(\[.*\])", recipe["HEALTHCHECK"][0])
    probe = json.loads(health.group(1))
    assert "http://127.0.0.1:8050/" in probe[-1]

    with dockerfile_server(tmp_path) as port:
        check = [sys.executable if probe[0] == "python" else probe[0], *probe[1:-1],
                 probe[-1].replace("127.0.0.1:8050", f"{HOST}:{port}")]
        assert subprocess.run(check, capture_output=True, timeout=30).returncode == 0
        # The image's default trial (the bundled sample) loads.
        page = DashSession(f"http://{HOST}:{port}/", timeout=60).open()
        asked = page.call(page.find("load-request.data"), {"url.search": ""}, ["url.search"]).values
        store = loaded_store(page.call_background(page.find("trial-store.data"), {"load-request.data": asked[
            "load-request.data"]}, ["load-request.data"], poll_s=POLL_S, timeout_s=60))
        assert store["path"].endswith(os.path.join("examples", "sample-trial", "trial"))


def test_gunicorn_on_loopback_answers_only_loopback_host_names(tmp_path):
    """The shipped command bound to 127.0.0.1, without DASHBOARD_ALLOWED_HOSTS: a request naming
    another host (a page elsewhere whose name points to 127.0.0.1: DNS rebinding) is refused, as by
    `app.py serve` on its default --host; the Dockerfile names the loopback names itself."""
    assert "DASHBOARD_ALLOWED_HOSTS=localhost,127.0.0.1,[::1]" in " ".join(dockerfile()["ENV"])
    with dockerfile_server(tmp_path) as port:
        url = f"http://{HOST}:{port}/"
        assert requests.get(url, timeout=30).status_code == 200
        assert requests.get(url, headers={"Host": f"localhost:{port}"}, timeout=30).status_code == 200
        refused = requests.get(url, headers={"Host": f"rebound.example:{port}"}, timeout=30)
        assert refused.status_code == 400 and refused.headers["X-Frame-Options"] == "DENY"
    with dockerfile_server(tmp_path, DASHBOARD_ALLOWED_HOSTS="*") as port:
        url = f"http://{HOST}:{port}/"
        assert requests.get(url, headers={"Host": f"rebound.example:{port}"}, timeout=30).status_code == 200


def command_line(process: psutil.Process) -> str:
    """A process's command line; "" for one that ended (an earlier test's child not yet reaped
    is a zombie, whose command line psutil refuses)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def test_gunicorn_servers_of_one_cache_folder_share_the_max_loads_places(tmp_path):
    """Two servers of the shipped command (3 workers each) on one cache folder, with
    DASHBOARD_MAX_LOADS=1: loads started by both still run one at a time (the places are in the
    shared job store), and all of them load."""
    data = tmp_path / "data"
    written = {str(data / f"trial-{i}"): write_trial(str(data / f"trial-{i}"), epochs=2, seed=i) for i in range(12)}
    with dockerfile_server(tmp_path, DASHBOARD_MAX_LOADS="1") as first, \
            dockerfile_server(tmp_path, DASHBOARD_MAX_LOADS="1") as second:
        masters = [p for p in psutil.Process().children() if any(f"{HOST}:{port}" in command_line(p)
                                                                   for port in (first, second))]
        assert len(masters) == 2
        running, starters, done = [], set(), threading.Event()

        def sample():
            while not done.is_set():
                master_of = {job: master.pid for master in masters for worker in master.children()
                             for job in worker.children()}
                jobs = running_together(list(master_of))
                starters.update(master_of[job] for job in jobs)
                running.append(len(jobs))
                time.sleep(0.01)

        def one(index_path):
            index, path = index_path
            page = DashSession(f"http://{HOST}:{(first, second)[index % 2]}/", timeout=60).open()
            return path, page, loaded_store(page.call_background(
                page.find("trial-store.data"), {"load-request.data": request_load(page, path)},
                ["load-request.data"], poll_s=0.1, timeout_s=120))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            with ThreadPoolExecutor(len(written)) as pool:
                loaded = list(pool.map(one, enumerate(written)))
        finally:
            done.set()
            sampler.join(10)
        for path, page, store in loaded:
            assert shown_counts(show(page, store)) == counts(written[path])
    assert max(running) == 1, sorted(running)[-5:]
    assert len(starters) == 2  # each server ran some


SLOW_CLIENTS = 50
# What a load balancer's probe may wait (the container's HEALTHCHECK waits 5 s). With the slow
# clients connected, /healthz answered in 3.2 ms (median), 18 ms at most, in 50 probes of 5 runs
# on a shared 2-core machine; with gthread, 2 in 5 probes waited for ever.
HEALTHZ_WITHIN_S = 1.0


class SlowPosts:
    """`count` clients that send a callback request's head, then its body a byte at a time every
    `every_s`: a slow link, or a slowloris."""

    def __init__(self, port: int, count: int, every_s: float = 0.5):
        self.sockets = []
        for _ in range(count):
            sock = socket.create_connection((HOST, port), timeout=10)
            sock.sendall(f"POST /_dash-update-component HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{".encode())
            self.sockets.append(sock)
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self):
        while not self._stop.wait(self.every_s):
            for sock in self.sockets:
                try:
                    sock.sendall(b" ")
                except OSError:
                    pass  # closed by the server: what the timeout test waits for

    def close(self):
        self._stop.set()
        self._thread.join(10)
        for sock in self.sockets:
            sock.close()


def test_slow_clients_do_not_starve_the_shipped_server(tmp_path):
    """Fifty clients trickling request bodies: /healthz still answers at once, every time.
    gunicorn's gthread worker (the Dockerfile's before) gave each a thread that blocked on the
    body, and 2 in 5 probes timed out."""
    with dockerfile_server(tmp_path) as port:
        slow = SlowPosts(port, SLOW_CLIENTS)
        try:
            time.sleep(1.0)  # every slow request's head is in
            waits = []
            for _ in range(10):  # new connections each: they land on every worker
                started = time.monotonic()
                answer = requests.get(f"http://{HOST}:{port}/healthz", timeout=HEALTHZ_WITHIN_S,
                                      headers={"Connection": "close"})
                waits.append(time.monotonic() - started)
                assert answer.status_code == 200 and answer.text == "ok\n"
                time.sleep(0.2)
            assert max(waits) < HEALTHZ_WITHIN_S, waits
        finally:
            slow.close()


def test_a_request_that_does_not_arrive_in_time_gets_408(tmp_path):
    """A request body has a read deadline (DASHBOARD_REQUEST_TIMEOUT_S), however steadily it
    trickles; a whole request sent at once is answered as usual."""
    timeout_s = 2
    with dockerfile_server(tmp_path, DASHBOARD_REQUEST_TIMEOUT_S=str(timeout_s)) as port:
        assert requests.get(f"http://{HOST}:{port}/healthz", timeout=10).status_code == 200
        # The clock starts before the connection: the server's deadline starts when it accepts it
        # (started after, this read 1.9986 s once under load).
        started = time.monotonic()
        slow = SlowPosts(port, 1, every_s=0.2)
        sock = slow.sockets[0]
        try:
            answer = b""
            while b"\r\n" not in answer and time.monotonic() - started < timeout_s + 10:
                try:
                    answer += sock.recv(4096)
                except socket.timeout:
                    pass
            took = time.monotonic() - started
        finally:
            slow.close()
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
        # The deadline is checked at each piece that arrives (every 0.2 s here).
        assert timeout_s <= took <= timeout_s + 2, took
