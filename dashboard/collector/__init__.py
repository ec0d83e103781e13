"""Collector: records DataLoader profiles from PyTorch training jobs in the trial format.

Imports nothing heavy at package import, so `dashboard.collector.writer` works
without torch, pandas or Dash installed.
"""
