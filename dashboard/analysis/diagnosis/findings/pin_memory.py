"""pin_memory off on a host with GPUs (`pin_memory`): not a GetNext wait (the copy to the
GPU happens after next()), so it has no part of the budget and no predicted seconds."""
from __future__ import annotations

from .base import LoaderContext, Recommendation


def find(ctx: LoaderContext) -> list[Recommendation]:
    process, loader = ctx.process, ctx.loader
    if not process.gpus or loader.pin_memory is not False:
        return []
    text = (f"{loader.label} on {process.label} has pin_memory=False while the host has {process.gpus} GPU(s) in "
            f"the system metrics: set `pin_memory=True` so batches are copied to the GPU from page-locked "
            f"memory, and overlap the copy with compute via `.to(device, non_blocking=True)`.")
    evidence = ctx.evidence(gpus=process.gpus)
    return [Recommendation("pin_memory", text, evidence, None, {"pin_memory": True}, None)]
