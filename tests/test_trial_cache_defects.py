"""The server's trial cache (dashboard/web/cache.py) where its disk does not hold what it was
given: a trial larger than the cache, entries another version of the code made, value files
damaged while the server was down, a damaged database (running, and at start-up).

Each with the real TrialCache on a temporary folder, or real server processes (the helpers of
tests/test_server_hardening.py); expected numbers come from the events the synthetic writer reports.
"""
from __future__ import annotations

import glob
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from dashboard import synthetic
from dashboard.web.cache import TRIALS_FOLDER, TrialCache
from tests.conftest import ROOT
from tests.test_server_hardening import (TRACEBACK, counts, load, loaded_store, running, server_env, show,
                                         shown_counts)

EVICTED_WORDS = "no longer in the server's cache"
NOT_KEPT_WORDS = "could not keep this trial"


def getnexts(trial) -> int:
    return int((trial.framework["kind"] == "getnext").sum())


# --- D1: a trial larger than the cache ---------------------------------------------------------------

def test_a_trial_larger_than_the_cache_is_shown_with_a_message_saying_so(tmp_path):
    """--cache-size-mb 1 and a trial whose pickle is about 2 MB (16,000 GetNexts; 6,000 made
    0.84 MB): written, the size limit's culling took it at once, and every Load answered a key
    whose panels said "no longer in the server's cache". It is shown, and the load says why it
    is not kept, as for any trial the cache cannot keep; another Load shows it again."""
    data = tmp_path / "data"
    trial = str(data / "big")
    written = synthetic.write_trial(trial, epochs=2, train_batches=8000, val_batches=0)
    with running(str(tmp_path / "server.log"), "serve", "--cache-dir", str(tmp_path / "cache"),
                 "--data-root", str(data), "--cache-size-mb", "1", env=server_env(tmp_path)) as server:
        page = server.page()
        result = load(page, trial, timeout_s=120)
        message = result.values.get("error-message.children") or ""
        assert NOT_KEPT_WORDS in message and "size limit" in message, message
        store = result.values["trial-store.data"]
        panels = show(page, store)
        assert EVICTED_WORDS not in str(panels.get("error-message.children")), panels.get("error-message.children")
        assert shown_counts(panels) == counts(written)
        # Loaded again, from a page of its own: shown again, and again said not to be kept.
        other = server.page()
        second = load(other, trial, timeout_s=120)
        message = second.values.get("error-message.children") or ""
        assert NOT_KEPT_WORDS in message and "size limit" in message, message
        again = second.values["trial-store.data"]
        assert again["key"] == store["key"]
        assert shown_counts(show(other, again)) == counts(written)
        assert server.alive() and not TRACEBACK.search(server.log()), server.log()


def test_why_a_trial_was_not_kept_is_not_told_once_a_later_read_kept_it(tmp_path):
    """A first read the disk could not keep leaves its reason (with how to read the trial again);
    a later read that the disk keeps ends it: if the trial is then evicted from the disk while
    this process still holds it, a Load says nothing of the first refusal."""
    folder = str(tmp_path / "big")
    written = synthetic.write_trial(folder, epochs=2, train_batches=8000, val_batches=0)
    cache_dir = str(tmp_path / "cache")
    small = TrialCache(cache_dir, 1)
    key, _, _ = small.load(folder, roots=[str(tmp_path)])
    assert small.not_kept() is not None and "size limit" in small.not_kept(), small.not_kept()
    large = TrialCache(cache_dir)
    assert large.load(folder, roots=[str(tmp_path)])[0] == key and large.not_kept() is None
    large.disk.delete(f"trial:{key}")  # evicted, while this process holds the trial
    again_key, again, cached = large.load(folder, roots=[str(tmp_path)])
    assert again_key == key and cached and getnexts(again) == len(written.of_kind("getnext"))
    assert large.not_kept() is None, large.not_kept()


def test_a_value_its_own_write_culls_is_not_counted_as_kept(tmp_path):
    """Under the size limit alone, but not with the database's own pages: diskcache's culling, in
    the very write, takes the ten least recently used entries, the new one too when there are no
    more. 3 values of 30 kB (kept inside the database: under diskcache's 32 kB of a file) and a part
    of 1 MB (under the limit's 1 MiB alone) pass it together; with the lock the part's computation
    holds, 5 entries. The cache must say it did not keep the part, and the other processes (a new
    TrialCache) must not find it."""
    cache = TrialCache(str(tmp_path / "cache"), 1)
    for index in range(3):
        cache.disk.set(f"older:{index}", b"o" * 30_000)
    part = {"figure": "p" * 1_000_000}
    assert cache.page_part("a large part", lambda: part) is part  # (this process keeps it in its memory)
    assert cache.not_kept() is not None and "size limit" in cache.not_kept(), cache.not_kept()
    assert TrialCache(str(tmp_path / "cache"), 1).kept_page_part("a large part") is None


# --- D2: entries another version of the code made ----------------------------------------------------

OLD_RELEASE_BUG = '''

# The old release's parser bug (added by the test): the first GetNext is lost.
_fixed_load_trial = load_trial


def load_trial(*args, **kwargs):
    trial = _fixed_load_trial(*args, **kwargs)
    first = trial.framework.index[trial.framework["kind"] == "getnext"][0]
    trial.framework = trial.framework.drop(index=first).reset_index(drop=True)
    return trial
'''


def test_a_trial_another_version_of_the_code_read_is_read_again_not_served(tmp_path):
    """An upgrade on the same cache folder: the old release (a copy of this code with a parser
    bug) read and kept the trial; this code must read it again (and show its own numbers), not
    serve the old release's trial from the cache."""
    folder = str(tmp_path / "trial")
    written = synthetic.write_trial(folder, epochs=1, train_batches=10, val_batches=0)
    cache_dir = str(tmp_path / "cache")
    old = tmp_path / "old-release"
    shutil.copytree(os.path.join(ROOT, "dashboard"), old / "dashboard", ignore=shutil.ignore_patterns("__pycache__"))
    with open(old / "dashboard" / "trial" / "load.py", "a") as source:
        source.write(OLD_RELEASE_BUG)
    script = textwrap.dedent(f"""
        from dashboard.web.cache import TrialCache
        key, trial, cached = TrialCache({cache_dir!r}).load({folder!r}, roots=[{str(tmp_path)!r}])
        print(int((trial.framework["kind"] == "getnext").sum()), cached)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=old, env=dict(os.environ, PYTHONPATH=str(old)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    expected = len(written.of_kind("getnext"))
    assert done.stdout.split() == [str(expected - 1), "False"]  # the old release read and kept its trial

    key, trial, cached = TrialCache(cache_dir).load(folder, roots=[str(tmp_path)])
    assert not cached and getnexts(trial) == expected
    # Kept as this code's: served from the cache from now on.
    again_key, again, cached = TrialCache(cache_dir).load(folder, roots=[str(tmp_path)])
    assert again_key == key and cached and getnexts(again) == expected


# --- D3: value files damaged while the server was down -----------------------------------------------

def test_a_load_never_answers_from_value_files_that_cannot_be_read(tmp_path):
    """The cache's value files truncated while no server ran: a load answered "ready" from the
    entries alone (their rows), and the page then found nothing to read. A load must read the
    trial again, and its page then finds it."""
    folder = str(tmp_path / "trial")
    written = synthetic.write_trial(folder, epochs=4, train_batches=300, val_batches=0, seed=1)
    cache_dir = str(tmp_path / "cache")
    cache = TrialCache(cache_dir)
    key, trial, _ = cache.load(folder, roots=[str(tmp_path)])
    cache.analyses(key, trial)
    span = (trial.start_us, trial.end_us)
    assert TrialCache(cache_dir).ready(key, [None]) == span
    values = glob.glob(os.path.join(cache_dir, TRIALS_FOLDER, "**", "*.val"), recursive=True)
    assert values  # (the trial's pickle, at least, is a file: over diskcache's 32 kB)
    for name in values:
        open(name, "w").close()

    restarted = TrialCache(cache_dir)  # a server process started after the damage
    assert restarted.ready(key, [None]) is None
    assert not restarted.holds(key)
    again_key, again, cached = restarted.load(folder, roots=[str(tmp_path)])
    assert again_key == key and not cached and getnexts(again) == len(written.of_kind("getnext"))
    restarted.analyses(key, again)
    page = TrialCache(cache_dir)  # the page's server process
    assert page.ready(key, [None]) == span and page.holds(key)
    assert getnexts(page.trial(key)) == len(written.of_kind("getnext"))


# --- D4: a damaged database --------------------------------------------------------------------------

DAMAGE = b"\xa5" * 4096  # over the database's first page: its header too ("file is not a database")


def damage(database: str, offset: int = 0, size: int = len(DAMAGE)) -> None:
    with open(database, "r+b") as handle:
        handle.seek(offset)
        handle.write(DAMAGE[:1] * size)


def set_aside(folder: str) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "cache.db.damaged-*[0-9]")))


def test_a_damaged_cache_database_is_set_aside_running_or_at_start_up(tmp_path):
    """The trials' database damaged under a running server: its next load worked on an empty
    one, not failed with DatabaseError; damaged (both databases) while it was down: the server
    starts, with one line naming each file set aside, instead of exiting with a traceback."""
    data = tmp_path / "data"
    first, second = str(data / "first"), str(data / "second")
    written_first = synthetic.write_trial(first, epochs=1, train_batches=10, val_batches=0)
    written_second = synthetic.write_trial(second, epochs=1, train_batches=12, val_batches=0, seed=2)
    cache = tmp_path / "cache"
    trials, jobs = str(cache / "trials"), str(cache / "jobs")
    log_path = str(tmp_path / "server.log")
    arguments = ("serve", "--cache-dir", str(cache), "--data-root", str(data))
    with running(log_path, *arguments, env=server_env(tmp_path)) as server:
        page = server.page()
        assert shown_counts(show(page, loaded_store(load(page, first)))) == counts(written_first)
        damage(os.path.join(trials, "cache.db"))
        page = server.page()
        assert shown_counts(show(page, loaded_store(load(page, second)))) == counts(written_second)
        assert len(set_aside(trials)) == 1
        assert server.alive()
    with open(set_aside(trials)[0], "rb") as aside:
        assert aside.read(len(DAMAGE)) == DAMAGE  # the damaged file itself, kept for a look

    for database in (os.path.join(trials, "cache.db"), os.path.join(jobs, "cache.db")):
        damage(database)
    with running(log_path, *arguments, env=server_env(tmp_path)) as server:
        page = server.page()
        assert shown_counts(show(page, loaded_store(load(page, first)))) == counts(written_first)
        assert len(set_aside(trials)) == 2 and len(set_aside(jobs)) == 1
        log = server.log()
        said = [line for line in log.splitlines() if "set aside as" in line]
        assert len(said) == 3, log  # one line per database set aside
        for name in set_aside(trials) + set_aside(jobs):
            assert sum(name in line for line in said) == 1, (name, said)
        assert not TRACEBACK.search(log), log


def test_a_database_damaged_within_fails_the_operation_that_meets_it_then_is_set_aside(tmp_path, caplog):
    """Damage within the database (its tables' pages; its header and settings whole), met by an
    operation: that operation fails, the database is set aside, and the next one works on an
    empty database, where a value the damaged one held is a miss, not an error."""
    cache = TrialCache(str(tmp_path / "cache"))
    for index in range(200):  # 400 kB of values in the database's pages
        cache.disk.set(f"entry:{index}", b"v" * 2_000)
    cache.disk.close()  # (as after each request: the WAL written into the file, no page left cached)
    database = os.path.join(cache.disk.directory, "cache.db")
    size = os.path.getsize(database)
    assert size > 200_000
    # From the 9th page on: the first pages hold the header, the settings the connection reads
    # first and the tables' roots; the entries' pages come after them.
    damage(database, offset=8 * 4096, size=size - 8 * 4096)
    caplog.set_level(logging.WARNING, logger="dashboard.web")
    with pytest.raises(sqlite3.DatabaseError):
        cache.disk.get("entry:150")
    assert cache.disk.get("entry:150") is None and cache.kept_page_part("anything") is None
    cache.disk.set("entry:new", b"n")
    assert TrialCache(str(tmp_path / "cache")).disk.get("entry:new") == b"n"  # (another process's view)
    (aside,) = set_aside(cache.disk.directory)
    said = [r.getMessage() for r in caplog.records if "set aside as" in r.getMessage()]
    assert len(said) == 1 and aside in said[0], said
