"""The display convention (dashboard/display.py): how durations, moments and names are written,
the same in the text report and on the page; and the colours of the event kinds."""
from __future__ import annotations

import itertools
import math
import re
import statistics

import numpy as np
import pytest

from dashboard import display, synthetic
from dashboard import format as fmt


# --- durations -------------------------------------------------------------------------------

@pytest.mark.parametrize("us, text", [
    (90, "90 µs"),  # 0.09 ms: below 0.1 ms, in microseconds
    (99.9, "99.9 µs"),
    (99.996, "0.1 ms"),  # rounds to 100 µs: that is 0.1 ms
    (100, "0.1 ms"),
    (1_731.5, "1.732 ms"),  # four significant digits
    (9_833, "9.833 ms"),
    (713_088, "713.1 ms"),
    (4_671_733.5, "4,672 ms"),  # thousands separated
    (9_900_000, "9,900 ms"),
    (9_999_960, "10 s"),  # 9,999.96 ms rounds to 10,000 ms: that is 10 s
    (10_000_000, "10 s"),
    (12_345_678, "12.35 s"),
    (86_400_000_000, "86,400 s"),  # a day
    (86_412_345_678, "86,410 s"),  # a day and a bit: still four significant digits
    (0, "0 ms"),
    (1, "1 µs"),
    (0.5, "0.5 µs"),
    (-5_000, "-5 ms"),
])
def test_durations_follow_the_convention_at_its_boundaries(us, text):
    assert display.duration_us(us) == text
    assert display.duration_s(us / 1e6) == text


@pytest.mark.parametrize("value", [None, float("nan"), float("inf"), "n/a"])
def test_an_unknown_duration_is_a_dash(value):
    assert display.duration_us(value) == "-" and display.duration_s(value) == "-"


def test_a_duration_never_shows_more_than_four_significant_digits_and_reads_back_close():
    rng = np.random.default_rng(3)
    for us in np.exp(rng.uniform(math.log(0.2), math.log(5e11), 3000)):
        text = display.duration_us(us)
        number, unit = text.split(" ")
        assert unit == ("µs" if us < 99.995 else "ms" if us < 9_999_500 else "s"), (us, text)
        digits = number.replace(",", "").replace(".", "").lstrip("0")
        significant = len(digits.rstrip("0")) if "." not in number else len(digits)
        assert significant <= 4, (us, text)
        if "," in number:  # separators every three digits of the integer part
            assert re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", number), text
        back = float(number.replace(",", "")) * {"µs": 1, "ms": 1e3, "s": 1e6}[unit]
        # Rounded to four significant digits (or to the unit's integer digits, past 9,999).
        assert back == pytest.approx(us, rel=5e-4 + 0.5 / max(us, 1)), (us, text)


def test_axis_units_are_those_of_the_largest_value():
    assert display.axis_unit(90).name == "µs"
    assert display.axis_unit(713_088).name == "ms"
    assert display.axis_unit(12_000_000).name == "s"


def test_moments_are_iso_utc_with_the_zone_stated():
    assert display.iso_utc(1_795_986_608_123_456) == "2026-11-29T21:10:08.123456Z"
    assert display.iso_utc(0) == "1970-01-01T00:00:00.000000Z"
    assert display.iso_utc(None) == "-"
    assert display.TIME_ZONE == "UTC"


def test_long_class_names_are_shortened_readably():
    assert display.short_name("_MultiProcessingDataLoaderIter") == "MultiProcessingIter"
    assert display.short_name("_SingleProcessDataLoaderIter") == "SingleProcessIter"
    assert display.short_name("enumerate(DataLoader)#_MultiProcessingDataLoaderIter") == "MultiProcessingIter"
    long = "MyVeryOwnCustomisedPrefetchingLoaderIterator"
    short = display.short_name(long)
    assert len(short) == display.MAX_NAME_CHARS and "…" in short
    assert long.startswith(short.split("…")[0]) and long.endswith(short.split("…")[1])


# --- the report and the page say the same ----------------------------------------------------

def test_the_text_report_and_the_page_write_the_same_value_the_same_way(tmp_path):
    import dashboard
    from dashboard.report import to_text
    from dashboard.web import views

    folder = str(tmp_path / "trial")
    written = synthetic.write_trial(folder, epochs=2, train_batches=30, val_batches=4,
                                    slow_batches={(0, 3): 61_234, (1, 9): 12_345_678})
    calls = written.of_kind("getnext")
    median = statistics.median(e.duration_us for e in calls)
    longest = max(e.duration_us for e in calls)
    assert longest == 12_345_678
    result = dashboard.analyze(folder)
    report = to_text(result)
    page = views.panels(views.trial_view(dashboard.load_trial(folder)))
    want_median, want_max = display.duration_us(median), display.duration_us(longest)
    assert (want_median, want_max)[1] == "12.35 s"
    assert page["getnext"]["median_us"] == want_median and page["getnext"]["max_us"] == want_max
    assert f"GetNext calls: {len(calls)} (median {want_median}, max {want_max})" in report
    # An outlier row: the page's duration text is in the report's line of that outlier.
    rows = page["getnext"]["outliers"]
    assert rows[0]["duration"] == want_max and rows[1]["duration"] == "61.23 ms"
    for row in rows[:2]:
        [line] = [line for line in report.splitlines() if line.strip().startswith(f"{row['start']} .. {row['end']} ")]
        assert f" {row['duration']} " in line
    # The batch time's median.
    gaps = []
    for key in {(e.node, e.epoch, e.iterator_class) for e in calls}:
        starts = sorted(e.start_us for e in calls if (e.node, e.epoch, e.iterator_class) == key)
        gaps += [(b - a) / 1e6 for a, b in zip(starts, starts[1:])]
    want_batch = display.duration_s(statistics.median(gaps))
    assert page["batchtime"]["median_s"] == want_batch
    assert f"median {want_batch}" in report


# --- colours -----------------------------------------------------------------------------------

# Machado, Oliveira and Fernandes (2009), severity 1: linear-RGB simulation of the three dichromacies.
DICHROMACIES = {
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]],
}


def _lab(hex_color: str, simulate=None) -> np.ndarray:
    rgb = np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)]) / 255
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    if simulate is not None:
        linear = np.clip(np.array(simulate) @ linear, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > 0.008856, np.cbrt(t), 7.787 * t + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_every_event_kind_has_its_own_colour_that_colour_blind_readers_tell_apart():
    from dashboard.web import figures

    kinds = [fmt.PHASE_INIT, fmt.PHASE_FIRST_BATCH, fmt.PHASE_ITER, fmt.PHASE_WORKER, fmt.PHASE_WORKER_FETCH,
             fmt.PHASE_STEP_TRAIN, fmt.PHASE_STEP_EVAL, fmt.PHASE_EPOCH_END]
    colours = figures.phase_colors(kinds + ["SomeOtherPhase", "AndAnother"])
    assert len({colours[k] for k in kinds}) == len(kinds)  # DataLoaderFetch and FirstBatch apart, too
    assert colours[fmt.PHASE_WORKER_FETCH] != colours[fmt.PHASE_FIRST_BATCH]
    # The stalls' colour is none of the kinds'; other phases get colours of their own.
    drawn = {**{k: colours[k] for k in kinds}, "stall": figures.OUTLIER_COLOR}
    assert len(set(drawn.values())) == len(drawn)
    assert len({colours["SomeOtherPhase"], colours["AndAnother"], *drawn.values()}) == len(drawn) + 2
    # CIE76 distance of at least 15 between any two, seen normally and under each dichromacy
    # (2.3 is a just-noticeable difference; 15 reads as a different colour at a glance).
    for name, matrix in [("normal vision", None), *DICHROMACIES.items()]:
        labs = {k: _lab(v, matrix) for k, v in drawn.items()}
        closest = min((float(np.linalg.norm(labs[a] - labs[b])), a, b) for a, b in itertools.combinations(labs, 2))
        assert closest[0] >= 15, (name, closest)


def test_a_batch_says_which_process_made_it_in_words():
    import pandas as pd

    from dashboard.display import worker_text

    assert worker_text(3) == "worker 3"
    assert worker_text(-1) == "main process"  # the collector's mark for num_workers=0
    for missing in (None, float("nan"), pd.NA):
        assert worker_text(missing) == "worker not recorded"


def test_the_text_report_names_a_main_process_batch_so():
    # A num_workers=0 loader's slow batch is the main process's, never "worker -1": the
    # bundled sample's validation loader reads in the main process, and its slow samples
    # (examples/sample-trial/record.py: every 97th index) make some of its batches outliers.
    import os

    from dashboard import analyze
    from dashboard.report import to_text
    from tests.conftest import ROOT

    result = analyze(os.path.join(ROOT, "examples", "sample-trial", "trial"))
    main_process = result.getnext.outliers["worker_id"] < 0
    assert main_process.any()
    text = to_text(result, max_rows=len(result.getnext.outliers))
    assert "worker -1" not in text
    assert text.count(" main process ") >= int(main_process.sum())
