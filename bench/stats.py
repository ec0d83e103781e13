"""How the benchmarks report a set of measurements: the median with its spread."""
from __future__ import annotations

import statistics


def spread(values, digits: int = 3) -> str:
    """'median M (min A, max B, n=N)'."""
    values = list(values)
    return (f"median {statistics.median(values):.{digits}f} (min {min(values):.{digits}f}, "
            f"max {max(values):.{digits}f}, n={len(values)})")


def spread_iqr(values, digits: int = 3) -> str:
    """'M (IQR Q1..Q3; mean X +- H)': for noisy paired differences, with the mean's 95 %
    confidence interval."""
    ordered = sorted(values)
    if len(ordered) >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4)
    else:
        q1, q3 = min(ordered), max(ordered)
    mean = statistics.mean(ordered)
    half = 1.96 * statistics.stdev(ordered) / len(ordered) ** 0.5 if len(ordered) > 1 else float("nan")
    return (f"{statistics.median(ordered):.{digits}f} (IQR {q1:.{digits}f}..{q3:.{digits}f}; "
            f"mean {mean:.{digits}f} +- {half:.{digits}f})")


def child_runs(script: str, folder: str, runs: int) -> list[dict]:
    """`runs` fresh processes of `script --child folder`, each printing one JSON line last."""
    import json
    import subprocess
    import sys

    out = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, script, "--child", folder], capture_output=True, text=True, check=True)
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out
