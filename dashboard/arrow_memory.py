"""Imported for its effect, before pandas or pyarrow: Arrow's allocator set to hand memory
it frees back to the operating system at once.

pyarrow allocates through mimalloc, which keeps freed pages for a while to reuse them. A
trial load churns through short-lived Arrow buffers in several threads while it builds the
frames, and the pages kept put the peak of a 600k-event load at about 330 MB instead of
240 MB (`bench/load_trial.py`); a dashboard server kept them after every load. The cost
in load time is within the benchmark's noise.

mimalloc reads its options from the environment once, when pyarrow loads. So the option
is set for that moment only: not when pyarrow is already imported (then this does
nothing), not when the environment already chooses a value, and taken out again so that
child processes (a training job's DataLoader workers, say) do not inherit it.
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys

PURGE_DELAY_OPTION = "MIMALLOC_PURGE_DELAY"


def _import_pyarrow_purging() -> None:
    if "pyarrow" in sys.modules or PURGE_DELAY_OPTION in os.environ:
        return
    os.environ[PURGE_DELAY_OPTION] = "0"
    try:
        import pyarrow
    except ImportError:
        return  # reported by the import that needs it
    finally:
        del os.environ[PURGE_DELAY_OPTION]
    pyarrow.default_memory_pool()


def release_unused() -> None:
    """Hands back the memory the allocators hold free after a load.

    Arrow's: in a process where the option could not be set (a notebook that imported pandas
    first), about 100 MB of a 600k-event load; about a millisecond.
    C's heap (glibc's malloc_trim): what a load freed outside Arrow, mostly the parse workers'
    pickled results (dashboard/trial/load.py's ForkedWorkers). glibc keeps freed memory in its
    heap unless it lies at the top, so a 300k-GetNext load parsed in 2 processes held 242 MB
    after it, 168 MB once trimmed."""
    import pyarrow

    pyarrow.default_memory_pool().release_unused()
    trim_c_heap()


def trim_c_heap() -> None:
    """Hands back the pages glibc's heap holds free, wherever they lie in it (malloc_trim)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim this way
        return None


_import_pyarrow_purging()
