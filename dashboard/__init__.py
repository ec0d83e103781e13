"""DataLoader Profiler Dashboard: read SageMaker-Debugger-format trials, analyze the
PyTorch DataLoader, and show it in a Dash app.

The public API is imported lazily, so `dashboard.collector` works in a training job
that has neither pandas nor Dash installed.
"""
from __future__ import annotations

__all__ = ["load_trial", "analyze", "Trial", "TrialAnalysis", "PandasFrame", "PT_dataloader_analysis",
           "TrialError"]
_WHERE = {
    "load_trial": "dashboard.trial.load", "Trial": "dashboard.trial.load",
    "analyze": "dashboard.api", "TrialAnalysis": "dashboard.api",
    "PandasFrame": "dashboard.analysis.compat", "PT_dataloader_analysis": "dashboard.analysis.compat",
    "TrialError": "dashboard.trial.errors",
}


def __getattr__(name):
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'dashboard' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
