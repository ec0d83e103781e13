"""Collector: records DataLoader profiles from PyTorch training jobs in the trial format.

    from dashboard.collector import profile_dataloaders

    with profile_dataloaders("s3://bucket/job/profiler-output"):   # or a local folder
        train()

or `start(out)` / `stop()`, or with no code change:
`python -m dashboard.collector --out PATH -- train.py ARGS`.

Imports nothing heavy at package import, so `dashboard.collector.writer` works
without torch, pandas or Dash installed; torch is imported when recording starts.
"""
from __future__ import annotations

__all__ = ["profile_dataloaders", "start", "stop", "Collector", "CollectorWarning", "active_collector"]


def __getattr__(name):
    if name in __all__:
        from . import collector

        return getattr(collector, name)
    raise AttributeError(f"module 'dashboard.collector' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
