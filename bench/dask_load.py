"""Benchmark: loading the 64-rank trial here and on a dask.distributed LocalCluster.

The trial is bench/ranks.py's job (dashboard.synthetic.write_job: 8 hosts x 8 ranks) with a
tenth of its steps, written once under bench/out/. Each measurement runs in a fresh process:
  local: load_trial in this process (reading threads);
  dask:  load_trial with a Client of a LocalCluster of 2 worker processes (1 thread each) on
         loopback, started before the clock starts: the workers read and parse every file and
         return Arrow tables;
and checks that both give the same frames. Needs requirements-dask.txt.

    python bench/dask_load.py [--runs 3]
"""
from __future__ import annotations

import argparse
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


def make_trial() -> str:
    from ranks import JOB

    # bench/ranks.py's job, 64 ranks, with a tenth of its steps: a trial of about 60 MB.
    return cached_trial("dask-ranks-64", **{**JOB, "steps": 1_400})


def child(folder: str, mode: str) -> None:
    import hashlib

    import pandas as pd

    from dashboard.trial.load import load_trial

    limits = dict(max_events=10**9, max_bytes=10**11)
    if mode == "dask":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None)
        client = Client(cluster)
    else:
        client = None
    started = time.perf_counter()
    trial = load_trial(folder, dask_client=client, **limits)
    load_s = time.perf_counter() - started
    digest = hashlib.sha256(pd.util.hash_pandas_object(trial.framework, index=False).to_numpy().tobytes()
                            ).hexdigest()
    print(json.dumps({"load_s": load_s, "events": len(trial.framework), "frame_digest": digest,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    if client is not None:
        client.close()
        cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    folder = make_trial()
    runs: dict[str, list] = {"local": [], "dask": []}
    for _ in range(args.runs):
        for mode in runs:
            out = subprocess.run([sys.executable, __file__, "--child", folder, mode], capture_output=True,
                                 text=True, check=True).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{runs['local'][0]['events']:,} events; same frames on both: "
          f"{len({r['frame_digest'] for rs in runs.values() for r in rs}) == 1}")
    for mode, results in runs.items():
        print(f"{mode:<5} load s: {spread([r['load_s'] for r in results])}; "
              f"peak RSS of the loading process MB: {spread([r['peak_rss_mb'] for r in results], 0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
