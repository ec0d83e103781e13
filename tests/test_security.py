"""Hostile paths, links out of a trial, the S3 bucket allow-list, credentials kept out of
messages and logs, and the size limits."""
from __future__ import annotations

import gzip
import json
import logging
import os
import posixpath
import re
import subprocess
import sys

import pytest

import dashboard
from dashboard.synthetic import write_trial
from dashboard.trial.errors import (TrialAccessError, TrialError, TrialNotFoundError,
                                    TrialTooLargeError)
from dashboard.trial.load import load_trial
from dashboard.trial.store import LocalStore
from tests.conftest import ROOT, CountingStore, free_port, upload_folder

FAKE_KEY_ID = "AKIAFAKEKEYID0000042"
FAKE_SECRET = "fAkeSecret/NeverLogMe+0123456789abcdefghijkl"
FAKE_TOKEN = "FakeSessionToken//NeverLogMeEither0123456789"


def run_app(*args, env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def event_keys(trial):
    fw = trial.framework
    return sorted(zip(fw["process"].astype(str), fw["name"].astype(str), fw["start_us"].tolist()))


def generated_keys(synthetic):
    return sorted((e.node, e.name, e.start_us) for e in synthetic.events)


@pytest.fixture
def roots(tmp_path):
    """A data root holding one trial, and a trial outside it."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    inside = write_trial(str(data / "job"), epochs=1, rotate_s=0.1)
    write_trial(str(outside / "job"), epochs=1, rotate_s=0.1, main_pid=30_000)
    (tmp_path / "data-evil").mkdir()
    write_trial(str(tmp_path / "data-evil" / "job"), epochs=1)
    return tmp_path, data, outside, inside


# --- local paths ------------------------------------------------------------------------

def test_paths_outside_the_roots_are_refused(roots):
    tmp_path, data, outside, inside = roots
    allowed = [str(data)]
    assert event_keys(load_trial(str(data / "job"), roots=allowed)) == generated_keys(inside)
    hostile = [str(data / ".." / "outside" / "job"),           # .. out of the root
               str(data / "job" / ".." / ".." / "outside" / "job"),
               str(outside / "job"),                           # absolute, elsewhere
               "/etc", "/", str(tmp_path),                     # the root's parents
               str(tmp_path / "data-evil" / "job")]            # a sibling sharing the prefix
    for path in hostile:
        with pytest.raises(TrialAccessError) as caught:
            load_trial(path, roots=allowed)
        # The path as typed, never the server's roots.
        assert str(caught.value) == f"{path}: outside the allowed data roots"
    relative = os.path.relpath(str(outside / "job"))
    with pytest.raises(TrialAccessError, match="outside the allowed data roots"):
        load_trial(relative, roots=allowed)
    with pytest.raises(TrialAccessError, match="none configured"):
        load_trial(str(data / "job"), roots=[])


def test_a_nul_character_is_a_clear_error_not_a_crash(roots):
    _, data, _, _ = roots
    with pytest.raises(TrialNotFoundError, match="NUL"):
        load_trial(str(data / "job") + "\0/../x", roots=[str(data)])
    with pytest.raises(TrialNotFoundError, match="NUL"):
        load_trial("\0")


def test_a_linked_trial_folder_leading_out_of_the_roots_is_refused(roots):
    _, data, outside, inside = roots
    os.symlink(outside / "job", data / "linked-out")
    with pytest.raises(TrialAccessError, match="linked-out: outside the allowed data roots"):
        load_trial(str(data / "linked-out"), roots=[str(data)])
    # a link that stays inside the roots is fine
    os.symlink(data / "job", data / "linked-in")
    assert event_keys(load_trial(str(data / "linked-in"), roots=[str(data)])) == generated_keys(inside)


def test_files_linking_out_of_the_trial_are_skipped_reported_and_not_read(roots):
    tmp_path, data, outside, inside = roots
    trial_dir = data / "job"
    first = sorted(inside.framework_files)[0]
    folder = posixpath.dirname(first)
    outside_files = sorted(os.path.join(d, n) for d, _, names in os.walk(outside / "job" / "framework")
                           for n in names)
    # a file named like a trial file, linking to another trial's file outside
    out_link = f"{folder}/1795986609999999_20001-algo-1_pythontimeline.json"
    os.symlink(outside_files[0], trial_dir / out_link)
    # a link with a relative target that climbs out
    rel_link = f"{folder}/1795986609999998_20001-algo-1_pythontimeline.json"
    os.symlink(os.path.relpath(outside_files[1], trial_dir / folder), trial_dir / rel_link)
    # a broken link, and a link to a folder outside (not followed: its files are never listed)
    broken = f"{folder}/1795986609999997_20001-algo-1_pythontimeline.json"
    os.symlink(trial_dir / "no-such-file", trial_dir / broken)
    os.symlink(outside / "job" / "system", trial_dir / "system" / "more")
    # a link to a file inside the trial is read: it is a copy of that file
    in_link = f"{folder}/1795986609999996_20001-algo-1_pythontimeline.json"
    os.symlink(trial_dir / first, trial_dir / in_link)

    trial = load_trial(str(trial_dir), roots=[str(data)])
    assert event_keys(trial) == generated_keys(inside)  # nothing from outside
    assert len(trial.system) == inside.system_samples
    skipped = {s.path: s.reason for s in trial.report.files_skipped}
    assert skipped == {out_link: "refused: links outside the trial folder",
                       rel_link: "refused: links outside the trial folder",
                       broken: "cannot read: No such file or directory",
                       "system/more": "a link to a folder outside the trial folder: not followed",
                       in_link: f"duplicate of {first}"}

    done = run_app("analyze", str(trial_dir), "--json")
    assert done.returncode == 0, done.stderr
    data_out = json.loads(done.stdout)
    assert {s["path"] for s in data_out["files"]["skipped"]} == set(skipped)
    assert data_out["getnext"]["count"] == len(inside.of_kind("getnext"))


def test_resolve_refuses_keys_that_climb_out(roots):
    _, data, _, _ = roots
    store = LocalStore(str(data / "job"), roots=[str(data)])
    for key in ("../../outside/job/system", "../job2/x", "/etc/passwd"):
        with pytest.raises(TrialAccessError, match="links outside the trial folder"):
            store.read(key)


# --- S3 ---------------------------------------------------------------------------------

def test_s3_bucket_allow_list(s3_endpoint, s3_client, tmp_path):
    synthetic = write_trial(str(tmp_path), epochs=1)
    for bucket in ("allowed-trials", "other-trials", "allowed-trials2"):
        upload_folder(s3_client, str(tmp_path), bucket, "job")
    allowed = ["allowed-trials"]
    trial = load_trial("s3://allowed-trials/job", s3_buckets=allowed)
    assert event_keys(trial) == generated_keys(synthetic)
    for path in ("s3://other-trials/job", "s3://allowed-trials2/job", "s3://ALLOWED-TRIALS/job"):
        with pytest.raises(TrialAccessError, match="is not in the allowed buckets"):
            load_trial(path, s3_buckets=allowed)
    # '..' could be normalised into another bucket by a proxy: refused everywhere
    for path in ("s3://allowed-trials/../other-trials/job", "s3://allowed-trials/job/./x"):
        with pytest.raises(TrialAccessError, match=r"'\.' and '\.\.' are not allowed"):
            load_trial(path, s3_buckets=allowed)
    with pytest.raises(TrialAccessError, match="not in the allowed buckets"):
        load_trial("s3://other-trials/job", s3_buckets=[])


def test_credentials_never_reach_messages_or_logs(s3_endpoint, s3_client, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", FAKE_TOKEN)
    caplog.set_level(logging.DEBUG)  # the most a deployment could log
    write_trial(str(tmp_path), epochs=1)
    upload_folder(s3_client, str(tmp_path), "creds", "job")
    messages = []
    # reachable: a missing bucket, a prefix without a trial, a trial that loads
    for path in ("s3://no-such-bucket-here/job", "s3://creds/nothing-here"):
        with pytest.raises(TrialError) as caught:
            load_trial(path)
        messages.append(str(caught.value))
    assert load_trial("s3://creds/job").report.files_read > 0
    # unreachable endpoint
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", dead)
    with pytest.raises(TrialError) as caught:
        load_trial("s3://creds/job")
    messages.append(str(caught.value))
    assert "cannot reach S3" in messages[-1] and dead in messages[-1]
    assert "?" not in messages[-1], "query strings are not shown"
    done = run_app("analyze", "s3://creds/job", "--json")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
    messages.append(done.stderr)

    assert "Authorization" in caplog.text and "Signature" in caplog.text, \
        "botocore's debug log must have been captured, or this test proves nothing"
    for text in messages + [caplog.text]:
        assert FAKE_SECRET not in text and FAKE_TOKEN not in text and FAKE_KEY_ID not in text
        assert not re.search(r"Signature[=:]\s*[0-9a-f]{16}", text)  # a signed request, replayable


def test_missing_credentials_are_a_clear_error(s3_endpoint, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(TrialAccessError, match=r"^s3://b-1/job: no AWS credentials found$"):
        load_trial("s3://b-1/job")


# --- size limits ------------------------------------------------------------------------

def test_event_limit_refuses_the_trial_and_stops_reading(tmp_path):
    synthetic = write_trial(str(tmp_path), epochs=10, train_batches=10, val_batches=0, rotate_s=0.0001)
    total = len(synthetic.events) + synthetic.system_samples
    files = len(synthetic.framework_files) + len(synthetic.system_files)
    assert files > 200
    trial = load_trial(str(tmp_path), max_events=total)  # exactly at the limit: loads
    assert len(trial.framework) + len(trial.system) == total
    with pytest.raises(TrialTooLargeError) as caught:
        load_trial(str(tmp_path), max_events=total - 1)
    assert str(caught.value) == (f"{tmp_path}: trial holds more than the limit of {total - 1:,} events "
                                 f"(framework events and system samples)")
    # a low limit stops the load after a few files, not after reading them all
    store = CountingStore(LocalStore(str(tmp_path)))
    with pytest.raises(TrialTooLargeError, match="limit of 5 events"):
        load_trial(str(tmp_path), max_events=5, store=store)
    assert len(store.reads) <= 10 < files
    done = run_app("analyze", str(tmp_path), "--json")  # no limit on the command line
    assert done.returncode == 0


def test_event_limit_counts_a_duplicated_file_once(tmp_path):
    synthetic = write_trial(str(tmp_path), epochs=1)
    total = len(synthetic.events) + synthetic.system_samples
    key = synthetic.framework_files[0]
    with open(os.path.join(tmp_path, key), "rb") as handle:
        copy = os.path.join(tmp_path, key + ".gz")
        with open(copy, "wb") as out:
            out.write(gzip.compress(handle.read()))
    trial = load_trial(str(tmp_path), max_events=total)
    assert len(trial.framework) == len(synthetic.events)
    assert [s.reason for s in trial.report.files_skipped] == [f"duplicate of {key}"]


def test_size_limit_on_listed_and_decompressed_bytes(tmp_path):
    synthetic = write_trial(str(tmp_path), epochs=1)
    listed = sum(os.path.getsize(os.path.join(tmp_path, k))
                 for k in synthetic.framework_files + synthetic.system_files)
    assert load_trial(str(tmp_path), max_bytes=listed).report.files_read > 0
    with pytest.raises(TrialTooLargeError) as caught:
        load_trial(str(tmp_path), max_bytes=listed // 2)
    assert str(caught.value) == (f"{tmp_path}: trial is {listed / 1e3:.1f} kB, over the limit of "
                                 f"{listed // 2 / 1e3:.1f} kB")
    # a small gzip file that inflates far beyond the limit (a "zip bomb") is refused
    # without inflating it whole
    bomb_key = synthetic.framework_files[0].replace("_pythontimeline", "0_pythontimeline") + ".gz"
    with gzip.open(os.path.join(tmp_path, bomb_key), "wb", compresslevel=9) as handle:
        handle.write(b"[")
        for _ in range(100):
            handle.write(b" " * 1_000_000)  # 100 MB in all
        handle.write(b"]")
    limit = listed + os.path.getsize(os.path.join(tmp_path, bomb_key)) + 1000
    assert limit < 1_000_000
    with pytest.raises(TrialTooLargeError, match=rf"^{tmp_path}: {bomb_key}: decompresses to more than "
                                                 rf"the limit of {limit / 1e3:.1f} kB$"):
        load_trial(str(tmp_path), max_bytes=limit)
    # several files each under the limit, together over it once decompressed
    os.remove(os.path.join(tmp_path, bomb_key))
    for index in range(3):
        key = synthetic.framework_files[0].replace("_pythontimeline", f"{index}_pythontimeline") + ".gz"
        with open(os.path.join(tmp_path, key), "wb") as handle:
            handle.write(gzip.compress(b"[" + b" " * (listed // 2) + b"]"))
    with pytest.raises(TrialTooLargeError, match=r"over the limit of [\d.]+ kB once decompressed$"):
        load_trial(str(tmp_path), max_bytes=listed + 10_000)


def test_api_passes_limits_through(tmp_path):
    write_trial(str(tmp_path), epochs=1)
    with pytest.raises(TrialTooLargeError):
        dashboard.analyze(str(tmp_path), max_events=3)
