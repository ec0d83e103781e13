"""Reading trials: layouts, nodes, bad input. Expected values come from the generator's own
event list, never from the code under test."""
from __future__ import annotations

import gzip
import json
import os
import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import dashboard
from dashboard import format as fmt
from dashboard.synthetic import write_trial
from dashboard.trial.errors import NotATrialError, TrialAccessError, TrialNotFoundError
from dashboard.trial.load import load_trial
from tests.conftest import CountingStore


def framework_files(folder):
    out = []
    for dirpath, _, names in os.walk(os.path.join(folder, "framework")):
        out += [os.path.join(dirpath, n) for n in names]
    return sorted(out)


def test_every_event_is_read_with_absolute_times(tmp_path):
    synthetic = write_trial(str(tmp_path), hosts=2, epochs=2, rotate_s=0.2)
    trial = load_trial(str(tmp_path))
    assert len(synthetic.framework_files) > 2, "rotation must produce several files per node"
    for kind in ("init", "getnext", "worker", "step"):
        expected = sorted((e.node, e.start_us, e.end_us) for e in synthetic.of_kind(kind))
        got = trial.framework[trial.framework["kind"] == kind]
        assert sorted(zip(got["process"].astype(str), got["start_us"], got["end_us"])) == expected
    assert trial.framework["start_us"].dtype == "int64"
    assert str(trial.framework["node"].dtype) == "category"
    # The nodes are the hosts; the framework node ids name the processes on them.
    assert trial.nodes == ["algo-1", "algo-2"]
    assert sorted(p.id for p in trial.processes) == sorted({e.node for e in synthetic.events})
    assert all(p.id.endswith("-" + p.node) and p.rank is None for p in trial.processes)
    assert trial.framework["node"].astype(str).tolist() == [p.split("-", 1)[1] for p in
                                                             trial.framework["process"].astype(str)]
    assert len(trial.system) == synthetic.system_samples
    assert trial.report.files_read == len(synthetic.framework_files) + len(synthetic.system_files)
    assert trial.report.files_skipped == [] and trial.report.lines_skipped == 0


def test_dataloader_columns_come_from_args(tmp_path):
    synthetic = write_trial(str(tmp_path), epochs=1, num_workers=3, pin_memory=True)
    fw = load_trial(str(tmp_path)).framework
    workers = fw[fw["kind"] == "worker"].sort_values("worker_id")
    expected = sorted(synthetic.of_kind("worker"), key=lambda e: e.worker_id)
    assert workers["worker_id"].tolist() == [e.worker_id for e in expected]
    assert workers["pid"].tolist() == [e.pid for e in expected]
    init = fw[fw["name"] == "_MultiProcessingDataLoaderIter.__init__"].iloc[0]
    assert init["num_workers"] == 3 and bool(init["pin_memory"]) is True
    getnext = fw[fw["kind"] == "getnext"]
    assert sorted(getnext["worker_id"].unique().tolist()) == [-1, 0, 1, 2]


def test_fetches_under_the_collectors_first_phase_name_are_fetches_not_workers(tmp_path):
    from dashboard.collector.writer import TraceWriter

    start = 1_795_986_600_000_000
    writer = TraceWriter(str(tmp_path), "algo-1", start_time_us=start, rotate_s=3600)
    for phase in (fmt.PHASE_WORKER_FETCH, fmt.LEGACY_PHASE_WORKER_FETCH):
        writer.complete(phase, "_MultiProcessingDataLoaderIter.fetch", start, start + 500,
                        {fmt.ARG_PID: 7, fmt.ARG_WORKER_ID: 0})
    writer.complete(fmt.PHASE_WORKER, "_MultiProcessingDataLoaderIter.worker_0", start, start + 9_000,
                    {fmt.ARG_PID: 7, fmt.ARG_WORKER_ID: 0})
    writer.close()
    fw = load_trial(str(tmp_path)).framework
    assert sorted(fw["kind"].astype(str)) == ["fetch", "fetch", "worker"]


def test_trial_without_system_folder(tmp_path):
    synthetic = write_trial(str(tmp_path), system=False)
    result = dashboard.analyze(str(tmp_path))
    assert result.getnext.count == len(synthetic.of_kind("getnext"))
    assert len(result.trial.system) == 0
    assert result.trial.start_us == min(e.start_us for e in synthetic.events)


def test_events_before_the_first_system_file_still_count(tmp_path):
    # The reference silently dropped every framework event older than the first system file.
    synthetic = write_trial(str(tmp_path), epochs=2, system_start_delay_s=0.6)
    first_system_us = synthetic.events[0].start_us + 600_000
    early = [e for e in synthetic.of_kind("getnext") if e.start_us < first_system_us]
    assert early, "the generator must put GetNexts before the system metrics start"
    result = dashboard.analyze(str(tmp_path))
    assert result.getnext.count == len(synthetic.of_kind("getnext"))
    assert result.trial.system["timestamp_us"].min() >= first_system_us - 1


def test_flat_system_layout_and_gzip(tmp_path):
    synthetic = write_trial(str(tmp_path))
    system_root = tmp_path / "system" / "incremental"
    for path in list(system_root.rglob("*.json")):
        shutil.move(str(path), str(system_root / path.name))  # the older flat layout
    for path in framework_files(str(tmp_path)):
        with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
            dst.write(src.read())
        os.remove(path)
    trial = load_trial(str(tmp_path))
    assert len(trial.system) == synthetic.system_samples
    assert (trial.framework["kind"] == "getnext").sum() == len(synthetic.of_kind("getnext"))


def test_reference_writer_quirks(tmp_path):
    """A trace pid re-defined mid-file (the reference writer re-uses pid 0) and B/E pairs."""
    folder = tmp_path / "framework" / "pevents" / "2026112921"
    folder.mkdir(parents=True)
    base = 1795986602611683
    events = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {fmt.ARG_START_TIME: base}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "DataLoaderIter"}},
        {"name": "_MultiProcessingDataLoaderIter::GetNext", "pid": 1, "ph": "X", "ts": 100, "dur": 50,
         "args": {"pid": 7, "step_num": "-1", "worker_id": 0}},
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "DataLoaderIterInitialize"}},
        {"name": "_SingleProcessDataLoaderIter.__init__", "pid": 0, "ph": "X", "ts": 200, "dur": 10,
         "args": {"pid": 7, "num_workers": 0, "pin_memory": False}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "Step:ModeKeys.TRAIN"}},
        {"name": "Step:ModeKeys.TRAIN", "pid": 2, "ph": "B", "ts": 300, "args": {"pid": 7}},
        {"name": "Step:ModeKeys.TRAIN", "pid": 2, "ph": "E", "ts": 380, "args": {"pid": 7}},
        {"name": "marker", "pid": 2, "ph": "i", "ts": 390},
    ]
    (folder / f"{base + 380}_7-algo-1_pythontimeline.json").write_text(
        "[\n" + "".join(json.dumps(e) + ",\n" for e in events) + "]\n")
    fw = load_trial(str(tmp_path)).framework
    assert fw["kind"].astype(str).tolist() == ["getnext", "init", "step"]
    assert fw["start_us"].tolist() == [base + 100, base + 200, base + 300]
    assert fw["duration_us"].tolist() == [50, 10, 80]
    assert fw["phase"].astype(str).tolist() == ["DataLoaderIter", "DataLoaderIterInitialize",
                                                "Step:ModeKeys.TRAIN"]


def test_bad_input_is_skipped_reported_and_the_rest_kept(tmp_path):
    synthetic = write_trial(str(tmp_path), epochs=3, rotate_s=0.15)
    files = framework_files(str(tmp_path))
    assert len(files) >= 5
    getnexts_in = {}
    for path in files:
        with open(path) as handle:
            getnexts_in[path] = sum("::GetNext" in line for line in handle)
    lost = 0
    # 1. a corrupt line in the middle of a file
    lines = open(files[0]).read().split("\n")
    victim = next(i for i, line in enumerate(lines) if "::GetNext" in line and 2 < i < len(lines) - 3)
    lines[victim] = lines[victim][:25] + "#garbage"
    open(files[0], "w").write("\n".join(lines))
    lost += 1
    # 2. a truncated file (writer killed mid-line): the last GetNext line is cut
    text = open(files[1]).read().rstrip().rstrip("]").rstrip().rstrip(",")
    last = text.rfind("\n")
    cut_line = text[last + 1:]
    open(files[1], "w").write(text[:last + 1] + cut_line[: len(cut_line) // 2])
    lost += "::GetNext" in cut_line
    # 3. a NaN duration
    lines = open(files[2]).read().split("\n")
    victim = next(i for i, line in enumerate(lines) if "::GetNext" in line)
    lines[victim] = lines[victim].replace('"dur": ', '"dur": NaN, "x": ', 1)
    open(files[2], "w").write("\n".join(lines))
    lost += 1
    # 4. a .tmp file still being written: complete events count, the partial last line does not
    tmp_file = tmp_path / "framework" / "20001-algo-1_pythontimeline.json.tmp"
    base = synthetic.events[-1].end_us + 1_000
    tmp_file.write_text(
        '[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": %d}},\n'
        '{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "DataLoaderIter"}},\n'
        '{"name": "_MultiProcessingDataLoaderIter::GetNext", "pid": 1, "ph": "X", "ts": 10, "dur": 5, "args": {"pid": 20001, "worker_id": 1}},\n'
        '{"name": "_MultiProcessingDataLoaderIter::GetNext", "pid": 1, "ph": "X", "ts": 20, "d' % base)
    # 5. an empty file, 6. an unknown suffix
    empty = tmp_path / "framework" / "pevents" / "2026112920" / "1795986600000000_20001-algo-1_pythontimeline.json"
    empty.parent.mkdir(parents=True)
    empty.write_text("")
    (tmp_path / "framework" / "pevents" / "notes.txt").write_text("hello")

    trial = load_trial(str(tmp_path))
    fw = trial.framework
    expected = len(synthetic.of_kind("getnext")) - lost + 1  # + the complete event of the .tmp file
    assert (fw["kind"] == "getnext").sum() == expected
    # the corrupt line, the cut line, the NaN event, the .tmp file's partial last line
    assert trial.report.lines_skipped == 4
    skipped = {os.path.basename(s.path): s.reason for s in trial.report.files_skipped}
    assert skipped == {empty.name: "empty file", "notes.txt": "not a trial file (unknown name or suffix)"}
    with_bad_lines = {os.path.basename(s.path) for s in trial.report.files_with_skipped_lines}
    assert with_bad_lines == {os.path.basename(f) for f in files[:3]} | {tmp_file.name}


def test_corrupt_system_lines(tmp_path):
    synthetic = write_trial(str(tmp_path), epochs=1)
    path = os.path.join(str(tmp_path), synthetic.system_files[0])
    lines = open(path).read().splitlines()
    lines[1] = lines[1].replace('"Value": ', '"Value": "abc", "v": ')
    lines[2] = lines[2][:30]
    lines.insert(3, '{"Type": "cpu", "Name": "cpu9", "Dimension": "CPUUtilization", "Value": NaN, '
                    '"NodeId": "algo-1", "Timestamp": 1795986600.5}')
    open(path, "w").write("\n".join(lines) + "\n")
    trial = load_trial(str(tmp_path))
    assert len(trial.system) == synthetic.system_samples - 2
    assert trial.report.lines_skipped == 3


def test_errors_name_the_path(tmp_path):
    with pytest.raises(TrialNotFoundError, match="nope"):
        load_trial(str(tmp_path / "nope"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "readme.md").write_text("x")
    with pytest.raises(NotATrialError, match="other.*not a trial"):
        load_trial(str(tmp_path / "other"))
    write_trial(str(tmp_path / "t"))
    with pytest.raises(TrialAccessError, match="outside the allowed data roots"):
        load_trial(str(tmp_path / "t"), roots=[str(tmp_path / "other")])
    assert load_trial(str(tmp_path / "t"), roots=[str(tmp_path)]).framework.shape[0] > 0


# --- reloading a running job's trial: only new or changed files are read ---------------------------

def counting(folder):
    from dashboard.trial.store import LocalStore

    return CountingStore(LocalStore(folder))


def _frame_rows(trial):
    return sorted(map(tuple, trial.framework.astype(str).to_numpy().tolist()))


def test_a_reload_reads_only_new_and_changed_files(tmp_path):
    folder = str(tmp_path / "trial")
    first = write_trial(folder, epochs=2, train_batches=20, val_batches=0, rotate_s=0.05)
    file_cache: dict = {}
    store = counting(folder)
    loaded = load_trial(folder, store=store, file_cache=file_cache)
    files = len(store.list())
    assert len(store.reads) == files and file_cache

    store = counting(folder)  # unchanged: nothing is read
    again = load_trial(folder, store=store, file_cache=file_cache)
    assert store.reads == []
    assert _frame_rows(again) == _frame_rows(loaded)
    assert again.report.to_dict() == loaded.report.to_dict()
    assert len(again.system) == len(loaded.system)

    # The job goes on: new files appear (and the current minute's system file grows).
    listing = {(info.key, info.size, info.version) for info in store.list()}
    before = {key for key, _, _ in listing}
    write_trial(folder, epochs=1, train_batches=15, val_batches=0, main_pid=40_000, rotate_s=0.05,
                start_us=first.events[-1].end_us + 1_000_000)
    new_or_changed = {key for key, _, _ in {(i.key, i.size, i.version) for i in store.list()} - listing}
    assert new_or_changed - before and len(new_or_changed) < len(before)
    store = counting(folder)
    grown = load_trial(folder, store=store, file_cache=file_cache)
    assert set(store.reads) == new_or_changed
    assert _frame_rows(grown) == _frame_rows(load_trial(folder))  # as a load from scratch

    # A file rewritten in place (a new version) is read again; the others are not.
    changed = sorted(k for k in before if k.startswith("framework/"))[0]
    path = os.path.join(folder, changed)
    with open(path) as handle:
        text = handle.read()
    with open(path, "w") as handle:
        handle.write(text.replace('"dur": ', '"dur": 1', 1))
    store = counting(folder)
    rewritten = load_trial(folder, store=store, file_cache=file_cache)
    assert store.reads == [changed]
    assert _frame_rows(rewritten) == _frame_rows(load_trial(folder))


def test_files_still_being_written_are_not_kept(tmp_path):
    folder = str(tmp_path / "trial")
    write_trial(folder, epochs=1, train_batches=10, val_batches=0)
    src = next(os.path.join(d, n) for d, _, names in os.walk(os.path.join(folder, "framework")) for n in names)
    node = os.path.basename(src).split("_", 1)[1].rsplit("_", 1)[0]
    with open(src) as handle:
        lines = handle.read().splitlines()
    tmp = os.path.join(folder, fmt.framework_tmp_key(node))
    with open(tmp, "w") as handle:  # the writer's open file: no closing bracket yet
        handle.write("\n".join(lines[:-1]) + "\n")
    file_cache: dict = {}
    store = counting(folder)
    load_trial(folder, store=store, file_cache=file_cache)
    assert fmt.framework_tmp_key(node) in store.reads
    assert len(file_cache) == len(store.reads) - 1  # every file with events but the .tmp one
    store = counting(folder)
    load_trial(folder, store=store, file_cache=file_cache)
    assert store.reads == [fmt.framework_tmp_key(node)]


def test_files_taken_from_the_cache_still_count_against_the_limits(tmp_path):
    from dashboard.trial.errors import TrialTooLargeError

    folder = str(tmp_path / "trial")
    write_trial(folder, epochs=2, train_batches=20, val_batches=0)
    file_cache: dict = {}
    events = len(load_trial(folder, file_cache=file_cache).framework)
    with pytest.raises(TrialTooLargeError, match="events"):
        load_trial(folder, file_cache=file_cache, max_events=events // 2)
    with pytest.raises(TrialTooLargeError):
        load_trial(folder, file_cache=file_cache, max_bytes=1000)


def test_a_failed_load_leaves_nothing_in_the_file_cache(tmp_path):
    from dashboard.trial.errors import TrialError

    folder = str(tmp_path / "trial")
    write_trial(folder, epochs=2, train_batches=20, val_batches=0, rotate_s=0.05)

    class FailingStore(CountingStore):
        def read(self, key, size=None):
            if len(self.reads) >= 5:
                raise TrialError(f"{folder}: cannot reach the store")
            return super().read(key, size)

    from dashboard.trial.store import LocalStore


    file_cache: dict = {}
    with pytest.raises(TrialError, match="cannot reach"):
        load_trial(folder, store=FailingStore(LocalStore(folder)), file_cache=file_cache, threads=1)
    assert file_cache == {}


def test_a_process_with_other_threads_parses_in_itself_never_forking(tmp_path, monkeypatch):
    # A fork copies the locks other threads hold (a server's, a test session's), and the copy
    # never unlocks: with another thread running, processes= is ignored.
    import threading

    from dashboard.trial import load

    write_trial(str(tmp_path), epochs=1)
    monkeypatch.setattr(load, "PROCESS_PARSE_MIN_BYTES", 0)

    def no_fork(self, processes):
        raise AssertionError("forked from a process with other threads")

    monkeypatch.setattr(load.ForkedWorkers, "__init__", no_fork)
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert not load.ForkedWorkers.usable()
        trial = load_trial(str(tmp_path), processes=2)
    finally:
        release.set()
        other.join()
    assert len(trial.framework) == len(load_trial(str(tmp_path)).framework) > 0


def _pyarrows_conversion(tables, schema):
    """What pyarrow's own pandas conversion makes of the tables: the frames' types, by another
    road (the frames fill their columns table by table instead)."""
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    for name in table.column_names:
        if pa.types.is_string(table.schema.field(name).type):
            table = table.set_column(table.schema.get_field_index(name), name,
                                     table.column(name).dictionary_encode())
    return table.unify_dictionaries().to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(),
                                                              pa.bool_(): pd.BooleanDtype()}.get)


def test_the_frames_columns_are_pyarrows_conversion_of_the_files_tables():
    """Per-file tables with different dictionaries, null codes, columns empty in some tables and
    in all, batches of several sizes: the columns equal pyarrow's conversion of the concatenated
    tables, category order included; the list is emptied (each table freed once copied)."""
    from dashboard.trial.frames import FRAMEWORK_ARROW_SCHEMA, SYSTEM_ARROW_SCHEMA, _columns_of

    rng = np.random.default_rng(7)

    def framework_table(rows: int, names: list[str], with_settings: bool) -> pa.Table:
        columns = {}
        for field in FRAMEWORK_ARROW_SCHEMA:
            if pa.types.is_dictionary(field.type):
                values = [None if rng.random() < 0.1 else names[i] for i in rng.integers(0, len(names), rows)]
                columns[field.name] = pa.array(values, pa.string()).dictionary_encode()
            elif field.name in ("start_us", "end_us"):
                columns[field.name] = pa.array(rng.integers(0, 10**12, rows), pa.int64())
            elif field.name in ("num_workers", "pin_memory") and not with_settings:
                columns[field.name] = pa.nulls(rows, field.type)
            elif field.name == "rank":
                columns[field.name] = pa.nulls(rows, field.type)  # empty in every table
            elif pa.types.is_boolean(field.type):
                columns[field.name] = pa.array([None if rng.random() < 0.3 else bool(rng.integers(2))
                                                for _ in range(rows)], pa.bool_())
            else:
                columns[field.name] = pa.array([None if rng.random() < 0.3 else int(v)
                                                for v in rng.integers(-5, 10**9, rows)], pa.int64())
        table = pa.table(columns, schema=FRAMEWORK_ARROW_SCHEMA)
        return pa.Table.from_batches(table.to_batches(max_chunksize=7), FRAMEWORK_ARROW_SCHEMA)

    tables = [framework_table(9, ["y"], True).slice(0, 0),  # empty chunks: their dictionaries count
              framework_table(20, ["b", "a"], True), framework_table(0, ["z"], False),
              framework_table(33, ["c", "a", "d"], False), framework_table(5, ["e"], True)]
    expected = _pyarrows_conversion(list(tables), FRAMEWORK_ARROW_SCHEMA)
    given = list(tables)
    columns = _columns_of(given, FRAMEWORK_ARROW_SCHEMA, never_null=("start_us", "end_us"))
    assert given == []
    frame = pd.DataFrame(columns)
    expected = expected.astype({"start_us": "int64", "end_us": "int64"})
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)
    assert frame["rank"].isna().all() and frame["num_workers"].notna().sum() > 0

    # In a stable sort of a column: written at their places, equal to pandas' stable sort of the
    # conversion (ties among the start times made on purpose: their tables' order must stay).
    for table_index, table in enumerate(tables):
        if table.num_rows:
            ties = pa.array(rng.integers(0, 4, table.num_rows) * 10**11, pa.int64())
            tables[table_index] = table.set_column(table.schema.get_field_index("start_us"), "start_us", ties)
    expected = _pyarrows_conversion(list(tables), FRAMEWORK_ARROW_SCHEMA).astype(
        {"start_us": "int64", "end_us": "int64"})
    assert not expected["start_us"].is_monotonic_increasing  # (the rows do move)
    expected = expected.sort_values("start_us", kind="stable").reset_index(drop=True)
    sorted_frame = pd.DataFrame(_columns_of(list(tables), FRAMEWORK_ARROW_SCHEMA, never_null=("start_us", "end_us"),
                                            order_by="start_us"))
    pd.testing.assert_frame_equal(sorted_frame, expected, check_exact=True)
    in_order = [tables[1].sort_by("start_us"), tables[4].slice(0, 0)]
    pd.testing.assert_frame_equal(
        pd.DataFrame(_columns_of(list(in_order), FRAMEWORK_ARROW_SCHEMA, never_null=("start_us", "end_us"),
                                 order_by="start_us")),
        _pyarrows_conversion(list(in_order), FRAMEWORK_ARROW_SCHEMA).astype({"start_us": "int64", "end_us": "int64"}),
        check_exact=True)

    # A table the frame cannot take is refused as such, before any row is placed: a start time
    # missing, or another schema.
    broken = tables[1].set_column(tables[1].schema.get_field_index("start_us"), "start_us",
                                  pa.array([None] + [5] * (tables[1].num_rows - 1), pa.int64()))
    with pytest.raises(ValueError, match="start_us: a column that is never null has 1 nulls"):
        _columns_of([tables[3], broken], FRAMEWORK_ARROW_SCHEMA, never_null=("start_us", "end_us"), order_by="start_us")
    with pytest.raises(ValueError, match="another schema"):
        _columns_of([tables[3], tables[1].drop_columns(["start_us"])], FRAMEWORK_ARROW_SCHEMA,
                    never_null=("start_us", "end_us"), order_by="start_us")

    system = [pa.table({"node": ["h1", "h2", "h1"], "timestamp_us": [3, 1, 2], "type": ["cpu", "cpu", "gpu"],
                        "name": ["cpu0", None, "gpu0"], "dimension": ["CPUUtilization"] * 3,
                        "value": [1.5, None, 3.0]}, schema=SYSTEM_ARROW_SCHEMA),
              pa.table({"node": ["h3"], "timestamp_us": [4], "type": ["io"], "name": ["sda"],
                        "dimension": ["ReadBytes"], "value": [9.0]}, schema=SYSTEM_ARROW_SCHEMA)]
    expected = _pyarrows_conversion(list(system), SYSTEM_ARROW_SCHEMA).astype({"timestamp_us": "int64"})
    frame = pd.DataFrame(_columns_of(list(system), SYSTEM_ARROW_SCHEMA, never_null=("timestamp_us",)))
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)

    empty = pd.DataFrame(_columns_of([], FRAMEWORK_ARROW_SCHEMA, never_null=("start_us", "end_us")))
    assert len(empty) == 0 and [str(d) for d in empty.dtypes] == [str(d) for d in pd.DataFrame(columns).dtypes]


def test_rows_taken_by_position_equal_pandas_selection_and_leave_empty_columns_empty(tmp_path):
    """take_rows is frame[mask] (pandas' own selection the oracle), on a real trial's frame with
    its empty settings columns; those stay missing_column (all missing, nothing written)."""
    from dashboard.trial.frames import take_rows

    write_trial(tmp_path / "t", epochs=1)
    framework = dashboard.load_trial(str(tmp_path / "t")).framework
    mask = (framework["kind"] == fmt.KIND_GETNEXT).to_numpy()
    taken = take_rows(framework, np.flatnonzero(mask))
    pd.testing.assert_frame_equal(taken, framework[mask], check_exact=True)
    empty = [name for name in framework.columns if framework[name].isna().all()]
    assert "iterator_id" in empty  # the reference's events carry none
    assert all(taken[name].isna().all() for name in empty)
