"""The whole analysis as per-rank work (dashboard/by_rank.py): each rank's files read,
summarised and assessed by a task of its own, combined here, give what `analyze` gives on the
whole trial: the `analyze --json` object and the text report, byte for byte (the Dask
cluster's run of it: tests/test_dask.py)."""
from __future__ import annotations

import glob
import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import dashboard
from dashboard import by_rank
from dashboard.api import compare
from dashboard.report import to_dict, to_text
from dashboard.result_cache import RESULTS_FOLDER
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
    again = []
    real = by_rank.rank_work

    def counting(path, group, plan, *args):
        if plan.thresholds is not None:
            again.append(group.processes)
        return real(path, group, plan, *args)

    monkeypatch.setattr(by_rank, "rank_work", counting)
    path = _fixture(tmp_path, "straggler rank")
    ranked = by_rank.analyze_by_rank(path)
    assert again and all(len(processes) == 1 for processes in again)
    whole = dashboard.analyze(path)
    assert to_dict(ranked)["getnext"]["outliers"] == to_dict(whole)["getnext"]["outliers"]
    assert len(to_dict(whole)["getnext"]["outliers"]) > 0


def _file_of(path: str, process: str) -> str:
    (found,) = glob.glob(os.path.join(path, "framework", "pevents", "*", f"*_{process}_pythontimeline.json"))
    return found


def _moved_far(path: str) -> None:
    """Rank 3's file, name and times 60 days later: a host whose clock is off."""
    old = _file_of(path, "3-algo-2")
    shift = 60 * 86_400 * 10**6
    with open(old) as handle:
        text = handle.read()
    start = re.search(r'"start_time_since_epoch_in_micros": (\d+)', text)
    text = text.replace(start.group(0), f'"start_time_since_epoch_in_micros": {int(start.group(1)) + shift}')
    end = int(os.path.basename(old).split("_")[0])
    os.remove(old)
    with open(os.path.join(os.path.dirname(old), f"{end + shift}_3-algo-2_pythontimeline.json"), "w") as handle:
        handle.write(text)


def _copied_as_another_rank(path: str) -> None:
    old = _file_of(path, "0-algo-1")
    shutil.copy(old, old.replace("0-algo-1", "9-algo-1"))


def _system_copied_for_another_host(path: str) -> None:
    (old,) = glob.glob(os.path.join(path, "system", "incremental", "*", "*.algo-1.json"))[:1]
    shutil.copy(old, old.replace("algo-1", "algo-3"))


def _same_broken_file_in_three_ranks(path: str) -> None:
    for process in ("2-algo-2", "3-algo-2", "1-algo-1"):
        with open(_file_of(path, process), "w") as handle:
            handle.write("garbage{\n")


def _unreadable_ranks(path: str) -> None:
    """Three of algo-2's four ranks unreadable: the host has one process with rows, which the
    whole trial's texts name by the host alone, though the file names list four."""
    for process in ("4-algo-2", "6-algo-2", "7-algo-2"):
        with open(_file_of(path, process), "w") as handle:
            handle.write(f"garbage{{ of {process}\n")


def _stray_json(path: str) -> None:
    with open(os.path.join(path, "extra.json"), "w") as handle:
        handle.write('{"a": 1}')


@pytest.mark.parametrize("damage", [_moved_far, _copied_as_another_rank, _system_copied_for_another_host,
                                    _same_broken_file_in_three_ranks, _unreadable_ranks, _stray_json],
                         ids=lambda damage: damage.__name__.strip("_"))
def test_what_only_the_whole_trial_shows_is_applied_to_every_rank(tmp_path, damage):
    # Events far from the whole trial's median time, copies of another rank's files, a host's
    # label count over the ranks with rows: each rank's task is told and runs again.
    path = _fixture(tmp_path, "straggler rank" if damage is _unreadable_ranks else "ranks by name")
    damage(path)
    whole, ranked = to_dict(dashboard.analyze(path)), to_dict(by_rank.analyze_by_rank(path))
    by_path = lambda items: sorted(items, key=lambda item: item["path"])  # noqa: E731
    assert ranked["files"]["skipped"] == by_path(whole["files"]["skipped"])
    ranked["files"]["skipped"] = whole["files"]["skipped"] = None
    assert ranked == whole
    if damage is _moved_far:
        assert whole["lines_skipped"] > 0 and "median time" in whole["lines_skipped_in"][0]["reason"]
    if damage is _unreadable_ranks:
        assert any(" on algo-2: " in r["text"] for r in whole["recommendations"]), whole["recommendations"]


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
    # In forked worker processes, the command line's way (a process with no other thread).
    forked = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "forked_load.py"), "--by-rank", path],
                            capture_output=True, text=True, timeout=120)
    assert forked.returncode == 0, forked.stderr
    forked = json.loads(forked.stdout)
    assert forked.pop("forked") == [2] and forked["report"] == run()
    cache = tmp_path / "columns"
    cache.mkdir(mode=0o700)
    assert run("--by-rank", "--cache-dir", str(cache)) == run()
    assert any(cache.glob("*.arrow"))  # the workers wrote the columns
    shutil.rmtree(cache / RESULTS_FOLDER)  # (the answer kept: tests/test_result_cache.py)
    assert run("--by-rank", "--cache-dir", str(cache)) == run()  # and read them back
    refused = subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "analyze", path, "--by-rank",
                              "--rank", "2"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--by-rank analyzes the whole job" in refused.stderr


def test_the_whole_trials_limits_hold_over_the_ranks(tmp_path):
    path = _fixture(tmp_path, "straggler rank")
    trial = dashboard.load_trial(path)
    events = len(trial.framework) + len(trial.system)  # what load_trial counts, each host's samples once
    by_rank.analyze_by_rank(path, max_events=events)
    dashboard.analyze(path, max_events=events)
    with pytest.raises(TrialTooLargeError, match="events"):
        by_rank.analyze_by_rank(path, max_events=events - 1)
    with pytest.raises(TrialTooLargeError, match="files"):
        by_rank.analyze_by_rank(path, max_files=1)
    # A file that is no part of the trial counts for neither.
    trial_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)
    with open(os.path.join(path, "model.pt"), "wb") as handle:
        handle.write(b"\0" * (trial_bytes + 1))
    dashboard.analyze(path, max_bytes=trial_bytes)
    by_rank.analyze_by_rank(path, max_bytes=trial_bytes)
    for analyze in (dashboard.analyze, by_rank.analyze_by_rank):
        with pytest.raises(TrialTooLargeError, match="over the limit"):
            analyze(path, max_bytes=trial_bytes // 2)


def test_an_empty_folder_is_refused_as_the_whole_load_refuses_it(tmp_path):
    from dashboard.trial.errors import NotATrialError

    (tmp_path / "empty").mkdir()
    messages = []
    for analyze in (dashboard.analyze, by_rank.analyze_by_rank):
        with pytest.raises(NotATrialError) as refused:
            analyze(str(tmp_path / "empty"))
        messages.append(str(refused.value))
    assert messages[0] == messages[1]


def test_a_ranked_result_cannot_be_compared_and_says_so(tmp_path):
    path = _fixture(tmp_path, "ranks by name")
    with pytest.raises(TrialError, match="analyzed by rank"):
        compare(by_rank.analyze_by_rank(path), path)


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
