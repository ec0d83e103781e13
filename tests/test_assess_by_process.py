"""The diagnosis as per-rank work: each process's part assessed from that process's rows alone
(what a worker that loaded only its files sees), then combined, equals the assessment of the
whole trial: verdicts, budgets, findings with their texts, what-ifs. Exactly, not nearly."""
from __future__ import annotations

import dataclasses
import os
import pickle

import numpy as np
import pytest

from dashboard.analysis import diagnosis
from dashboard.synthetic import write_job, write_trial
from dashboard.trial.load import load_trial
from tests.conftest import ROOT

SAMPLE = os.path.join(ROOT, "examples", "sample-trial", "trial")


def _fixtures(folder) -> dict[str, str]:
    out = {"sample": SAMPLE}
    out["one host"] = str(folder / "one")
    write_trial(out["one host"], epochs=3, slow_batches={(1, 4): 250_000}, slow_worker=1, slow_worker_factor=3.0)
    out["two hosts"] = str(folder / "two")
    write_trial(out["two hosts"], hosts=2, epochs=2, num_workers=4)
    out["straggler rank"] = str(folder / "ranks")
    write_job(out["straggler rank"], hosts=2, ranks_per_host=4, steps=60, slow_rank=5, seed=1)
    out["slow storage host"] = str(folder / "storage")
    write_job(out["slow storage host"], hosts=3, ranks_per_host=2, steps=40, slow_storage_host=2, seed=2)
    out["ranks by name"] = str(folder / "names")
    write_job(out["ranks by name"], hosts=2, ranks_per_host=2, steps=20, record_ranks=False, seed=3)
    return out


def _plain(value):
    """A result as plain data, numpy arrays as lists: dataclass equality cannot compare arrays."""
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _by_process(trial) -> list[diagnosis.ProcessAssessment]:
    """Each process assessed from its own rows and its host's system metrics only, sent as a
    worker sends it (pickled), in an order other than the trial's."""
    per_host: dict[str, int] = {}
    for process in trial.processes:
        per_host[process.node] = per_host.get(process.node, 0) + 1
    parts = []
    for process in reversed(trial.processes):
        mine = trial.for_node(process.id)
        parts += pickle.loads(pickle.dumps(diagnosis.assess_processes(mine.framework, mine.system, per_host)))
    return parts


@pytest.mark.parametrize("name", ["sample", "one host", "two hosts", "straggler rank", "slow storage host",
                                  "ranks by name"])
def test_combined_parts_are_the_whole_trials_assessment(tmp_path, name):
    trial = load_trial(_fixtures(tmp_path)[name])
    whole = diagnosis.assess(trial.framework, trial.system)
    combined = diagnosis.combine(_by_process(trial))

    assert combined.verdict == whole.verdict
    assert combined.nodes_verdict == whole.nodes_verdict
    assert combined.processes_verdict == whole.processes_verdict
    assert [r.id for r in combined.recommendations] == [r.id for r in whole.recommendations]
    assert combined.recommendations == whole.recommendations  # texts, evidence, savings, predictions
    assert _plain(combined.budget) == _plain(whole.budget)
    assert combined.what_if == whole.what_if
    # A what-if asked afterwards replays each part's own model.
    assert combined.predict({"num_workers": 6}) == whole.predict({"num_workers": 6})


def test_the_fixtures_hold_what_the_combination_must_get_right(tmp_path):
    # Cross-process findings and labels: a straggler rank, a straggler host, labels naming ranks.
    fixtures = _fixtures(tmp_path)
    ids = lambda name: {r.id for r in diagnosis.assess(*_frames(fixtures[name])).recommendations}  # noqa: E731
    assert "straggler_rank" in ids("straggler rank")
    assert "straggler_host" in ids("slow storage host")
    found = diagnosis.assess(*_frames(fixtures["straggler rank"]))
    assert len({b.process for b in found.budget}) == 8
    # A host of several processes: its ranks are named, which a rank's rows alone cannot tell.
    (straggler,) = [r for r in found.recommendations if r.id == "straggler_rank"]
    assert "rank 5" in straggler.text, straggler.text


def _frames(path):
    trial = load_trial(path)
    return trial.framework, trial.system


def test_a_part_is_small_beside_the_rows_it_was_computed_from(tmp_path):
    # The point of per-rank work: what a worker sends back is a summary, not its events.
    # A rank of 40,000 batches: its part keeps the replay's sample (at most
    # pipeline.MAX_REPLAY_BATCHES batches) and per-epoch windows, not per-batch rows.
    folder = str(tmp_path / "big")
    write_job(folder, hosts=1, ranks_per_host=1, epochs=2, steps=20_000, seed=4)
    trial = load_trial(folder)
    sent = pickle.dumps(diagnosis.assess_processes(trial.framework, trial.system, {trial.processes[0].node: 1}))
    assert len(sent) < trial.framework.memory_usage(deep=True).sum() / 4, len(sent)
