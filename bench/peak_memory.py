"""Benchmark: a load's peak memory as a multiple of the bytes --max-trial-mb counts.

--max-trial-mb refuses trials whose files hold more bytes (as listed, and once decompressed);
what a load then holds is a multiple of those bytes. For synthetic reference-format trials
(cached under bench/out/) of about 20, 50 and 100 MB of JSON, in fresh processes each:
  library: dashboard.load_trial(folder), as `app.py analyze` and the API read it;
  server:  TrialCache.load into a new cache folder, as a dashboard's background load does (the
           trial read, each file's parse and the trial pickled into the shared cache);
peak RSS above the process's RSS once its imports are done, divided by the trial's bytes.

    python bench/peak_memory.py [--runs 3] [--mb 20,50,100]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from stats import spread  # noqa: E402  (bench/, the script's own folder)
from trials import cached_trial  # noqa: E402

BATCHES_PER_MB = 2_960  # write_trial train batches per MiB of files (34,000 made 11.5 MiB)


def make_trial(mb: int) -> str:
    epochs = 10
    return cached_trial(f"peak-{mb}mb", epochs=epochs, train_batches=mb * BATCHES_PER_MB // epochs,
                        val_batches=0, num_workers=4, cpus=8, rotate_s=60, seed=2)


def trial_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(dirpath, name)) for dirpath, _, names in os.walk(folder)
               for name in names if name != ".complete")


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(folder: str, way: str) -> None:
    importlib.import_module("dashboard.web")  # as the server: arrow_memory first, then pandas and pyarrow
    from dashboard.trial.load import load_trial
    from dashboard.web.cache import TrialCache

    base = rss_mb()
    if way == "library":
        trial = load_trial(folder)
    else:
        with tempfile.TemporaryDirectory() as cache_dir:
            _, trial, _ = TrialCache(cache_dir).load(folder, roots=[os.path.dirname(folder)])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"base_mb": base, "peak_mb": peak, "events": len(trial.framework) + len(trial.system)}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mb", default="20,50,100")
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "WAY"))
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    print("trial MB  way       peak above imports MB              x the trial's bytes")
    for mb in [int(part) for part in args.mb.split(",")]:
        folder = make_trial(mb)
        size = trial_bytes(folder) / 2**20
        for way in ("library", "server"):
            ratios, above = [], []
            for _ in range(args.runs):
                done = subprocess.run([sys.executable, __file__, "--child", folder, way], capture_output=True,
                                      text=True, check=True)
                found = json.loads(done.stdout.strip().splitlines()[-1])
                above.append(found["peak_mb"] - found["base_mb"])
                ratios.append(above[-1] / size)
            print(f"{size:8.1f}  {way:8s}  {spread(above, 1):34s} {spread(ratios, 2)}")


if __name__ == "__main__":
    main()
