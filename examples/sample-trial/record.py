"""Records the bundled sample trial (`examples/sample-trial/trial`, what `python app.py` opens).

A real, small CPU training run under the collector, with the problems the dashboard is
for, on purpose:

- the train loader's workers are not persistent, so every epoch starts two new worker
  processes, and its first batch waits for them to start and open the dataset's index
  again (0.4 s of storage latency per process);
- about one sample in a hundred is slow to read (a storage hiccup: 150 to 300 ms), and
  which worker hits one is the luck of the draw, so some batches stall;
- the validation loader reads in the main process (num_workers=0), and its samples cost
  what the train samples cost, so validation is input-bound.

The images are generated from their index (no download), decoded and augmented as a
real pipeline would do it, and a small CNN learns to tell the ten classes apart.

    python examples/sample-trial/record.py [--out DIR] [--epochs 4]

Replaces the trial folder. Takes about a minute on 2 cores; the trial is ~0.3 MB.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from dashboard.collector import profile_dataloaders  # noqa: E402

CLASSES = 10
SLOW_EVERY = 97  # sample indices divisible by this are slow to read
OPEN_INDEX_S = 0.4


class Shapes(Dataset):
    """3x32x32 images of ten noisy stripe patterns; class = pattern. Deterministic per index.

    Like a dataset of files, it opens its index on first use in each process (storage
    latency, 0.4 s), so every new worker process pays for it again.
    """

    def __init__(self, size: int, offset: int = 0, augment: bool = True):
        self.size, self.offset, self.augment = size, offset, augment
        self._index = None

    def __len__(self):
        return self.size

    def _open_index(self):
        if self._index is None:
            time.sleep(OPEN_INDEX_S)
            self._index = list(range(self.offset, self.offset + self.size))
        return self._index

    def __getitem__(self, index):
        key = self._open_index()[index]
        if key % SLOW_EVERY == 0:
            time.sleep(0.15 + (key % 7) * 0.025)  # a slow read: 150..300 ms
        generator = torch.Generator().manual_seed(key)
        label = key % CLASSES
        # "decode": a pattern whose stripe frequency is the class, plus noise
        x = torch.linspace(0, 1, 32)
        pattern = torch.sin(2 * torch.pi * (label + 1) * x)[None, :].expand(32, 32)
        image = torch.stack([pattern, pattern.t(), pattern * pattern.t()])
        image = image + 2.0 * torch.randn(3, 32, 32, generator=generator)
        image = nn.functional.avg_pool2d(image[None], 3, stride=1, padding=1)[0]  # "augment": a blur,
        if self.augment and torch.rand(1, generator=generator).item() < 0.5:  # a random flip
            image = image.flip(-1)
        image = (image - image.mean()) / (image.std() + 1e-6)
        return image, label


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def train(epochs: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # The problems, as configured: workers re-spawned every epoch, validation in-process.
    train_loader = DataLoader(Shapes(2048), batch_size=32, shuffle=True, num_workers=2,
                              persistent_workers=False)
    val_loader = DataLoader(Shapes(512, offset=100_000, augment=False), batch_size=64, num_workers=0)
    for epoch in range(epochs):
        model.train()
        seen, total_loss = 0, 0.0
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * len(labels)
            seen += len(labels)
        model.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in val_loader:
                correct += int((model(images).argmax(1) == labels).sum())
        print(f"epoch {epoch}: train loss {total_loss / seen:.3f}, "
              f"val accuracy {correct / len(val_loader.dataset):.1%}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(HERE, "trial"))
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    if os.path.exists(args.out):
        shutil.rmtree(args.out)
    started = time.time()
    # Short rotation, so that the sample has several framework files as a real job does.
    with profile_dataloaders(args.out, rotate_s=15, worker_fetch=True, system_interval_s=0.5):
        train(args.epochs)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(args.out) for f in files)
    print(f"recorded {args.out} in {time.time() - started:.0f} s ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
