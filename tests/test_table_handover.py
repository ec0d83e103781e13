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


def test_no_room_to_spare_or_no_folder_leaves_the_table_to_the_pipe(tmp_path, monkeypatch):
    handover = TableHandover.create(str(tmp_path))
    monkeypatch.setattr(table_handover, "KEEP_FREE_BYTES", 2**62)  # more than any disk has
    assert handover.put(_table()) is None
    assert os.listdir(handover.folder) == []  # nothing half written left behind
    monkeypatch.undo()
    handover.close()
    assert handover.put(_table()) is None  # the folder is gone
    assert TableHandover.create(str(tmp_path / "missing")) is None


def test_a_folder_left_by_a_process_that_is_gone_is_removed_by_the_next_one(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    host = table_handover._host()
    abandoned = tmp_path / f"{PREFIX}{host}-{gone}-abc"
    live = tmp_path / f"{PREFIX}{host}-{os.getpid()}-abc"
    elsewhere = tmp_path / f"{PREFIX}otherhost-{gone}-abc"  # (another host's pids are not ours to judge)
    for folder in (abandoned, live, elsewhere):
        folder.mkdir()
        (folder / "table").write_bytes(b"x" * 1000)
    handover = TableHandover.create(str(tmp_path))
    assert not abandoned.exists()
    assert live.exists() and elsewhere.exists()
    handover.close()


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
    {before}
    trial = load.load_trial({trial!r}, processes=2)
    print(json.dumps({{"taken": len(taken), "folders": folders,
                       "left": [f for f in folders if f is not None and os.path.exists(f)], **kept(trial)}}))
""")


def _kept_here(trial: str) -> dict:
    """What a load in this process keeps, as the JSON of the forked one has it."""
    from dashboard.trial.load import load_trial
    from tests.forked_load import kept

    return json.loads(json.dumps(kept(load_trial(trial))))


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
    for found in (through_shared, through_pipe):
        assert {k: v for k, v in found.items() if k not in ("taken", "folders", "left")} == here


def test_a_forked_load_whose_handover_folder_vanishes_takes_its_tables_through_the_pipe(tmp_path):
    """Each worker that cannot write its table (the folder is gone: a cleaner, a full memory file
    system) sends it pickled: the load loses nothing."""
    from dashboard.synthetic import write_trial

    trial = tmp_path / "trial"
    write_trial(str(trial), epochs=1, train_batches=3000, val_batches=0, num_workers=2, rotate_s=5)
    shared = tmp_path / "shm"
    shared.mkdir()
    vanishing = textwrap.dedent("""
        import shutil
        workers_init = load.ForkedWorkers.__init__

        def vanished(self, processes):
            workers_init(self, processes)
            shutil.rmtree(self._handover.folder)

        load.ForkedWorkers.__init__ = vanished
    """)
    found = _forked_load(str(trial), str(shared), before=vanishing)
    assert found["taken"] == 0 and found["folders"] != [None]
    assert {k: v for k, v in found.items() if k not in ("taken", "folders", "left")} == _kept_here(str(trial))
