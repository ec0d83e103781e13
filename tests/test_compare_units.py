"""`compare` on reference-format trials (dashboard.synthetic), whose iterator initializations
record num_workers and pin_memory but not the other settings: what a trial records is
compared, persistence is seen from re-creations, the rest is "not recorded", and the
prediction is the first trial's own what-if for the second's settings."""
from __future__ import annotations

import pytest

import dashboard
from dashboard import synthetic
from dashboard.api import compare
from dashboard.report import compare_dict


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compare")
    a = synthetic.write_trial(str(folder / "a"), epochs=3, train_batches=20, num_workers=2, val_batches=0,
                              pin_memory=False, init_us=(300_000, 320_000))
    b = synthetic.write_trial(str(folder / "b"), epochs=3, train_batches=20, num_workers=4, val_batches=0,
                              pin_memory=True, init_us=(300_000, 320_000), main_pid=30_000)
    return dashboard.analyze(str(folder / "a")), dashboard.analyze(str(folder / "b")), a, b


def test_what_the_trials_record_is_compared_and_the_rest_is_not_recorded(two_runs):
    result_a, result_b, written_a, written_b = two_runs
    data = compare_dict(result_a, result_b)
    # Every epoch started its iterator anew in both (3 initializations, 3 iterators): not
    # persistent in either, seen from the re-creations; prefetch_factor and in_order are not
    # in this format's init events, on either side: not listed.
    assert len(written_a.of_kind("init")) == len(written_b.of_kind("init")) == 3
    changed = {(c["loader"], c["key"]): (c["a"], c["b"]) for c in data["settings_changed"]}
    assert changed == {("_MultiProcessingDataLoaderIter", "num_workers"): (2, 4),
                       ("_MultiProcessingDataLoaderIter", "pin_memory"): (False, True)}
    comparison = compare(result_a, result_b)
    (pair,) = comparison.loaders
    assert pair.settings_a == {"num_workers": 2, "pin_memory": False, "prefetch_factor": "not recorded",
                               "in_order": "not recorded", "persistent_workers": False}
    # The prediction replays what the what-if can: num_workers (pin_memory is not replayed).
    assert data["predicted"]["change"] == {"num_workers": 4}
    (what_if,) = result_a.what_if({"num_workers": 4})
    assert data["predicted"]["training_s"] == pytest.approx(what_if.predicted["training_s"])
    assert data["predicted"]["wait_fraction"] == pytest.approx(what_if.predicted["wait_fraction"])
    # Achieved: B's own training loader, as its budget has it.
    (budget_b,) = result_b.budget
    assert data["achieved"] == {"training_s": pytest.approx(budget_b.training_s),
                                "wait_fraction": pytest.approx(budget_b.wait_s / budget_b.training_s, abs=1e-6)}
    # B - A, from the verdicts.
    assert data["delta"]["training_s"] == pytest.approx(result_b.verdict.training_s - result_a.verdict.training_s,
                                                        abs=1e-6)


def test_comparing_a_trial_with_itself_changes_nothing(two_runs):
    result_a = two_runs[0]
    data = compare_dict(result_a, result_a)
    assert data["delta"] == {"training_s": 0, "wait_s": 0, "input_percent": 0}
    assert data["settings_changed"] == [] and data["predicted"] is None
    assert {f["status"] for f in data["findings"]} <= {"remaining"}
    assert all(f["saving_s_a"] == f["saving_s_b"] for f in data["findings"])


def test_compare_scoped_to_one_rank_compares_that_ranks_loaders_only(tmp_path):
    # Two runs of an 8-rank job, the second with its slow rank fixed: compared on that rank,
    # its own loader is the one pair, and its wait fell; on the whole job every rank pairs.
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    synthetic.write_job(a, hosts=2, ranks_per_host=4, steps=40, slow_rank=5, seed=1)
    synthetic.write_job(b, hosts=2, ranks_per_host=4, steps=40, seed=1)

    def run(*extra):
        done = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "compare", a, b, "--json", *extra],
                              capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout, done.stderr

    code, out, err = run("--rank", "5")
    assert code == 0, err
    scoped = json.loads(out)
    for side in ("a", "b"):
        (budget,) = scoped[side]["budget"]
        assert budget["node"] == "algo-2" and [p["rank"] for p in scoped[side]["processes"]] == [5]
    assert scoped["b"]["verdict"]["input_percent"] < scoped["a"]["verdict"]["input_percent"]
    assert scoped["delta"]["input_percent"] < 0
    code, out, err = run()
    assert code == 0, err
    assert [len(json.loads(out)[side]["budget"]) for side in ("a", "b")] == [8, 8]
    code, _, err = run("--rank", "99")
    assert code == 2 and "no events of --rank 99" in err


def _slow_worker_1(hosts: int = 1, **kwargs) -> dict:
    """Every batch of worker 1 (odd batches, 2 workers) 40 ms: a slow worker, on every host."""
    return dict(hosts=hosts, epochs=3, train_batches=20, num_workers=2, val_batches=0,
                slow_batches={(e, b): 40_000 for e in range(3) for b in range(1, 20, 2)}, **kwargs)


def test_a_slow_worker_gone_in_b_is_compared_with_as_predicted_and_only_where_nothing_else_changed(tmp_path):
    # A: worker 1 slow. B: the same job without it (its data fixed), no setting changed: B is
    # compared with A's prediction for the worker made as fast as the others. Without fetch times
    # that is A's imbalance part taken off (diagnosis.what_if.predict_worker_as_fast).
    synthetic.write_trial(str(tmp_path / "a"), **_slow_worker_1())
    synthetic.write_trial(str(tmp_path / "b"), **{**_slow_worker_1(), "slow_batches": {}}, main_pid=30_000)
    a, b = dashboard.analyze(str(tmp_path / "a")), dashboard.analyze(str(tmp_path / "b"))
    (found,) = [r for r in a.recommendations if r.id == "slow_worker"]
    (budget,) = a.budget
    assert found.evidence["worker_id"] == 1 and "slow_worker" not in [r.id for r in b.recommendations]
    predicted = compare(a, b).predicted
    assert predicted["change"] == {} and [(f["finding"], f["worker_id"]) for f in predicted["fixes"]] == [
        ("slow_worker", 1)], predicted
    assert predicted["training_s"] == pytest.approx(budget.training_s - budget.parts["imbalance"], abs=1e-6)
    assert predicted["training_s"] == pytest.approx(found.evidence["fixed_worker_predicted"]["training_s"], abs=1e-6)
    # B with pin_memory changed as well: that may be what removed it; nothing is predicted.
    synthetic.write_trial(str(tmp_path / "pinned"), **{**_slow_worker_1(), "slow_batches": {}},
                          pin_memory=True, main_pid=30_000)
    pinned = compare(a, dashboard.analyze(str(tmp_path / "pinned")))
    assert [c.key for c in pinned.settings_changed] == ["pin_memory"] and pinned.predicted is None


def test_no_fix_is_claimed_where_b_still_has_the_slow_workers_of_a_job_of_several_processes(tmp_path):
    # Both hosts' worker 1 slow in both runs. The findings keep one slow_worker for the job (on
    # the process where it saves most: algo-1's in A, algo-2's in B with these seeds), which made
    # algo-1's look fixed in B.
    synthetic.write_trial(str(tmp_path / "a"), **_slow_worker_1(hosts=2))
    synthetic.write_trial(str(tmp_path / "b"), **_slow_worker_1(hosts=2, seed=3), main_pid=30_000)
    a, b = dashboard.analyze(str(tmp_path / "a")), dashboard.analyze(str(tmp_path / "b"))
    assert [item.slow_worker for item in a.budget] == [1, 1] == [item.slow_worker for item in b.budget]
    assert [(r.id, r.evidence["node"]) for r in a.recommendations if r.id == "slow_worker"] == [("slow_worker", "algo-1")]
    assert [(r.id, r.evidence["node"]) for r in b.recommendations if r.id == "slow_worker"] == [("slow_worker", "algo-2")]
    comparison = compare(a, b)
    assert {f.id: f.status for f in comparison.findings}["slow_worker"] == "remaining"
    assert comparison.predicted is None, comparison.predicted


def test_findings_are_not_judged_by_a_run_that_recorded_no_loader(tmp_path):
    # B of the sample's system metrics alone (its GetNexts unrecorded): every one of A's
    # findings was marked resolved, a fix B never showed.
    import os
    import shutil

    from dashboard.analysis.compare import NOT_JUDGED, RESOLVED
    from dashboard.report import compare_text
    from tests.conftest import ROOT

    sample = os.path.join(ROOT, "examples", "sample-trial", "trial")
    shutil.copytree(os.path.join(sample, "system"), tmp_path / "b" / "system")
    a, b = dashboard.analyze(sample), dashboard.analyze(str(tmp_path / "b"))
    assert a.recommendations and not b.budget
    comparison = compare(a, b)
    assert [f.status for f in comparison.findings] == [NOT_JUDGED] * len(a.recommendations)
    data = compare_dict(a, b, comparison)
    assert {f["status"] for f in data["findings"]} == {"not_judged"}
    assert "  not judged (" in compare_text(a, b, comparison)  # as the page words it
    # B of a run with its loaders: A's findings B lacks are resolved, as before.
    fixed = compare(a, dashboard.analyze(sample))
    assert RESOLVED not in {f.status for f in fixed.findings}  # (the same run: all remaining)
