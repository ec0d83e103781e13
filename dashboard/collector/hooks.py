"""The hooks into torch's DataLoader (private internals, checked before use).

- `DataLoader.__iter__`: one init record per iter() call, with a fresh iterator id
  (a persistent-worker loader re-used across epochs gets one per epoch); while a
  multi-process iterator starts its workers, torch's `_worker_loop` is swapped for a
  `worker.WorkerLoop` carrying that id, so that each worker records its lifetime.
- `_BaseDataLoaderIter.__next__`: one GetNext record per batch: start and end (epoch
  ns), and the iterator id and worker id packed in one number (protocol.source), which
  the iterator carries as `_dlp`: set per iter() (worker -1 single-process), and per
  batch by `_MultiProcessingDataLoaderIter._process_data(data, worker_idx)`, which
  torch calls just before `__next__` returns that worker's batch.

The hot path is `__next__`: two `time.time_ns()` calls, one attribute read and three
numbers appended to an int64 array (no lock, no formatting, no object kept).
`inspect_torch()` checks each internal it relies on and degrades with a warning when one
differs (another torch 2.x): no worker id, no worker events, or nothing at all; it never
lets training break.
"""
from __future__ import annotations

import inspect
import itertools
import os
import threading
import weakref
from dataclasses import dataclass, field
from time import time_ns

from . import protocol, worker


@dataclass
class Capabilities:
    getnext: bool = False  # DataLoader.__iter__ and _BaseDataLoaderIter.__next__ found
    worker_id: bool = False  # _process_data(self, data, worker_idx)
    worker_events: bool = False  # _utils.worker._worker_loop with worker_id / num_workers
    loop_positions: dict = field(default_factory=dict)
    torch_version: str = ""
    warnings: list = field(default_factory=list)


def _positional(function) -> list[str]:
    params = inspect.signature(function).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def inspect_torch() -> Capabilities:
    import torch

    caps = Capabilities(torch_version=str(getattr(torch, "__version__", "?")))
    try:
        from torch.utils.data import DataLoader, dataloader as torch_dataloader

        base = torch_dataloader._BaseDataLoaderIter
        caps.getnext = callable(DataLoader.__dict__.get("__iter__")) and callable(base.__dict__.get("__next__"))
    except (ImportError, AttributeError):
        caps.getnext = False
    if not caps.getnext:
        caps.warnings.append(f"torch {caps.torch_version}: DataLoader internals not found; nothing is recorded")
        return caps
    multi = getattr(torch_dataloader, "_MultiProcessingDataLoaderIter", None)
    try:
        names = _positional(multi.__dict__["_process_data"])
        caps.worker_id = len(names) >= 3  # (self, data, worker_idx)
    except (AttributeError, KeyError, TypeError, ValueError):
        caps.worker_id = False
    if not caps.worker_id:
        caps.warnings.append(f"torch {caps.torch_version}: the worker of each batch is not known to this "
                             "torch; GetNext events carry no worker_id")
    try:
        from torch.utils.data._utils import worker as torch_worker

        names = _positional(torch_worker._worker_loop)
        positions = {name: names.index(name) for name in ("worker_id", "num_workers", "collate_fn")
                     if name in names}
        caps.worker_events = "worker_id" in positions and "num_workers" in positions
        caps.loop_positions = positions
    except (ImportError, AttributeError, TypeError, ValueError):
        caps.worker_events = False
    if not caps.worker_events:
        caps.warnings.append(f"torch {caps.torch_version}: the DataLoader worker loop is not the one the "
                             "collector knows; worker lifetimes are not recorded")
    return caps


# One count of iterator ids for the process, not one per Collector: a collector started again
# (stop() then start(), into the same trial or another) gave its first iterator id 1 again, so
# two iterators' GetNexts joined as one, one's epoch end closed the other's epoch (an unrecorded
# epoch counted as training), and an iterator that lived across the restart kept a label (_dlp)
# the new session gave another iterator.
_ITERATOR_IDS = itertools.count(1)


class Hooks:
    """Installs and removes the hooks for one Collector."""

    def __init__(self, collector, capabilities: Capabilities):
        self.collector = collector
        self.caps = capabilities
        self._installed: list[tuple[type, str, object, object]] = []  # (cls, name, original, wrapper)
        self._ids = _ITERATOR_IDS
        self._loader_ids = weakref.WeakKeyDictionary()
        self._next_loader_id = itertools.count(1)
        self._spawn_lock = threading.RLock()
        self._pid = os.getpid()

    # -- install / uninstall -------------------------------------------------------------
    def install(self) -> None:
        from torch.utils.data import DataLoader, dataloader as torch_dataloader
        from torch.utils.data._utils import worker as torch_worker

        base = torch_dataloader._BaseDataLoaderIter
        multi = getattr(torch_dataloader, "_MultiProcessingDataLoaderIter", None)
        self._torch_worker = torch_worker
        if not isinstance(torch_worker._worker_loop, worker.WorkerLoop):
            worker.ORIGINAL_LOOP = torch_worker._worker_loop
        # Defaults read by the hooks on iterators they have not seen (yet): 0, adopt it.
        base._dlp = 0
        base._dlp_base = 0
        self._patch(DataLoader, "__iter__", self._make_iter(DataLoader.__dict__["__iter__"]))
        self._patch(base, "__next__", self._make_next(base.__dict__["__next__"]))
        if multi is not None and self.caps.worker_id:
            self._patch(multi, "_process_data", self._make_process_data(multi.__dict__["_process_data"]))

    def _patch(self, cls: type, name: str, wrapper) -> None:
        original = cls.__dict__[name]
        wrapper.__wrapped__ = original
        setattr(cls, name, wrapper)
        self._installed.append((cls, name, original, wrapper))

    def uninstall(self) -> None:
        while self._installed:
            cls, name, original, wrapper = self._installed.pop()
            if cls.__dict__.get(name) is wrapper:
                setattr(cls, name, original)
            else:  # someone wrapped ours: leave the chain, make ours pass-through
                inert = getattr(wrapper, "_dlp_make_inert", None)
                if inert is not None:
                    inert()
        torch_worker = getattr(self, "_torch_worker", None)
        if torch_worker is not None and isinstance(torch_worker._worker_loop, worker.WorkerLoop):
            torch_worker._worker_loop = worker.ORIGINAL_LOOP

    # -- the wrappers --------------------------------------------------------------------
    def _make_next(self, original):
        # Defaults, not closures: the fastest names Python has (LOAD_FAST).
        def __next__(self, _original=original, _now=time_ns, _add=self.collector._buffer.add,
                     _adopt=self._adopt, _ended=self._epoch_end):
            start = _now()
            try:
                data = _original(self)
            except StopIteration:  # once an epoch: a try costs nothing until it raises
                _ended(self, start, _now())
                raise
            _add([start, _now(), self._dlp or _adopt(self)])
            return data

        def make_inert():
            defaults = list(__next__.__defaults__)
            defaults[2] = _discard
            defaults[4] = _discard_end
            __next__.__defaults__ = tuple(defaults)

        __next__._dlp_make_inert = make_inert
        return __next__

    def _make_process_data(self, original):
        adopt = self._adopt
        unknown, max_worker = protocol.WORKER_UNKNOWN, protocol.MAX_WORKER_ID  # bound once: per batch below

        def _process_data(self, data, worker_idx, *args, **kwargs):
            base = self._dlp_base
            if not base:
                adopt(self)
                base = self._dlp_base
            known = type(worker_idx) is int and 0 <= worker_idx <= max_worker
            self._dlp = base + (worker_idx if known else unknown) + 2
            return original(self, data, worker_idx, *args, **kwargs)

        return _process_data

    def _make_iter(self, original):
        hooks = self

        def __iter__(self):
            try:
                spawn = hooks._before_iter(self)
            except Exception as exc:
                hooks.collector._warn(f"iter() not recorded ({type(exc).__name__}: {exc})")
                return original(self)
            start = time_ns()
            try:
                iterator = original(self)
            finally:
                if spawn is not None and spawn[1]:
                    hooks._after_spawn()
            end = time_ns()
            hooks._after_iter(self, iterator, spawn, start, end)
            return iterator

        def make_inert():
            nonlocal hooks
            hooks = _InertHooks()

        __iter__._dlp_make_inert = make_inert
        return __iter__

    # -- iter() --------------------------------------------------------------------------
    def _loader_id(self, loader) -> int:
        try:
            lid = self._loader_ids.get(loader)
            if lid is None:
                lid = self._loader_ids[loader] = next(self._next_loader_id)
            return lid
        except TypeError:  # not weak-referenceable
            return -id(loader)

    def _before_iter(self, loader):
        """The iterator id of this iter(); while its workers start, torch's worker loop
        is swapped for a WorkerLoop with that id (under a lock: one iter() at a time)."""
        iid = next(self._ids)
        num_workers = getattr(loader, "num_workers", 0) or 0
        spawns = (num_workers > 0 and self.caps.worker_events and not
                  (getattr(loader, "persistent_workers", False) and getattr(loader, "_iterator", None) is not None))
        if not spawns:
            return (iid, False)
        self._spawn_lock.acquire()
        try:
            self._torch_worker._worker_loop = worker.WorkerLoop(
                self.collector._spool_dir, iid, self.caps.loop_positions, self.collector.worker_fetch)
        except BaseException:
            self._spawn_lock.release()
            raise
        return (iid, True)

    def _after_spawn(self) -> None:
        try:
            self._torch_worker._worker_loop = worker.ORIGINAL_LOOP
        finally:
            self._spawn_lock.release()

    def _after_iter(self, loader, iterator, spawn, start_ns: int, end_ns: int) -> None:
        if spawn is None:
            return
        try:
            iid, _ = spawn
            self._label(iterator, iid)
            self.collector._buffer.control({
                "t": "init", "iid": iid, "cls": type(iterator).__name__, "lid": self._loader_id(loader),
                "t0": start_ns, "t1": end_ns, "pid": self._pid,
                "nw": int(getattr(loader, "num_workers", 0) or 0),
                "pin": bool(getattr(loader, "pin_memory", False)),
                "pers": bool(getattr(loader, "persistent_workers", False)),
                "pf": _json_number(getattr(loader, "prefetch_factor", None)),
                "order": bool(getattr(loader, "in_order", True))})
        except Exception as exc:
            self.collector._warn(f"iter() not recorded ({type(exc).__name__}: {exc})")

    @staticmethod
    def _label(iterator, iid: int) -> None:
        """What the hot path reads: the iterator id, with worker -1 single-process and
        unknown until _process_data names the worker of a multi-process batch."""
        iterator._dlp_base = iid << protocol.WORKER_BITS
        single = getattr(iterator, "_num_workers", 1) == 0
        iterator._dlp = protocol.source(iid, -1 if single else protocol.WORKER_UNKNOWN)

    def _epoch_end(self, iterator, start_ns: int, end_ns: int) -> None:
        """The next() that raised StopIteration: when the epoch's last step ended."""
        try:
            iid, _ = protocol.split_source(iterator._dlp or self._adopt(iterator))
            self.collector._buffer.control({"t": "end", "iid": iid, "cls": type(iterator).__name__,
                                            "t0": start_ns, "t1": end_ns, "pid": self._pid})
        except Exception:  # never into the training loop
            pass

    def _adopt(self, iterator) -> int:
        """An iterator created before the recording started: give it an id on first use."""
        try:
            iid = next(self._ids)
            self._label(iterator, iid)
            self.collector._buffer.control({
                "t": "adopt", "iid": iid, "cls": type(iterator).__name__, "lid": -iid, "pid": self._pid,
                "nw": int(getattr(iterator, "_num_workers", 0) or 0)})
            return iterator._dlp
        except Exception:
            return protocol.source(0, protocol.WORKER_UNKNOWN)


def _json_number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _discard(_record) -> None:
    pass


def _discard_end(_iterator, _start_ns, _end_ns) -> None:
    pass


class _InertHooks:
    """Stands in for Hooks in a wrapper that could not be removed: records nothing."""

    def _before_iter(self, loader):
        return None

    def _after_spawn(self) -> None:
        pass

    def _after_iter(self, *args) -> None:
        pass
