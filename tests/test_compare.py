"""Comparing two runs (`app.py compare A B`, `?trial=A&compare=B`) on two real CPU training runs.

The runs are tests/scenario_job.py's startup job under the collector, run twice in fresh
processes: A as planted (workers re-created every epoch, `persistent_workers=False`), B with
the change A's finding proposes (`persistent_workers=True`). Each keeps its own books from
inside its training loop (every next() it waited, each epoch's training time); the expected
numbers below come from those books, never from the code under test. The tolerances are
those of tests/test_diagnosis_scenarios.py, whose comments give the measurements behind them.
"""
from __future__ import annotations

import glob
import json
import os
import re
import statistics
import subprocess
import sys

import pytest

from tests.conftest import ROOT, free_port
from test_diagnosis_scenarios import (TRAINING_RELATIVE_TOLERANCE, WAIT_FRACTION_TOLERANCE,
                                      WAIT_TOLERANCE_PER_BATCH_S, Run, fraction_tolerance, training_tolerance_s,
                                      wait_tolerance_s)

pytestmark = pytest.mark.torch

CHANGE = {"persistent_workers": True}
# B must show the change, else the comparison has nothing to find: persistent workers took the
# startup job to 0.25-0.34 of its training quiet and 0.31-0.39 with two `yes` running (the
# repeated runs in test_diagnosis_scenarios.py's docstring).
FIXED_TRAINING_RATIO_MAX = 0.75
COMPARE_KEYS = {"a", "b", "delta", "settings_changed", "findings", "predicted", "achieved"}
# The page writes durations to 4 significant digits (dashboard/display.py): 0.05 % of a value.
DISPLAY_RELATIVE = 5e-4


class Runs:
    def __init__(self, factory):
        self.a = Run(factory.mktemp("startup-planted"), "startup", None)
        self.b = Run(factory.mktemp("startup-persistent"), "startup", CHANGE)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs = Runs(tmp_path_factory)
    ratio = runs.b.books["training_s"] / runs.a.books["training_s"]
    assert ratio <= FIXED_TRAINING_RATIO_MAX, (
        f"B trained {ratio:.2f}x as long as A: the machine is too busy for the change to show "
        f"(see FIXED_TRAINING_RATIO_MAX)")
    return runs


@pytest.fixture(scope="module")
def compared(runs):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "compare", runs.a.trial, runs.b.trial,
                           "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1  # one JSON object
    return json.loads(done.stdout)


def books_startup_s(run: Run) -> tuple[float, float]:
    """What each epoch's first round of batches (one per worker) waited beyond that epoch's
    steady wait (the median of its other batches), from the loop's books; and how far the
    budget may be from it: the trial's timing of those batches (WAIT_TOLERANCE_PER_BATCH_S
    each) and the budget's steady wait, taken per worker rather than per epoch (the two differ
    by less than the steady wait itself)."""
    settings, waits = run.books["settings"], run.books["waits_s"]
    workers, batches = settings["num_workers"], settings["batches"]
    startup, steady_max = 0.0, 0.0
    for epoch in range(run.books["epochs"]):
        epoch_waits = waits[epoch * batches:(epoch + 1) * batches]
        steady = statistics.median(epoch_waits[workers:])
        steady_max = max(steady_max, steady)
        startup += sum(max(wait - steady, 0.0) for wait in epoch_waits[:workers])
    first_round = workers * run.books["epochs"]
    return startup, first_round * (WAIT_TOLERANCE_PER_BATCH_S + steady_max)


def training_delta_tolerance_s(runs: Runs) -> float:
    """How far B - A of training time may be from the books': each run's own tolerance."""
    return training_tolerance_s(runs.a) + training_tolerance_s(runs.b)


def wait_delta_tolerance_s(runs: Runs) -> float:
    return wait_tolerance_s(runs.a) + wait_tolerance_s(runs.b)


def test_compare_json_says_what_changed_and_that_startup_dropped(runs, compared):
    a_books, b_books = runs.a.books, runs.b.books
    assert set(compared) == COMPARE_KEYS
    # Each run's part is its `analyze --json` object.
    for key, run in (("a", runs.a), ("b", runs.b)):
        assert compared[key]["trial"] == run.trial and compared[key]["verdict"] == run.result.to_dict()["verdict"]
    # The deltas, B - A, against the two loops' own books.
    delta = compared["delta"]
    assert set(delta) == {"training_s", "wait_s", "input_percent"}
    assert delta["training_s"] == pytest.approx(b_books["training_s"] - a_books["training_s"],
                                                abs=training_delta_tolerance_s(runs))
    assert delta["wait_s"] == pytest.approx(b_books["wait_s"] - a_books["wait_s"], abs=wait_delta_tolerance_s(runs))
    books_percent = 100 * (runs.b.wait_fraction - runs.a.wait_fraction)
    assert delta["input_percent"] == pytest.approx(
        books_percent, abs=100 * (fraction_tolerance(runs.a) + fraction_tolerance(runs.b)))
    # One setting changed, read from the collector's init events.
    assert compared["settings_changed"] == [{"node": runs.a.result.budget[0].node,
                                             "loader": "_MultiProcessingDataLoaderIter",
                                             "key": "persistent_workers", "a": False, "b": True}]
    # The start-up part of the wait: what the books say each run's first rounds waited.
    (budget_a,), (budget_b,) = compared["a"]["budget"], compared["b"]["budget"]
    for budget, run in ((budget_a, runs.a), (budget_b, runs.b)):
        expected, tolerance = books_startup_s(run)
        assert budget["parts"]["startup"] == pytest.approx(expected, abs=tolerance), run.folder
    assert budget_b["parts"]["startup"] < budget_a["parts"]["startup"] / 2  # 8 starts -> 1
    # The finding that proposed the change is resolved; its saving was A's.
    statuses = {item["id"]: item for item in compared["findings"]}
    assert set(compared["findings"][0]) == {"id", "status", "saving_s_a", "saving_s_b"}
    persistent = statuses["persistent_workers"]
    finding_a = next(r for r in runs.a.result.recommendations if r.id == "persistent_workers")
    assert persistent == {"id": "persistent_workers", "status": "resolved", "saving_s_a": finding_a.saving_s,
                          "saving_s_b": None}
    assert {item["status"] for item in compared["findings"]} <= {"resolved", "remaining", "new"}


def test_predicted_and_achieved_both_appear_and_agree(runs, compared):
    predicted, achieved = compared["predicted"], compared["achieved"]
    assert set(predicted) == {"change", "fixes", "training_s", "wait_fraction"} and set(achieved) == {
        "training_s", "wait_fraction"}
    assert predicted["change"] == CHANGE  # B's settings, replayed on A
    assert predicted["fixes"] == []  # (a setting changed: no finding's fix of the job itself is predicted)
    # Predicted: A's what-if for that change; achieved: what B measured, as its books have it.
    b_books = runs.b.books
    assert achieved["training_s"] == pytest.approx(b_books["training_s"], abs=training_tolerance_s(runs.b))
    assert achieved["wait_fraction"] == pytest.approx(runs.b.wait_fraction, abs=fraction_tolerance(runs.b))
    assert predicted["wait_fraction"] == pytest.approx(runs.b.wait_fraction, abs=WAIT_FRACTION_TOLERANCE)
    assert predicted["training_s"] == pytest.approx(b_books["training_s"], rel=TRAINING_RELATIVE_TOLERANCE)
    # The same prediction the finding made in A (one what-if machinery).
    finding_a = next(r for r in runs.a.result.recommendations if r.id == "persistent_workers")
    assert finding_a.change == CHANGE
    assert predicted["training_s"] == pytest.approx(finding_a.predicted["training_s"], abs=1e-6)


def test_compare_text_names_the_change_the_finding_and_both_results(runs, compared):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "compare", runs.a.trial, runs.b.trial],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "persistent_workers False -> True" in text
    assert re.search(r"resolved\s+\(persistent_workers\)", text)
    assert "Predicted by A's what-if with persistent_workers=True" in text and "Achieved by B" in text
    assert text.index("=== A ===") < text.index("=== B ===")


def test_compare_errors_are_one_line(runs, tmp_path):
    done = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "compare", runs.a.trial,
                           str(tmp_path / "missing"), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "missing" in done.stderr and "Traceback" not in done.stderr


# --- the page -------------------------------------------------------------------------------------

UNITS_S = {"µs": 1e-6, "ms": 1e-3, "s": 1.0}


def seconds_of(text: str) -> float:
    """A duration as the page writes it ('-2,990 ms (-74.0 %)', '1,049 ms', '12.35 s'), in seconds."""
    found = re.match(r"\s*([+-]?[\d,]*\.?\d+)\s*(µs|ms|s)\b", text)
    assert found, text
    return float(found.group(1).replace(",", "")) * UNITS_S[found.group(2)]


def percent_of(text: str) -> float:
    found = re.search(r"\(([+-]?\d+\.\d) %\)", text)
    assert found, text
    return float(found.group(1))


@pytest.mark.browser
def test_the_compare_url_shows_the_deltas_findings_and_prediction(dash_duo, runs, compared, tmp_path):
    from dashboard.web.server import ServerOptions, create_app
    from test_web_browser import wait_until

    app = create_app(ServerOptions(trial=runs.a.trial, cache_dir=str(tmp_path / "cache"),
                                   data_roots=[str(runs.a.folder), str(runs.b.folder)]))
    dash_duo.start_server(app, port=free_port())
    dash_duo.driver.get(f"{dash_duo.server_url}/?trial={runs.a.trial}&compare={runs.b.trial}")
    dash_duo.wait_for_element("#compare:not(.hidden) #compare-deltas", timeout=60)

    def cell(table: str, key: str, column: str) -> str:
        return dash_duo.find_element(f"#{table} tr[data-key='{key}'] .{column}").text

    a_books, b_books = runs.a.books, runs.b.books
    # Training time and wait of each run, and the change: the books', to the tolerances and the
    # page's rounding.
    for key, tolerance_of in (("training_s", training_tolerance_s), ("wait_s", wait_tolerance_s)):
        tol_a, tol_b = tolerance_of(runs.a), tolerance_of(runs.b)
        before, want = a_books[key], b_books[key] - a_books[key]
        shown = cell("compare-deltas", key, "compare-change")
        assert seconds_of(shown) == pytest.approx(want, abs=tol_a + tol_b + DISPLAY_RELATIVE * abs(want)), shown
        # The change in percent of A's value: as far from the books' as the worst corner of the
        # two tolerances moves it, plus the page's rounding to 0.1.
        worst = max(abs(100 * (want + s * (tol_a + tol_b)) / (before + r * tol_a) - 100 * want / before)
                    for s in (-1, 1) for r in (-1, 1))
        assert percent_of(shown) == pytest.approx(100 * want / before, abs=worst + 0.05), shown
        assert seconds_of(cell("compare-deltas", key, "compare-a")) == pytest.approx(
            before, abs=tol_a + DISPLAY_RELATIVE * before)
        assert seconds_of(cell("compare-deltas", key, "compare-b")) == pytest.approx(
            b_books[key], abs=tol_b + DISPLAY_RELATIVE * b_books[key])
    verdicts = text_of_row(dash_duo, "compare-deltas", "verdict")
    assert verdicts.count("input-bound") == 2, verdicts  # both runs' verdicts named
    # Findings marked: the one the change fixed is resolved.
    finding = dash_duo.find_element("#compare-findings li[data-id='persistent_workers']")
    assert finding.get_attribute("data-status") == "resolved" and "resolved" in finding.text
    assert dash_duo.find_element("#compare-settings li[data-key='persistent_workers']").text.startswith(
        "persistent_workers False → True")
    # Predicted against achieved, side by side.
    achieved = seconds_of(cell("compare-prediction", "training_s", "compare-achieved"))
    predicted = seconds_of(cell("compare-prediction", "training_s", "compare-predicted"))
    assert achieved == pytest.approx(b_books["training_s"],
                                     abs=training_tolerance_s(runs.b) + DISPLAY_RELATIVE * b_books["training_s"])
    assert predicted == pytest.approx(b_books["training_s"], rel=TRAINING_RELATIVE_TOLERANCE)
    assert predicted == pytest.approx(compared["predicted"]["training_s"], rel=DISPLAY_RELATIVE)
    # The distributions, overlaid: one trace per run on each.
    for graph in ("compare-getnext", "compare-batchtime"):
        names = wait_until(lambda: dash_duo.driver.execute_script(
            "const gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
            "return gd && gd._fullData ? gd._fullData.map((t) => t.meta) : null;", graph), message=graph)
        assert names == ["A", "B"]
    # The URL keeps the comparison.
    wait_until(lambda: "compare=" in dash_duo.driver.current_url, message="compare= in the URL")
    assert dash_duo.find_element("#compare-path").get_attribute("value") == runs.b.trial
    assert dash_duo.find_element("#error-message").text == "" and dash_duo.find_element("#compare-error").text == ""


def text_of_row(dash_duo, table: str, key: str) -> str:
    return dash_duo.find_element(f"#{table} tr[data-key='{key}']").text


def raw_init_settings(trial: str) -> dict:
    """The DataLoader settings the collector wrote on the trial's iterator initializations, read
    straight from its files (the last init of the multi-process loader)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(trial, "framework", "**", "*.json"), recursive=True)):
        with open(path) as handle:
            text = handle.read().strip().rstrip(",")
        records = json.loads(text if text.endswith("]") else text + "]")
        for record in records:
            if record.get("ph") == "X" and record["name"] == "_MultiProcessingDataLoaderIter.__init__":
                found = {key: record["args"][key] for key in SETTINGS if key in record["args"]}
    return found


SETTINGS = ("num_workers", "pin_memory", "prefetch_factor", "in_order", "persistent_workers")


def test_a_kineto_trace_compares_where_both_record_and_says_not_recorded_for_the_rest(runs, tmp_path):
    from test_web_units import record_kineto_trace

    record_kineto_trace(tmp_path / "trace")  # a real torch.profiler run: a 2-worker loader, 2 epochs
    done = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "compare", runs.a.trial,
                           str(tmp_path / "trace"), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["a"]["format"], data["b"]["format"]) == ("smdebug", "kineto")
    # Both record GetNext and training time: the deltas are numbers.
    assert all(isinstance(data["delta"][key], (int, float)) for key in ("training_s", "wait_s", "input_percent"))
    # The trace records none of the DataLoader's settings: each the collector recorded in A is
    # listed as "not recorded" in B, nothing is compared, nothing predicted.
    recorded = raw_init_settings(runs.a.trial)
    assert set(recorded) == set(SETTINGS)
    assert [(c["loader"], c["key"], c["a"], c["b"]) for c in data["settings_changed"]] == [
        ("_MultiProcessingDataLoaderIter", key, recorded[key], "not recorded") for key in SETTINGS]
    assert data["predicted"] is None
    assert data["achieved"]["training_s"] > 0
