"""Background callbacks (trial loads) run in at most `limit` processes at once; the others queue.

Dash's DiskcacheManager forks a process for every background request at once: 200 load requests
in 4 s made 149 processes reading at the same time (each holding what it reads), and a queued
process still costs about 8 MB of its own. Here a request that finds every place taken waits in
the shared job store, in order, holding no process; the page shows its place ("Queued (k
ahead)"). The places and the queue are shared by every server process of one cache folder
(gunicorn's workers): a request is started by the process it reached, once a place is free and
no earlier request waits. Two requests for one trial still read it once: the second one's load
waits for the first one's read (TrialCache's lock) and takes what it read.

Without a limit every request starts at once, through the same line: its job is tracked the
same way, so a load killed by the out-of-memory killer is told to its page as with a limit
(Dash's own manager takes a job that ended without a result for a cancelled one, and its page
stops waiting without a word).

A queued request's job id is `q<ticket>`; the page polls with it as with a process id. A place
of a process gone (a cancelled job is killed) is freed by the next process to look; a queued
request of a server process gone is dropped (its page stops waiting, as for a killed job).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable

import dash
import psutil

from .cache import _lock_token, _process_alive

log = logging.getLogger("dashboard.web")

# {ticket: [owner token, pid, since, the process's identity]}. pid 0: waiting; -1: starting (a
# place taken, the process being forked); > 0: running. The identity tells the job's process
# from a later one given the same pid: a running job keeps its place however long it runs.
JOB_QUEUE = "job-queue"
JOB_TICKET = "job-ticket"  # the last ticket given
DISPATCH_EVERY_S = 0.1
STARTING_EXPIRE_S = 60  # a process that marked a place "starting" and never said its pid
# A job ended by terminate_job (the page started another load, or the job's result was taken)
# is marked so, for as long as a page could still poll it: its poll then stays Dash's
# "cancelled". A job that ended without a result and without that mark died (killed, out of
# memory) or was dropped from the line with its server process: its page is told so.
CANCELLED = "job-cancelled-"
CANCELLED_KEEP_S = 3600
ENDED_WITHOUT_RESULT = "ended without a result (stopped, or out of memory)"
KILL_WAIT_S = 1.0


def _identity(pid: int) -> int | None:
    """Which process has that pid now: psutil's identity of it (its pid and its start time since
    boot), as a number every process reads alike (a hash of ints and floats is not salted). Not
    its start time in wall-clock seconds: psutil gives that as the kernel's boot time plus the
    time since boot, and the kernel's boot time moves whenever the wall clock is stepped (a
    virtual machine's clock set after a pause, NTP): a running job was then read as a later
    process of its pid, its place freed and its page told that it had been cancelled."""
    try:
        return hash(psutil.Process(pid))
    except psutil.Error:
        return None


def _process(pid: int, identity: int | None = None) -> psutil.Process | None:
    """The process of that pid, if it runs (a zombie has ended) and is the one of that identity
    (not a later one given the same pid)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        if identity is not None and hash(process) != identity:
            return None
        return process
    except psutil.Error:
        return None


def _alive(pid: int, identity: int | None = None) -> bool:
    return _process(pid, identity) is not None


def _identity_of(entry: list) -> int | None:
    """A queue entry's process identity (None where an older version wrote the entry: none, or
    the process's start time, a float)."""
    identity = entry[3] if len(entry) > 3 else None
    return identity if isinstance(identity, int) else None


def _running(entry: list, now: float) -> bool:
    """Whether the job of a queue entry still waits, starts or runs."""
    owner, pid, since = entry[:3]
    if pid > 0:
        return _alive(pid, _identity_of(entry))
    if pid < 0:
        return _process_alive(owner) and now - since < STARTING_EXPIRE_S
    return _process_alive(owner)


def _kill(pid: int, identity: int | None) -> None:
    """Kills a job's process and its children, and waits a moment for it to end; outside any
    transaction of the job store (Dash's terminate_job holds one through its wait, and every
    fork and write of the queue waits with it)."""
    process = _process(pid, identity)
    if process is None:
        return  # ended (or its pid is another process's now)
    try:
        family = [*process.children(recursive=True), process]
    except psutil.Error:
        return
    for member in family:
        with contextlib.suppress(psutil.Error):
            member.kill()
    deadline = time.monotonic() + KILL_WAIT_S
    while _alive(pid, identity) and time.monotonic() < deadline:
        time.sleep(0.01)
    with contextlib.suppress(psutil.Error):
        process.wait(0)  # reaped, where this process forked it


class QueueingManager(dash.DiskcacheManager):
    """A DiskcacheManager that runs at most `limit` jobs at once (None: no limit).

    queued_progress(ahead) gives the progress values shown for a job that waits with `ahead`
    others before it, for the callbacks that report progress (this app's one: the load's)."""

    def __init__(self, cache, limit: int | None, queued_progress: Callable[[int], list] | None = None):
        self._reports: set[int] = set()  # id(job_fn) of the callbacks that report progress
        super().__init__(cache)  # (registers the callbacks known so far: make_job_fn)
        self.limit = limit
        self.queued_progress = queued_progress
        self._token = None  # this process's, made when it first queues (after gunicorn's fork)
        self._pending: dict[int, tuple] = {}  # ticket -> the job's (key, job_fn, args, context)
        self._told: dict[int, int] = {}  # ticket -> the place last shown
        self._lock = threading.Lock()
        self._dispatcher: threading.Thread | None = None
        self._request = threading.local()  # the job a poll's get_result found running (each request a thread)

    def make_job_fn(self, fn, progress, key=None):
        job_fn = super().make_job_fn(fn, progress, key)
        if progress:
            self._reports.add(id(job_fn))
        return job_fn

    # --- starting -------------------------------------------------------------------------

    def call_job_fn(self, key, job_fn, args, context):
        with self._lock:
            if self._token is None:
                self._token = _lock_token()
            with self.handle.transact():
                queue = self.handle.get(JOB_QUEUE) or {}
                ticket = self.handle.incr(JOB_TICKET)  # never one twice: a job id names one request
                queue[ticket] = [self._token, 0, time.time(), None]
                self.handle.set(JOB_QUEUE, queue)
            self._pending[ticket] = (key, job_fn, args, context)
            self._keep_dispatching()
        try:
            self._dispatch()  # at once where a place is free
        except Exception:  # noqa: BLE001 - a busy store: the dispatcher tries again in a moment
            log.debug("starting a queued job failed; tried again", exc_info=True)
        return f"q{ticket}"

    def _keep_dispatching(self) -> None:
        """Starts the dispatcher thread unless it runs (called under self._lock)."""
        if self._dispatcher is None or not self._dispatcher.is_alive():
            self._dispatcher = threading.Thread(target=self._dispatch_while_pending, name="job-queue", daemon=True)
            self._dispatcher.start()

    def _dispatch_while_pending(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._pending:
                        self._dispatcher = None
                        return
                try:
                    self._dispatch()
                except Exception:  # noqa: BLE001 - a busy or failing store: tried again next round
                    log.debug("dispatching queued jobs failed; tried again", exc_info=True)
                time.sleep(DISPATCH_EVERY_S)
        finally:
            # This thread's SQLite connection, closed under the fork guard. Left to the thread's
            # end, it was closed while another thread forked a load: the child inherited
            # SQLite's memory mutex held and hung on it for ever, holding its place (seen in
            # a burst of loads with two cores busy, by gdb: sqlite3_free in the child).
            self.handle.close()

    def _dispatch(self) -> None:
        """Starts this process's waiting jobs whose turn it is; tells the others their place."""
        with self._lock:
            with self.handle.transact():
                queue = self._live(self.handle.get(JOB_QUEUE) or {})
                waiting = sorted(t for t, entry in queue.items() if entry[1] == 0)
                free = max(0, self.limit - (len(queue) - len(waiting))) if self.limit else len(waiting)
                # The first `free` in line start, each in the process that has it.
                start = [t for t in waiting[:free] if queue[t][0] == self._token and t in self._pending]
                for ticket in start:
                    queue[ticket][1:] = [-1, time.time(), None]
                self.handle.set(JOB_QUEUE, queue)
            gone = [t for t in self._pending if t not in queue]  # cancelled (terminate_job) meanwhile
            for ticket in gone:
                self._pending.pop(ticket, None)
                self._told.pop(ticket, None)
            jobs = [(ticket, self._pending.pop(ticket)) for ticket in start]
            for ticket in start:
                self._told.pop(ticket, None)
            # Each waiting job's place, told as it changes (under the lock: in the order found).
            for ahead, ticket in enumerate(waiting):
                pending = self._pending.get(ticket)
                if pending is None or self._told.get(ticket) == ahead or self.queued_progress is None:
                    continue
                if id(pending[1]) in self._reports:
                    self.handle.set(self._make_progress_key(pending[0]), self.queued_progress(ahead))
                self._told[ticket] = ahead
        for ticket, job in jobs:
            self._start(ticket, job)

    def _start(self, ticket: int, job: tuple) -> None:
        """Forks a job whose place is taken ("starting") and records its process."""
        try:
            pid = super().call_job_fn(*job)  # (outside the transaction: a fork)
        except Exception:  # noqa: BLE001 - no process (fork refused: out of memory, of pids)
            log.warning("a background load could not start; it waits for its turn again", exc_info=True)
            with self._lock, self.handle.transact():
                queue = self.handle.get(JOB_QUEUE) or {}
                if ticket in queue:  # (unless cancelled meanwhile)
                    queue[ticket][1:] = [0, time.time(), None]
                    self.handle.set(JOB_QUEUE, queue)
                    self._pending[ticket] = job
                    self._keep_dispatching()
            return
        identity = _identity(pid)
        try:
            with self.handle.transact():
                queue = self.handle.get(JOB_QUEUE) or {}
                cancelled = ticket not in queue  # while it was starting: it must not run without a place
                if not cancelled:
                    queue[ticket][1:] = [pid, time.time(), identity]
                    self.handle.set(JOB_QUEUE, queue)
        except Exception:  # noqa: BLE001 - a job the queue cannot count must not run (its page
            # then stops as for a cancelled job, once the place "starting" expires)
            log.warning("a started background load could not be recorded; stopped", exc_info=True)
            _kill(pid, identity)
            return
        if cancelled:
            _kill(pid, identity)

    @staticmethod
    def _live(queue: dict) -> dict:
        """The queue without the entries of processes gone: jobs that ended (or were killed),
        and waiting requests of server processes that ended."""
        now = time.time()
        return {ticket: entry for ticket, entry in queue.items() if _running(entry, now)}

    # --- what the page's polls ask ---------------------------------------------------------

    @staticmethod
    def _ticket(job) -> int | None:
        text = str(job)
        return int(text[1:]) if text.startswith("q") and text[1:].isdigit() else None

    def _entry(self, ticket: int):
        return (self.handle.get(JOB_QUEUE) or {}).get(ticket)

    def get_result(self, key, job):
        # Dash reads the result, then asks whether the job runs, and takes "no result and not
        # running" for a cancelled job: a job that writes its result and ends between the two
        # left its page waiting for nothing, Dash answering its poll with HTTP 204 (a burst of
        # 50 loads: 1 page in 50, under load and, once, quiet). So the answer follows the read:
        # a job found running after a read without its result is still running for Dash's
        # question that follows (the page polls again, and gets the result); a job found ended
        # is read once more (it writes its result before it ends).
        self._request.running = None
        result = super().get_result(key, job)
        if result is not self.UNDEFINED or job is None:
            return result
        if self.job_running(job):
            self._request.running = job
            return result
        result = super().get_result(key, job)
        ticket = self._ticket(job)
        if result is self.UNDEFINED and ticket is not None and self.handle.get(f"{CANCELLED}{ticket}") is None:
            # Dash takes this for a cancelled job and answers nothing: the page stopped
            # waiting and said nothing (a load killed by the out-of-memory killer).
            log.warning("background job %s %s", job, ENDED_WITHOUT_RESULT)
            result = {"background_callback_error": {"msg": ENDED_WITHOUT_RESULT, "tb": ""}}
        return result

    def get_progress(self, key):
        # Dash's reads the job's last progress and then deletes it: a report the job wrote
        # between the two was deleted unread. The page kept the one before until the next, and
        # for good where none came: a load whose files all hang on S3 said "Listed N files;
        # reading…" instead of how many it had read (50 reports written by a forked job while a
        # page polls: the last one lost in 38 runs of 40). One atomic pop loses none.
        return self.handle.pop(self._make_progress_key(key), None)

    def job_running(self, job):
        if job is not None and getattr(self._request, "running", None) == job:
            self._request.running = None  # (Dash's question after get_result: answered by its read)
            return True
        ticket = self._ticket(job)
        if ticket is None:
            return super().job_running(job)
        entry = self._entry(ticket)
        return entry is not None and _running(entry, time.time())

    def terminate_job(self, job):
        ticket = self._ticket(job)
        if ticket is None:
            return super().terminate_job(job)
        self.handle.set(f"{CANCELLED}{ticket}", True, expire=CANCELLED_KEEP_S)
        # Decided in one transaction: a job waiting or starting leaves the queue at once (the
        # process that starts it kills what it forked: _start); a running one is killed first
        # and its place freed after. Freed before, the place let the next job start while
        # this one still ran (it had sent its result and was ending; 2 loads at once were
        # seen with a limit of 1). Kept where the process outlived the kill's wait: the next
        # look (_live) frees it once the process is gone.
        with self.handle.transact():
            queue = self.handle.get(JOB_QUEUE) or {}
            entry = queue.get(ticket)
            if entry is None:
                return
            if entry[1] <= 0:
                del queue[ticket]
                self.handle.set(JOB_QUEUE, queue)
                return
        pid, identity = entry[1], _identity_of(entry)
        _kill(pid, identity)  # (a running job's pid is its last: no other can be written meanwhile)
        with self.handle.transact():
            queue = self.handle.get(JOB_QUEUE) or {}
            entry = queue.get(ticket)
            if entry is not None and not _alive(pid, identity):
                del queue[ticket]
                self.handle.set(JOB_QUEUE, queue)

    def terminate_unhealthy_job(self, job):
        ticket = self._ticket(job)
        if ticket is None:
            return super().terminate_unhealthy_job(job)
        if not self.job_running(job):
            self.terminate_job(job)
            return True
        return False
