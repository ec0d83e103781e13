"""The result cache of `app.py analyze --cache-dir` (dashboard/result_cache.py): a reopen of an
unchanged trial prints what the analysis prints, without reading the trial; anything that
changes the answer (a file, an S3 object, an option, the code) is a miss; a damaged entry is a
miss and is written again; a load that missed files keeps nothing.

Every answer is compared with the same command run without a cache folder. Whether a run
computed is seen by counting the calls of the analysis it would make (dashboard.api.analyze).
"""
from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys

import pytest

import dashboard.api
import dashboard.result_cache as result_cache
from dashboard.result_cache import RESULTS_FOLDER, SUFFIX, ResultCache
from dashboard.synthetic import write_trial
from dashboard.trial.store import LocalStore
from tests.conftest import ROOT, upload_folder


def _app():
    spec = importlib.util.spec_from_file_location("dashboard_app_under_test", os.path.join(ROOT, "app.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


APP = _app()


def counted_calls(monkeypatch, module, name: str) -> list:
    """Each call of module.name from now on, by its first argument."""
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.fixture
def analyses(monkeypatch):
    """The analyses the command computes (each call of dashboard.api.analyze), counted."""
    return counted_calls(monkeypatch, dashboard.api, "analyze")


def _run(capsys, *args) -> str:
    capsys.readouterr()
    assert APP.main(["analyze", *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _trial(tmp_path) -> str:
    folder = str(tmp_path / "trial")
    write_trial(folder, epochs=2, train_batches=20, val_batches=0, rotate_s=0.05, num_workers=2, slow_worker=1,
                slow_worker_factor=3.0, slow_batches={(1, 7): 250_000})
    return folder


def _entries(cache: str) -> list[str]:
    return sorted(n for n in os.listdir(os.path.join(cache, RESULTS_FOLDER)) if n.endswith(SUFFIX))


def test_a_reopen_prints_the_analysis_without_computing_it(tmp_path, capsys, analyses):
    folder, cache = _trial(tmp_path), str(tmp_path / "cache")
    plain = {form: _run(capsys, folder, *form) for form in (("--json",), ())}
    assert len(analyses) == 2
    for form, expected in plain.items():
        assert _run(capsys, folder, *form, "--cache-dir", cache) == expected
    assert len(analyses) == 4 and len(_entries(cache)) == 2  # the JSON and the text: one entry each
    results = os.path.join(cache, RESULTS_FOLDER)
    assert stat.S_IMODE(os.stat(results).st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(os.path.join(results, n)).st_mode) for n in os.listdir(results)} == {0o600}
    for form, expected in plain.items():
        assert _run(capsys, folder, *form, "--cache-dir", cache) == expected
    assert len(analyses) == 4  # both answered from the cache
    assert json.loads(plain[("--json",)])["getnext"]["count"] > 0


def test_each_option_that_changes_the_answer_has_its_own_entry(tmp_path, capsys, analyses):
    folder, cache = _trial(tmp_path), str(tmp_path / "cache")
    variants = [("--json",), ("--json", "--what-if", "num_workers=4"), ("--json", "--what-if", "num_workers=8"),
                ("--json", "--node", "algo-1"), ("--json", "--outlier-factor", "1.1"), ("--json", "--by-rank")]
    plain = [_run(capsys, folder, *variant) for variant in variants]
    assert len(set(plain)) == 4  # (the node is the whole job, and by rank gives the same answers)
    cached = [_run(capsys, folder, *variant, "--cache-dir", cache) for variant in variants]
    computed = len(analyses)
    assert cached == plain and len(_entries(cache)) == len(variants)
    assert [_run(capsys, folder, *variant, "--cache-dir", cache) for variant in variants] == plain
    assert len(analyses) == computed


def test_a_changed_file_of_the_same_size_is_a_miss(tmp_path, capsys, analyses):
    folder, cache = _trial(tmp_path), str(tmp_path / "cache")
    before = _run(capsys, folder, "--json", "--cache-dir", cache)
    path = next(os.path.join(d, n) for d, _, names in sorted(os.walk(os.path.join(folder, "framework")))
                for n in sorted(names))
    with open(path) as handle:
        text = handle.read()
    at = text.index('"dur": ') + len('"dur": ')
    changed = text[:at] + ("2" if text[at] == "1" else "1") + text[at + 1:]  # one digit: the same size
    info = os.stat(path)
    with open(path, "w") as handle:
        handle.write(changed)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    assert os.path.getsize(path) == info.st_size
    computed = len(analyses)
    after = _run(capsys, folder, "--json", "--cache-dir", cache)
    assert len(analyses) == computed + 1
    assert after != before and after == _run(capsys, folder, "--json")


def test_a_new_file_is_a_miss(tmp_path, capsys, analyses):
    folder, cache = _trial(tmp_path), str(tmp_path / "cache")
    _run(capsys, folder, "--json", "--cache-dir", cache)
    # A running job's next system file (a copy, named a minute later, as the writer names them).
    system = sorted(os.path.join(d, n) for d, _, names in os.walk(os.path.join(folder, "system")) for n in names)[-1]
    stamp = int(os.path.basename(system).split(".")[0])
    with open(system) as handle:
        lines = handle.read().replace(f'"Timestamp": {stamp}', f'"Timestamp": {stamp + 60}')
    with open(os.path.join(os.path.dirname(system), f"{stamp + 60}" + os.path.basename(system)[len(str(stamp)):]),
              "w") as handle:
        handle.write(lines)
    computed = len(analyses)
    assert _run(capsys, folder, "--json", "--cache-dir", cache) == _run(capsys, folder, "--json")
    assert len(analyses) == computed + 2  # the miss, and the run without a cache


@pytest.mark.parametrize("damage", ["a byte flipped", "cut short", "empty"])
def test_a_damaged_entry_is_a_miss_and_is_written_again(tmp_path, capsys, analyses, damage):
    folder, cache = _trial(tmp_path), str(tmp_path / "cache")
    plain = _run(capsys, folder, "--json")
    _run(capsys, folder, "--json", "--cache-dir", cache)
    (entry,) = _entries(cache)
    path = os.path.join(cache, RESULTS_FOLDER, entry)
    with open(path, "rb") as handle:
        data = bytearray(handle.read())
    if damage == "a byte flipped":
        data[len(data) // 2] ^= 0x20
    elif damage == "cut short":
        data = data[:len(data) - 10]
    else:
        data = b""
    with open(path, "wb") as handle:
        handle.write(data)
    computed = len(analyses)
    assert _run(capsys, folder, "--json", "--cache-dir", cache) == plain
    assert len(analyses) == computed + 1
    assert _run(capsys, folder, "--json", "--cache-dir", cache) == plain  # written again, whole
    assert len(analyses) == computed + 1


def test_another_version_of_the_code_is_a_miss(tmp_path, capsys, analyses, monkeypatch):
    folder, cache = _trial(tmp_path), str(tmp_path / "cache")
    plain = _run(capsys, folder, "--json", "--cache-dir", cache)
    monkeypatch.setattr(result_cache, "code_version", lambda: "another version")
    computed = len(analyses)
    assert _run(capsys, folder, "--json", "--cache-dir", cache) == plain
    assert len(analyses) == computed + 1 and len(_entries(cache)) == 2


def test_a_load_that_missed_a_file_keeps_nothing(tmp_path, capsys, analyses, monkeypatch):
    folder, cache = _trial(tmp_path), str(tmp_path / "cache")
    plain = _run(capsys, folder, "--json")
    real_read = LocalStore.read
    gone = []

    def read(self, key, size=None):
        if key.startswith("framework/") and not gone:
            gone.append(key)
            raise FileNotFoundError(2, "No such file or directory", key)  # removed after the listing
        return real_read(self, key, size=size)

    monkeypatch.setattr(LocalStore, "read", read)
    missed = json.loads(_run(capsys, folder, "--json", "--cache-dir", cache))
    assert [f["path"] for f in missed["files"]["skipped"]] == gone
    assert _entries(cache) == []
    monkeypatch.setattr(LocalStore, "read", real_read)
    computed = len(analyses)
    assert _run(capsys, folder, "--json", "--cache-dir", cache) == plain
    assert len(analyses) == computed + 1


def test_a_new_etag_on_s3_is_a_miss(tmp_path, capsys, analyses, s3_client):
    folder, cache = _trial(tmp_path), str(tmp_path / "cache")
    upload_folder(s3_client, folder, "results", "job/trial")
    path = "s3://results/job/trial"
    plain = _run(capsys, path, "--json")
    assert _run(capsys, path, "--json", "--cache-dir", cache) == plain
    computed = len(analyses)
    assert _run(capsys, path, "--json", "--cache-dir", cache) == plain
    assert len(analyses) == computed
    key = next(o["Key"] for o in s3_client.list_objects_v2(Bucket="results", Prefix="job/trial/framework/")["Contents"])
    body = s3_client.get_object(Bucket="results", Key=key)["Body"].read().decode()
    at = body.index('"dur": ') + len('"dur": ')
    s3_client.put_object(Bucket="results", Key=key, Body=(body[:at] + ("2" if body[at] == "1" else "1")
                                                           + body[at + 1:]).encode())  # the same size
    changed = _run(capsys, path, "--json", "--cache-dir", cache)
    assert len(analyses) == computed + 1
    assert changed != plain and changed == _run(capsys, path, "--json")


def test_the_least_recently_used_entries_go_past_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(result_cache, "MAX_ENTRIES", 3)
    cache = ResultCache(str(tmp_path / "cache"))
    keys = [cache.key("t", "/t", [], {"n": n}) for n in range(5)]
    for n, key in enumerate(keys[:3]):
        cache.put(key, f"answer {n}\n")
        os.utime(os.path.join(cache.directory, key + SUFFIX), ns=(n * 10**9, n * 10**9))
    assert cache.get(keys[0]) == "answer 0\n"  # used now: the most recent
    cache.put(keys[3], "answer 3\n")
    assert [cache.get(k) for k in keys[:4]] == ["answer 0\n", None, "answer 2\n", "answer 3\n"]


def test_a_reopen_imports_no_pandas(tmp_path, capsys):
    folder, cache = _trial(tmp_path), str(tmp_path / "cache")
    expected = _run(capsys, folder, "--json", "--cache-dir", cache)
    probe = ("import sys, runpy\n"
             f"sys.argv = ['app.py', 'analyze', {folder!r}, '--json', '--cache-dir', {cache!r}]\n"
             "try:\n"
             f"    runpy.run_path({os.path.join(ROOT, 'app.py')!r}, run_name='__main__')\n"
             "except SystemExit as exit:\n"
             "    assert exit.code == 0, exit.code\n"
             "print(sorted(m for m in ('pandas', 'pyarrow.compute', 'scipy', 'msgspec') if m in sys.modules), "
             "file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
    assert done.stderr.strip() == "[]"


def test_the_by_rank_analysis_reports_what_the_listing_skipped(tmp_path, capsys, monkeypatch):
    # The command lists the trial once for the key; the per-rank analysis reads that listing,
    # and with it the listing's own skips (here a link to a folder outside, never followed).
    import dashboard.by_rank

    folder, cache = _trial(tmp_path), str(tmp_path / "cache")
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, os.path.join(folder, "system", "more"))
    calls = counted_calls(monkeypatch, dashboard.by_rank, "analyze_by_rank")
    plain = _run(capsys, folder, "--json", "--by-rank")
    assert [f["path"] for f in json.loads(plain)["files"]["skipped"]] == ["system/more"]
    assert _run(capsys, folder, "--json", "--by-rank", "--cache-dir", cache) == plain
    assert len(calls) == 2
    assert _run(capsys, folder, "--json", "--by-rank", "--cache-dir", cache) == plain
    assert len(calls) == 2  # the reopen printed the kept answer
