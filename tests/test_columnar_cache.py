"""The columnar cache of parsed files (dashboard/trial/columnar_cache.py), through load_trial.

What a load reads is counted with the real stores wrapped in CountingStore; what it returns
is compared with a load that uses no cache at all (the cache must never change an answer),
and event counts with what the synthetic writer wrote (its own books, not the reader's).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pandas as pd
import pytest

from dashboard import format as fmt
from dashboard.result_cache import RESULTS_FOLDER
from dashboard.synthetic import write_trial
from dashboard.trial.columnar_cache import SUFFIX, ColumnarFileCache
from dashboard.trial.errors import TrialTooLargeError
from dashboard.trial.load import load_trial
from dashboard.trial.store import LocalStore, open_store
from tests.conftest import ROOT, CountingStore, upload_folder


def _trial(tmp_path, **options):
    folder = str(tmp_path / "trial")
    written = write_trial(folder, epochs=2, train_batches=20, val_batches=0, rotate_s=0.05, **options)
    return folder, written


def _files_of(folder: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), folder).replace(os.sep, "/")
                  for d, _, names in os.walk(folder) for n in names)


def _same_trial(got, expected) -> None:
    pd.testing.assert_frame_equal(got.framework, expected.framework)
    pd.testing.assert_frame_equal(got.system, expected.system)
    assert got.report.to_dict() == expected.report.to_dict()
    assert got.report.lines_skipped == expected.report.lines_skipped


def _cache_files(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(SUFFIX))


def test_a_reopen_reads_columns_not_json(tmp_path):
    folder, written = _trial(tmp_path)
    directory = str(tmp_path / "columns")
    store = CountingStore(LocalStore(folder))
    first = load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert sorted(store.reads) == _files_of(folder)
    # One cache file per trial file with events, 0600 in a 0700 folder.
    assert len(_cache_files(directory)) == len(_files_of(folder))
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert {stat.S_IMODE(os.stat(os.path.join(directory, n)).st_mode) for n in os.listdir(directory)} == {0o600}

    store = CountingStore(LocalStore(folder))  # a new cache object on the same folder: a reopen
    again = load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert store.reads == []
    _same_trial(again, load_trial(folder))
    _same_trial(again, first)
    assert (again.framework["kind"] == "getnext").sum() == len(written.of_kind("getnext"))


def test_a_changed_file_is_a_miss(tmp_path):
    folder, _ = _trial(tmp_path)
    directory = str(tmp_path / "columns")
    load_trial(folder, file_cache=ColumnarFileCache(directory))
    changed = next(k for k in _files_of(folder) if k.startswith("framework/"))
    path = os.path.join(folder, changed)
    with open(path) as handle:
        text = handle.read()
    with open(path, "w") as handle:  # a longer duration: another size, another mtime
        handle.write(text.replace('"dur": ', '"dur": 1', 1))
    store = CountingStore(LocalStore(folder))
    reloaded = load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert store.reads == [changed]
    _same_trial(reloaded, load_trial(folder))


def test_a_rewrite_at_the_same_size_with_its_mtime_set_back_is_a_miss(tmp_path):
    # cp -p, rsync -t or tar x keep a file's mtime: a rewrite of the same size was read as
    # unchanged, the trial and every kept answer served with the old content.
    folder, _ = _trial(tmp_path)
    directory = str(tmp_path / "columns")
    command = [sys.executable, os.path.join(ROOT, "app.py"), "analyze", folder, "--json", "--cache-dir", directory]
    before = json.loads(subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout)
    changed = next(k for k in _files_of(folder) if k.startswith("framework/"))
    path = os.path.join(folder, changed)
    kept = os.stat(path)
    with open(path) as handle:
        text = handle.read()
    # Another first digit of the first duration: the same size, another time.
    rewritten = re.sub(r'("dur": )([1-9])', lambda m: m.group(1) + str(int(m.group(2)) % 9 + 1), text, count=1)
    assert rewritten != text and len(rewritten) == len(text)
    with open(path, "w") as handle:
        handle.write(rewritten)
    os.utime(path, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == kept.st_mtime_ns and os.stat(path).st_size == kept.st_size
    store = CountingStore(LocalStore(folder))
    reloaded = load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert store.reads == [changed]
    _same_trial(reloaded, load_trial(folder))
    after = json.loads(subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout)
    plain = json.loads(subprocess.run(command[:-2], capture_output=True, text=True, timeout=120, check=True).stdout)
    assert after == plain != before


def test_a_growing_tmp_file_is_read_again_each_time(tmp_path):
    folder, written = _trial(tmp_path)
    node = written.events[0].node
    source = sorted(k for k in _files_of(folder) if k.startswith("framework/"))[-1]
    with open(os.path.join(folder, source)) as handle:
        lines = [line for line in handle.read().split("\n") if line not in ("]", "")]
    os.remove(os.path.join(folder, source))
    tmp = os.path.join(folder, fmt.framework_tmp_key(node))
    half = len(lines) // 2
    with open(tmp, "w") as handle:  # the writer's open file: no closing bracket yet
        handle.write("\n".join(lines[:half]) + "\n")
    directory = str(tmp_path / "columns")
    load_trial(folder, file_cache=ColumnarFileCache(directory))
    with open(tmp, "a") as handle:  # the job writes on
        handle.write("\n".join(lines[half:]) + "\n")
    store = CountingStore(LocalStore(folder))
    grown = load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert store.reads == [fmt.framework_tmp_key(node)]
    _same_trial(grown, load_trial(folder))
    # Every GetNext the writer wrote is there: the ones of the .tmp file's second half too.
    assert (grown.framework["kind"] == "getnext").sum() == len(written.of_kind("getnext"))


def test_a_new_s3_etag_is_a_miss(s3_client, tmp_path):
    folder, _ = _trial(tmp_path)
    upload_folder(s3_client, folder, "columns", "job/profiler-output")
    path = "s3://columns/job/profiler-output"
    directory = str(tmp_path / "columns")
    store = CountingStore(open_store(path))
    load_trial(path, store=store, file_cache=ColumnarFileCache(directory))
    assert len(store.reads) == len(_files_of(folder))
    store = CountingStore(open_store(path))
    load_trial(path, store=store, file_cache=ColumnarFileCache(directory))
    assert store.reads == []

    # The same key uploaded again with other content of the same size: only the ETag differs.
    changed = next(k for k in _files_of(folder) if k.startswith("framework/"))
    with open(os.path.join(folder, changed)) as handle:
        text = handle.read()
    rewritten = re.sub(r'"dur": (\d)', lambda m: f'"dur": {int(m.group(1)) % 9 + 1}', text, count=1)
    assert rewritten != text and len(rewritten) == len(text)
    s3_client.put_object(Bucket="columns", Key=f"job/profiler-output/{changed}", Body=rewritten.encode())
    with open(os.path.join(folder, changed), "w") as handle:
        handle.write(rewritten)
    store = CountingStore(open_store(path))
    again = load_trial(path, store=store, file_cache=ColumnarFileCache(directory))
    assert store.reads == [changed]
    expected = load_trial(folder)
    pd.testing.assert_frame_equal(again.framework, expected.framework)
    pd.testing.assert_frame_equal(again.system, expected.system)


def test_damaged_cache_files_are_misses_and_rebuilt(tmp_path):
    folder, _ = _trial(tmp_path)
    directory = str(tmp_path / "columns")
    load_trial(folder, file_cache=ColumnarFileCache(directory))
    names = _cache_files(directory)
    assert len(names) >= 3
    damaged = names[:3]
    paths = [os.path.join(directory, n) for n in damaged]
    with open(paths[0], "r+b") as handle:  # one byte flipped in the middle of the columns
        handle.seek(os.path.getsize(paths[0]) // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with open(paths[1], "r+b") as handle:  # cut short (a disk that filled up)
        handle.truncate(os.path.getsize(paths[1]) // 3)
    with open(paths[2], "wb") as handle:  # not a cache file at all
        handle.write(b"\x80\x04garbage")
    store = CountingStore(LocalStore(folder))
    reloaded = load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert len(store.reads) == 3  # exactly the damaged ones: every other file is a hit
    _same_trial(reloaded, load_trial(folder))
    assert _cache_files(directory) == names  # rebuilt under the same names
    store = CountingStore(LocalStore(folder))
    load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert store.reads == []


def test_a_cache_file_leaves_its_columns_of_nulls_out_and_reads_them_back_whole(tmp_path):
    """A reference trial's settings and measures columns have no value (Arrow would write 8 bytes
    a row of zeros for each): not written. A file of the layout that wrote them (DLPCOL01), or
    whose columns left out do not make its schema, is a miss, rebuilt."""
    import struct
    import zlib

    import pyarrow as pa

    from dashboard.trial import columnar_cache

    folder, _ = _trial(tmp_path)
    directory = str(tmp_path / "columns")
    load_trial(folder, file_cache=ColumnarFileCache(directory))
    names = _cache_files(directory)
    header = struct.Struct("<8sIQ")

    def table_of(name: str) -> pa.Table:
        with open(os.path.join(directory, name), "rb") as handle:
            return pa.ipc.open_file(pa.py_buffer(handle.read()[header.size:])).read_all()

    framework = [n for n in names if "phase" in table_of(n).schema.names]  # (not the system files')
    assert len(framework) >= 2 and all({"iterator_id", "cpu_us", "runq_us"}.isdisjoint(table_of(n).schema.names)
                                       for n in framework)
    assert all("pid" in table_of(n).schema.names for n in framework)  # (a value: written)

    def rewrite(name: str, magic: bytes, table: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        body = sink.getvalue()
        with open(os.path.join(directory, name), "wb") as handle:
            handle.write(header.pack(magic, zlib.crc32(body), body.size) + body.to_pybytes())

    old_layout, inconsistent, not_fixed_width = framework[:3]
    rewrite(old_layout, b"DLPCOL01", table_of(old_layout))
    table = table_of(inconsistent)
    metadata = dict(table.schema.metadata)
    metadata[b"dashboard.null-columns.left-out"] = b"0"  # one column left out, where several were
    rewrite(inconsistent, columnar_cache.MAGIC, table.replace_schema_metadata(metadata))
    # As many left out as there were, one of them the process's (a dictionary: no such array
    # could be made over zeros, and Arrow would crash reading one).
    table = table_of(not_fixed_width)
    metadata = dict(table.schema.metadata)
    places = metadata[b"dashboard.null-columns.left-out"].split(b",")
    metadata[b"dashboard.null-columns.left-out"] = b",".join([b"0"] + places[1:])
    whole = pa.ipc.read_schema(pa.py_buffer(metadata[b"dashboard.null-columns.whole-schema"]))
    assert pa.types.is_dictionary(whole.field(0).type) and int(places[0]) != 0
    rewrite(not_fixed_width, columnar_cache.MAGIC, table.replace_schema_metadata(metadata))
    store = CountingStore(LocalStore(folder))
    reloaded = load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert len(store.reads) == 3  # the three rewritten files: every other one is a hit
    _same_trial(reloaded, load_trial(folder))
    store = CountingStore(LocalStore(folder))
    load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert store.reads == []  # rebuilt


def test_two_processes_share_one_cache(tmp_path):
    folder, written = _trial(tmp_path)
    directory = str(tmp_path / "columns")
    script = (
        "import json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from dashboard.trial.columnar_cache import ColumnarFileCache\n"
        "from dashboard.trial.load import load_trial\n"
        "trial = load_trial(sys.argv[2], file_cache=ColumnarFileCache(sys.argv[3]))\n"
        "print(json.dumps({'events': len(trial.framework), 'pid': __import__('os').getpid()}))\n")
    out = subprocess.run([sys.executable, "-c", script, ROOT, folder, directory], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    other = json.loads(out.strip().splitlines()[-1])
    assert other["pid"] != os.getpid()
    store = CountingStore(LocalStore(folder))
    here = load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert store.reads == []  # every file's columns written by the other process
    assert len(here.framework) == other["events"]
    _same_trial(here, load_trial(folder))
    assert (here.framework["kind"] == "getnext").sum() == len(written.of_kind("getnext"))


def test_columns_from_the_cache_count_against_the_limits(tmp_path):
    folder, _ = _trial(tmp_path)
    directory = str(tmp_path / "columns")
    events = len(load_trial(folder, file_cache=ColumnarFileCache(directory)).framework)
    with pytest.raises(TrialTooLargeError, match="events"):
        load_trial(folder, file_cache=ColumnarFileCache(directory), max_events=events // 2)
    with pytest.raises(TrialTooLargeError):
        load_trial(folder, file_cache=ColumnarFileCache(directory), max_bytes=1000)


def test_skipped_lines_are_reported_from_the_cache_as_from_the_json(tmp_path):
    folder, _ = _trial(tmp_path)
    key = sorted(k for k in _files_of(folder) if k.startswith("framework/"))[1]
    path = os.path.join(folder, key)
    with open(path) as handle:
        lines = handle.read().split("\n")
    getnext = next(i for i, line in enumerate(lines) if "::GetNext" in line)
    lines[getnext] = lines[getnext][:30]  # one line cut in two
    with open(path, "w") as handle:
        handle.write("\n".join(lines))
    directory = str(tmp_path / "columns")
    first = load_trial(folder, file_cache=ColumnarFileCache(directory))
    assert first.report.lines_skipped == 1
    store = CountingStore(LocalStore(folder))
    again = load_trial(folder, store=store, file_cache=ColumnarFileCache(directory))
    assert store.reads == []
    reasons = [(s.path, s.reason) for s in first.report.files_with_skipped_lines]
    assert [path for path, _ in reasons] == [key] and f"line {getnext + 1}: not JSON" in reasons[0][1]
    assert [(s.path, s.reason) for s in again.report.files_with_skipped_lines] == reasons
    _same_trial(again, first)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user takes root")
def test_a_cache_folder_of_another_user_is_refused(tmp_path):
    directory = tmp_path / "columns"
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, -1)  # nobody's: that user could put files here for the server to read
    with pytest.raises(PermissionError, match="another user"):
        ColumnarFileCache(str(directory))


def test_analyze_with_a_cache_dir_prints_what_it_prints_without(tmp_path):
    folder, _ = _trial(tmp_path)
    directory = str(tmp_path / "columns")
    command = [sys.executable, os.path.join(ROOT, "app.py"), "analyze", folder, "--json"]
    plain = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
    first = subprocess.run(command + ["--cache-dir", directory], capture_output=True, text=True, timeout=120,
                           check=True).stdout
    assert len(_cache_files(directory)) == len(_files_of(folder))  # written by the first
    # Without the answer the first kept (tests/test_result_cache.py), the second analyzes again:
    # from the columns (the reopen test counts the reads).
    shutil.rmtree(os.path.join(directory, RESULTS_FOLDER))
    second = subprocess.run(command + ["--cache-dir", directory], capture_output=True, text=True, timeout=120,
                            check=True).stdout
    assert json.loads(first) == json.loads(second) == json.loads(plain)
