"""Benchmark: the diagnosis (verdict, wait budget, findings) and a what-if on large trials.

Trials are synthetic reference-format ones (dashboard/synthetic.py), written once and
cached under bench/out/: 300,000 and 3,000,000 GetNext calls (10 epochs, 4 workers), and
100,000 iterators of 3 batches each (a job that calls iter() every few steps). Each
measurement runs in a fresh process, after the trial is loaded (the load is timed apart):
  diagnosis: `diagnosis.assess(framework, system)`, everything the verdict, the budget and
             the findings (with the what-ifs behind them) need;
  what-if:   `assessment.predict({"num_workers": 8})` afterwards;
  peak RSS of the process.
Targets: the verdict of a 3M trial finishes; 100,000 iterators in <= 1 s of diagnosis.

    python bench/diagnosis.py [--runs 3] [--sizes 300000,3000000,iterators]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from stats import child_runs, spread  # noqa: E402  (bench/, the script's own folder)
from trials import cached_trial  # noqa: E402

SIZES = {"300000": dict(epochs=10, train_batches=30_000), "3000000": dict(epochs=10, train_batches=300_000),
         "iterators": dict(epochs=100_000, train_batches=3)}


def make_trial(size: str) -> str:
    spec = SIZES[size]
    # 1 % of the batches slow: a tail the budget must find.
    slow = {(e, b): 40_000 for e in range(min(spec["epochs"], 10)) for b in range(7, spec["train_batches"], 100)}
    return cached_trial(f"diagnosis-{size}", val_batches=0, num_workers=4, cpus=8, gpus=1, rotate_s=60, seed=1,
                        slow_batches=slow, **spec)


def child(folder: str) -> None:
    import dashboard
    from dashboard.analysis import diagnosis

    started = time.perf_counter()
    trial = dashboard.load_trial(folder, max_events=10**9, max_bytes=10**11)
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    assessment = diagnosis.assess(trial.framework, trial.system)
    assess_s = time.perf_counter() - started
    started = time.perf_counter()
    predicted = assessment.predict({"num_workers": 8})
    what_if_s = time.perf_counter() - started
    budget = assessment.budget[0]
    print(json.dumps({"load_s": load_s, "assess_s": assess_s, "what_if_s": what_if_s,
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "getnext": int((trial.framework["kind"] == "getnext").sum()),
                      "findings": [r.id for r in assessment.recommendations],
                      "parts": budget.parts, "wait_s": budget.wait_s,
                      "predicted": predicted[0].predicted}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="300000,iterators,3000000")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    for size in args.sizes.split(","):
        started = time.perf_counter()
        folder = make_trial(size)
        print(f"{size}: trial ready in {time.perf_counter() - started:.1f} s ({folder})", flush=True)
        runs = child_runs(__file__, folder, args.runs)
        last = runs[-1]
        print(f"  {last['getnext']:,} GetNext; findings {last['findings']}; budget {last['parts']} "
              f"of {last['wait_s']} s; what-if num_workers=8 -> {last['predicted']}")
        for key, unit in (("load_s", "s"), ("assess_s", "s"), ("what_if_s", "s"), ("peak_mb", "MB")):
            print(f"  {key:<10} {spread([r[key] for r in runs])} {unit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
