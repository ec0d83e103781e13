"""Run a training script with the collector active, with no change to its code.

    python -m dashboard.collector --out PATH [options] -- train.py ARGS...
    python -m dashboard.collector --out PATH [options] -- -m package.train ARGS...
    torchrun --nproc-per-node 8 -m dashboard.collector --out s3://b/job -- train.py ARGS...

The script runs as `__main__` in this process (as `python train.py` would run it,
sys.argv and sys.path[0] included), between start() and stop(). The exit status is
the script's. SIGTERM (a job being stopped) ends the script with status 143 through
SystemExit, so the trial is finished; a script that handles SIGTERM itself keeps its
handler.
"""
from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import traceback

from .collector import DEFAULT_UPLOAD_TIMEOUT_S


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dashboard.collector",
        description="Run a PyTorch training script and record its DataLoaders into a trial.",
        usage="%(prog)s --out PATH [options] -- script.py [ARGS...] | -m module [ARGS...]")
    parser.add_argument("--out", required=True,
                        help="trial folder, or s3://bucket/prefix (closed files are uploaded as they close)")
    parser.add_argument("--rotate-s", type=float, default=60.0,
                        help="seconds per framework file (default 60)")
    parser.add_argument("--system-interval-s", type=float, default=0.5,
                        help="system metrics every this many seconds, 0.1 to 60 (default 0.5)")
    parser.add_argument("--no-system", action="store_true", help="no system metrics")
    parser.add_argument("--no-gpu", action="store_true", help="no GPU metrics even when a GPU is present")
    parser.add_argument("--worker-fetch", action="store_true",
                        help="also record each batch's fetch and collate time inside workers")
    parser.add_argument("--upload-timeout-s", type=float, default=DEFAULT_UPLOAD_TIMEOUT_S,
                        help=f"with s3:// output: how long the end of the job waits for the last uploads; "
                             f"past it the files stay local and a warning says where "
                             f"(default {DEFAULT_UPLOAD_TIMEOUT_S:g})")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="after --: the script and its arguments, or -m module and its arguments")
    return parser


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signal.SIGTERM)


# Forked DataLoader workers inherit this handler; worker.py puts its own in its place.
_on_sigterm.dashboard_collector_cli = True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, command = _split(argv)
    parser = build_parser()
    args = parser.parse_args(ours)
    if args.command:
        parser.error(f"unexpected arguments before --: {' '.join(args.command)}")
    if not command:
        parser.error("no script: put it after --, e.g. -- train.py --epochs 3")
    module = None
    if command[0] == "-m":
        if len(command) < 2:
            parser.error("-m needs a module name")
        module, script_args = command[1], command[2:]
        sys.argv = [module] + script_args
    else:
        script = command[0]
        if not os.path.isfile(script):
            parser.error(f"{script}: no such file")
        sys.argv = [script] + command[1:]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` has it
    # This package must stay importable: spawn workers unpickle the collector's worker hook.
    from .collector import _package_root

    if _package_root() not in [os.path.abspath(p or os.curdir) for p in sys.path]:
        sys.path.append(_package_root())

    from .collector import Collector

    try:
        collector = Collector(args.out, rotate_s=args.rotate_s,
                              system_interval_s=None if args.no_system else args.system_interval_s,
                              gpu=not args.no_gpu, worker_fetch=args.worker_fetch,
                              upload_timeout_s=args.upload_timeout_s)
    except ValueError as exc:
        parser.error(str(exc))
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    collector.start()
    status = 0
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code
        else:
            print(code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        status = 130
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        collector.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
