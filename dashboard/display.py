"""How durations and moments are written, on the page and in the text report: one
convention, defined here once (standard library only).

Durations are in milliseconds; from 10 s on in seconds, below 0.1 ms in microseconds. Each
carries its unit, at most four significant digits and thousands separators:

    duration_us(90)          '90 µs'
    duration_us(1_731.5)     '1.732 ms'
    duration_us(9_833)       '9.833 ms'
    duration_us(4_671_733)   '4,672 ms'
    duration_us(12_345_678)  '12.35 s'
    duration_s(86_400)       '86,400 s'

An axis of durations is drawn in the unit its largest value is written in (`axis_unit`),
and its title names that unit.

Moments are ISO-8601 in UTC, to the microsecond, with the zone stated ('Z'): a trial's
timestamps are epoch microseconds, and UTC is the only zone a trial carries.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone

SIGNIFICANT_DIGITS = 4
MICROSECONDS = "µs"
MS_FROM_US = 100  # 0.1 ms: below it, microseconds
S_FROM_US = 10_000_000  # 10 s: from it on, seconds
TIME_ZONE = "UTC"
MISSING = "-"


@dataclass(frozen=True)
class Unit:
    name: str  # as written after a number: 'µs', 'ms', 's'
    us: float  # microseconds in one of it


US = Unit(MICROSECONDS, 1.0)
MS = Unit("ms", 1e3)
S = Unit("s", 1e6)


def unit_for(us: float) -> Unit:
    """The unit a duration of `us` microseconds is written in."""
    size = abs(us)
    if size == 0:
        return MS  # nothing at all: in the convention's own unit, not "0 µs"
    return US if size < MS_FROM_US else MS if size < S_FROM_US else S


def _rounded(value: float, digits: int = SIGNIFICANT_DIGITS) -> tuple[float, int]:
    """`value` to `digits` significant digits, and the decimals that keeps (never fewer
    than 0: 86,412 keeps its integer digits' place, as 86,410)."""
    if value == 0:
        return 0.0, 0
    magnitude = math.floor(math.log10(abs(value)))
    decimals = digits - 1 - magnitude
    rounded = round(value, decimals)
    if rounded != 0 and math.floor(math.log10(abs(rounded))) > magnitude:  # 9.9996 -> 10.00
        decimals -= 1
        rounded = round(value, decimals)
    return rounded, max(decimals, 0)


def number_text(value: float, digits: int = SIGNIFICANT_DIGITS) -> str:
    """A number to `digits` significant digits, thousands separated, no trailing zeros."""
    rounded, decimals = _rounded(value, digits)
    text = f"{rounded:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def duration_us(us) -> str:
    """A duration given in microseconds, as the convention writes it ('-' when unknown)."""
    if not _finite(us):
        return MISSING
    us = float(us)
    unit = unit_for(us)
    rounded, _ = _rounded(us / unit.us)
    # Rounding may carry a value over its unit's end: 99.996 µs is 0.1 ms, 9,999.96 ms is 10 s.
    if unit is not S and unit_for(rounded * unit.us) is not unit:
        unit = unit_for(rounded * unit.us)
    return f"{number_text(us / unit.us)} {unit.name}"


def duration_s(seconds) -> str:
    """A duration given in seconds, as the convention writes it."""
    return duration_us(float(seconds) * 1e6) if _finite(seconds) else MISSING


def prediction_text(now: dict | None, then: dict, arrow: str = "->") -> str:
    """'waiting 81.6 % -> 74.0 % of training, training 18.98 s -> 13.44 s': a prediction, today's
    numbers and then those predicted (dicts with "wait_fraction" and "training_s"), without
    today's when they are not known; the page writes its arrow as →."""
    if now is None:
        return f"waiting {100 * then['wait_fraction']:.1f} % of training, training {duration_s(then['training_s'])}"
    return (f"waiting {100 * now['wait_fraction']:.1f} % {arrow} {100 * then['wait_fraction']:.1f} % of training, "
            f"training {duration_s(now['training_s'])} {arrow} {duration_s(then['training_s'])}")


def durations_us(values) -> list[str]:
    """duration_us of each value (hover texts of a figure's points)."""
    return [duration_us(v) for v in values]


def axis_unit(largest_us: float) -> Unit:
    """The unit of an axis whose largest duration is `largest_us`."""
    return unit_for(largest_us) if _finite(largest_us) else MS


def iso_utc(us) -> str:
    """A moment (epoch microseconds) as ISO-8601 UTC with microseconds: '2026-11-29T21:10:08.123456Z'."""
    if us is None or not _finite(us):
        return MISSING
    us = int(us)
    seconds, micros = divmod(us, 1_000_000)
    stamp = datetime.fromtimestamp(seconds, tz=timezone.utc).replace(microsecond=micros)
    return stamp.isoformat(timespec="microseconds").replace("+00:00", "Z")


MAX_NAME_CHARS = 22


# Who loaded a batch whose worker id is the collector's -1 (num_workers=0).
MAIN_PROCESS = "main process"


def worker_text(value) -> str:
    """Which process made a batch: a worker's id; -1, the collector's mark for a batch loaded
    in the training process (num_workers=0); missing where the profiler does not record it
    (Kineto)."""
    try:
        number = int(value)
    except (TypeError, ValueError):  # None, NaN, pandas' NA
        return "worker not recorded"
    return MAIN_PROCESS if number < 0 else f"worker {number}"


def short_name(name: str, limit: int = MAX_NAME_CHARS) -> str:
    """A long class name as a narrow column writes it (its whole name goes in a tooltip):
    torch's iterator classes without the private underscore and the 'DataLoader' every one
    of them carries ('_MultiProcessingDataLoaderIter' -> 'MultiProcessingIter'), Kineto's
    'enumerate(DataLoader)#' prefix dropped; anything still longer cut in the middle."""
    text = str(name)
    if text.startswith("enumerate(") and "#" in text:
        text = text.split("#", 1)[1]
    text = text.lstrip("_").replace("DataLoaderIter", "Iter") or str(name)
    if len(text) > limit:
        tail = limit // 3
        text = text[:limit - tail - 1] + "…" + text[-tail:]
    return text


def _finite(value) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):  # pd.NA and the like
        return False
