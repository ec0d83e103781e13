"""The DataLoader settings a what-if changes, and how a user writes them:
'num_workers=8,in_order=false'. Standard library only: the command line checks them before it
imports the analysis (a cached answer imports no pandas); the diagnosis's what_if predicts.
"""
from __future__ import annotations

# Bounds a user can ask for: torch accepts more, no host has use for them.
MAX_WORKERS = 256
MAX_PREFETCH = 64
_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
KEYS = ("num_workers", "prefetch_factor", "in_order", "persistent_workers")


def _as_int(key: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{key} must be a whole number, not {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{key} must be a whole number, not {value!r}") from None
    if not low <= number <= high:
        raise ValueError(f"{key} must be between {low} and {high}, not {number}")
    return number


def _as_bool(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    raise ValueError(f"{key} must be true or false, not {value!r}")


def validate(change: dict) -> dict:
    """The change with typed values, or ValueError naming the first bad key or value."""
    if not isinstance(change, dict) or not change:
        raise ValueError("a what-if needs at least one setting, e.g. num_workers=8")
    out = {}
    for key, value in change.items():
        if key == "num_workers":
            out[key] = _as_int(key, value, 0, MAX_WORKERS)
        elif key == "prefetch_factor":
            out[key] = _as_int(key, value, 1, MAX_PREFETCH)
        elif key in ("in_order", "persistent_workers"):
            out[key] = _as_bool(key, value)
        else:
            raise ValueError(f"unknown what-if setting {key!r}: use " + ", ".join(KEYS))
    return out


def parse(text: str) -> dict:
    """'num_workers=8,in_order=false' -> {'num_workers': 8, 'in_order': False}."""
    change = {}
    for item in str(text).split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            raise ValueError(f"what-if {text!r}: write settings as key=value[,key=value], "
                             f"e.g. num_workers=8,in_order=false")
        if key in change:
            raise ValueError(f"what-if {text!r}: {key} is given twice")
        change[key] = value.strip()
    return validate(change)
