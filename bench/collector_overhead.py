"""Benchmark: what recording costs a training loop, against no profiling and torch.profiler.

Targets (docs: the collector issue):
  1. main-process CPU per batch, trivial dataset, num_workers=0: collector <= 1 us over none;
  2. wall time with 2 workers (fork) on a small real training loop: collector <= 2 % over none.

Each run of a loop is one fresh process (`--child`), so that one mode's hooks, threads or
profiler state never leak into another; the modes are interleaved (none, collector,
torch.profiler, none, ...) over `--repeats` rounds and reported as median [min..max].

Measured, per mode:
  cpu_us_per_batch   time.process_time() of the training process (all its threads,
                     the collector's flush thread included) over the loop / batches
  wall_s             wall time of the loop
  sink_cpu_us_per_batch   CPU of the collector's sink process (the side process that
                     formats and writes the trial; not the training process's CPU)
Also measured in this process: the cost of the worker-side records, per worker lifetime
(start + end records) and per fetch record (worker_fetch=True).

    python bench/collector_overhead.py [--batches 200000] [--repeats 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

MODES = ("none", "collector", "torch.profiler")


# --- the loops (run in a child process) --------------------------------------------------

def _trivial_loop(batches: int):
    """num_workers=0, a dataset of ints, no collation: DataLoader's own per-batch floor."""
    from torch.utils.data import DataLoader

    loader = DataLoader(list(range(batches)), batch_size=None, num_workers=0)
    count = 0
    for _ in loader:
        count += 1
    return count


class _Samples:
    """A small real dataset: 3x32x32 images made from the index (work per sample)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        import torch

        generator = torch.Generator().manual_seed(index)
        image = torch.rand(3, 32, 32, generator=generator)
        return image * 2 - 1, index % 10


def _training_loop(batches: int, epochs: int = 2):
    """2 fork workers, non-persistent (re-spawned each epoch), a small CNN trained on CPU."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(_Samples(batches * 16 // epochs), batch_size=16, shuffle=True, num_workers=2,
                        multiprocessing_context="fork")
    count = 0
    for _ in range(epochs):
        for images, labels in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            count += 1
    return count


def child(mode: str, loop: str, batches: int) -> dict:
    import torch  # noqa: F401  (imported before timing in every mode)

    run = _trivial_loop if loop == "trivial" else _training_loop
    out = tempfile.mkdtemp(prefix="bench-collector-")
    sink_pid = None
    if mode == "collector":
        from dashboard.collector import Collector

        context = Collector(out, system_interval_s=0.5)
    elif mode == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        context = profile(activities=[ProfilerActivity.CPU])
    else:
        context = None
    wall0, cpu0 = time.perf_counter(), time.process_time()
    if context is not None:
        context.__enter__()
        if mode == "collector" and context._sink_process is not None:
            sink_pid = context._sink_process.pid
    wall1, cpu1 = time.perf_counter(), time.process_time()
    sink_cpu0 = _cpu_of(sink_pid)
    count = run(batches)
    wall2, cpu2 = time.perf_counter(), time.process_time()
    sink_cpu1 = _cpu_of(sink_pid)
    if context is not None:
        context.__exit__(None, None, None)
    wall3, cpu3 = time.perf_counter(), time.process_time()
    # Per batch: the loop while recording (the collector's flush thread included); the
    # one-off costs of starting and stopping (the profiler builds its trace at stop).
    result = {"mode": mode, "loop": loop, "batches": count, "cpu_s": cpu2 - cpu1, "wall_s": wall2 - wall1,
              "start_wall_s": wall1 - wall0, "stop_wall_s": wall3 - wall2,
              "start_stop_cpu_s": (cpu1 - cpu0) + (cpu3 - cpu2)}
    if sink_pid is not None:
        result["sink_cpu_s"] = sink_cpu1 - sink_cpu0
    return result


def _cpu_of(pid):
    if pid is None:
        return 0.0
    try:
        import psutil

        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    except Exception:
        return 0.0


# --- worker-side record costs (in this process) ---------------------------------------

def worker_record_costs(rounds: int = 2000, fetches: int = 200_000) -> dict:
    from dashboard.collector import worker

    spool = tempfile.mkdtemp(prefix="bench-spool-")
    loop = worker.WorkerLoop(spool, 1, {"worker_id": 0, "num_workers": 1}, fetch=True)
    start = time.process_time()
    for _ in range(rounds):
        recorder = worker._Recorder(loop, (0, 2), {})
        recorder.finish("exit")
    lifetime_us = (time.process_time() - start) / rounds * 1e6
    recorder = worker._Recorder(loop, (0, 2), {})
    now = time.time_ns
    start = time.process_time()
    for _ in range(fetches):
        t0 = now()
        recorder.fetched(t0, now())
    recorder.finish("exit")
    fetch_us = (time.process_time() - start) / fetches * 1e6
    return {"worker_lifetime_records_us": round(lifetime_us, 2), "fetch_record_us": round(fetch_us, 3)}


# --- the driver ------------------------------------------------------------------------

def _spawn(mode: str, loop: str, batches: int) -> dict:
    output = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, loop, str(batches)],
                            check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def _summary(values: list[float], digits: int = 3) -> str:
    return (f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}..{max(values):.{digits}f}]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200_000, help="batches of the trivial loop")
    parser.add_argument("--train-batches", type=int, default=400, help="batches of the 2-worker training loop")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "LOOP", "BATCHES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, loop, batches = args.child
        print(json.dumps(child(mode, loop, int(batches))))
        return 0

    report: dict = {"trivial": {}, "training": {}}
    for loop, batches in (("trivial", args.batches), ("training", args.train_batches)):
        runs = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                runs[mode].append(_spawn(mode, loop, batches))
        base_cpu = [r["cpu_s"] / r["batches"] * 1e6 for r in runs["none"]]
        base_wall = [r["wall_s"] for r in runs["none"]]
        print(f"\n{loop} loop: {runs['none'][0]['batches']} batches, {args.repeats} runs per mode "
              "(median [min..max])")
        for mode in MODES:
            cpu = [r["cpu_s"] / r["batches"] * 1e6 for r in runs[mode]]
            wall = [r["wall_s"] for r in runs[mode]]
            # Overhead per round against that round's baseline run (pairs share the noise).
            cpu_over = [c - b for c, b in zip(cpu, base_cpu)]
            wall_over = [100 * (w - b) / b for w, b in zip(wall, base_wall)]
            entry = {"cpu_us_per_batch": cpu, "wall_s": wall, "cpu_overhead_us_per_batch": cpu_over,
                     "wall_overhead_percent": wall_over}
            line = (f"  {mode:15s} cpu/batch {_summary(cpu)} us   wall {_summary(wall)} s   "
                    f"overhead cpu/batch {_summary(cpu_over)} us, wall {_summary(wall_over, 2)} %")
            start = [r["start_wall_s"] for r in runs[mode]]
            stop = [r["stop_wall_s"] for r in runs[mode]]
            entry.update(start_wall_s=start, stop_wall_s=stop)
            if mode != "none":
                line += f"\n  {'':15s} start {_summary(start)} s, stop {_summary(stop)} s (once per run, not in the loop)"
            sink = [r["sink_cpu_s"] / r["batches"] * 1e6 for r in runs[mode] if "sink_cpu_s" in r]
            if sink:
                entry["sink_cpu_us_per_batch"] = sink
                line += f"\n  {'':15s} sink process cpu/batch {_summary(sink)} us (outside the training process)"
            report[loop][mode] = entry
            print(line)
    costs = worker_record_costs()
    report["worker_records"] = costs
    print(f"\nworker side: {costs['worker_lifetime_records_us']} us per worker lifetime (start + end records), "
          f"{costs['fetch_record_us']} us per fetch record (worker_fetch=True)")
    trivial = report["trivial"]
    cpu_over = statistics.median(trivial["collector"]["cpu_overhead_us_per_batch"])
    wall_over = statistics.median(report["training"]["collector"]["wall_overhead_percent"])
    print(f"\ntargets: cpu overhead/batch {cpu_over:.3f} us (<= 1 us: {'met' if cpu_over <= 1 else 'NOT met'}); "
          f"2-worker wall overhead {wall_over:.2f} % (<= 2 %: {'met' if wall_over <= 2 else 'NOT met'})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
