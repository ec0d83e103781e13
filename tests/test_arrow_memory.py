"""dashboard.arrow_memory: Arrow's allocator hands freed memory back at once, in a process
that imports the reader first, and nothing changes anywhere else."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

# The start of every probe: the project importable, and anon(), the resident anonymous
# memory in MiB.
PRELUDE = textwrap.dedent(f"""
    import json, os, sys
    sys.path.insert(0, {ROOT!r})

    def anon():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) / 1024 for line in status if line.startswith("RssAnon"))
""")

# Allocates 2000 Arrow buffers of 64 KiB (125 MiB), frees them, and prints the resident
# anonymous memory before, while held and after.
PROBE = textwrap.dedent("""
    {imports}
    import pyarrow as pa

    before = anon()
    buffers = [pa.allocate_buffer(64 << 10) for _ in range(2000)]
    held = anon()
    del buffers
    print(json.dumps({{"before": before, "held": held, "after": anon(),
                      "env": os.environ.get("MIMALLOC_PURGE_DELAY")}}))
""")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


def run_probe(code: str, env: dict | None = None) -> dict:
    """The JSON object `code` prints last, run after PRELUDE in a fresh Python whose
    environment sets no allocator option but those in `env`."""
    environment = {k: v for k, v in os.environ.items() if k != "MIMALLOC_PURGE_DELAY"}
    environment.update(env or {})
    out = subprocess.run([sys.executable, "-c", PRELUDE + code], env=environment,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return json.loads(out.strip().splitlines()[-1])


def probe(imports: str, env: dict | None = None) -> dict:
    return run_probe(PROBE.format(imports=imports), env)


def test_the_reader_makes_arrow_return_freed_memory_at_once():
    found = probe("import dashboard.trial.load")
    assert found["held"] - found["before"] > 100  # the buffers were really resident
    assert found["after"] - found["before"] < 20
    assert found["env"] is None  # not left for child processes to inherit


def test_without_it_arrow_keeps_freed_memory():
    # The control: shows that the probe can tell the two apart.
    found = probe("")
    assert found["held"] - found["before"] > 100
    assert found["after"] - found["before"] > 100


def test_a_process_that_imported_pyarrow_first_is_left_alone():
    found = probe("import pyarrow; import dashboard.trial.load")
    assert found["after"] - found["before"] > 100
    assert found["env"] is None


def test_a_delay_chosen_in_the_environment_wins():
    found = probe("import dashboard.trial.load", env={"MIMALLOC_PURGE_DELAY": "100000"})
    assert found["after"] - found["before"] > 100
    assert found["env"] == "100000"


@pytest.mark.parametrize("module", ["dashboard.analysis", "dashboard.report", "dashboard.web",
                                    "dashboard.trial.frames", "dashboard.api"])
def test_every_entry_to_the_analysis_side_sets_it(module):
    found = probe(f"import {module}")
    assert found["after"] - found["before"] < 20


def test_the_collector_does_not_import_pyarrow():
    code = ("import sys; sys.path.insert(0, %r); import dashboard.collector, dashboard.collector.sink; "
            "print('pyarrow' in sys.modules)" % ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_load_hands_back_what_arrow_holds_free_even_when_pyarrow_came_first(tmp_path):
    from dashboard.synthetic import write_trial

    write_trial(str(tmp_path), epochs=1, train_batches=5, val_batches=0)
    found = run_probe(textwrap.dedent(f"""
        import pyarrow as pa
        from dashboard.trial.load import load_trial

        before = anon()
        buffers = [pa.allocate_buffer(64 << 10) for _ in range(2000)]
        del buffers
        kept = anon()
        trial = load_trial({str(tmp_path)!r})
        print(json.dumps({{"before": before, "kept": kept, "after": anon(), "events": len(trial.framework)}}))
    """))
    assert found["events"] > 0
    assert found["kept"] - found["before"] > 100  # pyarrow came first: freed memory was kept
    assert found["after"] - found["before"] < 40  # until the load handed it back


def test_a_load_hands_back_what_the_c_heap_holds_free(tmp_path):
    """A load parsed in forked processes receives their results pickled, through the C heap;
    glibc keeps freed heap memory unless it lies at the heap's top (a 300k-GetNext load held
    74 MB more). Here 125 MiB of 64 KiB bytes objects (below glibc's mmap threshold: heap) are
    freed under one that is kept, so the heap cannot shrink from its top."""
    from dashboard.synthetic import write_trial

    write_trial(str(tmp_path), epochs=1, train_batches=5, val_batches=0)
    found = run_probe(textwrap.dedent(f"""
        from dashboard.trial.load import load_trial

        before = anon()
        pieces = [b"x" * (64 << 10) for _ in range(2000)]  # (written: bytes(n) is calloc's untouched pages)
        top = b"x" * (64 << 10)
        del pieces
        kept = anon()
        trial = load_trial({str(tmp_path)!r})
        print(json.dumps({{"before": before, "kept": kept, "after": anon(), "events": len(trial.framework)}}))
    """))
    assert found["events"] > 0
    assert found["kept"] - found["before"] > 100  # glibc kept the freed heap memory
    assert found["after"] - found["before"] < 40  # until the load handed it back


def test_a_forked_load_hands_back_each_table_as_the_frame_takes_it_over(tmp_path):
    """A load parsed in forked processes where there is no shared memory to hand the tables over
    through (dashboard/trial/table_handover.py: here, none at all) receives each file's table
    pickled: its buffers are bytes objects on the C heap. The frame copies them table by table and frees each, but glibc
    keeps what it frees in the middle of its heap, so the frame grew beside all of them: a
    300k-GetNext trial's load peaked at 270 MB, 200 MB once each table was handed back.

    Measured on this trial (320k events, 34 MB of tables) in 3 runs: the frame's build took
    2.5 MB above what the process held before it with the tables handed back, 41 MB without.
    The limit, half of the tables' bytes, lies between the two."""
    from dashboard.synthetic import write_trial

    write_trial(str(tmp_path), epochs=2, train_batches=80_000, val_batches=0, num_workers=4, rotate_s=5)
    found = run_probe(textwrap.dedent(f"""
        import dashboard.trial.frames as frames
        import dashboard.trial.load as load

        load.PROCESS_PARSE_MIN_BYTES = 0  # parsed in forked processes whatever its size
        import dashboard.trial.table_handover as table_handover
        table_handover.SHARED_MEMORY_ROOT = {str(tmp_path / "no-shared-memory")!r}  # the pipe, then

        def status(key):
            with open("/proc/self/status") as lines:
                return next(int(line.split()[1]) / 1024 for line in lines if line.startswith(key))

        found = {{}}
        build = frames.framework_frame

        def measured(tables):
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # the peak (VmHWM) starts again from what the process holds now
            found.update(before=status("VmRSS"), tables=sum(table.nbytes for table in tables) / 2**20)
            frame = build(tables)
            found["peak"] = status("VmHWM")
            return frame

        frames.framework_frame = measured
        parses = []  # the files parsed in the forked processes
        submit = load.ForkedWorkers.submit
        load.ForkedWorkers.submit = lambda self, fn, *args, **kw: parses.append(fn) or submit(self, fn, *args, **kw)
        trial = load.load_trial({str(tmp_path)!r}, processes=2)
        found.update(events=len(trial.framework), forked=len(parses))
        print(json.dumps(found))
    """))
    assert found["events"] == 320_010
    assert found["forked"] > 40  # (every file, not parsed in this process: else nothing came pickled)
    assert found["tables"] > 25  # (the pickled buffers the frame is built from)
    assert found["peak"] - found["before"] < found["tables"] / 2, found
