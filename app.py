"""Entry point.

    python app.py [serve] [--trial PATH] [--host 127.0.0.1] [--port 8050] ...
    python app.py analyze TRIAL [--json] [--node HOST] [--rank N] [--what-if num_workers=8,in_order=false ...]
    python app.py compare A B [--json]        (B against A: deltas, findings, predicted vs achieved)
    python app.py export TRIAL --start-us S --end-us E -o window.json   (a Chrome/Perfetto trace)
    gunicorn app:server          (configured through DASHBOARD_* environment variables)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE_TRIAL = os.path.join(HERE, "examples", "sample-trial", "trial")


def _fail(text: str) -> None:
    """The command's error line on stderr, without the secrets of the URLs in it (a path typed
    with its credentials, an endpoint's from AWS_ENDPOINT_URL): its output often ends up in a
    CI log."""
    from dashboard.trial.store import redact

    print(f"error: {redact(text)}", file=sys.stderr)


def _analyze(args) -> int:
    from dashboard.trial.errors import TrialError
    from dashboard.what_if_settings import parse as parse_what_if

    try:
        what_if = [parse_what_if(text) for text in args.what_if]
    except ValueError as exc:
        _fail(f"--what-if: {exc}")
        return 2
    whole_job = args.node is None and args.rank is None
    if args.by_rank and not whole_job:
        _fail("--by-rank analyzes the whole job: leave out --node and --rank")
        return 2
    results = None
    if args.cache_dir:
        from dashboard.result_cache import ResultCache

        try:
            results = ResultCache(args.cache_dir)
        except OSError as exc:
            _fail(f"--cache-dir: {exc}")
            return 2
    try:
        store = files = key = None
        if results is not None:
            # Listed once: the key names this listing, and the analysis reads this listing.
            from dashboard.trial.store import open_store

            store = open_store(args.trial)
            files = store.list()
            key = results.key(args.trial, store.canonical_path, files, _analyze_options(args, what_if, whole_job))
            output = results.get(key)
            if output is not None:
                _write(output)
                return 0
        result = _analysis(args, whole_job, store, files)
        if _scope_is_empty(args, result):
            return 2
    except TrialError as exc:
        _fail(str(exc))
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug of ours: still one line, no traceback for the user
        _fail(f"{args.trial}: unexpected {type(exc).__name__}: {exc}")
        return 3
    from dashboard.report import to_dict, to_text

    if args.json:
        output = json.dumps(to_dict(result, what_if), allow_nan=False) + "\n"
    else:
        output = to_text(result, what_if=what_if) + "\n"
    _write(output)
    if key is not None and result.trial.report.complete:
        results.put(key, output)
    return 0


def _scope_is_empty(args, result, path: str | None = None) -> bool:
    """Whether --node / --rank matched no event of the trial (a mistyped host or rank); says so
    on stderr. Not an answer to print, nor one to keep: the trial has no such part."""
    if (args.node is None and args.rank is None) or not result.trial.framework.empty:
        return False
    scope = " ".join(f"--{k} {v}" for k, v in (("node", args.node), ("rank", args.rank)) if v is not None)
    _fail(f"{path or args.trial}: no events of {scope}")
    return True


def _node(text: str) -> str:
    """--node: a host or a process id; an empty one (an unset $HOST) is refused, not read as
    the whole job."""
    if not text.strip():
        raise argparse.ArgumentTypeError("no host given")
    return text


def _outlier_factor(text: str) -> float:
    """--outlier-factor: a finite number above 1 (dataloader.checked_outlier_factor)."""
    from dashboard.analysis.dataloader import checked_outlier_factor

    try:
        return checked_outlier_factor(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number above 1, not {text}") from None


def _analyze_options(args, what_if: list[dict], whole_job: bool) -> dict:
    """Every option of `analyze` that can change its output (the result cache's key)."""
    return {"json": args.json, "node": args.node, "rank": args.rank, "outlier_factor": args.outlier_factor,
            "what_if": what_if, "max_bytes": args.max_bytes, "max_events": args.max_events,
            "max_files": args.max_files, "by_rank": bool(args.by_rank or (args.dask_scheduler and whole_job))}


def _analysis(args, whole_job: bool, store, files):
    """The analysis `analyze` prints: of the listing `files` of `store` when given (else the
    load lists the trial)."""
    from dashboard import analyze

    dask_client = None
    if args.dask_scheduler:
        from dashboard.trial.dask_cluster import connect

        dask_client = connect(args.dask_scheduler)
    if args.by_rank or (dask_client is not None and whole_job):
        from dashboard.by_rank import analyze_by_rank

        options = _load_options(args)
        return analyze_by_rank(args.trial, client=dask_client, processes=options.pop("processes"),
                               outlier_factor=args.outlier_factor, cache_dir=args.cache_dir, store=store,
                               files=files, **options)
    file_cache = None
    if args.cache_dir:
        from dashboard.trial.columnar_cache import ColumnarFileCache

        file_cache = ColumnarFileCache(args.cache_dir)
    # assess: the report shows the verdict and budget anyway, and computing them first lowers
    # the process's peak; events=False: it prints no figure (see dashboard.analyze).
    return analyze(args.trial, node=args.node, rank=args.rank, outlier_factor=args.outlier_factor, assess=True,
                   events=False, file_cache=file_cache, dask_client=dask_client, store=store, files=files, **_load_options(args))


def _write(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _load_or_fail(path: str, load):
    """load(path), or (None, exit status) with a one-line message on stderr."""
    from dashboard.trial.errors import TrialError

    try:
        return load(path), 0
    except TrialError as exc:
        _fail(str(exc))
        return None, 2
    except KeyboardInterrupt:
        return None, 130
    except Exception as exc:  # a bug of ours: still one line, no traceback for the user
        _fail(f"{path}: unexpected {type(exc).__name__}: {exc}")
        return None, 3


def _compare(args) -> int:
    from dashboard import analyze
    from dashboard.api import compare
    from dashboard.report import compare_dict, compare_text

    limits = _load_options(args)
    results = []
    for path in (args.a, args.b):
        result, status = _load_or_fail(path, lambda p: analyze(p, node=args.node, rank=args.rank, **limits))
        if result is None:
            return status
        if _scope_is_empty(args, result, path):
            return 2
        results.append(result)
    comparison, status = _load_or_fail(args.b, lambda _: compare(*results))
    if comparison is None:
        return status
    if args.json:
        _write(json.dumps(compare_dict(*results, comparison), allow_nan=False) + "\n")
    else:
        _write(compare_text(*results, comparison) + "\n")
    return 0


def _export(args) -> int:
    from dashboard import load_trial
    from dashboard.analysis.trace_export import chrome_trace

    if args.end_us <= args.start_us:
        _fail("--end-us must be after --start-us")
        return 2
    limits = _load_options(args)
    trial, status = _load_or_fail(args.trial, lambda p: load_trial(p, **limits))
    if trial is None:
        return status
    text = json.dumps(chrome_trace(trial.framework, trial.system, args.start_us, args.end_us), allow_nan=False)
    if args.output == "-":
        _write(text + "\n")
        return 0
    try:
        with open(args.output, "w") as handle:
            handle.write(text + "\n")
    except OSError as exc:
        _fail(f"{args.output}: {exc.strerror or exc}")
        return 2
    return 0


def _load_options(args) -> dict:
    """What every command's load takes: its limits, and the cores to parse a large local trial
    on (load_trial's processes: a command runs no other thread, so it may fork)."""
    return dict(max_bytes=args.max_bytes, max_events=args.max_events, max_files=args.max_files,
                processes=os.cpu_count())


def _add_limits(parser) -> None:
    parser.add_argument("--max-bytes", type=int, help="refuse trials larger than this many bytes")
    parser.add_argument("--max-events", type=int, help="refuse trials with more events than this")
    parser.add_argument("--max-files", type=int, help="refuse trials with more files than this")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="app.py", description="DataLoader Profiler Dashboard")
    sub = parser.add_subparsers(dest="command")
    analyze = sub.add_parser("analyze", help="print the DataLoader analysis of a trial")
    analyze.add_argument("trial", help="trial path: a local folder or s3://bucket/prefix")
    analyze.add_argument("--json", action="store_true", help="print one JSON object")
    analyze.add_argument("--node", type=_node, help="only this host (e.g. algo-1), or one process by its id (e.g. 3-algo-1)")
    analyze.add_argument("--rank", type=int, help="only this training rank")
    analyze.add_argument("--outlier-factor", type=_outlier_factor, default=2.0,
                         help="an outlier is a value above this x the median (default 2)")
    analyze.add_argument("--what-if", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                         help="predict the wait and training time with changed DataLoader settings "
                              "(num_workers, prefetch_factor, in_order, persistent_workers); repeatable")
    _add_limits(analyze)
    analyze.add_argument("--dask-scheduler", metavar="tcp://HOST:8786",
                         help="read and parse the trial's files as tasks of this dask.distributed scheduler's "
                              "workers (they read S3 with their own credentials; pip install -r "
                              "requirements-dask.txt); default: DASHBOARD_DASK_SCHEDULER, else here")
    analyze.add_argument("--cache-dir", help="keep each file's parse as Arrow columns in this folder, and each "
                         "answer: the next analyze of an unchanged trial prints the kept answer, of a changed one "
                         "reads the columns instead of the JSON (files that changed are read again)")
    analyze.add_argument("--by-rank", action="store_true",
                         help="analyze one rank at a time, each in a worker process (with --dask-scheduler, on "
                              "the cluster's workers, which is the default there): no process holds the whole "
                              "trial's events; the answers are the same (see dashboard/by_rank.py). With "
                              "--cache-dir, every worker uses that folder on its own machine")
    compare = sub.add_parser("compare", help="compare run B with run A: what changed, and did it do what "
                                             "A's what-if predicted")
    compare.add_argument("a", help="the run before the change: a local folder or s3://bucket/prefix")
    compare.add_argument("b", help="the run after it")
    compare.add_argument("--json", action="store_true", help="print one JSON object")
    compare.add_argument("--node", type=_node, help="only this host, or one process by its id, in both runs")
    compare.add_argument("--rank", type=int, help="only this training rank, in both runs")
    _add_limits(compare)
    export = sub.add_parser("export", help="write a window of a trial as a Chrome/Perfetto JSON trace")
    export.add_argument("trial", help="trial path: a local folder or s3://bucket/prefix")
    export.add_argument("--start-us", type=int, required=True, help="window start, epoch microseconds")
    export.add_argument("--end-us", type=int, required=True, help="window end, epoch microseconds")
    export.add_argument("-o", "--output", required=True, help="the trace file to write; - for stdout")
    _add_limits(export)
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
    if args.command == "compare":
        return _compare(args)
    if args.command == "export":
        return _export(args)
    from dashboard.web.server import serve

    try:
        return serve(args)
    except OSError as exc:  # a cache folder it may not use, an address it cannot listen on
        _fail(str(exc))
        return 2


def __getattr__(name):
    # `gunicorn app:server` builds the app on first access, from DASHBOARD_* variables.
    if name == "server":
        from dashboard.web.server import server_from_environment

        return server_from_environment()
    raise AttributeError(name)


if __name__ == "__main__":
    sys.exit(main())
