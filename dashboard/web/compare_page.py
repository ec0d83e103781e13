"""The comparison of two runs on the page (`?trial=A&compare=B`): what it shows, and its
components. A is the trial the page shows (the run before a change), B the one compared
with it. The numbers come from dashboard.analysis.compare (the library's `compare`), the
words from the report's and the display's conventions.

    data = compare_data(view_a, view_b, comparison)     # plain values, figures as dicts
    compare_component(data)                             # the section's children
"""
from __future__ import annotations

import numpy as np
from dash import dcc, html

from ..analysis.compare import NOT_RECORDED, STATUS_WORDS, Comparison
from ..display import duration_s
from ..report import CLASS_WORDS, PART_WORDS, prediction_basis, saving_text, signed_duration
from . import figures, views



def _percent(value) -> str:
    return "-" if value is None else f"{value:.1f} %"


def _fraction(value) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _setting(value) -> str:
    return value if isinstance(value, str) else str(value)


def delta_rows(view_a: views.TrialView, view_b: views.TrialView, comparison: Comparison) -> list[dict]:
    """The deltas table: training time, wait and input-bound share of each run, and B - A."""
    va, vb = view_a.assessment.verdict, view_b.assessment.verdict
    delta = comparison.delta
    known = delta["training_s"] is not None
    rows = [
        {"key": "training_s", "label": "training time", "a": duration_s(va.training_s) if known else NOT_RECORDED,
         "b": duration_s(vb.training_s) if known else NOT_RECORDED,
         "change": signed_duration(delta["training_s"], va.training_s if known else None)},
        {"key": "wait_s", "label": "waiting for data (GetNext)",
         "a": duration_s(va.getnext_s) if known else NOT_RECORDED,
         "b": duration_s(vb.getnext_s) if known else NOT_RECORDED,
         "change": signed_duration(delta["wait_s"], va.getnext_s if known else None)},
        {"key": "input_percent", "label": "input-bound", "a": _percent(va.input_percent),
         "b": _percent(vb.input_percent),
         "change": NOT_RECORDED if delta["input_percent"] is None else f"{delta['input_percent']:+.1f} points"},
        {"key": "verdict", "label": "verdict", "a": CLASS_WORDS[va.class_ or "none"],
         "b": CLASS_WORDS[vb.class_ or "none"], "change": ""},
    ]
    return rows


def prediction_rows(comparison: Comparison) -> list[dict]:
    """A's what-if for B's settings beside what B measured (empty: nothing was predicted)."""
    predicted, achieved = comparison.predicted, comparison.achieved
    if predicted is None:
        return []
    training_gap = (None if achieved["training_s"] is None
                    else achieved["training_s"] - predicted["training_s"])
    return [
        {"key": "training_s", "label": "training time", "predicted": duration_s(predicted["training_s"]),
         "achieved": duration_s(achieved["training_s"]),
         "difference": signed_duration(training_gap, predicted["training_s"])},
        {"key": "wait_fraction", "label": "waiting, share of training",
         "predicted": _fraction(predicted["wait_fraction"]), "achieved": _fraction(achieved["wait_fraction"]),
         "difference": "-" if None in (predicted["wait_fraction"], achieved["wait_fraction"])
         else f"{100 * (achieved['wait_fraction'] - predicted['wait_fraction']):+.1f} points"},
    ]


def _batch_times_us(view: views.TrialView) -> np.ndarray:
    batches = view.analysis.batchtime.batches
    if batches.empty:
        return np.zeros(0)
    return batches["batch_time_s"].to_numpy(dtype="float64") * 1e6


def compare_data(view_a: views.TrialView, view_b: views.TrialView, comparison: Comparison) -> dict:
    """Everything the comparison section shows, as plain values and figure dicts."""
    # Both runs' budgets in one figure, A's bars above B's: one axis of seconds for both.
    budgets = ([{**row, "loader": f"A · {row['loader']}"} for row in views.budget_rows(view_a)]
               + [{**row, "loader": f"B · {row['loader']}"} for row in views.budget_rows(view_b)])
    return {
        "path_a": view_a.trial.path, "path_b": view_b.trial.path,
        "format_a": view_a.trial.format, "format_b": view_b.trial.format,
        "deltas": delta_rows(view_a, view_b, comparison),
        "settings": [{"node": c.node, "loader": c.loader, "key": c.key, "a": _setting(c.a), "b": _setting(c.b)}
                     for c in comparison.settings_changed],
        "budgets": figures.budget_figure_spec(budgets, PART_WORDS),
        "parts": [{"node": p.node, "loader": p.loader,
                   "parts": {part: (p.a.parts[part], p.b.parts[part]) for part in p.a.parts}}
                  for p in comparison.loaders if p.a is not None and p.b is not None],
        "getnext": figures.overlaid_distributions_spec(
            {"A": view_a.analysis.getnext.events["duration_us"].to_numpy(),
             "B": view_b.analysis.getnext.events["duration_us"].to_numpy()}, "GetNext duration"),
        "batchtime": figures.overlaid_distributions_spec(
            {"A": _batch_times_us(view_a), "B": _batch_times_us(view_b)}, "batch time"),
        "findings": [{"id": f.id, "loader": f.loader or "", "status": f.status, "saving_a": saving_text(f.saving_s_a),
                      "saving_b": saving_text(f.saving_s_b), "text": f.text_a or f.text_b or ""}
                     for f in comparison.findings],
        "predicted_change": views.change_text(comparison.predicted["change"]) if comparison.predicted else "",
        "predicted_basis": prediction_basis(comparison.predicted) if comparison.predicted else "",
        "prediction": prediction_rows(comparison),
        "note": comparison.note,
    }


# --- components ---------------------------------------------------------------------------------

def _graph(id_: str, figure: dict) -> dcc.Graph:
    return dcc.Graph(id=id_, figure=figure, config={"displaylogo": False, "showSendToCloud": False,
                                                    "displayModeBar": False})


def _deltas_table(id_: str, rows: list[dict]) -> html.Table:
    return html.Table(id=id_, className="compare-table", children=[
        html.Thead(html.Tr([html.Th(""), html.Th("A"), html.Th("B"), html.Th("change")])),
        html.Tbody([html.Tr(**{"data-key": row["key"]}, children=[
            html.Th(row["label"], scope="row"), html.Td(row["a"], className="compare-a number"),
            html.Td(row["b"], className="compare-b number"), html.Td(row["change"], className="compare-change number")])
            for row in rows])])


def compare_component(data: dict, ids) -> list:
    """The section's children; `ids`: layout.Ids."""
    settings = data["settings"]
    settings_block = html.Ul(id=ids.COMPARE_SETTINGS, className="compare-settings", children=[
        html.Li(**{"data-key": item["key"]}, children=[
            html.Code(item["key"]), f" {item['a']} → {item['b']} ",
            html.Span(f"({item['loader']} on {item['node']})", className="hint")]) for item in settings]
    ) if settings else html.P("No DataLoader setting differs (where both runs record it).", id=ids.COMPARE_SETTINGS,
                              className="hint")
    parts = []
    for item in data["parts"]:
        moved = [f"{PART_WORDS[p]} {duration_s(a)} → {duration_s(b)}" for p, (a, b) in item["parts"].items()
                 if abs(a) >= 0.0005 or abs(b) >= 0.0005]
        parts.append(html.Li([html.Strong(f"{item['loader']} on {item['node']}: "), "; ".join(moved) or "no wait"]))
    findings = data["findings"]
    prediction = data["prediction"]
    if prediction:
        predicted_block = [
            html.P(["A's what-if with ", html.Code(data["predicted_change"]), " (B's settings), beside what B "
                    "measured:"] if data["predicted_change"] else [data["predicted_basis"], ", beside what B measured:"],
                   className="hint"),
            html.Table(id=ids.COMPARE_PREDICTION, className="compare-table", children=[
                html.Thead(html.Tr([html.Th(""), html.Th("predicted"), html.Th("achieved"), html.Th("difference")])),
                html.Tbody([html.Tr(**{"data-key": row["key"]}, children=[
                    html.Th(row["label"], scope="row"), html.Td(row["predicted"], className="compare-predicted number"),
                    html.Td(row["achieved"], className="compare-achieved number"),
                    html.Td(row["difference"], className="compare-difference number")]) for row in prediction])])]
    else:
        predicted_block = [html.P(f"No prediction: {data['note']}.", id=ids.COMPARE_PREDICTION, className="hint")]
    return [
        html.P([html.Strong("A "), html.Code(data["path_a"]), f" ({data['format_a']})", html.Br(),
                html.Strong("B "), html.Code(data["path_b"]), f" ({data['format_b']})"], className="compare-runs"),
        _deltas_table(ids.COMPARE_DELTAS, data["deltas"]),
        html.H3("DataLoader settings changed", className="summary-heading"), settings_block,
        html.H3("Where the wait went", className="summary-heading"),
        html.Ul(parts, className="compare-parts") if parts else None,
        _graph(ids.COMPARE_BUDGET, data["budgets"]),
        html.Div(className="compare-columns", children=[
            html.Div(className="compare-column", children=[html.H4("GetNext, A and B"),
                                                           _graph(ids.COMPARE_GETNEXT, data["getnext"])]),
            html.Div(className="compare-column", children=[html.H4("Batch time, A and B"),
                                                           _graph(ids.COMPARE_BATCH, data["batchtime"])]),
        ]),
        html.H3(["Findings ", html.Span(str(len(findings)), className="badge count")], className="summary-heading"),
        html.Ul(id=ids.COMPARE_FINDINGS, className="compare-findings", children=[
            html.Li(className=f"compare-finding compare-{item['status']}",
                    **{"data-id": item["id"], "data-status": item["status"]}, children=[
                        html.Span(STATUS_WORDS[item["status"]], className="compare-status"), " ",
                        html.Code(item["id"]), " ",
                        html.Span(f"({item['loader']})" if item["loader"] else "", className="hint"), " ",
                        html.Span("; ".join(f"{run}: {text}" for run, text in (("A", item["saving_a"]),
                                                                                 ("B", item["saving_b"])) if text),
                                  className="saving")])
            for item in findings]) if findings else html.P("No findings in either run.", id=ids.COMPARE_FINDINGS,
                                                            className="hint"),
        html.H3("Predicted against achieved", className="summary-heading"), *predicted_block,
    ]
