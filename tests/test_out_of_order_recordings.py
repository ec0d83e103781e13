"""What out-of-order delivery is predicted to give a slow worker whose delay the compute partly
hides, on a busy host: two real recordings of tests/scenario_job.py's slow_worker job (the
collector's trials, `--hidden 2560 --hogs 2`; tests/recordings/README.md), each checked against
the books of out-of-order runs made beside it. Such a prediction is near the line (see the
scenario test of out-of-order delivery), and these runs are where it went wrong: made again,
they would fall elsewhere."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

import dashboard
from dashboard.analysis.diagnosis.findings import imbalance

RECORDINGS = Path(__file__).parent / "recordings"


def recording(name: str) -> tuple[dict, list[dict]]:
    """The in-order run's books and the out-of-order runs' (their totals)."""
    folder = RECORDINGS / name
    reruns = json.loads((folder / "out_of_order_reruns.json").read_text())["runs"]
    return json.loads((folder / "books.json").read_text()), reruns


def test_todays_replay_charges_the_fetches_queueing_for_a_core():
    # The fetches waited for a core 1.7x their CPU time (two busy processes beside the job), which
    # the workers' own demand does not explain: the replay charged each fetch its CPU time alone,
    # and today's replay fell 14 % short of the wait the books measured (0.49 s of 0.57 s); the
    # calibration then scaled every prediction up by as much. The replay of today's settings
    # must account for today's wait: within 5 % (it is 0.4 % here, and 3-4 % on three
    # recordings like it).
    books, _ = recording("hidden_slow_worker_in_order")
    result = dashboard.analyze(str(RECORDINGS / "hidden_slow_worker_in_order"))
    (model,) = result.assessment.models
    assert model.contention > 1.5 and model.stretch(model.settings.num_workers) == 1.0
    assert model.today_us / 1e6 == pytest.approx(books["wait_s"], rel=0.05)


def test_out_of_order_is_proposed_where_the_prediction_cannot_tell_it_from_a_gain():
    # Predicted 4.97 s -> 5.03 s of training out of order (before the replay charged the fetches'
    # queueing, 5.12 s): "would not help", since the saving was under the finding's bar. The four
    # re-runs made with it trained 4.11-4.89 s. A prediction that close to today is within what
    # the out-of-order cost, read from in-order hand-overs, can be off by: the change is proposed,
    # saying so, and the finding ranks by its part, not by the prediction's 0 s; "would not help"
    # is kept for one slower beyond that.
    books, reruns = recording("hidden_slow_worker_in_order")
    result = dashboard.analyze(str(RECORDINGS / "hidden_slow_worker_in_order"))
    (found,) = [r for r in result.recommendations if r.id == "slow_worker"]
    assert found.evidence["worker_id"] == books["settings"]["slow_worker_id"]
    assert found.change == {"in_order": False}, found.text
    assert "would not help" not in found.text and imbalance.CANNOT_TELL in found.text, found.text
    (then,) = result.what_if({"in_order": False})
    assert abs(then.saving_s) <= imbalance._undecided_s(result.assessment.models[0])
    assert found.predicted == then.predicted
    assert found.saving_s == round(found.evidence["part_s"], 3) > 0
    assert max(run["training_s"] for run in reruns) < books["training_s"]  # (what the re-runs did)


def test_the_cost_out_of_order_is_not_read_from_a_few_stalls():
    # A run whose main process computed slower than usual: 3 of its batches were received after a
    # wait, one of them 15.6 ms, and their mean, 6.1 ms, was taken for what each next() costs out
    # of order. The out-of-order runs beside it measured 2.7 and 3.5 ms a next() (their books'
    # hand-overs); the model's cost must be within the spread it is known to have
    # (imbalance.OUT_OF_ORDER_COST_SPREAD) of their mean.
    books, reruns = recording("hidden_slow_worker_few_stalls")
    result = dashboard.analyze(str(RECORDINGS / "hidden_slow_worker_few_stalls"))
    (model,) = result.assessment.models
    measured_us = 1e6 * statistics.mean(run["handover_mean_s"] for run in reruns)
    assert model.out_of_order_us == pytest.approx(measured_us, rel=imbalance.OUT_OF_ORDER_COST_SPREAD)
    assert books["batches"] == model.batches
