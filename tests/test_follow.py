"""Following a running job: a real CPU training job (tests/follow_job.py) writes its trial
through the collector, into a local folder and into S3 (the real S3 API server fixture); the
page, with Follow on in headless Chromium, shows the GetNext count growing without a reload,
keeps the window the user dragged, pauses while the tab is hidden, ends at the job's own
count of batches (its books), and stops with a note once no file changes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import dashboard
from dashboard import format as fmt
from dashboard.web import callbacks
from dashboard.web.layout import FOLLOW_EVERY_MS
from dashboard.web.server import ServerOptions, create_app
from tests.conftest import ROOT, free_port
from test_web_browser import axis_ms, drag, graph_points, scroll_to, text, wait_until, window_range

JOB = os.path.join(ROOT, "tests", "follow_job.py")
# Following stops after this long without a changed file (the page's default is 120 s): short
# here, so the test sees it stop once the job ends. A running job changes its files every
# 0.5 s (local: the collector's flush) or every rotation (S3: 1 s here); what the page counts
# is a reload landing, which on the busy 2-core machine was seen to take up to 15 s after a
# tick. 20 s is above that.
IDLE_S = 20
S3_ROTATE_S = 1.0


class Job:
    """tests/follow_job.py in a fresh process, until stop()."""

    def __init__(self, folder, out: str, rotate_s: float | None = None):
        self.folder, self.out = folder, out
        self.stop_file, self.books_path = folder / "stop", folder / "books.json"
        command = [sys.executable, JOB, "--out", out, "--stop-file", str(self.stop_file), "--books",
                   str(self.books_path), "--max-s", "400"]
        if rotate_s:
            command += ["--rotate-s", str(rotate_s)]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            env.pop(key, None)
        self.log = open(folder / "job.log", "w")
        self.process = subprocess.Popen(command, cwd=str(folder), env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def books(self) -> dict:
        return json.loads(self.books_path.read_text()) if self.books_path.exists() else {"batches": 0}

    def stop(self) -> dict:
        self.stop_file.write_text("")
        try:
            assert self.process.wait(timeout=90) == 0, (self.folder / "job.log").read_text()
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.log.close()
        books = self.books()
        assert books["done"], books
        return books


def getnext_count(path: str) -> int:
    try:
        trial = dashboard.load_trial(path)
    except dashboard.TrialError:
        return 0
    return int((trial.framework["kind"] == fmt.KIND_GETNEXT).sum())


def shown_count(dash_duo) -> int:
    value = text(dash_duo, "getnext-count")
    return int(value) if value.isdigit() else -1


def follow_a_running_job(dash_duo, job: Job, monkeypatch, s3_buckets=None) -> None:
    monkeypatch.setattr(callbacks, "FOLLOW_IDLE_S", IDLE_S)
    try:
        wait_until(lambda: getnext_count(job.out) >= 8, timeout=60, message="the job's first batches in its trial")
        app = create_app(ServerOptions(trial=job.out, cache_dir=str(job.folder / "cache"),
                                       data_roots=[str(job.folder)], s3_buckets=s3_buckets))
        dash_duo.start_server(app, port=free_port())
        driver = dash_duo.driver
        wait_until(lambda: shown_count(dash_duo) > 0, timeout=60, message="the page's first load")
        driver.execute_script("window.__sameDocument = true;")  # gone if the page reloads
        # Drag a window on the overview, as a user does.
        wait_until(lambda: graph_points(driver, "overview-graph") > 0, message="the overview")
        layer_css = "#overview-graph .draglayer .nsewdrag"  # (xy2 alone while S3 has no system metrics yet)
        layer = wait_until(lambda: (dash_duo.find_elements(layer_css) or [None])[0], message="the overview's axes")
        scroll_to(driver, layer)
        before = window_range(dash_duo)
        axis = axis_ms(driver, "overview-graph")
        drag(driver, layer, round(axis["length"] * 0.3), 20, 8)
        wait_until(lambda: window_range(dash_duo) != before, message="the dragged window")
        dragged = window_range(dash_duo)

        # Follow on: the count grows, twice, without a reload; the window stays.
        follow = dash_duo.find_element("#follow input")
        scroll_to(driver, follow)
        follow.click()
        dash_duo.wait_for_contains_text("#follow-note", "following", timeout=40)
        counts = [shown_count(dash_duo)]
        for _ in range(2):
            counts.append(wait_until(lambda: (lambda n: n if n > counts[-1] else None)(shown_count(dash_duo)),
                                     timeout=45, message=f"the GetNext count to grow past {counts[-1]}"))
            assert window_range(dash_duo) == dragged
        assert driver.execute_script("return window.__sameDocument === true;")

        # A hidden tab: following pauses (no new count while the job goes on writing).
        driver.execute_script("""
            Object.defineProperty(document, 'visibilityState', {value: 'hidden', configurable: true});
            document.dispatchEvent(new Event('visibilitychange'));""")
        # (Waits here are long: the renderer sends a callback's next request only after its last
        # one answered, and on a busy 2-core machine a reload's panels take seconds.)
        dash_duo.wait_for_contains_text("#follow-note", "paused", timeout=40)
        settle_s = 2.0  # a reload already on its way lands, and its panels are drawn

        def settled():
            first = shown_count(dash_duo)
            time.sleep(settle_s)
            idle = "hidden" in dash_duo.find_element("#load-progress-wrap").get_attribute("class")
            return idle and shown_count(dash_duo) == first

        wait_until(settled, timeout=60, message="the page to settle after pausing")
        paused_at = shown_count(dash_duo)
        written = job.books()["batches"]
        time.sleep(2.5 * FOLLOW_EVERY_MS / 1000)  # (at least two ticks)
        assert job.books()["batches"] > written, "the job wrote nothing while the tab was hidden"
        assert shown_count(dash_duo) == paused_at
        driver.execute_script("""
            Object.defineProperty(document, 'visibilityState', {value: 'visible', configurable: true});
            document.dispatchEvent(new Event('visibilitychange'));""")
        wait_until(lambda: shown_count(dash_duo) > paused_at, timeout=45, message="following again when visible")

        # The job ends: the page ends at the job's own count of batches, the window unchanged.
        books = job.stop()
        dash_duo.wait_for_text_to_equal("#getnext-count", str(books["batches"]), timeout=60)
        assert window_range(dash_duo) == dragged
        # The window can keep to the newest minutes instead: the last minute of the trial.
        trial = dashboard.load_trial(job.out)
        dash_duo.select_dcc_dropdown("#follow-window", value="newest 1 min")
        newest = (max(trial.start_us, trial.end_us - 60_000_000), trial.end_us)
        wait_until(lambda: window_range(dash_duo) == newest, timeout=20, message="the newest minute")
        # Nothing changes any more: following stops, and says why.
        dash_duo.wait_for_contains_text("#follow-note", "stopped", timeout=IDLE_S + 45)
        assert "no file of the trial changed" in text(dash_duo, "follow-note")
        assert not dash_duo.find_element("#follow input").is_selected()
        assert driver.execute_script("return window.__sameDocument === true;")
        assert text(dash_duo, "error-message") == ""
    finally:
        if job.process.poll() is None:
            job.stop_file.write_text("")
            try:
                job.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                job.process.kill()


@pytest.mark.torch
@pytest.mark.browser
def test_follow_a_job_writing_a_local_trial(dash_duo, tmp_path, monkeypatch):
    job = Job(tmp_path, str(tmp_path / "trial"))
    follow_a_running_job(dash_duo, job, monkeypatch)


@pytest.mark.torch
@pytest.mark.browser
def test_follow_a_job_writing_to_s3(dash_duo, tmp_path, monkeypatch, s3_client):
    s3_client.create_bucket(Bucket="follow")
    job = Job(tmp_path, "s3://follow/job-1/profiler-output", rotate_s=S3_ROTATE_S)
    follow_a_running_job(dash_duo, job, monkeypatch, s3_buckets=["follow"])


# --- what following does, tick by tick (no browser) -------------------------------------------------

def test_follow_state_pauses_when_hidden_and_stops_after_the_idle_time():
    from dashboard.web.layout import Ids

    store = {"key": "k1"}
    disabled, state, note, on = callbacks.follow_state(True, False, Ids.FOLLOW, store, None, now=100.0, idle_s=10)
    assert (disabled, on, state["changed_at"]) == (False, True, 100.0) and note.startswith("following")
    # A tick with no change, within the idle time: still following.
    disabled, state, note, on = callbacks.follow_state(True, False, Ids.FOLLOW_INTERVAL, store, state, 109.0, 10)
    assert (disabled, on) == (False, True)
    # The trial changed (a new key): the idle time starts again.
    store = {"key": "k2"}
    disabled, state, _, on = callbacks.follow_state(True, False, Ids.TRIAL_STORE, store, state, 109.5, 10)
    assert (disabled, on, state["key"], state["changed_at"]) == (False, True, "k2", 109.5)
    # Hidden: the interval stops, following stays on.
    disabled, state, note, on = callbacks.follow_state(True, True, Ids.VISIBILITY, store, state, 150.0, 10)
    assert (disabled, on) == (True, True) and "paused" in note
    # Visible again: the time hidden does not count as time without a change.
    disabled, state, note, on = callbacks.follow_state(True, False, Ids.VISIBILITY, store, state, 200.0, 10)
    assert (disabled, on, state["changed_at"]) == (False, True, 200.0)
    # More than the idle time without a change: following stops, and says why.
    disabled, state, note, on = callbacks.follow_state(True, False, Ids.FOLLOW_INTERVAL, store, state, 210.5, 10)
    assert (disabled, on) == (True, False) and "no file of the trial changed for 10 s" in note
    # Switched off: nothing runs, nothing said.
    disabled, _, note, on = callbacks.follow_state(False, False, Ids.FOLLOW, store, state, 211.0, 10)
    assert (disabled, on, note) == (True, False, "")


def test_the_window_can_follow_the_newest_minutes():
    span = (1_000_000_000, 1_000_000_000 + 600_000_000)  # ten minutes
    assert callbacks.newest_window(span, "1") == (span[1] - 60_000_000, span[1])
    assert callbacks.newest_window(span, "15") == span  # never before the trial's start
    for stays in ("", None, "0", "x"):
        assert callbacks.newest_window(span, stays) is None
