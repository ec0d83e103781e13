"""The Dask mode: a trial's files read and parsed as dask.distributed tasks.

`app.py analyze --dask-scheduler tcp://HOST:8786`, or DASHBOARD_DASK_SCHEDULER for the server
(and any load_trial without a client of its own), connect to a scheduler the team runs (or one
started with `dask scheduler` and `dask worker`). Each file is one task (load.parse_file_for_client):
the worker opens the trial itself, reads the file (an S3 trial with the worker's own standard
credential chain; AWS_ENDPOINT_URL_S3 is honoured), parses it, and returns its Arrow table (without
its columns of nulls alone: trial/null_columns.py) and its report; the load keeps its limits, its
cache and its report as without a cluster.

dask[distributed] is needed in this mode only: `pip install -r requirements-dask.txt`.
"""
from __future__ import annotations

import os
import threading

from .errors import TrialError

SCHEDULER_VARIABLE = "DASHBOARD_DASK_SCHEDULER"
_clients: dict[str, object] = {}
_lock = threading.Lock()


class DaskUnavailableError(TrialError):
    """The Dask mode was asked for, and dask.distributed is not installed or its scheduler not reached."""


def connect(address: str, timeout_s: float = 10):
    """A dask.distributed Client of the scheduler at `address` (tcp://HOST:PORT), one per address
    in this process."""
    try:
        from distributed import Client
    except ImportError:
        raise DaskUnavailableError("the Dask mode needs dask[distributed]: pip install -r requirements-dask.txt"
                                   ) from None
    with _lock:
        client = _clients.get(address)
        if client is None or client.status != "running":
            try:
                client = Client(address, timeout=timeout_s, set_as_default=False)
            except (OSError, TimeoutError) as exc:
                raise DaskUnavailableError(f"cannot reach the Dask scheduler at {address} ({exc})") from None
            _clients[address] = client
        return client


def client_from_environment():
    """The Client of the scheduler DASHBOARD_DASK_SCHEDULER names, or None when it is not set."""
    address = os.environ.get(SCHEDULER_VARIABLE, "").strip()
    return connect(address) if address else None
