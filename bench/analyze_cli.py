"""Benchmark: the whole `app.py analyze --json` process, as a user runs it, cold and warm.

On bench/load_trial.py's 300k-GetNext trial or bench/diagnosis.py's 3M one (its 1 % slow
batches: a tail the verdict must find), each measurement a fresh process:
  cold:     no cache folder (every file read and parsed, in forked workers);
  filling:  cold, with a new --cache-dir (the parse, then every file's columns written);
  changed:  --cache-dir after one framework file changed (its mtime): that file parsed, the
            rest read from the columnar cache, the whole analysis run again (a followed job);
  kept:     --cache-dir on the unchanged trial (the answer kept by the last run).
Each with its wall time, the peak RSS of its largest process, the most shared memory it held at
once (the tables the parse workers hand over, trial/table_handover.py: not in the RSS until
touched), and the process's peak with that shared memory (sampled every 5 ms).
Targets (issue "Trials of any size", 3M): cold <= 6 s, warm <= 1.5 s, peak RSS <= 1 GB (954 MiB).

    python bench/analyze_cli.py [--runs 3] [--size 300000|3000000]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
APP = os.path.join(os.path.dirname(HERE), "app.py")
sys.path.insert(0, os.path.dirname(HERE))
from stats import compile_project, run_watching_shared_memory, spread  # noqa: E402  (bench/, the script's own folder)
from trials import trial_of_size  # noqa: E402


def measure(folder: str, cache_dir: str | None) -> dict:
    """One `analyze --json` process (run from a process of its own, whose only child it is)."""
    out = subprocess.run([sys.executable, __file__, "--child", folder, cache_dir or ""], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def child(folder: str, cache_dir: str) -> None:
    started = time.perf_counter()
    shared, together = run_watching_shared_memory([sys.executable, APP, "analyze", folder, "--json",
                                         *(["--cache-dir", cache_dir] if cache_dir else [])])
    print(json.dumps({"wall_s": time.perf_counter() - started, "shared_mb": shared, "with_shared_mb": together,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default="3000000", choices=("300000", "3000000"))
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    folder = trial_of_size(args.size)
    compile_project()
    newest = max(glob.glob(os.path.join(folder, "framework", "**", "*.json"), recursive=True))
    found: dict[str, list] = {"cold": [], "filling": [], "changed": [], "kept": []}
    for _ in range(args.runs):  # (interleaved: the host's speed drifts)
        found["cold"].append(measure(folder, None))
        cache_dir = tempfile.mkdtemp(prefix="bench-analyze-")
        try:
            found["filling"].append(measure(folder, cache_dir))
            os.utime(newest)  # a new version of the file: its columns and the kept answer are stale
            found["changed"].append(measure(folder, cache_dir))
            found["kept"].append(measure(folder, cache_dir))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    print(f"trial: {folder}")
    for label, runs in found.items():
        print(f"{label:<8} wall s: {spread([r['wall_s'] for r in runs])}; peak RSS MiB: "
              f"{spread([r['peak_rss_mb'] for r in runs], 0)}; shared MiB: {spread([r['shared_mb'] for r in runs], 0)}; "
              f"peak with the shared MiB: {spread([r['with_shared_mb'] for r in runs], 0)}")
    print(f"(memory in MiB, 2**20 bytes: the 1 GB target is {1e9 / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
