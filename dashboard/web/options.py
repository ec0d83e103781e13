"""Command-line and environment options of the server."""
from __future__ import annotations

import argparse


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
    parser.add_argument("--dev-debug", action="store_true",
                        help="developers only: turn on Dash's debugger (runs code for any visitor)")
