"""The whole analysis as per-rank work (dashboard/by_rank.py): each rank's files read,
summarised and assessed by a task of its own, combined here, give what `analyze` gives on the
whole trial: the `analyze --json` object and the text report, byte for byte (the Dask
cluster's run of it: tests/test_dask.py)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

import dashboard
from dashboard import by_rank
from dashboard.report import to_dict, to_text
from dashboard.synthetic import write_job, write_trial
from dashboard.trial.errors import TrialError, TrialTooLargeError
from dashboard.trial.load import rank_files
from dashboard.trial.store import open_store
from tests.conftest import ROOT

SAMPLE = os.path.join(ROOT, "examples", "sample-trial", "trial")


def _fixture(folder, name: str) -> str:
    path = str(folder / name.replace(" ", "-"))
    if name == "sample":
        return SAMPLE
    if name == "straggler rank":
        write_job(path, hosts=2, ranks_per_host=4, steps=60, slow_rank=5, seed=1)
    elif name == "slow storage host":
        write_job(path, hosts=3, ranks_per_host=2, steps=40, slow_storage_host=2, seed=2)
    elif name == "ranks by name":
        write_job(path, hosts=2, ranks_per_host=2, steps=20, record_ranks=False, seed=3)
    elif name == "two hosts":
        write_trial(path, hosts=2, epochs=2, num_workers=4, slow_batches={(1, 3): 300_000})
    elif name == "no system metrics":
        write_job(path, hosts=2, ranks_per_host=2, steps=20, system=False, seed=4)
    return path


@pytest.mark.parametrize("name", ["sample", "straggler rank", "slow storage host", "ranks by name", "two hosts",
                                  "no system metrics"])
def test_per_rank_work_gives_the_whole_trials_report(tmp_path, name):
    path = _fixture(tmp_path, name)
    whole, ranked = dashboard.analyze(path), by_rank.analyze_by_rank(path)
    assert to_dict(ranked) == to_dict(whole)
    assert to_text(ranked) == to_text(whole)
    assert ranked.what_if({"num_workers": 8}) == whole.what_if({"num_workers": 8})


def test_a_rank_far_slower_than_the_job_is_summarised_again_with_the_jobs_thresholds(tmp_path, monkeypatch):
    # Its own cut for possible outliers lies above the job's threshold (all its GetNexts are
    # outliers of the job): its task runs again, keeping every row above the job's.
    calls = []
    real = by_rank.resummarise
    monkeypatch.setattr(by_rank, "resummarise", lambda *args: calls.append(args[1].processes) or real(*args))
    path = _fixture(tmp_path, "straggler rank")
    ranked = by_rank.analyze_by_rank(path)
    assert calls and all(len(processes) == 1 for processes in calls)
    whole = dashboard.analyze(path)
    assert to_dict(ranked)["getnext"]["outliers"] == to_dict(whole)["getnext"]["outliers"]
    assert len(to_dict(whole)["getnext"]["outliers"]) > 0


def _break(path: str) -> dict[str, str]:
    """A broken line in one rank's file, a gzip file that is not one, and a file of no kind."""
    framework = sorted(os.path.join(d, f) for d, _, names in os.walk(os.path.join(path, "framework"))
                       for f in names)
    with open(framework[0]) as handle:
        lines = handle.read().split("\n")
    broken = next(i for i, line in enumerate(lines) if "::GetNext" in line)
    lines[broken] = lines[broken][:30]
    with open(framework[0], "w") as handle:
        handle.write("\n".join(lines))
    bad_gzip = framework[-1] + ".gz"
    with open(bad_gzip, "wb") as handle:
        handle.write(b"not gzip at all")
    with open(os.path.join(path, "notes.txt"), "w") as handle:
        handle.write("not a trial file")
    return {"broken": framework[0], "bad_gzip": bad_gzip}


def test_bad_files_are_reported_as_the_whole_load_reports_them(tmp_path):
    path = _fixture(tmp_path, "straggler rank")
    _break(path)
    whole, ranked = to_dict(dashboard.analyze(path)), to_dict(by_rank.analyze_by_rank(path))
    assert ranked["lines_skipped"] == whole["lines_skipped"] == 1
    assert ranked["lines_skipped_in"] == whole["lines_skipped_in"]
    assert ranked["files"]["read"] == whole["files"]["read"]
    # Skipped files in path order (the whole load lists the listing's skips first).
    by_path = lambda items: sorted(items, key=lambda item: item["path"])  # noqa: E731
    assert ranked["files"]["skipped"] == by_path(whole["files"]["skipped"])
    assert {item["path"] for item in whole["files"]["skipped"]} >= {"notes.txt"}
    ranked["files"]["skipped"] = whole["files"]["skipped"] = None
    assert ranked == whole


def test_the_command_line_runs_it_in_worker_processes_with_the_same_answers(tmp_path):
    path = _fixture(tmp_path, "straggler rank")

    def run(*extra):
        done = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "analyze", path, "--json", *extra],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert run("--by-rank") == run()
    cache = tmp_path / "columns"
    cache.mkdir(mode=0o700)
    assert run("--by-rank", "--cache-dir", str(cache)) == run()
    assert any(cache.iterdir())  # the workers wrote the columns
    assert run("--by-rank", "--cache-dir", str(cache)) == run()  # and read them back
    refused = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "analyze", path, "--by-rank",
                              "--rank", "2"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--by-rank analyzes the whole job" in refused.stderr


def test_the_whole_trials_limits_hold_over_the_ranks(tmp_path):
    path = _fixture(tmp_path, "straggler rank")
    events = len(dashboard.load_trial(path).framework)
    with pytest.raises(TrialTooLargeError, match="events"):
        by_rank.analyze_by_rank(path, max_events=events - 1)
    with pytest.raises(TrialTooLargeError, match="files"):
        by_rank.analyze_by_rank(path, max_files=1)


def test_its_result_says_why_it_has_no_window(tmp_path):
    ranked = by_rank.analyze_by_rank(_fixture(tmp_path, "ranks by name"))
    with pytest.raises(TrialError, match="analyzed by rank"):
        ranked.window()


def test_a_trial_of_gzip_files_splits_by_rank_too(tmp_path):
    path = _fixture(tmp_path, "ranks by name")
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            with open(full, "rb") as handle, gzip.open(full + ".gz", "wb") as out:
                out.write(handle.read())
            os.remove(full)
    groups, per_host = rank_files(open_store(path).list())
    assert len(groups) == 4 and per_host == {"algo-1": 2, "algo-2": 2}
    assert to_dict(by_rank.analyze_by_rank(path)) == to_dict(dashboard.analyze(path))
