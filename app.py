"""Entry point.

    python app.py [serve] [--trial PATH] [--host 127.0.0.1] [--port 8050] ...
    python app.py analyze TRIAL [--json] [--node NODE] [--what-if num_workers=8,in_order=false ...]
    gunicorn app:server          (configured through DASHBOARD_* environment variables)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE_TRIAL = os.path.join(HERE, "examples", "sample-trial", "trial")


def _analyze(args) -> int:
    from dashboard import analyze
    from dashboard.report import to_dict, to_text
    from dashboard.trial.errors import TrialError

    from dashboard.analysis.diagnosis import parse_what_if

    try:
        what_if = [parse_what_if(text) for text in args.what_if]
    except ValueError as exc:
        print(f"error: --what-if: {exc}", file=sys.stderr)
        return 2
    try:
        result = analyze(args.trial, node=args.node, outlier_factor=args.outlier_factor,
                         max_bytes=args.max_bytes, max_events=args.max_events, max_files=args.max_files)
    except TrialError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug of ours: still one line, no traceback for the user
        print(f"error: {args.trial}: unexpected {type(exc).__name__}: {exc}", file=sys.stderr)
        return 3
    try:
        if args.json:
            sys.stdout.write(json.dumps(to_dict(result, what_if), allow_nan=False) + "\n")
        else:
            print(to_text(result, what_if=what_if))
        sys.stdout.flush()
    except BrokenPipeError:  # `analyze ... | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="app.py", description="DataLoader Profiler Dashboard")
    sub = parser.add_subparsers(dest="command")
    analyze = sub.add_parser("analyze", help="print the DataLoader analysis of a trial")
    analyze.add_argument("trial", help="trial path: a local folder or s3://bucket/prefix")
    analyze.add_argument("--json", action="store_true", help="print one JSON object")
    analyze.add_argument("--node", help="only this node (framework node id or host, e.g. algo-1)")
    analyze.add_argument("--outlier-factor", type=float, default=2.0,
                         help="an outlier is a value above this x the median (default 2)")
    analyze.add_argument("--what-if", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                         help="predict the wait and training time with changed DataLoader settings "
                              "(num_workers, prefetch_factor, in_order, persistent_workers); repeatable")
    analyze.add_argument("--max-bytes", type=int, help="refuse trials larger than this many bytes")
    analyze.add_argument("--max-events", type=int, help="refuse trials with more events than this")
    analyze.add_argument("--max-files", type=int, help="refuse trials with more files than this")
    from dashboard.web.options import add_serve_arguments

    serve = sub.add_parser("serve", help="serve the dashboard (the default)")
    add_serve_arguments(serve)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv.insert(0, "serve")
    args = build_parser().parse_args(argv)
    if args.command == "analyze":
        return _analyze(args)
    from dashboard.web.server import serve

    return serve(args)


def __getattr__(name):
    # `gunicorn app:server` builds the app on first access, from DASHBOARD_* variables.
    if name == "server":
        from dashboard.web.server import server_from_environment

        return server_from_environment()
    raise AttributeError(name)


if __name__ == "__main__":
    sys.exit(main())
