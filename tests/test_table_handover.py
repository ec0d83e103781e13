"""dashboard/trial/table_handover.py: the tables a forked parse hands its parent through shared
memory, and the pipe when there is none."""
import json
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from dashboard.trial import table_handover
from dashboard.trial.table_handover import PREFIX, TableHandover
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks, reads /proc")


def _table(rows: int = 1000) -> pa.Table:
    return pa.table({"start_us": pa.array(range(rows), pa.int64()),
                     "name": pa.array(["GetNext", "Step"] * (rows // 2)).dictionary_encode()})


def test_a_table_put_is_taken_whole_once_and_its_file_removed(tmp_path):
    handover = TableHandover.create(str(tmp_path))
    assert oct(os.stat(handover.folder).st_mode & 0o777) == oct(0o700)
    table = _table()
    name = handover.put(table)
    assert os.listdir(handover.folder) == [name]
    taken = handover.take(name)
    assert taken.equals(table) and taken.schema.equals(table.schema)
    assert os.listdir(handover.folder) == []  # (the table stays mapped: its memory goes with it)
    assert taken.column("start_us").to_pylist()[-3:] == [997, 998, 999]
    with pytest.raises(OSError):
        handover.take(name)  # taken once
    handover.close()
    assert not os.path.exists(handover.folder)


def test_columns_of_nulls_alone_are_not_written_and_come_back_whole(tmp_path):
    """A column of nulls alone of a fixed-width type (most of a reference trial's: Arrow gives each
    8 bytes a row of zeros) is left out of the table a worker hands over (null_columns.py), and
    made again in the parent over one read-only mapping of zeros that every such table shares."""
    from dashboard.trial.null_columns import with_null_columns, without_null_columns

    rows = 10_000
    none = [None] * rows
    table = pa.table({
        "start_us": pa.array(range(rows), pa.int64()),
        "iterator_id": pa.array(none, pa.int64()), "pin_memory": pa.array(none, pa.bool_()),
        "value": pa.array(none, pa.float64()), "tiny": pa.array(none, pa.int8()),
        "worker_id": pa.array([None, 1] * (rows // 2), pa.int64()),  # some nulls: written
        "label": pa.array(none, pa.string()),  # not fixed-width: written
        "name": pa.array(["GetNext", None] * (rows // 2)).dictionary_encode()},
    ).replace_schema_metadata({"kept": "as it was"})
    handover = TableHandover.create(str(tmp_path))
    name = handover.put(without_null_columns(table))
    path = os.path.join(handover.folder, name)
    with pa.memory_map(path) as mapped:
        written = pa.ipc.open_file(mapped).schema
    assert written.names == ["start_us", "worker_id", "label", "name"]
    whole_file = pa.BufferOutputStream()
    with pa.ipc.new_file(whole_file, table.schema) as writer:
        writer.write_table(table)
    assert os.path.getsize(path) <= whole_file.getvalue().size - (2 * 8 + 1) * rows  # (the values left out)
    taken = with_null_columns(handover.take(name))
    assert taken.schema.equals(table.schema, check_metadata=True) and taken.equals(table)
    taken.validate(full=True)
    for column in ("iterator_id", "pin_memory", "value", "tiny"):
        assert taken.column(column).null_count == rows and taken.column(column).to_pylist() == none
        assert not any(b.is_mutable for b in taken.column(column).chunk(0).buffers())
    assert taken.column("worker_id").to_pylist()[:4] == [None, 1, None, 1]
    handover.close()
    # A table with a value in every column, or without rows, is left as it is; no rows of one
    # that left columns out (a slice of it) is made whole all the same.
    for whole in (_table(), table.slice(0, 0)):
        assert without_null_columns(whole) is whole and with_null_columns(whole) is whole
    none_of_it = with_null_columns(without_null_columns(table).slice(0, 0))
    assert none_of_it.schema.equals(table.schema, check_metadata=True) and none_of_it.num_rows == 0
    # Thousands of tables made whole add no mapping each: a load of 45,000 files once ran out of
    # the 65,530 a process may hold.
    with open("/proc/self/maps") as maps:
        before = len(maps.readlines())
    narrow = without_null_columns(table)
    kept = [with_null_columns(narrow) for _ in range(3000)]
    with open("/proc/self/maps") as maps:
        assert len(maps.readlines()) - before < 10
    assert all(t.equals(table) for t in kept[:3])


def test_no_room_to_spare_a_failed_write_or_no_folder_leaves_the_table_to_the_pipe(tmp_path, monkeypatch):
    handover = TableHandover.create(str(tmp_path))
    monkeypatch.setattr(table_handover, "KEEP_FREE_BYTES", 2**62)  # more than any disk has
    assert handover.put(_table()) is None
    monkeypatch.undo()
    # A table Arrow's file format refuses once its file is open (two chunks, two dictionaries):
    # not an OSError, and the file it began is removed.
    refused = pa.table({"name": pa.chunked_array([pa.array(["a", "b"]).dictionary_encode(),
                                                  pa.array(["c"]).dictionary_encode()])})
    assert handover.put(refused) is None
    assert os.listdir(handover.folder) == []
    handover.close()
    assert handover.put(_table()) is None  # the folder is gone
    assert TableHandover.create(str(tmp_path / "missing")) is None


def test_only_folders_no_live_process_holds_are_removed_as_abandoned(tmp_path):
    """A handover's process holds its folder locked while it lives; the kernel lets go of the lock
    however the process ends (here: SIGKILL). Only such folders of this user are removed."""
    root = str(tmp_path)
    killed = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {ROOT!r})
        from dashboard.trial.table_handover import TableHandover
        handover = TableHandover.create({root!r})
        handover.put(__import__("pyarrow").table({{"x": [1, 2, 3]}}))
        print(handover.folder, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    left = killed.stdout.readline().strip()
    live = TableHandover.create(root)  # (held by this process)
    never_locked = tmp_path / f"{PREFIX}never-locked"
    never_locked.mkdir()
    others = tmp_path / f"{PREFIX}another-users"
    others.mkdir()
    if os.geteuid() == 0:  # (root can give it away: CI's case)
        os.chown(others, 65534, 65534)
    not_a_folder = tmp_path / f"{PREFIX}a-file"
    not_a_folder.write_bytes(b"x")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "kept").write_bytes(b"x")
    link = tmp_path / f"{PREFIX}a-link"
    link.symlink_to(target)
    try:
        assert os.path.isdir(left) and len(os.listdir(left)) == 1
        TableHandover.create(root).close()
        assert os.path.isdir(left)  # its process lives: kept
        killed.kill()
        killed.wait()
        survivor = TableHandover.create(root)
        assert not os.path.exists(left) and not never_locked.exists()
        assert os.path.isdir(live.folder)
        if os.geteuid() == 0:
            assert others.exists()
        assert not_a_folder.exists() and link.is_symlink() and (target / "kept").exists()
        survivor.close()
        live.close()
    finally:
        killed.kill()
        killed.wait()


# A load parsed in 2 forked processes, in a process of its own (a fork needs one without
# threads): what it kept, how the tables came, and the shared memory before, during and after.
FORKED_LOAD = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {root!r})
    from dashboard.trial import load, table_handover
    from tests.forked_load import kept

    load.PROCESS_PARSE_MIN_BYTES = 0
    table_handover.SHARED_MEMORY_ROOT = {shared!r}
    taken, folders = [], []
    take, create = table_handover.TableHandover.take, table_handover.TableHandover.create.__func__

    def counting_take(self, name):
        taken.append(name)
        return take(self, name)

    def remembered(cls, root=None):
        handover = create(cls, root)
        folders.append(handover.folder if handover is not None else None)
        return handover

    table_handover.TableHandover.take = counting_take
    table_handover.TableHandover.create = classmethod(remembered)
    received, made_whole = [], load._made_whole  # the columns of each table a worker sent

    def recording(parsed):
        if parsed.table is not None:
            received.append(parsed.table.schema.names)
        return made_whole(parsed)

    load._made_whole = recording
    {before}
    trial = load.load_trial({trial!r}, processes=2)
    print(json.dumps({{"taken": len(taken), "folders": folders, "received": received,
                       "left": [f for f in folders if f is not None and os.path.exists(f)], **kept(trial)}}))
""")


def _kept_here(trial: str) -> dict:
    """What a load in this process keeps, as the JSON of the forked one has it."""
    from dashboard.trial.load import load_trial
    from tests.forked_load import kept

    return json.loads(json.dumps(kept(load_trial(trial))))


def _what_it_kept(found: dict) -> dict:
    """A forked load's JSON without what the probe adds of its own (how the tables came)."""
    return {key: value for key, value in found.items() if key not in ("taken", "folders", "left", "received")}


def _small_trial_forked(tmp_path, before: str) -> tuple[dict, dict]:
    """(the forked load's JSON, what a load in this process keeps) of a small trial, the probe's
    code `before` run ahead of the load."""
    from dashboard.synthetic import write_trial

    trial = tmp_path / "trial"
    write_trial(str(trial), epochs=1, train_batches=3000, val_batches=0, num_workers=2, rotate_s=5)
    shared = tmp_path / "shm"
    shared.mkdir()
    return _forked_load(str(trial), str(shared), before=before), _kept_here(str(trial))


def _forked_load(trial: str, shared: str, before: str = "") -> dict:
    out = subprocess.run([sys.executable, "-c", FORKED_LOAD.format(root=ROOT, shared=shared, trial=trial,
                                                                  before=before)],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_forked_load_takes_its_tables_through_shared_memory_and_keeps_what_one_process_keeps(tmp_path):
    from dashboard.synthetic import write_trial

    trial = tmp_path / "trial"
    write_trial(str(trial), epochs=2, train_batches=2000, val_batches=200, num_workers=2, rotate_s=5)
    shared = tmp_path / "shm"
    shared.mkdir()
    here = _kept_here(str(trial))
    through_shared = _forked_load(str(trial), str(shared))
    files_with_rows = sum(1 for _, _, names in os.walk(trial) for name in names if name.endswith(".json"))
    assert through_shared["taken"] == files_with_rows > 4  # every file's table came mapped
    assert through_shared["left"] == [] and os.listdir(shared) == []  # its folder went with the load
    through_pipe = _forked_load(str(trial), str(tmp_path / "none"))  # no such folder: pickled
    assert through_pipe["taken"] == 0 and through_pipe["folders"] == [None]
    # Either way a table comes without its columns of nulls alone (the reference's files have no
    # iterator id, nor this project's collector's measures), made whole here.
    for found in (through_shared, through_pipe):
        assert len(found["received"]) == files_with_rows
        framework = [names for names in found["received"] if "phase" in names]
        assert framework and all({"iterator_id", "cpu_us", "runq_us"}.isdisjoint(names) for names in framework)
    for found in (through_shared, through_pipe):
        assert _what_it_kept(found) == here


def test_a_forked_load_whose_handover_folder_vanishes_takes_its_tables_through_the_pipe(tmp_path):
    """Each worker that cannot write its table (the folder is gone: a cleaner, a full memory file
    system) sends it pickled: the load loses nothing."""
    vanishing = textwrap.dedent("""
        import shutil
        workers_init = load.ForkedWorkers.__init__

        def vanished(self, processes):
            workers_init(self, processes)
            shutil.rmtree(self._handover.folder)

        load.ForkedWorkers.__init__ = vanished
    """)
    found, here = _small_trial_forked(tmp_path, vanishing)
    assert found["taken"] == 0 and found["folders"] != [None]
    assert _what_it_kept(found) == here


def test_a_table_whose_handover_file_is_gone_before_its_parent_takes_it_is_parsed_again_there(tmp_path):
    """A file removed between the worker's put and the parent's take (a cleaner of /dev/shm):
    the parent reads and parses that trial file itself, and the load loses nothing."""
    cleaner = textwrap.dedent("""
        import os
        counted_take = table_handover.TableHandover.take

        def cleaned_first(self, name):
            os.remove(os.path.join(self.folder, name))
            return counted_take(self, name)

        table_handover.TableHandover.take = cleaned_first
    """)
    found, here = _small_trial_forked(tmp_path, cleaner)
    assert found["taken"] > 4  # (every file's take failed, each parsed again)
    assert _what_it_kept(found) == here
