"""System metrics of this host, sampled with psutil (and NVML when a GPU is present).

Every `interval_s` one sample: per core CPUUtilization and I/OWaitPercentage, the
memory in use, disk IOPS and throughput, network throughput, and per GPU its
utilisation and memory in use, as the trial format's (type, name, dimension, value,
timestamp) records. Rates are over the time since the previous sample, so the first
sample only sets the baseline. No GPU, no NVML library, or NVML failing: GPUs are
skipped quietly. Standard library, psutil, and optionally nvidia-ml-py (`pynvml`).
"""
from __future__ import annotations

import threading
import time
from typing import Callable

Record = tuple  # (type, name, dimension, value, timestamp_s)
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.1, 60.0


def _cpu_busy_and_iowait(before, after) -> tuple[float, float]:
    """Utilisation and I/O wait in percent between two psutil cpu_times of one core.

    As psutil's cpu_percent: guest time is already counted in user/nice, and idle and
    iowait are not busy.
    """
    def total(t):
        value = sum(t)
        return value - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

    elapsed = total(after) - total(before)
    if elapsed <= 0:
        return 0.0, 0.0
    idle = (after.idle - before.idle) + (getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0))
    iowait = getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0)
    busy = min(100.0, max(0.0, 100.0 * (elapsed - idle) / elapsed))
    return round(busy, 2), round(min(100.0, max(0.0, 100.0 * iowait / elapsed)), 2)


class _Gpus:
    """NVML handles of every GPU, or none."""

    def __init__(self):
        self.nvml = None
        self.handles = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception:  # no library, no driver, no GPU: quietly none
            self.handles = []

    def sample(self, ts: float) -> list[Record]:
        records = []
        for index, handle in enumerate(self.handles):
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception:
                continue
            used = 100.0 * memory.used / memory.total if memory.total else 0.0
            records.append(("gpu", f"gpu{index}", "GPUUtilization", float(util.gpu), ts))
            records.append(("gpu", f"gpu{index}", "GPUMemoryUtilization", round(used, 2), ts))
        return records

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.nvml = None


class SystemSampler:
    """Samples on a daemon thread and hands each sample's records to `sink`."""

    def __init__(self, sink: Callable[[list[Record]], None], interval_s: float = 0.5, gpu: bool = True,
                 on_error: Callable[[str], None] | None = None):
        import psutil  # noqa: F401  (fail here, in the caller, when it is missing)

        self.sink = sink
        self.interval_s = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, float(interval_s)))
        self.gpu = gpu
        self.on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous = None
        self._gpus: _Gpus | None = None
        self.samples = 0

    def start(self) -> None:
        # NVML and the baseline are set up here, not on the thread: a job that ends before
        # the thread first runs (a loaded host) still has them, so stop() can sample.
        # This runs in the sink, never in the training loop.
        if self.gpu:
            self._gpus = _Gpus()
        self._sample_and_send()
        self._thread = threading.Thread(target=self._run, name="dashboard-collector-system", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sampling, after one last sample: a job shorter than the interval still
        gets its rates (over its whole run). A last sample right after a regular one is
        skipped (rates over a few ms are noise), unless it would be the only one."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive() and self._previous is not None:
                too_soon_s = self._previous["ts"] + MIN_INTERVAL_S / 2 - time.time()
                if self.samples == 0:  # it would be the only one: worth a moment's wait
                    time.sleep(max(0.0, too_soon_s))
                    self._sample_and_send()
                elif too_soon_s <= 0:
                    self._sample_and_send()
        if self._gpus is not None:
            self._gpus.close()

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval_s
            if next_at < time.monotonic():  # fell behind (a suspended host): do not burst
                next_at = time.monotonic() + self.interval_s
            self._sample_and_send()

    def _sample_and_send(self) -> None:
        """One sample to the sink; a failure is reported, never raised into training."""
        try:
            records = self.sample()
            if records:
                self.sink(records)
        except Exception as exc:
            if self.on_error is not None:
                self.on_error(f"system metrics: {type(exc).__name__}: {exc}")

    def sample(self) -> list[Record]:
        """One sample's records (empty for the first: rates need a previous sample)."""
        import psutil

        now = time.time()
        current = {
            "ts": now,
            "cpu": psutil.cpu_times(percpu=True),
            "disk": _safe(psutil.disk_io_counters),
            "net": _safe(psutil.net_io_counters),
        }
        previous, self._previous = self._previous, current
        if previous is None:
            return []
        records: list[Record] = []
        for index, (before, after) in enumerate(zip(previous["cpu"], current["cpu"])):
            busy, iowait = _cpu_busy_and_iowait(before, after)
            records.append(("cpu", f"cpu{index}", "CPUUtilization", busy, now))
            records.append(("cpu", f"cpu{index}", "I/OWaitPercentage", iowait, now))
        if self._gpus is not None:
            records += self._gpus.sample(now)
        memory = _safe(psutil.virtual_memory)
        if memory is not None:
            records.append(("memory", "MemoryUsedPercent", "", float(memory.percent), now))
        elapsed = now - previous["ts"]
        if elapsed > 0:
            disk_before, disk_after = previous["disk"], current["disk"]
            if disk_before is not None and disk_after is not None:
                ops = (disk_after.read_count - disk_before.read_count
                       + disk_after.write_count - disk_before.write_count)
                records += [
                    ("i/o", "IOPS", "", _rate(ops, elapsed), now),
                    ("i/o", "ReadThroughputInBytesPerSecond", "",
                     _rate(disk_after.read_bytes - disk_before.read_bytes, elapsed), now),
                    ("i/o", "WriteThroughputInBytesPerSecond", "",
                     _rate(disk_after.write_bytes - disk_before.write_bytes, elapsed), now),
                ]
            net_before, net_after = previous["net"], current["net"]
            if net_before is not None and net_after is not None:
                records += [
                    ("network", "ReceiveBytesPerSecond", "Algorithm",
                     _rate(net_after.bytes_recv - net_before.bytes_recv, elapsed), now),
                    ("network", "TransmitBytesPerSecond", "Algorithm",
                     _rate(net_after.bytes_sent - net_before.bytes_sent, elapsed), now),
                ]
        self.samples += 1
        return records


def _rate(delta: float, elapsed: float) -> float:
    # Counters can wrap or reset (a device removed): never a negative rate.
    return round(max(0.0, delta) / elapsed, 2)


def _safe(function):
    try:
        return function()
    except Exception:  # containers without /proc/diskstats, etc.
        return None
