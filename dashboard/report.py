"""Results as the `analyze --json` object and as a readable text report."""
from __future__ import annotations

from . import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)

import math

import pandas as pd

from .api import TrialAnalysis
from .display import duration_s, duration_us, iso_utc, prediction_text, worker_text  # noqa: F401  (iso_utc: the report's moments, re-exported)


def _num(value):
    if value is None or (isinstance(value, float) and not math.isfinite(value)) or value is pd.NA:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _int(value, default=-1):
    return default if value is None or pd.isna(value) else int(value)


def _records(frame: pd.DataFrame, spec: dict) -> list[dict]:
    """frame rows as dicts: spec maps output key -> (column, converter). Converted a column at a
    time, then zipped into rows: a dict built per row from a named tuple took 0.5 s for the 60,000
    outliers of a 3M-GetNext trial."""
    converted = [list(map(conv, frame[column].tolist())) for column, conv in spec.values()]
    return [dict(zip(spec, row)) for row in zip(*converted)]


def _int_or_none(value):
    return None if value is None or pd.isna(value) else int(value)


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
    return {"input_percent": _num(verdict.input_percent), "class": verdict.class_, "basis": verdict.basis,
            # the seconds the percentage is of (null without a verdict: nothing was timed)
            **{key: None if verdict.input_percent is None else _num(getattr(verdict, key))
               for key in ("getnext_s", "training_s")}}


def recommendation_dict(item) -> dict:
    return {"id": item.id, "text": item.text, "evidence": _jsonable(item.evidence),
            "saving_s": _num(item.saving_s), "change": _jsonable(item.change),
            "predicted": _jsonable(item.predicted)}


def budget_dict(item) -> dict:
    return {"node": item.node, "process": item.process, "loader": item.loader, "training_s": _num(item.training_s),
            "wait_s": _num(item.wait_s), "parts": {k: _num(v) for k, v in item.parts.items()},
            "bound": item.bound, "evidence": _jsonable(item.evidence),
            "windows": {part: [{"start_us": s, "end_us": e} for s, e in spans]
                        for part, spans in item.windows.items()}}


def what_if_dict(item) -> dict:
    return {"node": item.node, "process": item.process, "loader": item.loader, "change": _jsonable(item.change),
            "now": _jsonable(item.now), "predicted": _jsonable(item.predicted), "note": item.note}


def not_recorded_anywhere(trial) -> bool:
    """True when no process's profiler recorded what `trial.not_recorded` names (a Kineto-only
    trial): counts of those are unknown (null), not zero."""
    if not trial.not_recorded:
        return False
    return {p.id for p in trial.processes} <= set(trial.kineto_processes)


def process_dict(process) -> dict:
    return {"node": process.node, "pid": process.pid, "rank": process.rank, "local_rank": process.local_rank,
            "id": process.id}


def to_dict(result: TrialAnalysis, what_if: list[dict] | tuple = ()) -> dict:
    """The `analyze --json` object; `what_if` adds the predictions of those changes (one
    entry per training loader per change) to the recommendations' own."""
    trial, init, workers, getnext, batch = (result.trial, result.initialization, result.workers,
                                            result.getnext, result.batchtime)
    duration = {"start_us": ("start_us", int), "end_us": ("end_us", int),
                "duration_us": ("duration_us", lambda v: _num(float(v)))}
    unknown = not_recorded_anywhere(trial)
    processes = trial.processes
    where = {"node": ("node", str), "rank": ("rank", _int_or_none), "pid": ("pid", _int)}
    return {
        "trial": trial.path,
        "format": trial.format,
        "verdict": verdict_dict(result.verdict),
        "nodes_verdict": {node: verdict_dict(v) for node, v in result.nodes_verdict.items()},
        "processes_verdict": {process: verdict_dict(v) for process, v in result.processes_verdict.items()},
        "recommendations": [recommendation_dict(r) for r in result.recommendations],
        "budget": [budget_dict(b) for b in result.budget],
        "what_if": [{**what_if_dict(w), "asked": True} for change in what_if for w in result.what_if(change)]
        + [{**what_if_dict(w), "asked": False} for w in result.assessment.what_if],
        # What the trial's profiler did not record (Kineto: no iterator creation, no worker
        # processes, no worker ids), and by which processes, on which hosts.
        "not_recorded": list(trial.not_recorded),
        "not_recorded_processes": list(trial.kineto_processes),
        "not_recorded_nodes": sorted({p.node for p in processes if p.id in trial.kineto_processes}),
        "nodes": list(trial.nodes),  # the hosts
        "processes": [process_dict(p) for p in processes],
        "files": trial.report.to_dict(),
        "lines_skipped": trial.report.lines_skipped,
        # Values of kept events read as missing: not of their field's type.
        "values_ignored": trial.report.values_ignored,
        # The files with skipped lines or ignored values, and what in each.
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
            "outliers": _records(init.outliers, {**duration, **where, "type": ("type", str)}),
        },
        "workers": {
            "count": None if unknown else workers.count, "median_us": _num(workers.median_us),
            "max_us": _num(workers.max_us),
            "outliers": _records(workers.outliers, {**duration, "worker_id": ("worker_id", _int_or_none), **where}),
        },
        "getnext": {
            "count": getnext.count, "median_us": _num(getnext.median_us), "max_us": _num(getnext.max_us),
            "outliers": _records(getnext.outliers, {**duration, "worker_id": ("worker_id", _int_or_none), **where}),
        },
        "batchtime": {
            "count": batch.count, "median_s": _num(batch.median_s),
            "outliers": _records(batch.outliers, {
                "start_us": ("start_us", int), "end_us": ("end_us", int),
                "batch_time_s": ("batch_time_s", float), **where, "worker_id": ("worker_id", _int_or_none)}),
        },
    }


def saving_text(saving_s: float | None) -> str:
    """A finding's saving, as the report and the page write it ("" when it has none)."""
    return "" if saving_s is None else f"saves about {duration_s(saving_s)}"


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
              "tail": "slow samples", "main_process": "in the main process",
              "contention": "host contention", "residual": "unexplained"}
BOUND_WORDS = {"latency": "workers wait (latency-bound)", "cpu": "workers compute (CPU-bound)",
               "unknown": "what bounds the workers is not recorded"}


def _percent(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f} %" if whole > 0 else "-"


def _who(row: dict) -> str:
    """The process of an outlier: 'rank 3 (pid 812) on algo-2', or 'pid 812 on algo-2'."""
    rank = f"rank {row['rank']} (pid {row['pid']})" if row.get("rank") is not None else f"pid {row['pid']}"
    return f"{rank} on {row['node']}"


def _where(data: dict, item: dict) -> str:
    """A budget's or a what-if's process as the text names it: its host, and its rank (else
    pid) where the host has several processes."""
    process = next((p for p in data["processes"] if p["id"] == item["process"]), None)
    if process is None or sum(p["node"] == item["node"] for p in data["processes"]) <= 1:
        return item["node"]
    return f"{item['node']} " + (f"rank {process['rank']}" if process["rank"] is not None else f"pid {process['pid']}")


def no_findings_reason(notes) -> str:
    """Why a trial has no findings: nothing to change, or what its budgets say the trial does
    not show (budget.UNSEEN_NOTE: a trace that saw no iterator begin)."""
    reasons = list(dict.fromkeys(note for note in notes if note))
    return "; ".join(reasons) if reasons else "nothing to change in the input pipeline"


def _budget_lines(data: dict) -> list[str]:
    """Where the wait went, per training loader."""
    lines = []
    for item in data["budget"]:
        lines.append("")
        lines.append(f"Wait budget of {item['loader']} on {_where(data, item)}: {duration_s(item['wait_s'])} of "
                     f"{duration_s(item['training_s'])} of training "
                     f"({_percent(item['wait_s'], item['training_s'])}); {BOUND_WORDS[item['bound']]}")
        for part, seconds in sorted(item["parts"].items(), key=lambda kv: -abs(kv[1])):
            if abs(seconds) >= 0.0005:
                lines.append(f"  {PART_WORDS[part]:<20} {duration_s(seconds):>10}  "
                             f"{_percent(seconds, item['training_s']):>7} of training")
    asked = [w for w in data["what_if"] if w["change"] and w.get("asked")]
    for item in asked:
        change = ", ".join(f"{k}={v}" for k, v in item["change"].items())
        if item["predicted"] is None:
            lines.append(f"What if {change} ({item['loader']} on {_where(data, item)}): {item['note']}")
            continue
        lines.append(f"What if {change} ({item['loader']} on {_where(data, item)}): "
                     + prediction_text(item["now"], item["predicted"]))
    return lines


def _summary_lines(data: dict, result: TrialAnalysis) -> list[str]:
    """The verdict and the findings: what the report says first."""
    lines = [f"Verdict: {verdict_text(result.verdict)}"]
    processes = {p["id"]: p for p in data["processes"]}
    if len(result.nodes_verdict) > 1 or len(result.processes_verdict) > 1:
        for node, verdict in result.nodes_verdict.items():
            percent = "-" if verdict.input_percent is None else f"{verdict.input_percent:.1f} %"
            lines.append(f"  {node}: {percent} {CLASS_WORDS.get(verdict.class_, '')}")
            for process_id, own in result.processes_verdict.items():
                process = processes.get(process_id)
                if process is None or process["node"] != node or len(result.processes_verdict) <= 1:
                    continue
                who = f"rank {process['rank']}" if process["rank"] is not None else f"pid {process['pid']}"
                percent = "-" if own.input_percent is None else f"{own.input_percent:.1f} %"
                lines.append(f"    {who}: {percent} {CLASS_WORDS.get(own.class_, '')}")
    lines += _budget_lines(data)
    findings = data["recommendations"]
    lines.append("")
    lines.append(f"Findings: {len(findings)}" if findings else
                 f"Findings: none ({no_findings_reason(item['evidence'].get('no_findings_reason') for item in data['budget'])})")
    for number, item in enumerate(findings, 1):
        saving = "" if item["saving_s"] is None else f" [{saving_text(item['saving_s'])}]"
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
             f"  span {iso_utc(trial.start_us)} .. {iso_utc(trial.end_us)}; nodes: {', '.join(data['nodes']) or '-'}; "
             f"processes: {len(data['processes'])}",
             f"  files read {data['files']['read']}, skipped {len(data['files']['skipped'])}; "
             f"lines skipped {data['lines_skipped']}"
             + (f", values ignored {data['values_ignored']}" if data["values_ignored"] else "")]
    for skipped in data["files"]["skipped"][:max_rows]:
        lines.append(f"    skipped {skipped['path']}: {skipped['reason']}")
    for item in trial.report.files_with_skipped_lines[:max_rows]:
        what = "lines skipped" if trial.report.lines_skipped_by_path.get(item.path) else "values ignored"
        lines.append(f"    {what} in {item.path}: {item.reason}")

    def section(title, part, unit_key="median_us"):
        lines.append("")
        if part["count"] is None:
            lines.append(f"{title}: not recorded")
            return
        lines.append(f"{title}: {part['count']} (median {duration_us(part.get('median_us'))}, "
                     f"max {duration_us(part.get('max_us'))})")

    init = data["initialization"]
    section("Iterator initializations", init)
    for it in init["iterators"]:
        lines.append(f"  {it['type']}: num_workers={it['num_workers']} pin_memory={it['pin_memory']} "
                     f"initialized {it['count']}x, median {duration_us(it['median_us'])}")
    for key, title in (("workers", "Worker processes"), ("getnext", "GetNext calls")):
        section(title, data[key])
    for key, title in (("initialization", "initialization"), ("workers", "worker"), ("getnext", "GetNext")):
        rows = data[key]["outliers"]
        if rows:
            lines.append("")
            lines.append(f"{title} outliers (> {result.dataloader.outlier_factor:g} x median): {len(rows)}")
            for row in rows[:max_rows]:
                extra = f" {worker_text(row['worker_id'])}" if "worker_id" in row else ""
                lines.append(f"  {iso_utc(row['start_us'])} .. {iso_utc(row['end_us'])} "
                             f"{duration_us(row['duration_us'])}{extra} {_who(row)}")
    batch = data["batchtime"]
    lines.append("")
    lines.append(f"Batch time: {batch['count']} batches, median {duration_s(batch['median_s'])}")
    if batch["outliers"]:
        lines.append(f"batch time outliers: {len(batch['outliers'])}")
        for row in batch["outliers"][:max_rows]:
            lines.append(f"  {iso_utc(row['start_us'])} .. {iso_utc(row['end_us'])} "
                         f"{duration_s(row['batch_time_s'])} {_who(row)}")
    return "\n".join(lines)


# --- two runs compared (`app.py compare A B`) ---------------------------------------------------

def _setting_json(value):
    return value if isinstance(value, str) else _jsonable(value)


def comparison_dict(comparison) -> dict:
    """A Comparison's own keys of the `compare --json` object (without the two analyses)."""
    return {
        "delta": {key: _num(value) for key, value in comparison.delta.items()},
        "settings_changed": [{"node": c.node, "loader": c.loader, "key": c.key, "a": _setting_json(c.a),
                              "b": _setting_json(c.b)} for c in comparison.settings_changed],
        "findings": [{"id": f.id, "status": f.status, "saving_s_a": _num(f.saving_s_a),
                      "saving_s_b": _num(f.saving_s_b)} for f in comparison.findings],
        "predicted": None if comparison.predicted is None else {
            "change": _jsonable(comparison.predicted["change"]),
            "fixes": _jsonable(comparison.predicted["fixes"]),
            "training_s": _num(comparison.predicted["training_s"]),
            "wait_fraction": _num(comparison.predicted["wait_fraction"])},
        "achieved": {key: _num(value) for key, value in comparison.achieved.items()},
    }


def compare_dict(a: TrialAnalysis, b: TrialAnalysis, comparison=None) -> dict:
    """The `app.py compare A B --json` object: each run's `analyze --json` object, then B
    against A (dashboard.api.compare, computed here unless given)."""
    if comparison is None:
        from .api import compare

        comparison = compare(a, b)
    return {"a": to_dict(a), "b": to_dict(b), **comparison_dict(comparison)}


def change_percent(delta: float | None, before: float | None) -> float | None:
    """A change as a percentage of its value before (None where there is no base)."""
    if delta is None or before is None or before == 0:
        return None
    return 100.0 * delta / before


def signed_duration(delta: float | None, before: float | None = None) -> str:
    """A change of a duration in seconds, with its share of the value before:
    '-2,340 ms (-45.1 %)', '+120 ms', or 'not recorded'."""
    if delta is None:
        return "not recorded"
    percent = change_percent(delta, before)
    return ("+" if delta > 0 else "") + duration_s(delta) + ("" if percent is None else f" ({percent:+.1f} %)")


def compare_text(a: TrialAnalysis, b: TrialAnalysis, comparison=None) -> str:
    """The readable form of `compare`: B against A, then each run's summary."""
    from .analysis.compare import STATUS_WORDS
    if comparison is None:
        from .api import compare

        comparison = compare(a, b)
    data = compare_dict(a, b, comparison)
    va, vb = a.verdict, b.verdict
    delta = data["delta"]
    lines = [f"Comparing B {b.trial.path} ({b.trial.format}) against A {a.trial.path} ({a.trial.format})", "",
             f"A: {verdict_text(va)}", f"B: {verdict_text(vb)}"]
    known = delta["training_s"] is not None
    lines.append(f"Training time: {duration_s(va.training_s if known else None)} -> "
                 f"{duration_s(vb.training_s if known else None)}: "
                 f"{signed_duration(delta['training_s'], va.training_s if known else None)}")
    lines.append(f"Waiting for data (GetNext): {duration_s(va.getnext_s if known else None)} -> "
                 f"{duration_s(vb.getnext_s if known else None)}: "
                 f"{signed_duration(delta['wait_s'], va.getnext_s if known else None)}")
    lines.append("Input-bound: " + ("not recorded" if delta["input_percent"] is None else
                                    f"{va.input_percent:.1f} % -> {vb.input_percent:.1f} % "
                                    f"({delta['input_percent']:+.1f} points)"))
    lines.append("")
    changed = data["settings_changed"]
    lines.append("DataLoader settings changed:" if changed else
                 "DataLoader settings changed: none (where both runs record them)")
    for item in changed:
        lines.append(f"  {item['loader']} on {item['node']}: {item['key']} {str(item['a'])} -> "
                     f"{str(item['b'])}")
    for pair in comparison.loaders:
        if pair.a is not None and pair.b is not None:
            parts = [f"{PART_WORDS[p]} {duration_s(pair.a.parts[p])} -> {duration_s(pair.b.parts[p])}"
                     for p in pair.a.parts if abs(pair.a.parts[p]) >= 0.0005 or abs(pair.b.parts[p]) >= 0.0005]
            lines.append(f"  wait budget of {pair.loader} on {pair.node}: " + ("; ".join(parts) or "no wait"))
    lines.append("")
    lines.append("Findings:" if data["findings"] else "Findings: none in either run")
    for item in data["findings"]:
        savings = ", ".join(f"{saving_text(value)} in {run}" for run, value in
                            (("A", item["saving_s_a"]), ("B", item["saving_s_b"])) if value is not None)
        lines.append(f"  {STATUS_WORDS[item['status']]:<10} ({item['id']})" + (f" [{savings}]" if savings else ""))
    lines.append("")
    predicted, achieved = data["predicted"], data["achieved"]
    if predicted is None:
        lines.append(f"Predicted: none ({comparison.note})")
    else:
        lines.append(f"Predicted by {prediction_basis(predicted)}: training {duration_s(predicted['training_s'])}, "
                     f"waiting {_fraction_text(predicted['wait_fraction'])} of training")
    lines.append(f"Achieved by B: training {duration_s(achieved['training_s'])}, waiting "
                 f"{_fraction_text(achieved['wait_fraction'])} of training")
    lines += ["", "=== A ==="] + _summary_lines(data["a"], a) + ["=== B ==="] + _summary_lines(data["b"], b)
    return "\n".join(lines)


def prediction_basis(predicted: dict) -> str:
    """What a comparison's prediction is of: "A's what-if with num_workers=8", or A's findings
    for the slow workers B no longer has."""
    if predicted["change"]:
        return "A's what-if with " + ", ".join(f"{k}={v}" for k, v in predicted["change"].items())
    return "A's " + "; ".join(f"{fix['finding']} prediction (worker {fix['worker_id']} of {fix['loader']} on "
                              f"{fix['node']} made as fast as the others)" for fix in predicted["fixes"])


def _fraction_text(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"

