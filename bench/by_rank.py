"""Benchmark: the whole analysis of the 64-rank trial, in one process against per-rank work.

The trial is bench/ranks.py's job (dashboard.synthetic.write_job: 8 hosts x 8 ranks, 1.8M
GetNext, one slow rank and one slow host), written once under bench/out/. Each measurement is
a fresh process that analyzes it as `app.py analyze --json` does, verdict and findings
included, and prints its wall time, its own peak RSS and its workers' largest:
  whole:  dashboard.analyze, the whole trial's frame in this process;
  ranks:  dashboard.by_rank.analyze_by_rank in 2 forked worker processes (what
          `analyze --by-rank` runs): each rank's events stay in the worker that read them;
  dask:   the same on a LocalCluster of 2 worker processes (1 thread each) on loopback,
          started before the clock starts (needs requirements-dask.txt).
The three JSON reports must be equal.

    python bench/by_rank.py [--runs 3] [--modes whole,ranks,dask]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from stats import spread  # noqa: E402  (bench/, the script's own folder)
from trials import cached_trial  # noqa: E402

MODES = ("whole", "ranks", "dask")


def child(folder: str, mode: str) -> None:
    from dashboard import analyze
    from dashboard.by_rank import analyze_by_rank
    from dashboard.report import to_dict

    cluster = client = None
    if mode == "dask":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None)
        client = Client(cluster)
    start = time.perf_counter()
    if mode == "whole":
        result = analyze(folder)
    else:
        result = analyze_by_rank(folder, client=client, processes=2)
    report = to_dict(result)
    wall = time.perf_counter() - start
    workers_mb = None
    if client is not None:
        workers_mb = max(client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024).values())
        client.close()
        cluster.close()
    elif mode == "ranks":
        workers_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "workers_peak_mb": workers_mb, "getnext": report["getnext"]["count"],
                      "digest": hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()}))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    from ranks import JOB

    folder = cached_trial("ranks-64", **JOB)
    modes = [m for m in args.modes.split(",") if m]
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.runs):  # interleaved: the machine's other load falls on every mode alike
        for mode in modes:
            done = subprocess.run([sys.executable, __file__, "--child", folder, mode], capture_output=True,
                                  text=True, check=True)
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
    digests = {r["digest"] for rs in runs.values() for r in rs}
    print(f"trial: {folder}, {runs[modes[0]][0]['getnext']:,} GetNext; reports equal: {len(digests) == 1}")
    for mode in modes:
        print(f"{mode:>5}: wall s {spread([r['wall_s'] for r in runs[mode]])}")
        print(f"       peak RSS of the analyzing process MB {spread([r['peak_mb'] for r in runs[mode]], 1)}")
        if runs[mode][0]["workers_peak_mb"] is not None:
            print(f"       largest worker's peak RSS MB {spread([r['workers_peak_mb'] for r in runs[mode]], 1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
