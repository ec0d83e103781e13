"""Imported for its effect, before pandas or pyarrow: Arrow's allocator set to hand memory
it frees back to the operating system at once, and C's (glibc's) to do so for large blocks.

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
    trim = _glibc_function("malloc_trim")
    if trim is not None:
        trim(0)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter: blocks this large or larger are mapped apart
LARGE_BLOCK_BYTES = 16 << 20


def _map_large_blocks_apart() -> None:
    """Every block of LARGE_BLOCK_BYTES or more mapped on its own, and unmapped when freed.

    glibc serves a block below its threshold from its heap, and raises the threshold to the
    size of each mapped block freed (up to 32 MiB). So after a large trial's first arrays were
    freed, the rest (24 MB an array of 3M GetNexts) came from the heap, which kept them when
    freed, in pieces the next arrays did not always fit: `analyze --json` of the 3M-GetNext
    trial peaked at 1,094-1,100 MiB that way, 1,048-1,051 MiB with this threshold, in the same
    time (`--cache-dir`, one file changed; 2 runs each, alternated). Smaller blocks come from
    the heap as before: a 300k-GetNext trial's arrays (2.4 MB) never reach it."""
    mallopt = _glibc_function("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES)


@functools.cache
def _glibc_function(name: str):
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune this way
        return None


_import_pyarrow_purging()
_map_large_blocks_apart()
