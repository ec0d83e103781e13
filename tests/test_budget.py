"""The wait budget's own guarantees, on every kind of trial the project has: its parts add up
to the measured wait, the measured wait is the loader's GetNexts (summed here from the frame,
not by the code under test), findings never claim more than the wait, and the bundled
sample's planted faults each get their finding. What-if inputs are checked at every door."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import dashboard
from dashboard import format as fmt
from dashboard.analysis.diagnosis import PARTS, parse_what_if, validate_what_if
from dashboard.synthetic import write_trial
from tests.conftest import ROOT
from tests.test_verdict import MP, SP, plant

SAMPLE = os.path.join(ROOT, "examples", "sample-trial", "trial")


def _trials(tmp_path) -> dict[str, str]:
    folders = {"sample": SAMPLE}
    write_trial(str(tmp_path / "synthetic"), epochs=3, train_batches=40, val_batches=5, num_workers=3,
                slow_batches={(1, 7): 90_000, (2, 30): 120_000}, slow_worker=1, slow_worker_factor=6.0)
    folders["synthetic"] = str(tmp_path / "synthetic")
    plant(str(tmp_path / "planted"), epochs=2, batches=30, persistent=False, num_workers=4,
          getnext_us=lambda epoch, batch, worker: 25_000 if worker == 3 else 700, cpu_percent=60.0)
    folders["planted"] = str(tmp_path / "planted")
    plant(str(tmp_path / "single"), batches=25, num_workers=0, cls=SP, getnext_us=lambda *_: 9_000)
    folders["single"] = str(tmp_path / "single")
    return folders


def _getnext_seconds(result, budget) -> float:
    """The loader's training GetNexts, summed from the frame: the node's GetNexts of the
    loader's class (the label's head), all counting as training here (no evaluation steps)."""
    frame = result.trial.framework
    calls = frame[(frame["kind"] == fmt.KIND_GETNEXT) & (frame["node"].astype(str) == budget.node)]
    cls = budget.loader.split(" ", 1)[0]
    mine = calls[calls["name"].astype(str).str.startswith(cls)]
    return float(mine["duration_us"].sum()) / 1e6


def test_parts_add_up_to_the_measured_wait_on_every_fixture(tmp_path):
    for name, folder in _trials(tmp_path).items():
        result = dashboard.analyze(folder)
        assert result.budget, name
        for budget in result.budget:
            assert set(budget.parts) == set(PARTS), name
            assert sum(budget.parts.values()) == pytest.approx(budget.wait_s, abs=2e-6), name
            assert budget.wait_s == pytest.approx(_getnext_seconds(result, budget), abs=2e-6), name
            assert all(v >= -1e-6 for v in budget.parts.values()), (name, budget.parts)
            assert 0 < budget.wait_s <= budget.training_s, name
            assert budget.bound in ("latency", "cpu", "unknown")
        # the budgets are the verdict's wait, split
        assert sum(b.wait_s for b in result.budget) == pytest.approx(result.verdict.getnext_s, abs=1e-5), name
        by_loader: dict = {}
        for item in result.recommendations:
            if item.saving_s is not None:
                key = (item.evidence.get("node"), item.evidence.get("loader"))
                by_loader[key] = by_loader.get(key, 0.0) + item.saving_s
        for (node, loader), saving in by_loader.items():
            wait = sum(b.wait_s for b in result.budget if b.node == node and b.loader.startswith(loader))
            assert saving <= wait + 1e-3, (name, node, loader)
        json.dumps(result.to_dict(), allow_nan=False)  # the JSON form stays valid JSON


def test_the_bundled_sample_names_its_planted_faults():
    # examples/sample-trial/record.py plants: non-persistent workers that open the dataset's
    # index again in every new process (0.4 s), slow samples (about one in a hundred), and a
    # validation loader that loads in the main process.
    result = dashboard.analyze(SAMPLE)
    ids = {r.id for r in result.recommendations}
    assert {"persistent_workers", "slow_samples", "use_workers"} <= ids
    assert "slow_worker" not in ids  # which worker meets a slow sample is the luck of the draw
    by_class = {b.loader.split(" ", 1)[0]: b for b in result.budget}
    train, val = by_class[MP], by_class[SP]
    assert train.largest == "tail" and train.parts["startup"] > 0.05 * train.wait_s
    assert val.parts["main_process"] == pytest.approx(val.wait_s)
    persistent = next(r for r in result.recommendations if r.id == "persistent_workers")
    assert persistent.change == {"persistent_workers": True}
    assert 0 < persistent.saving_s <= train.parts["startup"]
    # every finding with a change carries that change's prediction, and the what-if agrees
    for item in result.recommendations:
        if item.predicted is not None:
            again = [w for w in result.what_if(item.change) if w.node == item.evidence["node"]
                     and w.loader.startswith(item.evidence["loader"])]
            assert again and again[0].predicted == item.predicted


def test_a_clean_job_has_a_small_residual_and_no_finding(tmp_path):
    plant(str(tmp_path), batches=60, getnext_us=lambda *_: 400, step_us=20_000)
    result = dashboard.analyze(str(tmp_path))
    [budget] = result.budget
    assert result.recommendations == []
    assert budget.parts["residual"] <= 0.05 * budget.wait_s + 1e-6


@pytest.mark.parametrize("text, message", [
    ("num_workers=8", None), ("num_workers=8,in_order=false", None), ("prefetch_factor=4", None),
    ("persistent_workers=true", None),
    ("num_workrs=8", "unknown what-if setting 'num_workrs'"), ("num_workers=-1", "between 0 and 256"),
    ("num_workers=x", "whole number"), ("in_order=maybe", "true or false"), ("num_workers", "key=value"),
    ("num_workers=2,num_workers=3", "given twice"), ("prefetch_factor=0", "between 1 and 64")])
def test_what_if_settings_are_parsed_or_refused_clearly(text, message):
    if message is None:
        change = parse_what_if(text)
        assert validate_what_if(change) == change
    else:
        with pytest.raises(ValueError, match=message):
            parse_what_if(text)


def test_what_if_from_the_command_line_and_the_api(tmp_path):
    plant(str(tmp_path), batches=40, getnext_us=lambda *_: 30_000, first_us=30_000, step_us=30_000,
          cpu_percent=30.0, cores=8)
    app = [sys.executable, os.path.join(ROOT, "app.py"), "analyze", str(tmp_path)]
    out = subprocess.run(app + ["--json", "--what-if", "num_workers=4", "--what-if", "num_workers=4,in_order=false"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    data = json.loads(out)
    asked = [w for w in data["what_if"] if w["asked"]]
    assert [w["change"] for w in asked] == [{"num_workers": 4}, {"num_workers": 4, "in_order": False}]
    api = dashboard.analyze(str(tmp_path)).what_if("num_workers=4")
    assert asked[0]["predicted"] == api[0].predicted
    # Two workers fetch in 2 x 60 ms; four keep up with the 30 ms compute: what is left is
    # the pipeline's first fill (120 ms) and a delivery per batch (40 x 1 ms), 0.16 s of
    # about 1.35 s of training (12 %).
    assert asked[0]["now"]["wait_fraction"] == pytest.approx(0.5, abs=0.01)
    assert asked[0]["predicted"]["wait_fraction"] == pytest.approx(0.16 / 1.36, abs=0.02)
    assert asked[0]["predicted"]["training_s"] == pytest.approx(api[0].now["training_s"] - 1.04, abs=0.03)
    bad = subprocess.run(app + ["--what-if", "workers=4"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "error: --what-if: unknown what-if setting 'workers': use num_workers, prefetch_factor, in_order, "
        "persistent_workers"]
    text = subprocess.run(app + ["--what-if", "num_workers=4"], capture_output=True, text=True, check=True,
                          cwd=ROOT).stdout
    assert "What if num_workers=4" in text and "Wait budget of" in text


def test_a_verdict_of_many_iterators_and_a_long_tail_of_batches(tmp_path):
    # 2,000 iterators of 3 batches (a job calling iter() every few steps): vectorised, the
    # budget has one loader whose start-ups are every iterator's first round.
    write_trial(str(tmp_path), epochs=2_000, train_batches=3, val_batches=0, num_workers=2, system=False,
                init_us=(100, 200))
    result = dashboard.analyze(str(tmp_path))
    [budget] = result.budget
    assert budget.evidence["iterators"] == 2_000 and budget.evidence["batches"] == 6_000
    assert sum(budget.parts.values()) == pytest.approx(budget.wait_s, abs=2e-6)
    assert np.isfinite(result.verdict.input_percent)


def test_a_long_iterator_is_replayed_on_its_first_batches_as_if_whole(tmp_path, monkeypatch):
    # One epoch of 30,000 batches, beyond pipeline.MAX_REPLAY_BATCHES: the replay runs its first
    # batches and extrapolates the rest from its steady state; replayed whole (the bound lifted)
    # it must say the same, within what a stationary synthetic job's batches vary.
    from dashboard.analysis.diagnosis import pipeline

    folder = str(tmp_path / "long")
    # Waits of 5-15 ms against 9-11 ms of compute: the workers barely keep up, so the replay's
    # waits, and what other worker counts give, depend on every batch's inferred service.
    write_trial(folder, epochs=1, train_batches=30_000, val_batches=0, num_workers=4, cpus=8, gpus=0, seed=3,
                getnext_us=(5_000, 15_000))
    trial = dashboard.load_trial(folder)
    capped = dashboard.analyze(trial)
    (model,) = capped.assessment.models
    assert int(pipeline.replayed_rows(model).sum()) <= pipeline.MAX_REPLAY_BATCHES
    assert model.replay_cap == pipeline.MAX_REPLAY_BATCHES and model.replay_beyond.tolist() == [10_000]
    monkeypatch.setattr(pipeline, "MAX_REPLAY_BATCHES", 10**9)
    whole = dashboard.analyze(trial)
    (whole_model,) = whole.assessment.models
    assert whole_model.replay_beyond.tolist() == [0]
    # 1 %: the synthetic job's waits and compute are drawn from fixed ranges; the second half of
    # the first 20,000 batches stands for the last 10,000 within their sampling noise (measured:
    # 0.4 % on today's replay, 0.1 % on the predictions).
    assert model.today_us == pytest.approx(whole_model.today_us, rel=0.01)
    for change in ({"num_workers": 8}, {"num_workers": 2}, {"in_order": False}):
        (a,), (b,) = capped.what_if(change), whole.what_if(change)
        assert a.predicted["training_s"] == pytest.approx(b.predicted["training_s"], rel=0.01), change
    # ...and the predictions are not today's: the replay's waits decide them.
    (fewer,) = capped.what_if({"num_workers": 2})
    assert fewer.predicted["training_s"] > 1.5 * fewer.now["training_s"], fewer


def test_a_cause_whose_saving_an_earlier_change_claims_is_still_named(monkeypatch):
    # findings.find caps the savings so that together they never exceed the wait. A change that
    # dilutes a cause (more workers against one slow worker) can predict more than removing the
    # cause; the cause stays named with its saving capped, while a finding whose own part is
    # small and whose saving the others claim is left out.
    from types import SimpleNamespace

    from dashboard.analysis.diagnosis import findings
    from dashboard.analysis.diagnosis.findings import LoaderContext, Recommendation

    def made(rid, saving, part):
        return Recommendation(rid, rid, {"part_s": part}, saving)

    found = [made("more_workers", 0.9, 0.3), made("slow_worker", 0.5, 0.6), made("slow_samples", 0.3, 0.1)]
    monkeypatch.setattr(findings, "MODULES", (SimpleNamespace(find=lambda ctx: found),))
    # A 10 s process: a finding is worth naming from 0.2 s (base.MIN_SHARE_OF_JOB).
    ctx = LoaderContext(SimpleNamespace(span_us=10e6), None, None, SimpleNamespace(wait_s=1.0), None)
    kept = findings.find(ctx)
    assert [(item.id, item.saving_s) for item in kept] == [("more_workers", 0.9), ("slow_worker", 0.1)]
    assert kept[1].evidence["uncapped_saving_s"] == 0.5


def test_a_per_batch_measure_the_trial_lacks_holds_no_memory_and_a_measured_one_is_kept(tmp_path):
    """Without the collector's fetch events, the model's hand-over and run queue per batch are NaN
    read from one value (24 MB each at 3M GetNexts otherwise, alive at the assessment's peak);
    with them, the hand-over is each batch's own: its return after its fetch ended."""
    from dashboard.analysis.diagnosis import loaders, pipeline

    plant(str(tmp_path / "bare"), batches=30, num_workers=2)
    plant(str(tmp_path / "fetched"), batches=30, num_workers=2, fetch_us=lambda batch, worker: 4_000,
          fetch_ready_us=300)
    for name in ("bare", "fetched"):
        trial = dashboard.load_trial(str(tmp_path / name))
        (process,) = loaders.processes(trial.framework, trial.system)
        (loader,) = process.loaders
        model = pipeline.build(loader, process)
        n = len(loader.calls)
        assert n == 30 and len(model.runq_us) == n and len(model.handover_us) == n, name
        assert np.isnan(model.runq_us).all() and model.runq_us.strides == (0,), name  # (no run queue recorded)
        if name == "bare":
            assert np.isnan(model.handover_us).all() and model.handover_us.strides == (0,)
            assert not model.service_measured
        else:
            assert model.service_measured and model.handover_us.strides == (8,)
            assert model.handover_us == pytest.approx(np.full(n, 300.0))  # each batch's, as planted


def test_the_model_holds_the_calls_own_waits_and_iterators_and_each_batchs_worker_in_16_bits(tmp_path):
    """The pipeline model reads each batch's wait and iterator from the calls frame's arrays
    themselves, not copies (24 MB each at 3M GetNexts, alive through the assessment), and holds
    each batch's worker as int16: the recorded one where it is one of the loader's, else its
    place in the round (its index mod num_workers)."""
    from dashboard.analysis.diagnosis import loaders, pipeline

    plant(str(tmp_path), epochs=2, batches=30, num_workers=2)
    trial = dashboard.load_trial(str(tmp_path))
    framework = trial.framework.copy()
    getnext = np.flatnonzero((framework["kind"] == fmt.KIND_GETNEXT).to_numpy())
    # Batch 4 recorded on the other worker than its place in the round (1, not 0); batches 3, 5
    # and 8 with no worker, one beyond the loader's two, and a negative one.
    recorded = framework["worker_id"].copy()
    for row, value in ((4, 1), (3, None), (5, 7), (8, -1)):
        recorded.iloc[getnext[row]] = value
    framework["worker_id"] = recorded
    (process,) = loaders.processes(framework, trial.system)
    (loader,) = process.loaders
    model = pipeline.build(loader, process)
    calls = loader.calls
    assert len(calls) == 60
    assert np.shares_memory(model.wait_us, calls["duration_us"].to_numpy())
    assert model.wait_us.tolist() == [end - start for start, end in zip(calls["start_us"], calls["end_us"])]
    assert np.shares_memory(model.segment, calls["segment"].to_numpy())  # (its iterators are numbered 0.. already)
    assert model.segment.tolist() == pd.factorize(calls["segment"].to_numpy())[0].tolist()
    expected = [int(w) if pd.notna(w) and 0 <= w < 2 else int(i) % 2 for w, i in zip(calls["worker_id"], calls["index"])]
    assert model.worker.dtype == np.int16 and model.worker.tolist() == expected
    assert model.worker[:10].tolist() == [0, 1, 0, 1, 1, 1, 0, 1, 0, 1]  # (batch 4's recorded 1; 3, 5, 8 by the round)


def _slow_samples_job(folder, init_args: dict) -> None:
    """Two workers that keep up, but for a slow sample every tenth batch of worker 1."""
    plant(folder, epochs=2, batches=40, num_workers=2, init_args=init_args,
          getnext_us=lambda epoch, batch, worker: 90_000 if worker == 1 and batch % 10 == 1 else 600)


def test_a_prefetch_factor_torch_accepts_is_analyzed_and_its_what_ifs_stay_within_bounds(tmp_path):
    # torch takes any prefetch_factor; the what-if takes at most MAX_PREFETCH (64). The slow-samples
    # finding tries deeper prefetch (2x and 4x today's): 66 failed the whole analysis.
    from dashboard.what_if_settings import MAX_PREFETCH

    _slow_samples_job(str(tmp_path / "t"), {fmt.ARG_PREFETCH: 33})
    result = dashboard.analyze(str(tmp_path / "t"))
    (budget,) = result.budget
    assert budget.evidence["prefetch_factor"] == 33
    (found,) = [r for r in result.recommendations if r.id == "slow_samples"]
    tried = [dict(item.split("=") for item in key.split(", ")) for key in found.evidence["tried"]]
    assert {"prefetch_factor": str(MAX_PREFETCH)} in tried, tried
    assert all(int(t["prefetch_factor"]) <= MAX_PREFETCH for t in tried if "prefetch_factor" in t), tried


@pytest.mark.parametrize("recorded", [0, 2**62])
def test_a_prefetch_factor_no_dataloader_has_is_ignored(tmp_path, recorded):
    # A damaged init event: 2**62 overflowed the model's arithmetic and failed the analysis.
    _slow_samples_job(str(tmp_path / "t"), {fmt.ARG_PREFETCH: recorded})
    result = dashboard.analyze(str(tmp_path / "t"))
    (budget,) = result.budget
    assert budget.evidence["prefetch_factor"] == 2  # torch's default, as where none is recorded
    assert "slow_samples" in [r.id for r in result.recommendations], result.recommendations


@pytest.mark.parametrize("recorded", [-3, 5_000_000])
def test_a_worker_count_no_dataloader_has_is_ignored_and_the_count_inferred(tmp_path, recorded):
    # A damaged init event: -3 failed the whole analysis, 5,000,000 sized its per-worker arrays
    # (a 180 kB trial took a minute). The GetNexts name workers 0 and 1: two.
    _slow_samples_job(str(tmp_path / "t"), {fmt.ARG_NUM_WORKERS: recorded})
    result = dashboard.analyze(str(tmp_path / "t"))
    (budget,) = result.budget
    assert budget.loader.endswith("(num_workers=2)"), budget.loader
    assert budget.evidence["num_workers"] == 2
    assert "slow_samples" in [r.id for r in result.recommendations], result.recommendations


def test_workers_beyond_an_iterators_batches_take_no_core_in_a_what_if():
    # The sample's single-process loader runs iterators of 8 batches. Every worker of a what-if
    # was counted as computing on the 2 cores: 256 workers predicted 199 s of training, 31x
    # today's 6.3 s. At most 8 of them ever hold a batch, so 16, 64 or 256 give what 8 give.
    result = dashboard.analyze(SAMPLE)
    (single,) = [b for b in result.budget if b.loader.startswith(SP)]
    batches = single.evidence["batches"] // single.evidence["iterators"]
    assert batches == 8

    def predicted(workers: int) -> float:
        (found,) = [w for w in result.what_if({"num_workers": workers}) if w.loader == single.loader]
        return found.predicted["training_s"]

    at_batches = predicted(batches)
    assert np.isfinite(at_batches)
    assert predicted(16) == predicted(64) == predicted(256) == at_batches
    assert at_batches < 2 * single.training_s  # (199 s of 6.3 s before)


def test_a_single_process_iterator_without_its_init_has_no_workers(tmp_path):
    # The inits rotated away (or a recording begun after iter()): its worker count came from
    # worker ids, -1 for the main process, so "unknown"; its 5.8 s of loading in the main
    # process went to "throughput", and the use_workers finding was gone.
    import glob
    import shutil

    trial = str(tmp_path / "trial")
    shutil.copytree(SAMPLE, trial)
    for path in glob.glob(os.path.join(trial, "framework", "**", "*.json"), recursive=True):
        with open(path) as handle:
            events = [e for e in json.load(handle) if not str(e.get("name", "")).endswith("__init__")]
        with open(path, "w") as handle:
            json.dump(events, handle)
    whole, cut = dashboard.analyze(SAMPLE), dashboard.analyze(trial)
    assert not (cut.trial.framework["kind"] == fmt.KIND_INIT).any()
    (single,) = [b for b in cut.budget if b.loader.startswith(SP)]
    (before,) = [b for b in whole.budget if b.loader.startswith(SP)]
    assert single.evidence["num_workers"] == 0 and single.loader == before.loader
    assert single.parts == before.parts and single.parts["main_process"] > 0.9 * single.wait_s
    assert "use_workers" in {r.id for r in cut.recommendations}


def test_a_start_up_finding_quotes_its_own_loaders_initializations(tmp_path):
    # Two loaders of one iterator class in a process (2 and 4 workers: train and validation):
    # the 2-worker loader's persistent_workers finding quoted the median of both loaders' inits.
    import glob
    import shutil

    trial = str(tmp_path / "trial")
    shutil.copytree(SAMPLE, trial)
    for path in glob.glob(os.path.join(trial, "framework", "**", "*.json"), recursive=True):
        with open(path) as handle:
            events = json.load(handle)
        for event in events:  # the single-process loader made a 4-worker one of the other's class
            if str(event.get("name", "")).startswith(SP):
                event["name"] = event["name"].replace(SP, MP)
                if "num_workers" in event.get("args", {}):
                    event["args"]["num_workers"] = 4
        with open(path, "w") as handle:
            json.dump(events, handle)
    result = dashboard.analyze(trial)
    frame = result.trial.framework
    inits = frame[(frame["kind"] == fmt.KIND_INIT).to_numpy()]
    own = inits[(inits["num_workers"] == 2).to_numpy()]["duration_us"]
    assert 0 < len(own) < len(inits) and float(own.median()) != float(inits["duration_us"].median())
    (found,) = [r for r in result.recommendations if r.id == "persistent_workers" and r.evidence["num_workers"] == 2]
    assert found.evidence["init_median_s"] == round(float(own.median()) / 1e6, 6)


def test_a_profiling_window_of_a_long_iterator_does_not_cap_the_workers_a_what_if_keeps_busy(tmp_path):
    # A recording of 16 batches (200..215) of a 400-batch iterator: taken for the iterator's
    # length, the cap predicted 64 workers as 16. Only whole iterators (between the first and
    # the last, two or more of one length) tell the length.
    import glob

    folder = str(tmp_path / "window")
    write_trial(folder, epochs=1, train_batches=400, val_batches=0, num_workers=4, cpus=4, cpu_percent=95,
                getnext_us=(5000, 9000))
    for path in glob.glob(os.path.join(folder, "framework", "**", "*.json"), recursive=True):
        with open(path) as handle:
            events = json.load(handle)
        kept = [e for e in events if not (e.get("ph") == "X" and str(e.get("name", "")).endswith("::GetNext")
                                          and not 200 <= int(e["args"]["step_num"]) < 216)]
        with open(path, "w") as handle:
            json.dump(kept, handle)
    result = dashboard.analyze(folder)
    (budget,) = result.budget
    assert budget.evidence["batches"] == 16 and budget.evidence["iterators"] == 1

    def predicted(workers: int) -> float:
        (found,) = result.what_if({"num_workers": workers})
        return found.predicted["training_s"]

    assert predicted(64) != predicted(16)
