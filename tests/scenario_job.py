"""One small, real CPU training job with one planted DataLoader fault, run under the collector.

    python3 tests/scenario_job.py --out TRIAL_DIR --books BOOKS.json --fault F \
        [--num-workers N] [--prefetch-factor P] [--in-order true|false] [--persistent true|false]
        [--epochs E] [--batches B] ...

Run as a subprocess by tests/test_diagnosis_scenarios.py, which checks the diagnosis of the
trial against the books this script keeps from inside its own training loop:

- waits_s: the duration of every `next()` that returned a batch (time.perf_counter around
  the call; the final call of each epoch, the one that raises StopIteration, is not a wait
  for a batch and is not counted; the collector records it as the epoch's end, not as a
  GetNext);
- training_s: per epoch, from the start of its first `next()` to the end of its last
  training step, summed over the epochs (the time between epochs, iter() and the workers'
  shutdown in the last `next()`, is outside);
- steps_s, epoch_books: each step's compute, and per epoch its wait, training time and
  last step (the trial has no step events: where a reader cannot see the epoch's end, the
  last step is what the books have and the trial does not);
- handovers_s: per batch, the part of its wait after its worker had finished it: the batch
  carries the moment its collation ended (perf_counter, CLOCK_MONOTONIC: one clock for every
  process of the host), and the hand-over is from then, or from the ask if later, to
  next()'s return.

The faults, planted in the Dataset, deterministic (by index, by worker id), each with its
planted DataLoader settings (every setting can be changed from the command line: the fix):

- latency: every sample sleeps (storage or network latency) and 2 workers cannot keep up;
  more workers fix it, even beyond the 2 cores: sleeping processes need no core.
- cpu: every sample spins a pure-Python arithmetic loop (a fixed amount of work, so it
  stretches when the cores are shared); 2 workers plus the main process already use both
  cores, so more workers do not help.
- slow_worker: worker 1 sleeps 4x longer per sample than the other 3; in-order delivery
  makes every round of 4 batches wait for it; out of order (in_order=False) it gets fewer.
- startup: the Dataset opens its "index" lazily, 0.4 s per process (like
  examples/sample-trial/record.py), and the workers are not persistent over 8 short
  epochs, so every epoch's first batch pays it again; persistent_workers=True pays it once.
- clean: the workers are far faster than the compute; nothing to fix.
- pairing: two alike workers in lock-step (equal sleep per sample), the main process faster
  than the workers, not persistent: the waits fall on the batch first in line each round
  (worker 0's, unless the machine's load shifts the phase), although neither is slower.
- contention: the clean job on a host that other processes keep busy (`--hogs` of them, each
  a busy loop for the whole run): finished batches wait for a core to be handed over.
- zipped: latency's loader zipped with a fast companion of the same settings (its samples
  sleep `--companion-sleep-ms`), as `zip(labeled, unlabeled)` does: each step asks the planted
  loader, then the companion, and trains on both batches. The books keep the companion's
  waits apart (companion_waits_s) and count them in wait_s; a setting from the command line
  changes the planted loader alone (the finding names it: the first of two alike).
- evaluated: latency's job with a validation pass every `--evaluate-every` steps inside the
  epoch (never after its last step), through a loader of its own (EVAL_LOADER: 1 persistent
  worker, fast samples), as a loop that validates every N steps does. The books keep the
  validation's waits apart (eval_waits_s) and count them in wait_s (without step events every
  iterator is a training one); its time lies inside the epochs' training time.

The compute is real: an MLP (256 -> 1536 -> 1536 -> 10) trained with SGD, one thread,
about 4-6 ms per batch of 16 on a quiet core of the 2-core CI machine (2-3x that with both
cores busy). Each step frees its batch before the step's clock stops, so that the
shared-memory tensors are not freed inside the next `next()` window (about 30 us a batch
the collector's GetNext does not see).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info  # noqa: E402

from dashboard.collector import profile_dataloaders  # noqa: E402

FEATURES = 256
CLASSES = 10

# Planted configuration of each fault. sleep_ms / spin: per sample (spin: iterations of a
# pure-Python loop, about 20 k per ms on this machine); slow_factor: worker slow_worker_id's
# sleep multiplier; open_index_s: once per process, on first use. Chosen from repeated runs
# (see the measurements in tests/test_diagnosis_scenarios.py) so that the planted cause
# dominates the wait even with both cores busy (where the compute per batch is 2-3x slower
# and a sleep-based fault shrinks against it), and the fix changes the training time by
# more than half; each run 3-8 s on 2 cores, plus 1.5 s of start-up.
#   latency: a batch's fetch takes ~66 ms against ~5 ms of compute, 2 workers: ~28 ms wait per batch.
#   cpu: ~32 ms of pure-Python work per batch, 2 workers and the main process on 2 cores.
#   slow_worker: 32 ms per batch on 3 workers, 128 ms on worker 1; in order a round of 4 batches
#     takes 128 ms (32 ms a batch), out of order the 4 workers deliver one every ~9.8 ms; two
#     long epochs, as each epoch's first round (start-up) also waits for worker 1.
#   startup: 0.4 s per worker process and epoch against ~12 batches x 5 ms of compute.
#   clean: ~2 ms per batch on 2 workers against ~11 ms of compute (hidden=2560): the only wait
#     is the delivery cost every batch pays (~1.1 ms: unpickling, shared-memory tensors).
#   pairing: 2 alike workers, ~100 ms per batch each, ~5 ms of compute, rebuilt every epoch.
#   contention: clean's job with 2 busy processes beside it: on 2 cores a finished batch waited
#     6-8 ms to be handed over (1 ms quiet) and the job's wait grew from ~0.2 s to ~1 s.
FAULTS = {
    "latency": dict(num_workers=2, persistent=True, epochs=2, batches=60, sleep_ms=4.0),
    "cpu": dict(num_workers=2, persistent=True, epochs=2, batches=60, spin=40_000),
    "slow_worker": dict(num_workers=4, persistent=True, epochs=2, batches=72, sleep_ms=2.0,
                        slow_worker_id=1, slow_factor=4.0),
    "startup": dict(num_workers=2, persistent=False, epochs=8, batches=12, sleep_ms=0.1, open_index_s=0.4),
    "clean": dict(num_workers=2, persistent=True, epochs=2, batches=80, sleep_ms=0.1, hidden=2560),
    "pairing": dict(num_workers=2, persistent=False, epochs=3, batches=24, sleep_ms=6.0),
    "contention": dict(num_workers=2, persistent=True, epochs=2, batches=80, sleep_ms=0.1, hidden=2560, hogs=2),
    "zipped": dict(num_workers=2, persistent=True, epochs=2, batches=60, sleep_ms=4.0, companion_sleep_ms=0.1),
    "evaluated": dict(num_workers=2, persistent=True, epochs=2, batches=60, sleep_ms=4.0, evaluate_every=20),
}
# The validation loader of the evaluated job: its settings, its batches a pass and its samples' sleep.
# (Its 1 worker keeps up: 0.8 ms of samples a batch against about 1.5 ms of forward pass. At
# 8 ms it waited too, and its own more_workers finding was right.)
EVAL_LOADER = dict(num_workers=1, persistent=True, prefetch_factor=2, in_order=True, batches=8, sleep_ms=0.05)
COMMON = dict(batch_size=16, prefetch_factor=2, in_order=True, hidden=1536, sleep_ms=0.0, spin=0,
              slow_worker_id=-1, slow_factor=1.0, open_index_s=0.0, hogs=0, companion_sleep_ms=None,
              evaluate_every=None)


def _spin(iterations: int) -> int:
    acc = 0
    for i in range(iterations):
        acc = (acc + i * i) % 1_000_003
    return acc


def stamped_collate(samples):
    """The default collation, and the moment it ended (the books' hand-over starts there)."""
    return (*default_collate(samples), time.perf_counter())


class ScenarioSamples(Dataset):
    """FEATURES-long samples, class index % CLASSES; the fault's cost paid per sample."""

    def __init__(self, size: int, sleep_ms: float, spin: int, slow_worker_id: int, slow_factor: float,
                 open_index_s: float):
        self.size, self.sleep_s, self.spin = size, sleep_ms / 1e3, spin
        self.slow_worker_id, self.slow_factor, self.open_index_s = slow_worker_id, slow_factor, open_index_s
        self._index = None
        self._index_pid = None

    def __len__(self):
        return self.size

    def _open_index(self):
        # Like a dataset of files: the index is opened on first use in each process.
        if self._index is None or self._index_pid != os.getpid():
            if self.open_index_s:
                time.sleep(self.open_index_s)
            self._index = list(range(self.size))
            self._index_pid = os.getpid()
        return self._index

    def __getitem__(self, index):
        key = self._open_index()[index]
        sleep_s = self.sleep_s
        info = get_worker_info()
        if info is not None and info.id == self.slow_worker_id:
            sleep_s *= self.slow_factor
        if sleep_s:
            time.sleep(sleep_s)
        if self.spin:
            _spin(self.spin)
        generator = torch.Generator().manual_seed(key)
        return torch.randn(FEATURES, generator=generator), key % CLASSES


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="trial folder (a new one)")
    parser.add_argument("--books", required=True, help="where to write the loop's own books (JSON)")
    parser.add_argument("--fault", required=True, choices=sorted(FAULTS))
    # Every default None: the fault's planted value (FAULTS, then COMMON) unless given.
    parser.add_argument("--num-workers", type=int)
    parser.add_argument("--prefetch-factor", type=int)
    parser.add_argument("--in-order", type=_bool)
    parser.add_argument("--persistent", type=_bool, help="persistent_workers")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--batches", type=int, help="batches per epoch")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--hidden", type=int, help="MLP width (the compute per batch)")
    parser.add_argument("--sleep-ms", type=float, help="sleep per sample")
    parser.add_argument("--spin", type=int, help="pure-Python loop iterations per sample")
    parser.add_argument("--slow-worker-id", type=int)
    parser.add_argument("--slow-factor", type=float)
    parser.add_argument("--open-index-s", type=float)
    parser.add_argument("--hogs", type=int, help="busy processes beside the job, for the whole run")
    parser.add_argument("--companion-sleep-ms", type=float,
                        help="zip the loader with a companion of the same settings whose samples sleep this")
    parser.add_argument("--evaluate-every", type=int, help="a validation pass every this many steps (EVAL_LOADER)")
    args = parser.parse_args(argv)
    planted = {**COMMON, **FAULTS[args.fault]}
    for key, value in planted.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.num_workers < 0 or args.epochs < 1 or args.batches < 1 or args.batch_size < 1 or args.hogs < 0:
        parser.error("num_workers, hogs >= 0; epochs, batches and batch size >= 1")
    return args


def settings_of(args) -> dict:
    keys = ["num_workers", "prefetch_factor", "in_order", "persistent", "epochs", "batches", "batch_size",
            "hidden", "sleep_ms", "spin", "slow_worker_id", "slow_factor", "open_index_s", "hogs", "companion_sleep_ms",
            "evaluate_every"]
    return {"fault": args.fault, **{key: getattr(args, key) for key in keys}}


def build_loader(args, sleep_ms: float | None = None, settings: dict | None = None) -> DataLoader:
    """The planted loader; with sleep_ms, another whose samples sleep that, of `settings` (those
    of EVAL_LOADER), else of the planted loader's planted settings (the command line changes the
    planted loader's alone)."""
    other = sleep_ms is not None
    if other:
        settings = settings or {**COMMON, **FAULTS[args.fault]}
        args = argparse.Namespace(**{**vars(args), **{key: value for key, value in settings.items() if key in (
            "num_workers", "prefetch_factor", "in_order", "persistent", "batches")}})
    dataset = ScenarioSamples(args.batches * args.batch_size, sleep_ms if other else args.sleep_ms,
                              0 if other else args.spin, -1 if other else args.slow_worker_id,
                              1.0 if other else args.slow_factor, 0.0 if other else args.open_index_s)
    options = dict(batch_size=args.batch_size, shuffle=False, num_workers=args.num_workers,
                   collate_fn=stamped_collate)
    if args.num_workers:
        options.update(multiprocessing_context="fork", prefetch_factor=args.prefetch_factor,
                       persistent_workers=args.persistent, in_order=args.in_order)
    return DataLoader(dataset, **options)


def evaluate(model, loader: DataLoader, clock, waits: list) -> None:
    """One validation pass, each next() timed into waits (the one that ends it not counted)."""
    it = iter(loader)
    with torch.no_grad():
        while True:
            start = clock()
            try:
                features, _, _ = next(it)
            except StopIteration:
                break
            waits.append(clock() - start)
            model(features)
            del features
    del it


def train(args) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden),
                          nn.ReLU(), nn.Linear(args.hidden, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = build_loader(args)
    companion = build_loader(args, args.companion_sleep_ms) if args.companion_sleep_ms is not None else None
    validation = build_loader(args, EVAL_LOADER["sleep_ms"], EVAL_LOADER) if args.evaluate_every else None
    clock = time.perf_counter
    waits, handovers, steps, epochs, companion_waits, eval_waits = [], [], [], [], [], []
    for _ in range(args.epochs):
        it = iter(loader)
        companion_it = iter(companion) if companion is not None else None
        first_start = last_end = None
        epoch_waits, last_step = [], 0.0
        while True:
            start = clock()
            try:
                features, labels, collated = next(it)
            except StopIteration:
                break
            got = clock()
            epoch_waits.append(got - start)
            handovers.append(max(got - max(start, collated), 0.0))
            if first_start is None:
                first_start = start
            if companion_it is not None:  # zip(loader, companion): the companion asked second
                more_features, more_labels, _ = next(companion_it)
                companion_waits.append(clock() - got)
                got = clock()
                features, labels = torch.cat([features, more_features]), torch.cat([labels, more_labels])
                del more_features, more_labels
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(features), labels)
            loss.backward()
            optimizer.step()
            loss.item()
            # Freed here, in the step: else the rebinding in the next `features, labels = next(it)`
            # frees the previous batch's shared-memory tensors (about 30 us) inside the books'
            # next() window, where the collector's GetNext does not see it.
            del features, labels, loss
            last_end = clock()
            last_step = last_end - got
            steps.append(last_step)
            if validation is not None and len(epoch_waits) % args.evaluate_every == 0 and len(epoch_waits) < args.batches:
                evaluate(model, validation, clock, eval_waits)
        del it, companion_it
        waits.extend(epoch_waits)
        epochs.append({"batches": len(epoch_waits), "wait_s": sum(epoch_waits),
                       "training_s": (last_end - first_start) if first_start is not None else 0.0,
                       "last_step_s": last_step})
    return {"waits_s": waits, "handovers_s": handovers, "companion_waits_s": companion_waits, "eval_waits_s": eval_waits,
            "wait_s": sum(waits) + sum(companion_waits) + sum(eval_waits),
            "training_s": sum(e["training_s"] for e in epochs),
            "epochs": args.epochs, "batches": len(waits), "steps_s": steps, "compute_s": sum(steps),
            "epoch_books": epochs}


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """In a child before its exec: the kernel kills it when this process ends, however it ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv=None) -> int:
    args = parse_args(argv)
    # More workers than cores is the point of some scenarios: torch's advice against it is noise here.
    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    torch.set_num_threads(1)
    started = time.perf_counter()
    # A job killed (a test's timeout, an interrupted suite) takes its busy processes with it: two
    # left behind by a suite stopped with SIGTERM kept both cores busy for the next suite's half hour.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=_die_with_parent)
            for _ in range(args.hogs)]
    try:
        with profile_dataloaders(args.out, worker_fetch=True, system_interval_s=0.2):
            books = train(args)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    books["settings"] = settings_of(args)
    books["wall_s"] = time.perf_counter() - started
    with open(args.books, "w") as handle:
        json.dump(books, handle)
    print(f"{args.fault}: {books['batches']} batches, wait {books['wait_s']:.3f} s of "
          f"{books['training_s']:.3f} s training, wall {books['wall_s']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
