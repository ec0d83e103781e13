"""Results as the `analyze --json` object and as a readable text report."""
from __future__ import annotations

import math
from datetime import datetime, timezone

import pandas as pd

from .api import TrialAnalysis


def _num(value):
    if value is None or (isinstance(value, float) and not math.isfinite(value)) or value is pd.NA:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _int(value, default=-1):
    return default if value is None or pd.isna(value) else int(value)


def _records(frame: pd.DataFrame, spec: dict) -> list[dict]:
    """frame rows as dicts: spec maps output key -> (column, converter)."""
    out = []
    for row in frame.itertuples(index=False):
        row = row._asdict()
        out.append({key: conv(row[col]) for key, (col, conv) in spec.items()})
    return out


def _bool_or_none(value):
    return None if value is None or pd.isna(value) else bool(value)


def to_dict(result: TrialAnalysis) -> dict:
    trial, init, workers, getnext, batch = (result.trial, result.initialization, result.workers,
                                            result.getnext, result.batchtime)
    duration = {"start_us": ("start_us", int), "end_us": ("end_us", int),
                "duration_us": ("duration_us", lambda v: _num(float(v)))}
    return {
        "trial": trial.path,
        "nodes": trial.nodes,
        "files": trial.report.to_dict(),
        "lines_skipped": trial.report.lines_skipped,
        "initialization": {
            "count": init.count, "median_us": _num(init.median_us), "max_us": _num(init.max_us),
            "iterators": _records(init.iterators, {
                "type": ("type", str), "num_workers": ("num_workers", _int),
                "pin_memory": ("pin_memory", _bool_or_none), "count": ("count", int),
                "median_us": ("median_us", lambda v: _num(float(v))),
                "max_us": ("max_us", lambda v: _num(float(v)))}),
            "outliers": _records(init.outliers, {**duration, "node": ("node", str), "pid": ("pid", _int),
                                                 "type": ("type", str)}),
        },
        "workers": {
            "count": workers.count, "median_us": _num(workers.median_us), "max_us": _num(workers.max_us),
            "outliers": _records(workers.outliers, {**duration, "worker_id": ("worker_id", _int),
                                                    "pid": ("pid", _int), "node": ("node", str)}),
        },
        "getnext": {
            "count": getnext.count, "median_us": _num(getnext.median_us), "max_us": _num(getnext.max_us),
            "outliers": _records(getnext.outliers, {**duration, "worker_id": ("worker_id", _int),
                                                    "pid": ("pid", _int), "node": ("node", str)}),
        },
        "batchtime": {
            "count": batch.count, "median_s": _num(batch.median_s),
            "outliers": _records(batch.outliers, {
                "start_us": ("start_us", int), "end_us": ("end_us", int),
                "batch_time_s": ("batch_time_s", float), "pid": ("pid", _int), "node": ("node", str),
                "worker_id": ("worker_id", _int)}),
        },
    }


def iso_utc(us: int | None) -> str:
    """Epoch microseconds as ISO-8601 UTC with microseconds."""
    if us is None:
        return "-"
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).isoformat(timespec="microseconds").replace(
        "+00:00", "Z")


def _stat(value, unit):
    return "-" if value is None else f"{value:,.0f} {unit}" if unit == "us" else f"{value:.4f} {unit}"


def to_text(result: TrialAnalysis, max_rows: int = 10) -> str:
    data = to_dict(result)
    trial = result.trial
    lines = [f"Trial {data['trial']}",
             f"  span {iso_utc(trial.start_us)} .. {iso_utc(trial.end_us)}; nodes: {', '.join(data['nodes']) or '-'}",
             f"  files read {data['files']['read']}, skipped {len(data['files']['skipped'])}; "
             f"lines skipped {data['lines_skipped']}"]
    for skipped in data["files"]["skipped"][:max_rows]:
        lines.append(f"    skipped {skipped['path']}: {skipped['reason']}")
    for item in trial.report.files_with_skipped_lines[:max_rows]:
        lines.append(f"    lines skipped in {item.path}: {item.reason}")

    def section(title, part, unit_key="median_us"):
        lines.append("")
        lines.append(f"{title}: {part['count']} (median {_stat(part.get('median_us'), 'us')}, "
                     f"max {_stat(part.get('max_us'), 'us')})")

    init = data["initialization"]
    section("Iterator initializations", init)
    for it in init["iterators"]:
        lines.append(f"  {it['type']}: num_workers={it['num_workers']} pin_memory={it['pin_memory']} "
                     f"initialized {it['count']}x, median {_stat(it['median_us'], 'us')}")
    for key, title in (("workers", "Worker processes"), ("getnext", "GetNext calls")):
        section(title, data[key])
    for key, title in (("initialization", "initialization"), ("workers", "worker"), ("getnext", "GetNext")):
        rows = data[key]["outliers"]
        if rows:
            lines.append("")
            lines.append(f"{title} outliers (> {result.dataloader.outlier_factor:g} x median): {len(rows)}")
            for row in rows[:max_rows]:
                extra = f" worker {row['worker_id']}" if "worker_id" in row else ""
                lines.append(f"  {iso_utc(row['start_us'])} .. {iso_utc(row['end_us'])} "
                             f"{row['duration_us']:,} us{extra} pid {row['pid']} on {row['node']}")
    batch = data["batchtime"]
    lines.append("")
    median_s = "-" if batch["median_s"] is None else f"{batch['median_s']:.4f} s"
    lines.append(f"Batch time: {batch['count']} batches, median {median_s}")
    if batch["outliers"]:
        lines.append(f"batch time outliers: {len(batch['outliers'])}")
        for row in batch["outliers"][:max_rows]:
            lines.append(f"  {iso_utc(row['start_us'])} .. {iso_utc(row['end_us'])} "
                         f"{row['batch_time_s']:.4f} s pid {row['pid']} on {row['node']}")
    return "\n".join(lines)
