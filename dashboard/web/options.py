"""Command-line and environment options of the server."""
from __future__ import annotations

import argparse
import os

# Trials over these limits are refused with a message instead of filling the server's
# memory: every server process (gunicorn worker) that shows a trial holds its frames.
DEFAULT_MAX_TRIAL_MB = 2048
DEFAULT_MAX_EVENTS = 50_000_000
MB = 1_000_000  # decimal megabytes, as the load errors print sizes
# Each file costs a read and a parse however small: about 1.5 ms on a busy 2-core machine, so
# 100,000 tiny files held a load for minutes. A day of an 8-node job, writing a framework and a
# system file a minute on each node, is 23,040 files.
DEFAULT_MAX_FILES = 50_000
# A trial whose frames take more than this is not held whole to draw its windows: each drag
# reads the files the window reaches (dashboard/trial/window_files.py).
DEFAULT_EVENT_BUDGET_MB = 1024


def default_max_loads() -> int:
    """Loads run at once by default: one per core this server may run on. A load parses on
    every core already, so more loads at once finish no sooner; they only hold more trials in
    memory (each up to a few times --max-trial-mb)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity (macOS)
        return max(1, os.cpu_count() or 1)


def limit(text: str) -> int:
    """A size limit: a whole number >= 0, where 0 means no limit."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) or more, not {value}")
    return value


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trial", help="trial opened at start (default: the bundled sample)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8050)
    parser.add_argument("--cache-dir", help="diskcache folder shared by all server processes")
    parser.add_argument("--cache-size-mb", type=int, default=2048, help="cache size limit")
    parser.add_argument("--data-root", action="append", default=[],
                        help="local folder trials may be opened from (repeatable); "
                             "the bundled sample is always allowed")
    parser.add_argument("--s3-bucket", action="append", default=None,
                        help="allow only these S3 buckets (repeatable; default: any)")
    parser.add_argument("--max-trial-mb", type=limit, default=DEFAULT_MAX_TRIAL_MB, metavar="MB",
                        help=f"refuse to load a trial whose files hold more than this many MB (10^6 bytes), "
                             f"as listed or once decompressed; a load peaks at about 1.4 times that plus 35 MB "
                             f"(bench/peak_memory.py) (default {DEFAULT_MAX_TRIAL_MB}; 0: no limit; "
                             f"under gunicorn: DASHBOARD_MAX_TRIAL_MB)")
    parser.add_argument("--max-events", type=limit, default=DEFAULT_MAX_EVENTS, metavar="N",
                        help=f"refuse to load a trial with more framework events and system samples "
                             f"than this (default {DEFAULT_MAX_EVENTS:,}; 0: no limit; under gunicorn: "
                             f"DASHBOARD_MAX_EVENTS)")
    parser.add_argument("--max-files", type=limit, default=DEFAULT_MAX_FILES, metavar="N",
                        help=f"refuse to load a trial of more files than this (default {DEFAULT_MAX_FILES:,}; "
                             f"0: no limit; under gunicorn: DASHBOARD_MAX_FILES)")
    parser.add_argument("--event-budget-mb", type=limit, default=DEFAULT_EVENT_BUDGET_MB, metavar="MB",
                        help=f"a trial whose events take more memory than this is not held whole to draw "
                             f"its timeline: each window reads only the files it reaches, from the cache "
                             f"folder's parsed columns, and a window over this much is refused (default "
                             f"{DEFAULT_EVENT_BUDGET_MB}; 0: no budget, trials are held whole; under "
                             f"gunicorn: DASHBOARD_EVENT_BUDGET_MB)")
    parser.add_argument("--max-loads", type=limit, default=None, metavar="N",
                        help="run at most N trial loads at once, counting every server process that "
                             "shares the cache folder; later ones wait in line, holding no process, and "
                             "the page shows their place (default: the number of cores; 0: no limit; "
                             "under gunicorn: DASHBOARD_MAX_LOADS)")
    parser.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                        help="answer only requests whose Host header names this host (repeatable; "
                             "'*': any; default: the loopback names when --host is a loopback address, "
                             "else any; under gunicorn: DASHBOARD_ALLOWED_HOSTS, comma-separated)")
    parser.add_argument("--dev-debug", action="store_true",
                        help="developers only: turn on Dash's debugger (runs code for any visitor)")
