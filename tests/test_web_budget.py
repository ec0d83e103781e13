"""The wait budget and the what-if on the page: in headless Chromium on the bundled sample
(real clicks and typing), and the view and figure functions behind them.

Expected numbers come from `dashboard.analyze(SAMPLE)` computed here (the budget's parts,
its windows, the what-if's predictions), never from the page's own code. Run with `--headless`.
"""
from __future__ import annotations

import math
import os
import time

import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

import dashboard
from dashboard.analysis.diagnosis import PARTS
from dashboard.display import duration_s
from dashboard.report import PART_WORDS
from dashboard.web import figures, layout, views
from dashboard.web.server import SAMPLE_TRIAL, ServerOptions, create_app
from tests.conftest import free_port
from test_web_browser import (PLOTLY_DATE_US, assert_no_traceback, band_ms, scroll_to, text,
                              wait_until, window_range)
from test_web_units import by_id, component_text, find_components, with_margin

needs_sample = pytest.mark.skipif(not os.path.isdir(SAMPLE_TRIAL), reason="the bundled sample trial is missing")


@pytest.fixture(scope="module")
def sample():
    """The analysis of the bundled sample, as the library gives it (the page must agree)."""
    return dashboard.analyze(SAMPLE_TRIAL)


# --- in the browser -----------------------------------------------------------------------------

def start_sample(dash_duo, tmp_path):
    app = create_app(ServerOptions(cache_dir=str(tmp_path / "cache")))
    dash_duo.start_server(app, port=free_port())
    wait_until(lambda: budget_traces(dash_duo.driver), timeout=60, message="the budget's bars")
    return app


def budget_traces(driver) -> list:
    """The budget figure's bar traces as the browser holds them: meta (the part), x, customdata."""
    return driver.execute_script("""
        const gd = document.querySelector('#budget-graph .js-plotly-plot');
        if (!gd || !gd.data) { return []; }
        return gd.data.filter((t) => t.type === 'bar').map((t) => ({meta: t.meta, x: Array.from(t.x),
                                                                    customdata: t.customdata}));
    """)


def what_if_traces(driver) -> list:
    return driver.execute_script("""
        const gd = document.querySelector('#what-if-graph .js-plotly-plot');
        if (!gd || !gd.data) { return []; }
        return gd.data.map((t) => ({meta: t.meta, x: Array.from(t.x), y: Array.from(t.y),
                                    customdata: t.customdata}));
    """)


def bar_element(dash_duo, trace: int, row: int):
    """The drawn bar of a budget trace for a row (plotly draws one path per point)."""
    traces = dash_duo.find_elements("#budget-graph .barlayer .trace")
    return traces[trace].find_elements("css selector", ".point")[row]


def click_bar(dash_duo, trace: int, row: int) -> None:
    bar = bar_element(dash_duo, trace, row)
    scroll_to(dash_duo.driver, bar)
    ActionChains(dash_duo.driver).move_to_element(bar).pause(0.2).click().perform()


def type_into(dash_duo, element_id: str, value: str) -> None:
    """Replace an input's text as a user does: select all, then type (or delete)."""
    box = dash_duo.find_element(f"#{element_id}")
    scroll_to(dash_duo.driver, box)
    box.click()
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(value if value else Keys.DELETE)


def result_lines(dash_duo) -> dict:
    return {e.get_attribute("data-key"): " ".join(e.text.split())
            for e in dash_duo.find_elements("#what-if-result .what-if-line")}


@pytest.mark.browser
@needs_sample
def test_the_budget_shows_each_training_loaders_parts_and_a_click_shows_a_part(dash_duo, tmp_path, sample):
    budget = sample.budget
    assert len(budget) == 2  # the sample: a 2-worker loader and a num_workers=0 one, on one node
    start_sample(dash_duo, tmp_path)
    driver = dash_duo.driver
    traces = budget_traces(driver)
    # One trace per part (then the rest, not waiting), one bar per training loader, in seconds.
    assert [t["meta"] for t in traces] == list(PARTS) + ["not_waiting"]
    labels = [row[5] for row in traces[0]["customdata"]]
    assert labels == [f"{b.loader} on {b.node}" for b in budget]
    for trace in traces[:len(PARTS)]:
        for i, item in enumerate(budget):
            assert trace["x"][i] == pytest.approx(item.parts[trace["meta"]], abs=1e-9)
            share = 100 * item.parts[trace["meta"]] / item.training_s
            assert trace["customdata"][i][1] == pytest.approx(share, abs=1e-9)  # the share, on hover
    for i, item in enumerate(budget):
        assert sum(t["x"][i] for t in traces) == pytest.approx(item.training_s, abs=1e-6)  # the bar: training
    # The sums are on the page in words too, with the residual named.
    block = text(dash_duo, "budget")
    for item in budget:
        assert (f"waits {duration_s(item.wait_s)} of {duration_s(item.training_s)} "
                f"({100 * item.wait_s / item.training_s:.1f} %)") \
            in block
    assert "unexplained (residual)" in block
    # A click on the slow samples ("tail") of the 2-worker loader: the window is its longest wait.
    tail = PARTS.index("tail")
    assert budget[0].parts["tail"] > 1 and budget[0].windows["tail"]
    want = with_margin(*budget[0].windows["tail"][0])
    whole = window_range(dash_duo)
    assert whole != want
    click_bar(dash_duo, tail, 0)
    wait_until(lambda: window_range(dash_duo) == want, message="the window of the slow samples")
    # The overview (the whole job) shows that window as its band.
    wait_until(lambda: (lambda b: b is not None and abs(b[0] * 1000 - want[0]) <= PLOTLY_DATE_US)(band_ms(driver)),
               message="the overview's band at the slow samples")
    assert band_ms(driver)[1] * 1000 == pytest.approx(want[1], abs=PLOTLY_DATE_US)
    # Start-up: its own longest wait.
    want_startup = with_margin(*budget[0].windows["startup"][0])
    click_bar(dash_duo, PARTS.index("startup"), 0)
    wait_until(lambda: window_range(dash_duo) == want_startup, message="the window of the start-up")
    # The loader without workers has no windows for its part: a click on it leaves the window.
    assert budget[1].parts["main_process"] > 1 and not budget[1].windows.get("main_process")
    click_bar(dash_duo, PARTS.index("main_process"), 1)
    time.sleep(1.5)
    assert window_range(dash_duo) == want_startup
    assert text(dash_duo, "error-message") == ""


@pytest.mark.browser
@needs_sample
def test_typing_a_what_if_shows_the_predicted_bar_and_a_bad_value_its_message(dash_duo, tmp_path, sample):
    start_sample(dash_duo, tmp_path)
    driver = dash_duo.driver
    budget = sample.budget
    keys = [views.loader_key(b.node, b.loader) for b in budget]
    dash_duo.wait_for_contains_text("#what-if-result", "Type a setting", timeout=20)
    type_into(dash_duo, "what-if-num-workers", "4")
    expected = {views.loader_key(w.node, w.loader): w for w in sample.what_if({"num_workers": 4})}
    assert set(expected) == set(keys)
    wait_until(lambda: set(result_lines(dash_duo)) == set(keys), message="a prediction per loader")

    def predicted_bars():
        traces = {t["meta"]: t for t in what_if_traces(driver)}
        wait, rows = traces["wait"], {}
        for x, custom in zip(wait["x"], wait["customdata"]):
            if custom[3] == "predicted":
                rows[custom[4]] = (x, custom[1], custom[2])  # seconds waited, % of training, training s
        return rows

    bars = wait_until(lambda: (lambda b: b if len(b) == len(budget) else None)(predicted_bars()),
                      message="the predicted bars")
    for key, want in expected.items():
        then = want.predicted
        seconds, percent, training = bars[f"{want.loader} on {want.node}"]
        assert training == pytest.approx(then["training_s"], abs=1e-9)
        assert percent == pytest.approx(100 * then["wait_fraction"], abs=1e-9)
        assert seconds == pytest.approx(then["wait_fraction"] * then["training_s"], abs=1e-9)
        now = want.now
        line = result_lines(dash_duo)[key]
        assert (f"waiting {100 * now['wait_fraction']:.1f} % → {100 * then['wait_fraction']:.1f} % of training, "
                f"training {duration_s(now['training_s'])} → {duration_s(then['training_s'])}") in line
    assert text(dash_duo, "what-if-error") == ""
    # A bad value: the library's message beside the inputs, no prediction, no traceback.
    with pytest.raises(ValueError) as bad:
        sample.what_if({"num_workers": -1})
    type_into(dash_duo, "what-if-num-workers", "-1")
    dash_duo.wait_for_text_to_equal("#what-if-error", str(bad.value), timeout=20)
    assert "num_workers" in str(bad.value) and "-1" in str(bad.value)
    assert result_lines(dash_duo) == {}
    assert_no_traceback(dash_duo)
    # The server keeps serving: a good value again, then none (unchanged: no prediction).
    type_into(dash_duo, "what-if-num-workers", "8")
    dash_duo.wait_for_text_to_equal("#what-if-error", "", timeout=20)
    wait_until(lambda: set(result_lines(dash_duo)) == set(keys), message="the prediction of num_workers=8")
    type_into(dash_duo, "what-if-num-workers", "")
    dash_duo.wait_for_contains_text("#what-if-result", "Type a setting", timeout=20)
    # A finding's "try in what-if" puts its change in the inputs; the prediction is the finding's.
    finding = next(r for r in sample.recommendations if r.change == {"persistent_workers": True})
    button = dash_duo.find_element(f"#recommendations .recommendation[data-id='{finding.id}'] button.try-what-if")
    scroll_to(driver, button)
    button.click()
    key = views.loader_key(finding.evidence["node"], budget[0].loader)
    wait_until(lambda: list(result_lines(dash_duo)) == [key], message="the finding's loader alone")
    then = finding.predicted
    assert f"→ {100 * then['wait_fraction']:.1f} % of training" in result_lines(dash_duo)[key]
    assert f"→ {duration_s(then['training_s'])}" in result_lines(dash_duo)[key]
    assert "True" in text(dash_duo, "what-if-persistent-workers")
    assert dash_duo.find_element("#what-if-num-workers").get_attribute("value") == ""


@pytest.mark.browser
@needs_sample
def test_the_summary_reads_well_at_1440_by_900(dash_duo, tmp_path, sample):
    start_sample(dash_duo, tmp_path)
    driver = dash_duo.driver
    driver.set_window_size(1440, 900)
    type_into(dash_duo, "what-if-num-workers", "4")
    wait_until(lambda: len(result_lines(dash_duo)) == len(sample.budget), message="the what-if")
    driver.execute_script("window.scrollTo(0, 0)")
    # The budget, the findings and the what-if all begin in the first screen.
    for element_id in ("budget-graph", "recommendations", "what-if-graph"):
        assert dash_duo.find_element(f"#{element_id}").rect["y"] < 900, element_id
    # Findings show their predicted effect.
    shown = dash_duo.find_elements("#recommendations .recommendation .finding-predicted")
    assert len(shown) == sum(1 for r in sample.recommendations if r.predicted is not None)
    time.sleep(0.5)
    path = os.path.join(os.environ.get("DASHBOARD_SCREENSHOTS", str(tmp_path)), "dashboard-budget-1440x900.png")
    driver.save_screenshot(path)
    assert os.path.getsize(path) > 50_000


# --- the views and figures ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def sample_view():
    return views.trial_view(dashboard.load_trial(SAMPLE_TRIAL))


@needs_sample
def test_budget_view_draws_every_part_of_every_training_loader(sample_view, sample):
    shown = views.budget_view(sample_view)
    rows, figure = shown["rows"], shown["figure"]
    assert [r["label"] for r in rows] == [f"{b.loader} on {b.node}" for b in sample.budget]
    traces = [t for t in figure["data"] if t["type"] == "bar"]
    assert [t["meta"] for t in traces] == list(PARTS) + ["not_waiting"]
    for trace in traces[:-1]:
        assert trace["x"] == [b.parts[trace["meta"]] for b in sample.budget]
        assert trace["marker"]["color"] == figures.PART_COLORS[trace["meta"]]
        assert trace["name"].startswith(PART_WORDS[trace["meta"]])
        assert "% of training" in trace["hovertemplate"] and "%{customdata[6]}, " in trace["hovertemplate"]
        # The seconds on hover are written as everywhere else (display.duration_s).
        assert [c[6] for c in trace["customdata"]] == [duration_s(b.parts[trace["meta"]]) for b in sample.budget]
    assert traces[-1]["x"] == [pytest.approx(b.training_s - b.wait_s) for b in sample.budget]
    # Each part's window: its longest GetNext with an outlier click's margin; none without one.
    for row, item in zip(rows, sample.budget):
        for part in PARTS:
            spans = item.windows.get(part) or []
            custom = traces[PARTS.index(part)]["customdata"][rows.index(row)]
            if spans:
                assert (custom[2], custom[3]) == with_margin(*spans[0])
                assert views.budget_click_window({"points": [{"customdata": custom}]}) == with_margin(*spans[0])
            else:
                assert custom[2] is None and views.budget_click_window({"points": [{"customdata": custom}]}) is None
    # Colour-blind-safe and distinct; the key on the page says the same.
    assert len(set(figures.PART_COLORS.values())) == len(PARTS)
    assert [k[0] for k in figures.budget_key(PART_WORDS)] == list(PARTS) + ["not_waiting"]
    assert shown["several_loaders"] and [o["value"] for o in shown["loader_options"]][1:] == [r["key"] for r in rows]


def test_budget_click_window_reads_only_a_real_window():
    assert views.budget_click_window(None) is None
    assert views.budget_click_window({}) is None
    assert views.budget_click_window({"points": []}) is None
    assert views.budget_click_window({"points": [{"customdata": [1, 2, None, None, "", "x"]}]}) is None
    assert views.budget_click_window({"points": [{"customdata": [1, 2, 30, 20, "", "x"]}]}) is None
    assert views.budget_click_window({"points": [{"customdata": [1, 2, "a", 20]}]}) is None
    assert views.budget_click_window({"points": [{"customdata": [1, 2, math.nan, 20]}]}) is None
    assert views.budget_click_window({"points": [{"customdata": [1, 2, 10, 20.0, "", "x"]}]}) == (10, 20)


def test_what_if_change_keeps_what_was_typed():
    assert views.what_if_change() == {}
    assert views.what_if_change(None, "", "", None) == {}
    assert views.what_if_change(4, None, "false", "") == {"num_workers": 4, "in_order": "false"}
    assert views.what_if_change(-1, 2.5) == {"num_workers": -1, "prefetch_factor": 2.5}  # the library judges
    assert views.what_if_inputs({"num_workers": 8, "persistent_workers": True}) == {
        "num_workers": 8, "prefetch_factor": None, "in_order": "", "persistent_workers": "true"}
    assert views.what_if_change(*views.what_if_inputs({"in_order": False}).values()) == {"in_order": "false"}


@needs_sample
def test_what_if_view_predicts_as_the_library_and_says_what_is_wrong(sample_view, sample):
    change = {"num_workers": 4, "in_order": "false"}
    shown = views.what_if_view(sample_view, change)
    want = sample.what_if({"num_workers": 4, "in_order": False})
    assert shown["change"] == "num_workers=4, in_order=False"
    assert [r["label"] for r in shown["rows"]] == [f"{w.loader} on {w.node}" for w in want]
    for row, result in zip(shown["rows"], want):
        assert row["now"]["wait_fraction"] == pytest.approx(result.now["wait_fraction"], abs=1e-6)
        assert row["predicted"]["training_s"] == result.predicted["training_s"]
        assert row["predicted"]["wait_s"] == pytest.approx(result.predicted["wait_fraction"]
                                                           * result.predicted["training_s"])
        assert f"→ {100 * result.predicted['wait_fraction']:.1f} %" in row["text"]
    # The figure: today and predicted per loader, in seconds, with the share as text.
    wait = next(t for t in shown["figure"]["data"] if t["meta"] == "wait")
    assert [c[3] for c in wait["customdata"]] == ["today", "predicted"] * len(want)
    assert wait["x"][1] == pytest.approx(want[0].predicted["wait_fraction"] * want[0].predicted["training_s"])
    # One loader chosen: that loader alone.
    key = views.loader_key(want[1].node, want[1].loader)
    one = views.what_if_view(sample_view, change, key)
    assert [r["key"] for r in one["rows"]] == [key]
    # Nothing typed: today's bars, no prediction.
    empty = views.what_if_view(sample_view, {})
    assert empty["change"] == "" and all(r["predicted"] is None for r in empty["rows"])
    assert len([c for c in next(t for t in empty["figure"]["data"] if t["meta"] == "wait")["customdata"]]) == len(want)
    # Bad settings: the library's ValueError, word for word.
    for bad in ({"num_workers": -1}, {"prefetch_factor": 0}, {"num_workers": 2.5}, {"in_order": "maybe"}):
        with pytest.raises(ValueError) as expected:
            sample.what_if(bad)
        with pytest.raises(ValueError) as got:
            views.what_if_view(sample_view, bad)
        assert str(got.value) == str(expected.value)


@needs_sample
def test_findings_carry_their_predicted_effect_once(sample_view, sample):
    data = views.verdict_summary(sample_view)
    assert [f["id"] for f in data["findings"]] == [r.id for r in sample.recommendations]
    for shown, item in zip(data["findings"], sample.recommendations):
        if item.predicted is None:
            assert shown["predicted"] is None and shown["text"] == item.text
            continue
        # Today's numbers: those of the what-if the finding ran (its loader's).
        now = next(w.now for w in sample.assessment.what_if if w.node == item.evidence["node"]
                   and w.change == item.change and w.predicted == item.predicted)
        then = item.predicted
        assert shown["predicted"]["text"] == (
            f"waiting {100 * now['wait_fraction']:.1f} % → {100 * then['wait_fraction']:.1f} % of training, "
            f"training {duration_s(now['training_s'])} → {duration_s(then['training_s'])}")
        assert shown["predicted"]["change"] == ", ".join(f"{k}={v}" for k, v in item.change.items())
        # The text says the rest, without repeating the prediction.
        assert "Predicted:" not in shown["text"] and item.text.startswith(shown["text"][:40])
    parts = layout.summary_parts(views.summary(sample_view.trial), data)
    findings = by_id(parts["findings"], "recommendations")
    predicted = find_components(findings, lambda c: "finding-predicted" in (getattr(c, "className", "") or ""))
    assert len(predicted) == sum(1 for r in sample.recommendations if r.predicted is not None)
    buttons = find_components(findings, lambda c: isinstance(getattr(c, "id", None), dict)
                              and c.id["type"] == "try-what-if")
    assert [b.id["change"] for b in buttons] == [views.change_text(r.change) for r in sample.recommendations
                                                 if r.predicted is not None]
    first = next(r for r in sample.recommendations if r.predicted is not None)
    assert f"Predicted with {views.change_text(first.change)}: waiting" in component_text(findings)


def test_figures_say_when_there_is_nothing_to_draw():
    assert figures.budget_figure_spec([], PART_WORDS)["data"] == []
    assert figures.what_if_figure_spec([])["data"] == []
    # Many loaders stay one block, at a compact row height.
    row = {"label": "L on n", "node": "n", "loader": "L", "training_s": 2.0, "wait_s": 1.0,
           "parts": {**dict.fromkeys(PARTS, 0.0), "throughput": 1.0}, "windows": {}}
    few = figures.budget_figure_spec([row] * 2, PART_WORDS)["layout"]["height"]
    many = figures.budget_figure_spec([row] * 12, PART_WORDS)["layout"]["height"]
    assert many < 12 * figures.BUDGET_ROW_PX and few < 160
