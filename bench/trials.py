"""The benchmarks' synthetic trials: written once under bench/out/, again when the code that
writes them changes (or their parameters do)."""
from __future__ import annotations

import hashlib
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))


def cached_trial(name: str, writer: str = "write_trial", **write_options) -> str:
    """The folder of a `dashboard.synthetic.<writer>(folder, **write_options)` trial (write_trial,
    or write_job for a job of many ranks)."""
    import dashboard.collector.writer
    import dashboard.synthetic

    version = hashlib.sha256(b"".join(open(module.__file__, "rb").read() for module in (
        dashboard.synthetic, dashboard.collector.writer)) + repr((writer, sorted(write_options.items()))).encode()).hexdigest()
    folder = os.path.join(HERE, "out", name)
    marker = os.path.join(folder, ".complete")
    if not os.path.exists(marker) or open(marker).read() != version:
        shutil.rmtree(folder, ignore_errors=True)
        getattr(dashboard.synthetic, writer)(folder, **write_options)
        with open(marker, "w") as out:
            out.write(version)
    return folder


def trial_of_size(size: str) -> str:
    """The benchmarks' trial of that many GetNexts: bench/load_trial.py's 300k one (4 workers,
    pin_memory, no tail), or bench/diagnosis.py's (1 % slow batches) for any other size."""
    if size == "300000":
        from load_trial import make_trial

        return make_trial(300_000)
    from diagnosis import make_trial

    return make_trial(size)
