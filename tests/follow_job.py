"""A small real CPU training job that runs until told to stop, under the collector: the
running job the dashboard's Follow switch watches (tests/test_follow.py).

    python3 tests/follow_job.py --out TRIAL (a folder or s3://bucket/prefix) --stop-file PATH \
        --books BOOKS.json [--rotate-s 1] [--max-s 120]

Epochs of 16 batches from 2 persistent fork workers; each step trains a small MLP and then
sleeps 40 ms, so that the job writes a steady trickle of GetNexts (about 20 a second) without
taking the test machine's cores. It keeps its own books: after every epoch it writes the
number of batches it has trained on so far to BOOKS (`batches`), and `done: true` once the
collector has finished the trial (every file closed and, for S3, uploaded).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from dashboard.collector import profile_dataloaders  # noqa: E402

BATCHES_PER_EPOCH = 16
BATCH_SIZE = 8
STEP_SLEEP_S = 0.04


def write_books(path: str, books: dict) -> None:
    partial = path + ".part"
    with open(partial, "w") as handle:
        json.dump(books, handle)
    os.replace(partial, path)  # the test never reads half a file


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stop-file", required=True, help="the job stops after the epoch in which this appears")
    parser.add_argument("--books", required=True)
    parser.add_argument("--rotate-s", type=float, default=60.0, help="the collector's file rotation")
    parser.add_argument("--max-s", type=float, default=120.0, help="stop after this long anyway")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(BATCHES_PER_EPOCH * BATCH_SIZE, 32), torch.randint(0, 4, (BATCHES_PER_EPOCH * BATCH_SIZE,)))
    loader = DataLoader(data, batch_size=BATCH_SIZE, num_workers=2, multiprocessing_context="fork",
                        persistent_workers=True)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    books = {"batches": 0, "epochs": 0, "done": False}
    started = time.monotonic()
    with profile_dataloaders(args.out, rotate_s=args.rotate_s, system_interval_s=0.5):
        while not os.path.exists(args.stop_file) and time.monotonic() - started < args.max_s:
            for features, labels in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(features), labels).backward()
                optimizer.step()
                books["batches"] += 1
                time.sleep(STEP_SLEEP_S)
            books["epochs"] += 1
            write_books(args.books, books)
        del loader
    books["done"] = True
    write_books(args.books, books)
    return 0


if __name__ == "__main__":
    sys.exit(main())
