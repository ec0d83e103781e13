"""Benchmark: decoding reference-format framework files, and how to run the decodes in parallel.

On the 300k-GetNext trial's framework files (bench/load_trial.py's, ~88 MB in 57 files),
each in fresh processes, interleaved, medians with their spread:
  decoder (CPU seconds, one thread, all files): Arrow's JSON reader into the raw table (the
      path the reader had before msgspec, kept here only as the baseline), msgspec's typed
      structs into the same raw table (smdebug_format._raw_trace_table), and the whole parse
      (parse_trace_file: raw table + canonical rows);
  parallel (wall seconds, parse_trace_file over all files, pool start included): serial, 2
      threads, 2 processes by fork, forkserver and spawn;
  the load's forked workers (load.ForkedWorkers.parse, every file of the trial, system files
      too, 2 processes), their tables handed over through shared memory
      (trial/table_handover.py) or pickled back through the pool's pipe (no shared memory).

    python bench/parse_speed.py [--runs 5] [--size 300000|3000000]
"""
from __future__ import annotations

import argparse
import glob
import importlib
import io
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
from stats import spread  # noqa: E402  (bench/, the script's own folder)
from trials import trial_of_size  # noqa: E402

MODES = ("serial", "threads", "fork", "forkserver", "spawn")
WORKER_MODES = ("workers-handover", "workers-pipe")


def _datas(folder: str) -> list[bytes]:
    files = sorted(glob.glob(os.path.join(folder, "framework", "**", "*.json"), recursive=True))
    return [open(f, "rb").read() for f in files]


def _parse(data: bytes):
    from dashboard.trial.smdebug_format import parse_trace_file

    return parse_trace_file(data, "20001-algo-1", None).rows


def decoders(folder: str) -> dict:
    import pyarrow.json as pj

    from dashboard.trial import smdebug_format as sf

    datas = _datas(folder)

    def arrow_raw(data: bytes):
        body = data.strip()[1:-1].replace(b"},\n", b"} \n").strip().rstrip(b",")
        return pj.read_json(io.BytesIO(body), read_options=sf._READ, parse_options=sf._TRACE_PARSE)

    out = {"mb": sum(map(len, datas)) / 1e6}
    for label, decode in (("arrow_raw", arrow_raw), ("msgspec_raw", lambda d: sf._raw_trace_table(d)[0]),
                          ("parse_trace_file", lambda d: sf.parse_trace_file(d, "p", None))):
        started = time.process_time()
        for data in datas:
            decode(data)
        out[label] = time.process_time() - started
    first = datas[0]
    out["same_raw_table"] = arrow_raw(first).equals(sf._raw_trace_table(first)[0])
    return out


def parallel(folder: str, mode: str) -> float:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    datas = _datas(folder)
    started = time.perf_counter()
    if mode == "serial":
        [_parse(d) for d in datas]
    elif mode == "threads":
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(_parse, datas))
    else:
        context = multiprocessing.get_context(mode)
        if mode == "forkserver":
            context.set_forkserver_preload(["dashboard.trial.smdebug_format"])
        with ProcessPoolExecutor(2, mp_context=context) as pool:
            list(pool.map(_parse, datas))
    return time.perf_counter() - started


def workers(folder: str, mode: str) -> float:
    """Every file of the trial parsed by the load's 2 forked workers (4 threads waiting on them,
    as load_trial runs them), the tables handed over (mode workers-handover) or pickled."""
    from concurrent.futures import ThreadPoolExecutor

    from dashboard.trial import load, table_handover
    from dashboard.trial.store import open_store

    if mode == "workers-pipe":
        table_handover.SHARED_MEMORY_ROOT = os.path.join(folder, "no-such-folder")
    store = open_store(folder)
    jobs = [(info, *load.classify_key(info.key)) for info in sorted(store.list(), key=lambda i: i.key)
            if load.classify_key(info.key) is not None]
    started = time.perf_counter()
    forked = load.ForkedWorkers(2)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda job: forked.parse(store.canonical_path, *job, None), jobs))
    forked.shutdown()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", default="300000", choices=("300000", "3000000"),
                        help="the trial: bench/load_trial.py's 300k, or bench/diagnosis.py's 3M")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, folder = args.child
        importlib.import_module("dashboard.trial.smdebug_format")  # (its imports not timed)

        print(json.dumps(decoders(folder) if what == "decoders" else
                         {"wall_s": (workers if what in WORKER_MODES else parallel)(folder, what)}))
        return 0
    folder = trial_of_size(args.size)
    runs: dict[str, list] = {}
    for _ in range(args.runs):
        for what in ("decoders",) + MODES + WORKER_MODES:
            out = subprocess.run([sys.executable, __file__, "--child", what, folder], capture_output=True,
                                 text=True, check=True).stdout
            runs.setdefault(what, []).append(json.loads(out.strip().splitlines()[-1]))
    decoded = runs["decoders"]
    print(f"{decoded[0]['mb']:.0f} MB of framework JSON; msgspec's raw table equals Arrow's: "
          f"{all(r['same_raw_table'] for r in decoded)}")
    for label in ("arrow_raw", "msgspec_raw", "parse_trace_file"):
        values = [r[label] for r in decoded]
        print(f"decode {label:<17} CPU s: {spread(values)}  "
              f"({decoded[0]['mb'] / sorted(values)[len(values) // 2]:.0f} MB/s)")
    for mode in MODES:
        print(f"parse, {mode:<10} wall s: {spread([r['wall_s'] for r in runs[mode]])}")
    for mode in WORKER_MODES:
        print(f"load's workers, tables {mode.split('-')[1]:<8} wall s (all files): "
              f"{spread([r['wall_s'] for r in runs[mode]])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
