"""Benchmark: load + analyze a large reference-format trial.

Generates (once, cached under bench/out/) a synthetic trial with 300,000 GetNext calls
(about 600k events, ~90 MB of framework JSON in 60 s rotated files) and a node with 8 CPUs
and 1 GPU of system metrics every 500 ms, then measures in fresh processes:
  cold: load + all four analyses, first time in a new process
  warm: the same again in that process (OS and allocator warm)
  peak RSS of the process after the cold load + analyses;
  the dashboard's brush -> timeline callback work (server side, JSON included) for a
  window of the whole job, 30 % and 1 % of it (target <= 300 ms).
  columnar: a reopen in a new process with every file's columns in the columnar cache
  (dashboard/trial/columnar_cache.py, written by an earlier process), load alone and with
  the analyses, and its peak RSS (target <= 0.4 s of load).
  reopen: the whole `analyze --json --cache-dir` process on the unchanged trial, whose answer an
  earlier run kept (dashboard/result_cache.py).
Targets on a 2-core machine: cold <= 1.5 s, peak RSS <= 270 MB (257 MiB: the peaks below are in MiB, 2**20 bytes).
If `smdebug` is importable (here, or in the Python given by --reference-python), its
PandasFrame + PT_dataloader_analysis run on the same trial, in the same run, for the ratio:

    python bench/load_trial.py [--runs 5] [--batches 300000] [--reference-python PYTHON]

    # the reference, in a virtual environment of its own:
    python3 -m venv /tmp/smdebug && /tmp/smdebug/bin/pip install smdebug==1.0.34 pandas requests psutil bokeh
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from stats import compile_project, run_watching_shared_memory, spread  # noqa: E402  (bench/, the script's own folder)
from trials import cached_trial  # noqa: E402


def make_trial(batches: int) -> str:
    epochs = 10
    return cached_trial(f"trial-{batches}", epochs=epochs, train_batches=batches // epochs, val_batches=0,
                        num_workers=4, cpus=8, gpus=1, rotate_s=60, seed=1)


def framework_mb(folder: str) -> float:
    total = 0
    for dirpath, _, names in os.walk(os.path.join(folder, "framework")):
        total += sum(os.path.getsize(os.path.join(dirpath, n)) for n in names)
    return total / 1e6


def child(folder: str) -> None:
    """One measurement in this (fresh) process; prints a JSON line."""
    t0 = time.perf_counter()
    import dashboard
    import dashboard.api  # noqa: F401  (pandas, pyarrow: a once-per-process cost, timed apart)

    imports = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = dashboard.analyze(folder)
    cold = time.perf_counter() - t0
    peak_cold = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # What the CLI's report and the dashboard add on top: the verdict and recommendations.
    t0 = time.perf_counter()
    result.assessment
    verdict_s = time.perf_counter() - t0
    peak_verdict = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    dashboard.analyze(folder)
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    middle = (result.trial.start_us + result.trial.end_us) // 2
    result.window(middle - 5_000_000, middle + 5_000_000)
    window_s = time.perf_counter() - t0
    # The dashboard's brush -> timeline path, server side, JSON encoding included.
    from plotly.io.json import to_json_plotly

    from dashboard.web.views import trial_view, window_payload

    view = trial_view(result.trial, analysis=result.dataloader)
    start, end = result.trial.start_us, result.trial.end_us
    brush = {}
    for label, (lo, hi) in {"whole": (start, end), "30%": (middle - (end - start) * 15 // 100,
                                                         middle + (end - start) * 15 // 100),
                            "1%": (middle - (end - start) // 200, middle + (end - start) // 200)}.items():
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            to_json_plotly(window_payload(view, lo, hi))
            times.append(time.perf_counter() - t0)
        brush[label] = statistics.median(times)
    print(json.dumps({"imports_s": imports, "cold_s": cold, "warm_s": warm, "window_s": window_s, "brush": brush,
                      "verdict_s": verdict_s, "peak_verdict_mb": peak_verdict, "getnext": result.getnext.count, "events": len(result.trial.framework),
                      "system": len(result.trial.system),
                      "peak_rss_mb": peak_cold}))


def columnar_child(folder: str, cache_dir: str) -> None:
    """A reopen in a fresh process: the load (and the 4 analyses) with every file's columns in
    the columnar cache (written by an earlier process), as `analyze --cache-dir` does."""
    t0 = time.perf_counter()
    import dashboard
    from dashboard.trial.columnar_cache import ColumnarFileCache

    imports = time.perf_counter() - t0
    t0 = time.perf_counter()
    trial = dashboard.load_trial(folder, file_cache=ColumnarFileCache(cache_dir))
    load_s = time.perf_counter() - t0
    dashboard.analyze(trial)
    print(json.dumps({"imports_s": imports, "load_s": load_s, "load_analyses_s": time.perf_counter() - t0,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def cli_child(folder: str, cache_dir: str | None = None) -> None:
    """The whole `app.py analyze --json` process, as a user runs it (imports, a load parsed in
    worker processes, the four analyses, verdict and findings): its wall time, and the peak
    RSS of the largest process of it (RUSAGE_CHILDREN: this process has no other child)."""
    t0 = time.perf_counter()
    app = os.path.join(os.path.dirname(HERE), "app.py")
    shared, together = run_watching_shared_memory([sys.executable, app, "analyze", folder, "--json",
                                                   *(["--cache-dir", cache_dir] if cache_dir else [])])
    print(json.dumps({"wall_s": time.perf_counter() - t0, "shared_mb": shared, "with_shared_mb": together,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def reference_child(folder: str) -> None:
    from smdebug.profiler.analysis.utils.profiler_data_to_pandas import PandasFrame
    from smdebug.profiler.analysis.utils.pytorch_dataloader_analysis import PT_dataloader_analysis

    t0 = time.perf_counter()
    analysis = PT_dataloader_analysis(PandasFrame(folder))
    analysis.analyze_dataloaderIter_initialization()
    analysis.analyze_dataloaderWorkers()
    analysis.analyze_dataloader_getnext()
    analysis.analyze_batchtime()
    print(json.dumps({"cold_s": time.perf_counter() - t0,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _smdebug_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("smdebug") is not None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batches", type=int, default=300_000)
    parser.add_argument("--reference-python", help="a Python with smdebug installed, to run the reference "
                        "on the same trial (smdebug pins old packages: give it its own virtual environment)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cli-child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--reference-child", help=argparse.SUPPRESS)
    parser.add_argument("--columnar-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    if args.columnar_child:
        columnar_child(*args.columnar_child)
        return 0
    if args.reference_child:
        reference_child(args.reference_child)
        return 0
    if args.cli_child:
        cli_child(*args.cli_child)
        return 0
    t0 = time.perf_counter()
    folder = make_trial(args.batches)
    compile_project()
    print(f"trial: {folder} ({framework_mb(folder):.0f} MB framework JSON, ready in {time.perf_counter() - t0:.1f} s)")
    runs = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, __file__, "--child", folder], capture_output=True, text=True,
                             check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    cli = [json.loads(subprocess.run([sys.executable, __file__, "--cli-child", folder], capture_output=True,
                                     text=True, check=True).stdout.strip().splitlines()[-1])
           for _ in range(args.runs)]
    first = runs[0]
    print(f"events {first['events']:,}, GetNext {first['getnext']:,}, system samples {first['system']:,}")
    print(f"imports (once/process)  s: {spread([r['imports_s'] for r in runs])}")
    print(f"cold load + 4 analyses  s: {spread([r['cold_s'] for r in runs])}   target <= 1.5")
    print(f"warm load + 4 analyses  s: {spread([r['warm_s'] for r in runs])}")
    print(f"window (10 s) query     s: {spread([r['window_s'] for r in runs])}")
    print(f"peak RSS              MiB: {spread([r['peak_rss_mb'] for r in runs])}   target <= 270 MB (257 MiB)")
    print(f"+ verdict, recommendations s: {spread([r['verdict_s'] for r in runs])}   (CLI report, dashboard)")
    print(f"  peak RSS with them    MiB: {spread([r['peak_verdict_mb'] for r in runs])}")
    print(f"whole `analyze --json`  s: {spread([r['wall_s'] for r in cli])}   (the process, as a user runs it)")
    print(f"  its peak RSS          MiB: {spread([r['peak_rss_mb'] for r in cli])}")
    print(f"  shared memory at most MiB: {spread([r['shared_mb'] for r in cli])}   (the tables the parse workers "
          f"handed over, which the RSS counts once touched)")
    print(f"  its peak with it      MiB: {spread([r['with_shared_mb'] for r in cli])}   target <= 270 MB (257 MiB) (sampled: "
          f"RSS less shared pages, plus the shared memory held)")
    for label in runs[0]["brush"]:
        print(f"brush -> timeline {label:>5} s: {spread([r['brush'][label] for r in runs])}   target <= 0.3")
    with tempfile.TemporaryDirectory() as cache_dir:
        columns = os.path.join(cache_dir, "columns")
        warm = []
        for _ in range(args.runs + 1):  # the first writes the columns
            out = subprocess.run([sys.executable, __file__, "--columnar-child", folder, columns],
                                 capture_output=True, text=True, check=True).stdout
            warm.append(json.loads(out.strip().splitlines()[-1]))
        first_write, warm = warm[0], warm[1:]
    print(f"columnar cache: first load writing it {first_write['load_s']:.3f} s; a reopen in a new process:")
    print(f"  load from columns      s: {spread([r['load_s'] for r in warm])}   target <= 0.4")
    print(f"  load + 4 analyses      s: {spread([r['load_analyses_s'] for r in warm])}")
    print(f"  peak RSS             MiB: {spread([r['peak_rss_mb'] for r in warm])}")
    with tempfile.TemporaryDirectory() as cache_dir:
        # The first run fills the folder (columns and answer); the next reopen the unchanged trial.
        reopens = [json.loads(subprocess.run([sys.executable, __file__, "--cli-child", folder, cache_dir],
                                             capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
                   for _ in range(args.runs + 1)][1:]
    print(f"reopen of the unchanged trial, `analyze --json --cache-dir` (its answer kept) s: "
          f"{spread([r['wall_s'] for r in reopens])}, peak RSS MiB: {spread([r['peak_rss_mb'] for r in reopens])}")
    reference_python = args.reference_python or (sys.executable if _smdebug_importable() else None)
    if reference_python is None:
        print("smdebug not importable: reference not run (see --reference-python; it took ~19-22 s and "
              "790-820 MiB on such a trial)")
    else:
        out = subprocess.run([reference_python, __file__, "--reference-child", folder], capture_output=True,
                             text=True, check=True).stdout
        ref = json.loads(out.strip().splitlines()[-1])
        cold = statistics.median(r["cold_s"] for r in runs)
        peak = statistics.median(r["peak_rss_mb"] for r in runs)
        whole = statistics.median(r["wall_s"] for r in cli)
        print(f"reference smdebug      : {ref['cold_s']:.2f} s, peak RSS {ref['peak_rss_mb']:.0f} MiB "
              f"(one run): {ref['cold_s'] / cold:.1f}x the time of a load + 4 analyses, "
              f"{ref['cold_s'] / whole:.1f}x that of the whole analyze process; {ref['peak_rss_mb'] / peak:.1f}x "
              f"the memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
