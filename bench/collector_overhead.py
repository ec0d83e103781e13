"""Benchmark: what recording costs a training loop, against no profiling and torch.profiler.

Targets (the collector issue):
  1. main-process CPU per batch, trivial dataset, num_workers=0: collector <= 1 us over none;
  2. wall time with 2 workers on a small real training loop: collector <= 2 % over none.

Three measurements, all in one run:

A. per-batch CPU, paired (target 1). One process alternates short loops over a trivial
   dataset (ints, no collation: DataLoader's own per-batch floor, ~6 us): none,
   collector, none, torch.profiler, ... for `--rounds` rounds. Each recorded loop is
   compared with the mean of the plain loops just before and after it, so a machine whose
   load drifts (shared cores) cancels out; reported as median and interquartile range.
   CPU is time.process_time() of the training process over the loop: every thread of it,
   the collector's flush thread included. Starting and stopping are not in the loop;
   they are reported apart (once per run, not per batch).
B. the same three modes, one fresh process each, interleaved over `--repeats` rounds:
   cpu per batch and wall time of the loop, median [min..max]; and the CPU of the
   collector's sink process (it formats and writes the trial outside the training
   process; its start-up is most of it).
C. wall time of a real 2-worker training loop: a small CNN trained on CPU, fork workers
   re-spawned every epoch; one fresh process per mode, interleaved. (The sink process's
   CPU per batch here is mostly its interpreter start-up, once per run.)
D. the same training, paired (target 2): one process alternates epochs plain, recorded,
   plain, ... (collector and torch.profiler in turn); each recorded epoch's loop wall
   against the mean of the plain epochs around it; median and interquartile range. The
   recording starts 0.5 s before its epoch: this is the steady state of a long job, whose
   one-off start-up (the sink process's interpreter, ~50 ms of CPU) C includes.

Also measured here: what the worker side costs, per worker lifetime (the start and end
records) and per fetch record (worker_fetch=True); the training process pays nothing
per worker event (the sink reads them from the workers' spool files).

    python bench/collector_overhead.py [--rounds 20] [--repeats 5] [--json out.json]
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
from stats import spread, spread_iqr  # noqa: E402  (bench/, the script's own folder)

MODES = ("none", "collector", "torch.profiler")


# --- the loops -------------------------------------------------------------------------------

def trivial_loop(batches: int) -> int:
    """num_workers=0, a dataset of ints, no collation."""
    from torch.utils.data import DataLoader

    count = 0
    for _ in DataLoader(list(range(batches)), batch_size=None, num_workers=0):
        count += 1
    return count


class Samples:
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


class Training:
    """2 fork workers, non-persistent (re-spawned each epoch), a small CNN trained on CPU."""

    def __init__(self, batches_per_epoch: int):
        import torch
        from torch import nn
        from torch.utils.data import DataLoader

        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.nn = nn
        self.model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4), nn.Flatten(),
                                   nn.Linear(8 * 8 * 8, 10))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.loader = DataLoader(Samples(batches_per_epoch * 16), batch_size=16, shuffle=True, num_workers=2,
                                 multiprocessing_context="fork")

    def epoch(self) -> int:
        count = 0
        for images, labels in self.loader:
            self.optimizer.zero_grad()
            self.nn.functional.cross_entropy(self.model(images), labels).backward()
            self.optimizer.step()
            count += 1
        return count


def training_loop(batches: int, epochs: int = 2) -> int:
    epochs = min(epochs, max(1, batches // 16))
    training = Training(batches // epochs)
    return sum(training.epoch() for _ in range(epochs))


def recording(mode: str, out: str):
    if mode == "collector":
        from dashboard.collector import Collector

        return Collector(out, system_interval_s=0.5)
    if mode == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CPU])
    return None


def _cpu_of(pid) -> float:
    if pid is None:
        return 0.0
    try:
        import psutil

        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    except Exception:
        return 0.0


def timed(mode: str, run, batches: int, settle_s: float = 0.0) -> dict:
    """One loop under `mode`: CPU and wall of the loop, and of starting and stopping."""
    with tempfile.TemporaryDirectory(prefix="bench-collector-") as out:
        context = recording(mode, out)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        sink_pid = None
        if context is not None:
            context.__enter__()
            process = getattr(context, "_sink_process", None)
            sink_pid = process.pid if process is not None else None
        if settle_s:  # let the sink process finish starting (its interpreter start-up is once per job)
            time.sleep(settle_s)
        wall1, cpu1 = time.perf_counter(), time.process_time()
        sink0 = _cpu_of(sink_pid)
        count = run(batches)
        wall2, cpu2 = time.perf_counter(), time.process_time()
        sink1 = _cpu_of(sink_pid)
        if context is not None:
            context.__exit__(None, None, None)
        wall3, cpu3 = time.perf_counter(), time.process_time()
    result = {"mode": mode, "batches": count, "cpu_s": cpu2 - cpu1, "wall_s": wall2 - wall1,
              "start_wall_s": wall1 - wall0, "stop_wall_s": wall3 - wall2,
              "start_stop_cpu_s": (cpu1 - cpu0) + (cpu3 - cpu2)}
    if sink_pid is not None:
        result["sink_cpu_s"] = sink1 - sink0
    return result


# --- child processes ----------------------------------------------------------------------------

def child_paired(rounds: int, batches: int) -> dict:
    """A: interleaved loops in this one process; per-batch CPU over the neighbouring plain loops."""
    import torch  # noqa: F401

    trivial_loop(batches)  # warm up
    over = {"collector": [], "torch.profiler": []}
    base = []
    starts = {"collector": [], "torch.profiler": []}
    stops = {"collector": [], "torch.profiler": []}
    for _ in range(rounds):
        for mode in over:
            before = timed("none", trivial_loop, batches)
            recorded = timed(mode, trivial_loop, batches)
            after = timed("none", trivial_loop, batches)
            plain = (before["cpu_s"] + after["cpu_s"]) / 2
            over[mode].append((recorded["cpu_s"] - plain) / batches * 1e6)
            base.append(plain / batches * 1e6)
            starts[mode].append(recorded["start_wall_s"])
            stops[mode].append(recorded["stop_wall_s"])
    return {"overhead_us": over, "base_us": base, "start_s": starts, "stop_s": stops}


def child_paired_training(rounds: int, batches: int) -> dict:
    """D: epochs of the 2-worker training in this one process: plain, recorded, plain, ...;
    wall of each recorded epoch over the mean of the plain ones around it."""
    training = Training(batches)
    training.epoch()  # warm up
    over = {"collector": [], "torch.profiler": []}
    for _ in range(rounds):
        for mode in over:
            walls = []
            for step_mode in ("none", mode, "none"):
                walls.append(timed(step_mode, lambda _: training.epoch(), batches, settle_s=0.5)["wall_s"])
            plain = (walls[0] + walls[2]) / 2
            over[mode].append(100 * (walls[1] - plain) / plain)
    return {"wall_overhead_percent": over}


def child(mode: str, loop: str, batches: int) -> dict:
    run = trivial_loop if loop == "trivial" else training_loop
    # Warm up in every mode: torch imports and initialises much on first use (optimizers,
    # the profiler ops behind DataLoader's record_function), which torch.profiler's start
    # would otherwise take out of its timed loop and leave in the others'.
    run(32)
    return timed(mode, run, batches)


def _spawn(*args) -> dict:
    output = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *map(str, args)],
                            check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


# --- worker side -----------------------------------------------------------------------------------

def worker_record_costs(rounds: int = 2000, fetches: int = 200_000) -> dict:
    from dashboard.collector import worker

    with tempfile.TemporaryDirectory(prefix="bench-spool-") as spool:
        return _worker_record_costs(worker, spool, rounds, fetches)


def _worker_record_costs(worker, spool: str, rounds: int, fetches: int) -> dict:
    loop = worker.WorkerLoop(spool, 1, {"worker_id": 0, "num_workers": 1}, fetch=True)
    start = time.process_time()
    for _ in range(rounds):
        worker._Recorder(loop, (0, 2), {}).finish("exit")
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


# --- report ------------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="A: rounds of paired loops")
    parser.add_argument("--paired-batches", type=int, default=30_000, help="A: batches per loop")
    parser.add_argument("--batches", type=int, default=200_000, help="B: batches of the trivial loop")
    parser.add_argument("--train-batches", type=int, default=1500, help="C: batches of the training loop")
    parser.add_argument("--repeats", type=int, default=5, help="B and C: runs per mode")
    parser.add_argument("--training-rounds", type=int, default=20, help="D: rounds of paired epochs")
    parser.add_argument("--epoch-batches", type=int, default=300, help="D: batches per epoch")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child[0] == "paired":
            result = child_paired(int(args.child[1]), int(args.child[2]))
        elif args.child[0] == "paired-training":
            result = child_paired_training(int(args.child[1]), int(args.child[2]))
        else:
            result = child(args.child[0], args.child[1], int(args.child[2]))
        print(json.dumps(result))
        return 0

    report: dict = {}
    print(f"A. per-batch CPU of the training process, paired loops of {args.paired_batches} batches, "
          f"{args.rounds} rounds (trivial dataset, num_workers=0)")
    paired = _spawn("paired", args.rounds, args.paired_batches)
    report["paired"] = paired
    print(f"  plain loop            {spread_iqr(paired['base_us'])} us per batch")
    for mode, values in paired["overhead_us"].items():
        print(f"  {mode:21s} +{spread_iqr(values)} us per batch; start {spread(paired['start_s'][mode])} s, "
              f"stop {spread(paired['stop_s'][mode])} s (once per run)")

    for label, loop, batches in (("B. fresh process per run, trivial loop", "trivial", args.batches),
                                 ("C. fresh process per run, 2-worker training loop", "training",
                                  args.train_batches)):
        runs = {mode: [] for mode in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                runs[mode].append(_spawn(mode, loop, batches))
        print(f"\n{label}: {runs['none'][0]['batches']} batches, {args.repeats} runs per mode "
              "(median [min..max])")
        base_cpu = [r["cpu_s"] / r["batches"] * 1e6 for r in runs["none"]]
        base_wall = [r["wall_s"] for r in runs["none"]]
        report[loop] = {}
        for mode in MODES:
            cpu = [r["cpu_s"] / r["batches"] * 1e6 for r in runs[mode]]
            wall = [r["wall_s"] for r in runs[mode]]
            wall_over = [100 * (w - b) / b for w, b in zip(wall, base_wall)]
            entry = {"cpu_us_per_batch": cpu, "wall_s": wall, "wall_overhead_percent": wall_over,
                     "cpu_overhead_us_per_batch": [c - b for c, b in zip(cpu, base_cpu)]}
            line = f"  {mode:15s} cpu/batch {spread(cpu)} us   loop wall {spread(wall)} s"
            if mode != "none":
                line += f"   wall vs none (same round) {spread(wall_over, 2)} %"
            sink = [r["sink_cpu_s"] / r["batches"] * 1e6 for r in runs[mode] if "sink_cpu_s" in r]
            if sink:
                entry["sink_cpu_us_per_batch"] = sink
                line += f"\n  {'':15s} sink process cpu/batch {spread(sink)} us (not the training process)"
            report[loop][mode] = entry
            print(line)

    print(f"\nD. 2-worker training epochs ({args.epoch_batches} batches, workers re-spawned each), paired in "
          f"one process, {args.training_rounds} rounds: loop wall over the plain epochs around it")
    paired_training = _spawn("paired-training", args.training_rounds, args.epoch_batches)
    report["paired_training"] = paired_training
    for mode, values in paired_training["wall_overhead_percent"].items():
        print(f"  {mode:21s} {spread_iqr(values, 2)} %")

    costs = worker_record_costs()
    report["worker_records"] = costs
    print(f"\nworker side: {costs['worker_lifetime_records_us']} us per worker lifetime (start + end "
          f"records, in the worker), {costs['fetch_record_us']} us per fetch record (worker_fetch=True); "
          "0 in the training process")
    cpu_over = statistics.median(paired["overhead_us"]["collector"])
    wall_over = statistics.median(paired_training["wall_overhead_percent"]["collector"])
    print(f"\ntargets (medians of the paired measurements A and D; see their spread above):\n"
          f"  per-batch CPU {cpu_over:+.3f} us (<= 1 us: {'met' if cpu_over <= 1 else 'NOT met'})\n"
          f"  2-worker wall {wall_over:+.2f} % (<= 2 %: {'met' if wall_over <= 2 else 'NOT met'})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
