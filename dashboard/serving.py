"""gunicorn worker processes that take whole requests: waitress reads them, then a thread runs one.

    gunicorn --worker-class dashboard.serving.BufferingWorker --workers 3 --threads 4 app:server

gunicorn's gthread worker gives a connection to a thread as soon as bytes arrive; the thread
then blocks reading the request. Measured with gunicorn 27 (`--workers 3 --threads 4`): with 12
clients trickling a POST body, /healthz timed out (10 s) on 1 in 5 tries, with 50 on 2 in 5,
and never came back for as long as the bodies trickled. Here each worker process reads its
connections in waitress's event loop, body and all (in memory, or a temporary file past 512 kB),
and hands a thread only a complete request: slow clients hold a socket each, never a thread.
gunicorn still runs the processes: --workers, --threads, --timeout (the event loop reports in
every second, so a hung worker is replaced), --graceful-timeout and its signals.

A request must arrive whole within DASHBOARD_REQUEST_TIMEOUT_S (default 30 s): past it the
client gets 408 at its next bytes; a connection that sends nothing for that long is closed.

Outside the Dash app's package on purpose: gunicorn's master process imports the worker class,
and this module imports neither Dash nor pandas nor pyarrow.
"""
from __future__ import annotations

import os
import time

from gunicorn.workers.base import Worker
from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import BaseWSGIServer, create_server
from waitress.utilities import BadRequest

# Callback requests are small JSON documents: a body over this could only be abuse (the app
# refuses it too). Waitress refuses it before it is read, instead of buffering it to disk.
MAX_REQUEST_BYTES = 10 * 2**20
DEFAULT_REQUEST_TIMEOUT_S = 30
LOOP_TIMEOUT_S = 1.0  # how often the event loop reports to gunicorn, and looks at the clock


# The addresses this worker process listens on (set before gunicorn loads the app): the app's
# default allowed hosts follow them, as `app.py serve` follows its --host.
LISTENING: list[str] = []


def listening_hosts() -> list[str]:
    """The IP addresses the server process listens on; [] where not known (not this worker, or
    a Unix socket: behind a proxy)."""
    return list(LISTENING)


def request_timeout_s(environ=None) -> float:
    environ = os.environ if environ is None else environ
    text = (environ.get("DASHBOARD_REQUEST_TIMEOUT_S") or "").strip()
    try:
        value = float(text) if text else DEFAULT_REQUEST_TIMEOUT_S
    except ValueError:
        raise ValueError(f"DASHBOARD_REQUEST_TIMEOUT_S: not a number of seconds: {text!r}") from None
    if not value > 0:
        raise ValueError(f"DASHBOARD_REQUEST_TIMEOUT_S: must be more than 0, not {text!r}")
    return value


class RequestTimeout(BadRequest):
    code = 408
    reason = "Request Timeout"


def _channel_class(timeout_s: float) -> type[HTTPChannel]:
    class DeadlineParser(HTTPRequestParser):
        """One request, made when its first bytes arrive: refused when the rest comes too late."""

        def __init__(self, adj):
            super().__init__(adj)
            self.deadline = time.monotonic() + timeout_s

        def received(self, data):
            if not self.completed and time.monotonic() > self.deadline:
                self.error = RequestTimeout(f"the request did not arrive within {timeout_s:g} s")
                self.completed = True
                return len(data)  # the rest of it is dropped with the connection
            return super().received(data)

    class DeadlineChannel(HTTPChannel):
        parser_class = DeadlineParser

    return DeadlineChannel


class BufferingWorker(Worker):
    def load_wsgi(self):
        addresses = [listener.sock.getsockname() for listener in self.sockets]
        if all(isinstance(address, tuple) for address in addresses):
            LISTENING[:] = [address[0] for address in addresses]
        super().load_wsgi()

    def run(self):
        timeout_s = request_timeout_s()
        socket_map: dict = {}
        for listener in self.sockets:
            listener.setblocking(False)
        server = create_server(
            self.wsgi, map=socket_map, sockets=[listener.sock for listener in self.sockets],
            threads=max(1, self.cfg.threads), connection_limit=self.cfg.worker_connections,
            channel_timeout=max(1, round(timeout_s)), cleanup_interval=max(1, round(timeout_s / 4)),
            max_request_body_size=MAX_REQUEST_BYTES, asyncore_use_poll=True, expose_tracebacks=False,
            ident="", clear_untrusted_proxy_headers=True)
        servers = [s for s in socket_map.values() if isinstance(s, BaseWSGIServer)]
        channel = _channel_class(timeout_s)
        for listening in servers:
            listening.channel_class = channel
        while self.alive:
            self.notify()
            if self.ppid != os.getppid():
                self.log.info("Parent changed, shutting down: %s", self)
                break
            wasyncore.loop(timeout=LOOP_TIMEOUT_S, map=socket_map, use_poll=True, count=1)
        # Stopping: accept nothing more, let the requests in hand finish (--graceful-timeout).
        for listening in servers:
            listening.accepting = False
        deadline = time.monotonic() + self.cfg.graceful_timeout
        while time.monotonic() < deadline and any(
                isinstance(c, HTTPChannel) and (c.requests or c.total_outbufs_len) for c in socket_map.values()):
            self.notify()
            wasyncore.loop(timeout=LOOP_TIMEOUT_S, map=socket_map, use_poll=True, count=1)
        server.task_dispatcher.shutdown(cancel_pending=True, timeout=1)
