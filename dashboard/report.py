"""Results as the `analyze --json` object and as a readable text report."""
from __future__ import annotations

from . import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)

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


def _jsonable(value):
    """Evidence as plain JSON values: numpy scalars unwrapped, NaN as None."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    return _num(value) if isinstance(value, float) or value is None or value is pd.NA else value


def verdict_dict(verdict) -> dict:
    return {"input_percent": _num(verdict.input_percent), "class": verdict.class_, "basis": verdict.basis}


def recommendation_dict(item) -> dict:
    return {"id": item.id, "text": item.text, "evidence": _jsonable(item.evidence),
            "saving_s": _num(item.saving_s), "change": _jsonable(item.change),
            "predicted": _jsonable(item.predicted)}


def budget_dict(item) -> dict:
    return {"node": item.node, "loader": item.loader, "training_s": _num(item.training_s),
            "wait_s": _num(item.wait_s), "parts": {k: _num(v) for k, v in item.parts.items()},
            "bound": item.bound, "evidence": _jsonable(item.evidence),
            "windows": {part: [{"start_us": s, "end_us": e} for s, e in spans]
                        for part, spans in item.windows.items()}}


def what_if_dict(item) -> dict:
    return {"node": item.node, "loader": item.loader, "change": _jsonable(item.change),
            "now": _jsonable(item.now), "predicted": _jsonable(item.predicted), "note": item.note}


def not_recorded_anywhere(trial) -> bool:
    """True when no node's profiler recorded what `trial.not_recorded` names (a Kineto-only
    trial): counts of those are unknown (null), not zero."""
    if not trial.not_recorded:
        return False
    framework_nodes = {str(n) for n in trial.framework["node"].unique()}
    return framework_nodes <= set(trial.kineto_nodes)


def to_dict(result: TrialAnalysis, what_if: list[dict] | tuple = ()) -> dict:
    """The `analyze --json` object; `what_if` adds the predictions of those changes (one
    entry per training loader per change) to the recommendations' own."""
    trial, init, workers, getnext, batch = (result.trial, result.initialization, result.workers,
                                            result.getnext, result.batchtime)
    duration = {"start_us": ("start_us", int), "end_us": ("end_us", int),
                "duration_us": ("duration_us", lambda v: _num(float(v)))}
    unknown = not_recorded_anywhere(trial)
    return {
        "trial": trial.path,
        "format": trial.format,
        "verdict": verdict_dict(result.verdict),
        "nodes_verdict": {node: verdict_dict(v) for node, v in result.nodes_verdict.items()},
        "recommendations": [recommendation_dict(r) for r in result.recommendations],
        "budget": [budget_dict(b) for b in result.budget],
        "what_if": [{**what_if_dict(w), "asked": True} for change in what_if for w in result.what_if(change)]
        + [{**what_if_dict(w), "asked": False} for w in result.assessment.what_if],
        # What the trial's profiler did not record (Kineto: no iterator creation, no worker
        # processes, no worker ids), and on which nodes.
        "not_recorded": list(trial.not_recorded),
        "not_recorded_nodes": list(trial.kineto_nodes),
        "nodes": trial.nodes,
        "files": trial.report.to_dict(),
        "lines_skipped": trial.report.lines_skipped,
        "lines_skipped_in": [{"path": f.path, "reason": f.reason}
                             for f in trial.report.files_with_skipped_lines],
        "initialization": {
            "count": None if unknown else init.count, "median_us": _num(init.median_us),
            "max_us": _num(init.max_us),
            "iterators": _records(init.iterators, {
                "type": ("type", str), "num_workers": ("num_workers", _int),
                "pin_memory": ("pin_memory", _bool_or_none), "count": ("count", int),
                "median_us": ("median_us", lambda v: _num(float(v))),
                "max_us": ("max_us", lambda v: _num(float(v)))}),
            "outliers": _records(init.outliers, {**duration, "node": ("node", str), "pid": ("pid", _int),
                                                 "type": ("type", str)}),
        },
        "workers": {
            "count": None if unknown else workers.count, "median_us": _num(workers.median_us),
            "max_us": _num(workers.max_us),
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


CLASS_WORDS = {"highly": "highly input-bound", "moderately": "moderately input-bound",
               "not": "not input-bound", "none": "no GetNext"}  # "none": the class_ None, as the page names it
NOT_RECORDED_WORDS = {"initialization": "iterator initialization", "workers": "worker processes",
                      "worker_id": "which worker produced a batch"}


def verdict_text(verdict) -> str:
    if verdict.class_ is None:
        return f"no verdict: {verdict.basis}"
    return (f"{CLASS_WORDS[verdict.class_]}: {verdict.input_percent:.1f} % of training time waits for "
            f"data ({verdict.basis})")


PART_WORDS = {"startup": "start-up", "throughput": "throughput", "imbalance": "slow worker",
              "tail": "slow samples", "main_process": "in the main process", "residual": "unexplained"}
BOUND_WORDS = {"latency": "workers wait (latency-bound)", "cpu": "workers compute (CPU-bound)",
               "unknown": "what bounds the workers is not recorded"}


def _percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole > 0 else "-"


def _budget_lines(data: dict) -> list[str]:
    """Where the wait went, per training loader."""
    lines = []
    for item in data["budget"]:
        lines.append("")
        lines.append(f"Wait budget of {item['loader']} on {item['node']}: {item['wait_s']:.2f} s of "
                     f"{item['training_s']:.2f} s of training ({_percent(item['wait_s'], item['training_s'])}); "
                     f"{BOUND_WORDS[item['bound']]}")
        for part, seconds in sorted(item["parts"].items(), key=lambda kv: -abs(kv[1])):
            if abs(seconds) >= 0.0005:
                lines.append(f"  {PART_WORDS[part]:<20} {seconds:8.2f} s  {_percent(seconds, item['training_s']):>7}"
                             " of training")
    asked = [w for w in data["what_if"] if w["change"] and w.get("asked")]
    for item in asked:
        change = ", ".join(f"{k}={v}" for k, v in item["change"].items())
        if item["predicted"] is None:
            lines.append(f"What if {change} ({item['loader']} on {item['node']}): {item['note']}")
            continue
        now, then = item["now"], item["predicted"]
        lines.append(f"What if {change} ({item['loader']} on {item['node']}): waiting "
                     f"{100 * now['wait_fraction']:.1f} % -> {100 * then['wait_fraction']:.1f} %, training "
                     f"{now['training_s']:.2f} s -> {then['training_s']:.2f} s")
    return lines


def _summary_lines(data: dict, result: TrialAnalysis) -> list[str]:
    """The verdict and the findings: what the report says first."""
    lines = [f"Verdict: {verdict_text(result.verdict)}"]
    if len(result.nodes_verdict) > 1:
        for node, verdict in result.nodes_verdict.items():
            percent = "-" if verdict.input_percent is None else f"{verdict.input_percent:.1f} %"
            lines.append(f"  {node}: {percent} {CLASS_WORDS.get(verdict.class_, '')}")
    lines += _budget_lines(data)
    findings = data["recommendations"]
    lines.append("")
    lines.append(f"Findings: {len(findings)}" if findings else "Findings: none (nothing to change)")
    for number, item in enumerate(findings, 1):
        saving = "" if item["saving_s"] is None else f" [saves about {item['saving_s']:.2f} s]"
        lines.append(f"  {number}. ({item['id']}){saving} {item['text']}")
    if data["not_recorded"]:
        where = ("" if not_recorded_anywhere(result.trial)
                 else f" on {', '.join(data['not_recorded_nodes'])}")
        lines.append("")
        lines.append(f"Not recorded{where} (PyTorch profiler traces): "
                     + ", ".join(NOT_RECORDED_WORDS.get(k, k) for k in data["not_recorded"])
                     + "; shown as 'not recorded', never as zero.")
    lines.append("")
    return lines


def to_text(result: TrialAnalysis, max_rows: int = 10, what_if: list[dict] | tuple = ()) -> str:
    data = to_dict(result, what_if)
    trial = result.trial
    lines = _summary_lines(data, result)
    lines += [f"Trial {data['trial']} ({data['format']})",
             f"  span {iso_utc(trial.start_us)} .. {iso_utc(trial.end_us)}; nodes: {', '.join(data['nodes']) or '-'}",
             f"  files read {data['files']['read']}, skipped {len(data['files']['skipped'])}; "
             f"lines skipped {data['lines_skipped']}"]
    for skipped in data["files"]["skipped"][:max_rows]:
        lines.append(f"    skipped {skipped['path']}: {skipped['reason']}")
    for item in trial.report.files_with_skipped_lines[:max_rows]:
        lines.append(f"    lines skipped in {item.path}: {item.reason}")

    def section(title, part, unit_key="median_us"):
        lines.append("")
        if part["count"] is None:
            lines.append(f"{title}: not recorded")
            return
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
