"""Benchmark: load a ~500 MB PyTorch profiler (Kineto) trace as a trial.

Records (once, cached under bench/out/kineto/) a real torch.profiler trace of a CPU
training loop with a 2-worker DataLoader, `record_shapes` and `with_stack` (so it is
mostly `cpu_op` and `python_function` events, like real large traces), then grows it to
about `--mb` MB by repeating its event text, byte for byte as Kineto wrote it, with
every `ts` shifted by the recording's span per copy. Also writes the .gz of it.

Then measures `dashboard.load_trial` + `dashboard.analyze` in fresh processes (after
importing pandas/pyarrow, which is timed apart): wall time and the process's peak RSS,
for the plain and the gzip trace, and checks the GetNext count equals the recorded one
times the number of copies.

    python bench/kineto_load.py [--runs 5] [--mb 500] [--naive]

--naive also measures orjson.loads of the whole document (what a straightforward
reader would do), for comparison.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from stats import spread  # noqa: E402  (bench/, the script's own folder)
OUT = os.path.join(HERE, "out", "kineto")
_TS_RE = re.compile(rb'("ts"\s*:\s*)(\d+(?:\.\d+)?)')


def record_seed(path: str) -> None:
    """A real trace: 3 epochs x 16 batches, 2 workers, shapes and Python stacks recorded."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 64), torch.randint(0, 10, (256,)))
    loader = DataLoader(data, batch_size=16, num_workers=2)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optim = torch.optim.SGD(model.parameters(), lr=0.01)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True) as prof:
        for _ in range(3):
            for x, y in loader:
                optim.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optim.step()
    prof.export_chrome_trace(path)


def grow(seed: str, target_mb: int, out_path: str) -> int:
    """Writes the seed's events repeated to ~target_mb; returns the number of copies."""
    with open(seed, "rb") as handle:
        text = handle.read()
    start = text.index(b"[", text.index(b'"traceEvents"')) + 1
    end = text.rindex(b"]")
    head, body, tail = text[:start], text[start:end].rstrip().rstrip(b","), text[end:]
    stamps = [float(m.group(2)) for m in _TS_RE.finditer(body)]
    span = max(stamps) - min(stamps) + 1000.0
    copies = max(1, int(target_mb * 1e6 // len(body)))
    with open(out_path, "wb") as out:
        out.write(head)
        for copy in range(copies):
            shift = copy * span
            if copy:
                out.write(b",")
            out.write(_TS_RE.sub(lambda m: m.group(1) + b"%.3f" % (float(m.group(2)) + shift), body)
                      if shift else body)
        out.write(b"\n  " + tail)
    return copies


def prepare(target_mb: int) -> tuple[str, str, int]:
    folder = os.path.join(OUT, f"{target_mb}mb")
    plain_dir, gz_dir = os.path.join(folder, "plain"), os.path.join(folder, "gz")
    marker = os.path.join(folder, "copies")
    if not os.path.exists(marker):
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(plain_dir)
        os.makedirs(gz_dir)
        seed = os.path.join(folder, "seed.pt.trace.json")
        subprocess.run([sys.executable, __file__, "--record", seed], check=True)
        big = os.path.join(plain_dir, "host_1.1.pt.trace.json")
        copies = grow(seed, target_mb, big)
        with open(big, "rb") as src, gzip.open(os.path.join(gz_dir, "host_1.1.pt.trace.json.gz"), "wb",
                                                  compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 16 << 20)
        with open(marker, "w") as handle:
            handle.write(str(copies))
    with open(marker) as handle:
        copies = int(handle.read())
    return plain_dir, gz_dir, copies


def seed_getnext(folder: str) -> int:
    with open(os.path.join(os.path.dirname(folder), "seed.pt.trace.json"), "rb") as handle:
        doc = json.load(handle)
    return sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "user_annotation"
               and str(e.get("name", "")).startswith("enumerate(DataLoader)#"))


def child(folder: str) -> None:
    t0 = time.perf_counter()
    import dashboard
    import dashboard.api  # pandas, pyarrow: imported before the clock starts

    import_s = time.perf_counter() - t0
    rss_imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    trial = dashboard.load_trial(folder)
    load_s = time.perf_counter() - t0
    result = dashboard.analyze(trial)
    verdict = result.verdict
    total_s = time.perf_counter() - t0
    print(json.dumps({"load_s": load_s, "total_s": total_s, "getnext": result.getnext.count,
                      "import_s": import_s, "rss_after_import_mb": rss_imported,
                      "input_percent": verdict.input_percent,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def naive_child(path: str) -> None:
    import orjson

    t0 = time.perf_counter()
    with open(path, "rb") as handle:
        doc = orjson.loads(handle.read())
    n = sum(1 for e in doc["traceEvents"] if str(e.get("name", "")).startswith("enumerate(DataLoader)#"))
    print(json.dumps({"load_s": time.perf_counter() - t0, "getnext": n,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_child(flag: str, target: str) -> dict:
    out = subprocess.run([sys.executable, __file__, flag, target], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--naive", action="store_true")
    parser.add_argument("--record", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--naive-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.record:
        record_seed(args.record)
        return 0
    if args.child:
        child(args.child)
        return 0
    if args.naive_child:
        naive_child(args.naive_child)
        return 0

    t0 = time.perf_counter()
    plain_dir, gz_dir, copies = prepare(args.mb)
    expected = seed_getnext(plain_dir) * copies
    sizes = {d: sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)) / 1e6
             for d in (plain_dir, gz_dir)}
    print(f"trace: {sizes[plain_dir]:.0f} MB plain, {sizes[gz_dir]:.0f} MB gzip, {copies} copies of a real "
          f"trace, {expected:,} GetNext (ready in {time.perf_counter() - t0:.1f} s)")
    for label, folder in (("plain", plain_dir), ("gzip", gz_dir)):
        runs = [run_child("--child", folder) for _ in range(args.runs)]
        counts = {r["getnext"] for r in runs}
        status = "ok" if counts == {expected} else f"MISMATCH {counts} != {expected}"
        print(f"{label:5}: load_trial s {spread([r['load_s'] for r in runs], 2)}; "
              f"+ analyze s {spread([r['total_s'] for r in runs], 2)}; "
              f"peak RSS MB {spread([r['peak_rss_mb'] for r in runs], 2)} (after imports: "
              f"{statistics.median(r['rss_after_import_mb'] for r in runs):.0f}); GetNext count {status}")
    if args.naive:
        path = os.path.join(plain_dir, os.listdir(plain_dir)[0])
        naive = run_child("--naive-child", path)
        print(f"naive orjson.loads of the whole trace: {naive['load_s']:.1f} s, "
              f"peak RSS {naive['peak_rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
