"""smdebug_format.trace_rows: each event's phase from its trace pid's latest definition, and the
rows kept where the bad ones lie anywhere in the file (a slice when they all come first, a
filter otherwise: both must keep the same rows)."""
import json

import pytest

from dashboard.trial import smdebug_format
from dashboard.trial.smdebug_format import parse_trace_file

START = 1_795_986_600_000_000


def _file(lines: list[dict]) -> bytes:
    return ("[\n" + ",\n".join(json.dumps(line) for line in lines) + "\n]\n").encode()


def _define(pid: int, phase: str) -> dict:
    return {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": phase}}


def _event(name: str, pid: int, ts, dur=10, **args) -> dict:
    return {"name": name, "ph": "X", "pid": pid, "ts": ts, "dur": dur, "args": {"pid": 77, **args}}


def _expected(lines: list[dict]) -> tuple[list, list]:
    """(names, phases) of the events kept, by the rule itself: an X event with a time, a
    duration of 0 or more and a name; its phase its trace pid's latest definition above it."""
    phase_of, names, phases = {}, [], []
    for line in lines:
        if line["ph"] == "M" and line["name"] == "process_name" and "name" in line["args"]:
            phase_of[line["pid"]] = line["args"]["name"]
        elif line["ph"] == "X" and line["ts"] is not None and line["dur"] >= 0:
            names.append(line["name"])
            phases.append(phase_of.get(line["pid"]))
    return names, phases


def _first_use(values: list) -> list:
    return list(dict.fromkeys(v for v in values if v is not None))


@pytest.mark.parametrize("bad_first", [True, False])
@pytest.mark.parametrize("redefined", [True, False])
def test_each_event_takes_its_pids_latest_phase_and_the_dictionaries_are_in_order_of_first_use(bad_first, redefined):
    # bad_first and not redefined: every row not kept comes first (the usual file, kept by a slice).
    start = {"name": "process_name", "ph": "M", "pid": 0, "args": {fmt_start(): START}}
    events = [
        _event("Step:ModeKeys.TRAIN", 3, 100, step_num="1"),  # pid 3 first: its phase is the first used
        _event("GetNext", 2, 200, worker_id=0),
        _event("orphan", 9, 250),  # a pid never defined: no phase
        *([_define(2, "DataLoaderIterInitialize")] if redefined else []),  # pid 2's phase from here on
        _event("GetNext", 2, 300, worker_id=1),
        _event("GetNext", 3, 400),
    ]
    bad = [_event("broken", 2, None), _event("negative", 3, 500, dur=-1)]
    head = [start, _define(2, "DataLoaderIter"), _define(3, "Step:ModeKeys.TRAIN")]
    lines = head + (bad + events if bad_first else events[:2] + bad[:1] + events[2:] + bad[1:])
    parsed = parse_trace_file(_file(lines), "77-algo-1")
    assert parsed.lines_skipped == 2
    table = parsed.table
    names, phases = _expected(lines)
    assert table.column("name").to_pylist() == names == ["Step:ModeKeys.TRAIN", "GetNext", "orphan", "GetNext",
                                                         "GetNext"]
    assert table.column("phase").to_pylist() == phases
    assert phases[3] == ("DataLoaderIterInitialize" if redefined else "DataLoaderIter") and phases[2] is None
    assert table.column("phase").chunk(0).dictionary.to_pylist() == _first_use(phases)
    assert table.column("name").chunk(0).dictionary.to_pylist() == _first_use(names)
    assert table.column("start_us").to_pylist() == [START + t for t in (100, 200, 250, 300, 400)]
    assert table.column("end_us").to_pylist() == [START + t + 10 for t in (100, 200, 250, 300, 400)]
    assert table.column("worker_id").to_pylist() == [None, 0, None, 1, None]
    assert table.column("step").to_pylist() == [1, None, None, None, None]


def test_times_are_rounded_half_to_even_as_the_canonical_rows_are():
    lines = [{"name": "process_name", "ph": "M", "pid": 0, "args": {fmt_start(): START}},
             _event("a", 1, 0.5, dur=1.5), _event("b", 1, 1.5, dur=2.5), _event("c", 1, 2.4, dur=0.6)]
    table = parse_trace_file(_file(lines), "77-algo-1").table
    assert table.column("start_us").to_pylist() == [START, START + 2, START + 2]
    assert table.column("end_us").to_pylist() == [START + 2, START + 4, START + 3]


def fmt_start() -> str:
    from dashboard import format as fmt

    return fmt.ARG_START_TIME


def _reference_file_lines(extra_last_args: dict) -> list[dict]:
    """A reference-format file (the arguments its writer gives), the last event with more."""
    lines = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": START}},
             _define(1, "DataLoaderIterInitialize"),
             _event("_MultiProcessingDataLoaderIter.__init__", 1, 0, 400, num_workers=2, pin_memory=True,
                    step_num="-1"),
             _define(2, "DataLoaderIter")]
    lines += [_event("_MultiProcessingDataLoaderIter::GetNext", 2, 500 + 100 * i, 50, worker_id=i % 2,
                     step_num=str(i)) for i in range(20)]
    lines[-1]["args"].update(extra_last_args)
    return lines


def _decoded_by_the_reference_arguments(data: bytes) -> bool:
    try:
        smdebug_format._TRACE_DECODINGS[0].decoder.decode(data)
    except smdebug_format._REFUSED:
        return False
    return True


def test_the_files_of_a_reference_trial_take_the_decoding_of_the_reference_arguments(tmp_path):
    # The benchmarks' trials (dashboard/synthetic.py writes the reference's events) measure it.
    from dashboard import synthetic

    synthetic.write_trial(str(tmp_path), epochs=2, train_batches=30, pin_memory=True, system=False)
    files = sorted(tmp_path.glob("framework/**/*.json"))
    assert files and all(_decoded_by_the_reference_arguments(f.read_bytes()) for f in files)


@pytest.mark.parametrize("extra_last_args", [
    {},  # the reference's arguments alone
    {"iterator_id": 7, "in_order": False, "cpu_us": 30, "rank": 3},  # the collector's, in the last event only
    {"tid": 12, "note": {"nested": [1, 2]}},  # arguments the reader does not read
])
def test_the_fast_path_keeps_what_the_line_by_line_path_keeps_whatever_arguments_the_events_carry(extra_last_args):
    # A line that is not JSON sends the same file down the line-by-line path (orjson, a row at a
    # time): the rows either path keeps are the same, every argument of the last event with them.
    lines = _reference_file_lines(extra_last_args)
    # (A file of the reference's arguments alone is what the first, cheaper decoding is for.)
    assert _decoded_by_the_reference_arguments(_file(lines)) == (not extra_last_args)
    fast = parse_trace_file(_file(lines), "77-algo-1")
    by_line = parse_trace_file(_file(lines)[:-3] + b',\n{"name": "cut off\n]\n', "77-algo-1")
    assert (fast.lines_skipped, by_line.lines_skipped) == (0, 1)
    assert fast.table.equals(by_line.table)
    last = fast.table.slice(fast.table.num_rows - 1).to_pylist()[0]
    for key in ("iterator_id", "in_order", "cpu_us", "rank"):
        assert last[key] == extra_last_args.get(key)
    assert fast.table.column("num_workers").to_pylist()[0] == 2
    assert fast.table.column("step").to_pylist()[-1] == 19


def test_a_file_the_first_decoding_refuses_for_any_reason_is_decoded_with_every_argument():
    # A key that is not UTF-8 makes the decoding that forbids unknown arguments refuse the file
    # as not JSON (it reads the key to name it); the decoding of every argument skips it as an
    # argument it does not read, and keeps the event, as the reader did before that decoding.
    lines = _reference_file_lines({})
    data = _file(lines).replace(b'"step_num": "3"', b'"step_n\xffum": "3"')
    assert not _decoded_by_the_reference_arguments(data)
    parsed = parse_trace_file(data, "77-algo-1")
    assert (parsed.lines_skipped, parsed.problems) == (0, [])
    assert parsed.table.column("step").to_pylist() == [-1, 0, 1, 2, None] + list(range(4, 20))
