"""Benchmark: a job of 64 ranks (8 hosts x 8 ranks, 1 hour, about 2M GetNext) and its rank
heat map.

The trial is synthetic (dashboard.synthetic.write_job: one slow rank, one host with slow
storage), written once and cached under bench/out/. Each run is a fresh process:
  load:      `load_trial` of the whole trial;
  summaries: `ranks.rank_waits(framework)`, the per-rank summaries (once per trial);
  heat map:  what the page's callback does once loaded: `views.rank_heatmap_view` (120
             buckets over the whole job, the window marked), median of 20 calls;
  diagnosis: `diagnosis.assess`, the verdict per host and rank and the straggler findings;
  by rank:   `per_rank.analyze_by_process` (each rank summarised, then combined) against
             `dataloader.analyze` of the whole frame, the same numbers, and the summaries'
             bytes against the frame's (memory_usage(deep=True));
  peak RSS of the process.
Target: the heat map draws in <= 300 ms of server time once loaded.

    python bench/ranks.py [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from stats import child_runs, spread  # noqa: E402  (bench/, the script's own folder)
from trials import cached_trial  # noqa: E402

# 8 x 8 ranks; 28,000 batches each of about 128 ms (a 3-12 ms wait, a 110-125 ms step): 1 hour.
JOB = dict(writer="write_job", hosts=8, ranks_per_host=8, epochs=2, steps=14_000, getnext_us=(3_000, 12_000),
           step_us=(110_000, 125_000), slow_rank=21, slow_rank_us=(40_000, 60_000), slow_storage_host=6,
           storage_us=(20_000, 30_000), system_interval_s=1.0, cpus=8, rotate_s=300, seed=7)


def child(folder: str) -> None:
    import dashboard
    from dashboard.analysis import dataloader, diagnosis, per_rank, ranks
    from dashboard.web import views

    started = time.perf_counter()
    trial = dashboard.load_trial(folder, max_events=10**9, max_bytes=10**11)
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    waits = ranks.rank_waits(trial.framework)
    summaries_s = time.perf_counter() - started
    calls = []
    window = (trial.start_us + 600_000_000, trial.start_us + 900_000_000)
    for order in ("host", "wait") * 10:
        started = time.perf_counter()
        view = views.rank_heatmap_view(waits, order, window)
        json.dumps(view["figure"])  # what the callback's response serialises
        calls.append(time.perf_counter() - started)
    started = time.perf_counter()
    assessment = diagnosis.assess(trial.framework, trial.system)
    assess_s = time.perf_counter() - started
    started = time.perf_counter()
    whole = dataloader.analyze(trial.framework)
    analyze_s = time.perf_counter() - started
    started = time.perf_counter()
    by_rank = per_rank.analyze_by_process(trial)
    by_rank_s = time.perf_counter() - started
    assert (by_rank.getnext.count, by_rank.getnext.median_us, by_rank.batchtime.median_s, len(by_rank.getnext.outliers)) \
        == (whole.getnext.count, whole.getnext.median_us, whole.batchtime.median_s, len(whole.getnext.outliers))
    summaries = per_rank.summarise_by_rank(trial)  # those combined, a slow rank's summarised again
    summary_mb = sum(s.nbytes for s in summaries) / 2**20
    frame_mb = trial.framework.memory_usage(deep=True).sum() / 2**20
    print(json.dumps({"load_s": load_s, "summaries_s": summaries_s, "heatmap_s": statistics.median(calls),
                      "assess_s": assess_s, "analyze_s": analyze_s, "by_rank_s": by_rank_s,
                      "summary_mb": summary_mb, "frame_mb": frame_mb, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "getnext": int((trial.framework["kind"] == "getnext").sum()), "ranks": len(waits.processes),
                      "hours": (trial.end_us - trial.start_us) / 3.6e9,
                      "stragglers": [(r.id, r.evidence.get("rank"), r.evidence.get("node"))
                                     for r in assessment.recommendations if r.id.startswith("straggler")]}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    started = time.perf_counter()
    folder = cached_trial("ranks-64", **JOB)
    print(f"trial ready in {time.perf_counter() - started:.1f} s ({folder})", flush=True)
    runs = child_runs(__file__, folder, args.runs)
    last = runs[-1]
    print(f"  {last['getnext']:,} GetNext over {last['ranks']} ranks, {last['hours']:.2f} h; "
          f"stragglers {last['stragglers']}")
    for key, unit in (("load_s", "s"), ("summaries_s", "s"), ("heatmap_s", "s"), ("assess_s", "s"),
                      ("peak_mb", "MB")):
        print(f"  {key:<12} {spread([r[key] for r in runs])} {unit}", flush=True)
    print(f"  by rank      analyze_by_process {spread([r['by_rank_s'] for r in runs])} s vs analyze "
          f"{spread([r['analyze_s'] for r in runs])} s; summaries {spread([r['summary_mb'] for r in runs], 1)} MB "
          f"vs frame {spread([r['frame_mb'] for r in runs], 1)} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
