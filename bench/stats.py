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


def shared_memory_mb() -> float:
    """The machine's shared memory now (/proc/meminfo Shmem), in MB."""
    with open("/proc/meminfo") as lines:
        return next(int(line.split()[1]) / 1024 for line in lines if line.startswith("Shmem:"))


def _unshared_rss_mb(pid: int) -> float:
    """A process's resident memory but its shared memory pages (RSS - RssShmem), in MB; 0 once gone."""
    try:
        with open(f"/proc/{pid}/status") as lines:
            found = {line.split(":")[0]: int(line.split()[1]) for line in lines
                     if line.startswith(("VmRSS", "RssShmem"))}
    except OSError:
        return 0.0
    return (found.get("VmRSS", 0) - found.get("RssShmem", 0)) / 1024


def run_watching_shared_memory(command: list[str], every_s: float = 0.005) -> tuple[float, float]:
    """Runs the command (its output dropped; CalledProcessError when it fails) and returns (the
    most shared memory the machine held at once above what it held at the start; the most the
    command's process held with that shared memory at once), in MB. A forked load's workers hand
    their tables over in shared memory (dashboard/trial/table_handover.py), which the process's
    RSS counts only once it touches them: the second is the process's peak memory with them (the
    process alone: its workers' own peak is RUSAGE_CHILDREN's). The shared memory is the whole
    machine's: run nothing else that uses /dev/shm meanwhile. Sampled: a moment shorter than
    every_s may be missed."""
    import subprocess
    import time

    base = shared_memory_mb()
    shared = together = 0.0
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    while process.poll() is None:
        held = shared_memory_mb() - base
        shared, together = max(shared, held), max(together, held + _unshared_rss_mb(process.pid))
        time.sleep(every_s)
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command)
    return shared, together


def compile_project() -> None:
    """Compiles the project's modules to bytecode first, as installing a package does (the
    reference's, which pip installed): the processes timed then read it instead of compiling
    every module each time, which they do where bytecode is never written
    (PYTHONDONTWRITEBYTECODE, as on this project's CI machine): the whole `analyze --json` of
    the 300k trial took 1.42-1.62 s without it, 1.38-1.41 s with it (4 runs each, alternated)."""
    import compileall
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    compileall.compile_dir(os.path.join(root, "dashboard"), quiet=1)
    compileall.compile_file(os.path.join(root, "app.py"), quiet=1)
