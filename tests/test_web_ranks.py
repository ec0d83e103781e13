"""The rank heat map on the page, in headless Chromium: a real click on a cell moves the
window to the cell's stretch of the job and scopes the panels to its rank (run with --headless).

Expected numbers come from the events the multi-rank generator wrote."""
from __future__ import annotations

import os

import numpy as np
import pytest
from selenium.webdriver.common.action_chains import ActionChains

from dashboard.synthetic import write_job
from dashboard.web import views
from test_web_browser import assert_no_traceback, scroll_to, start, text, wait_loaded, wait_until, window_range

SLOW_RANK = 5


def heatmap(driver) -> dict | None:
    """The heat map as the browser holds it: its rows (process ids) and its values."""
    return driver.execute_script("""
        const gd = document.querySelector('#rank-heatmap .js-plotly-plot');
        if (!gd || !gd.data || !gd.data.length || gd.data[0].type !== 'heatmap') { return null; }
        return {y: Array.from(gd.data[0].y), z: gd.data[0].z};
    """)


@pytest.mark.browser
def test_a_click_on_a_heatmap_cell_sets_the_window_and_the_rank(dash_duo, tmp_path):
    folder = tmp_path / "job"
    job = write_job(str(folder), hosts=2, ranks_per_host=4, steps=60, slow_rank=SLOW_RANK, seed=4)
    getnexts = [e for e in job.events if e.kind == "getnext"]
    dash_duo.driver.set_window_size(1440, 900)
    start(dash_duo, tmp_path, folder)
    wait_loaded(dash_duo, len(getnexts))
    found = wait_until(lambda: heatmap(dash_duo.driver), timeout=30, message="the rank heat map")
    assert "hidden" not in dash_duo.find_element("#ranks").get_attribute("class")
    rows = found["y"]
    assert rows == [f"{r}-algo-{1 + r // 4}" for r in range(8)]  # by host, then rank
    # The slow rank's brightest column, from the figure's own numbers, is clicked for real.
    row = rows.index(f"{SLOW_RANK}-algo-2")
    column = max(range(len(found["z"][row])), key=lambda b: found["z"][row][b])
    # The columns split the job's GetNext span evenly: that column's stretch, from the events.
    first, last = min(e.start_us for e in getnexts), max(e.end_us for e in getnexts)
    edges = [round(first + (last - first) * i / views.RANK_BUCKETS) for i in range(views.RANK_BUCKETS + 1)]
    cell = (edges[column], edges[column + 1])
    graph = dash_duo.find_element("#rank-heatmap .js-plotly-plot")
    scroll_to(dash_duo.driver, graph)
    # The cell's centre, by plotly's own axis conversions, as an offset from the plot's centre.
    dx, dy = dash_duo.driver.execute_script("""
        const gd = arguments[0], xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
        const x = xa._offset + xa.l2p(gd.data[0].x[arguments[1]]), y = ya._offset + ya.l2p(arguments[2]);
        const box = gd.getBoundingClientRect();
        return [x - box.width / 2, y - box.height / 2];
    """, graph, column, row)  # (a category axis: the row index is its linear coordinate)
    # From the plot's centre to the cell's: a move relative to the pointer (an offset from an element
    # is placed by the element's in-view centre, which plotly's layers shift).
    ActionChains(dash_duo.driver).move_to_element(graph).pause(0.2).move_by_offset(int(dx), int(dy)).pause(0.3) \
        .click().perform()
    # The window is the cell's stretch of the job...
    wait_until(lambda: window_range(dash_duo) == cell, timeout=20, message=f"the window {cell}")
    # ...and the panels are the rank's: its GetNext count, counted here from the events.
    wait_loaded(dash_duo, sum(1 for e in getnexts if e.rank == SLOW_RANK))
    assert "rank 5" in text(dash_duo, "node-select")
    assert "verdict for algo-2 · rank 5" in text(dash_duo, "summary-verdict").lower()  # (CSS capitals)
    assert_no_traceback(dash_duo)
    out = os.environ.get("DASHBOARD_SCREENSHOTS")
    if out:
        dash_duo.driver.save_screenshot(os.path.join(out, "ranks.png"))


def test_rank_cell_finds_the_clicked_column():
    from dashboard.analysis import ranks
    from dashboard.trial.load import Process

    one = ranks.ProcessWaits(Process("algo-2", "5-algo-2", 50, 5, 1), np.array([0]), np.array([10]), np.array([0]))
    waits = ranks.RankWaits([one], 1_795_986_600_000_000, 1_795_986_600_000_000 + views.RANK_BUCKETS * 1000)
    # the 4th column's middle, as plotly writes a date: 3.5 ms after the start
    click = {"points": [{"x": "2026-11-29 21:10:00.0035", "y": "5-algo-2"}]}
    assert views.rank_cell(click, waits) == ("5-algo-2", waits.start_us + 3000, waits.start_us + 4000)
    for bad in (None, {}, {"points": []}, {"points": [{"x": "soon", "y": "5-algo-2"}]},
                {"points": [{"x": "2026-11-29 21:10:00.0035", "y": "6-algo-2"}]},
                {"points": [{"x": "2026-11-29 22:10:00", "y": "5-algo-2"}]}):
        assert views.rank_cell(bad, waits) is None
    assert views.rank_cell(click, None) is None


def test_a_job_of_one_process_has_no_heatmap(tmp_path):
    import dashboard
    from dashboard.analysis import ranks
    from dashboard.synthetic import write_trial

    write_trial(str(tmp_path), hosts=1)
    view = views.rank_heatmap_view(ranks.rank_waits(dashboard.load_trial(str(tmp_path)).framework), "host", None)
    assert view["class"] == "panel ranks hidden" and view["note"] == ""


@pytest.mark.browser
def test_the_heatmap_is_not_shown_for_one_process(dash_duo, tmp_path):
    from dashboard.synthetic import write_trial

    written = write_trial(str(tmp_path / "one"), hosts=1)
    start(dash_duo, tmp_path, tmp_path / "one")
    wait_loaded(dash_duo, len(written.of_kind("getnext")))
    ranks_section = dash_duo.find_element("#ranks")
    wait_until(lambda: "hidden" in ranks_section.get_attribute("class"), message="the ranks section's class")
    assert not ranks_section.is_displayed()
