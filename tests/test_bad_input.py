"""A corpus of broken trials: each case writes a trial with the generator, breaks it in one
way, and states what the break destroyed. The reader must load every other event, report
each skipped file or line with the file and a reason, and `app.py analyze --json` must
still exit 0 with one JSON object.

Expected events are the generator's own events minus what the case destroyed, read off
the lines the case broke (with the standard library `json`), never off the reader.
"""
from __future__ import annotations

import gzip
import json
import os
import posixpath
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from dashboard import format as fmt
from dashboard.synthetic import write_trial
from dashboard.trial.errors import NotATrialError
from dashboard.trial.load import load_trial
from tests.conftest import ROOT
from tests.forked_load import kept

NOT_A_TRIAL_FILE = r"^not a trial file \(unknown name or suffix\)$"
# A JSON file off the convention is looked at as a possible PyTorch profiler trace first.
NOT_A_TRIAL_JSON = r"^not a trial file \(unknown name or suffix, and not a PyTorch profiler trace \(no traceEvents\)\)$"


@dataclass
class Broken:
    """What a case did to the trial."""
    lost: list = field(default_factory=list)  # (node, name, start_us, end_us) destroyed
    added: list = field(default_factory=list)  # events the case added
    system_lost: int = 0  # metric records destroyed
    files_skipped: dict = field(default_factory=dict)  # key -> regex the reason must match
    lines: dict = field(default_factory=dict)  # key -> (lines skipped, regex of the reason)
    read_delta: int = 0  # files read, relative to the intact trial


class Trial:
    """The intact trial a case breaks, with helpers to edit its files."""

    def __init__(self, folder: str):
        self.folder = folder
        self.synthetic = write_trial(folder, epochs=2, rotate_s=0.1)
        assert len(self.synthetic.framework_files) >= 5 and len(self.synthetic.system_files) == 1

    def path(self, key: str) -> str:
        return os.path.join(self.folder, *key.split("/"))

    def lines(self, key: str) -> list[str]:
        with open(self.path(key), encoding="utf-8") as handle:
            return handle.read().split("\n")

    def write(self, key: str, text: str | bytes) -> None:
        os.makedirs(os.path.dirname(self.path(key)), exist_ok=True)
        with open(self.path(key), "wb") as handle:
            handle.write(text if isinstance(text, bytes) else text.encode())

    def framework_file(self, index: int) -> str:
        return sorted(self.synthetic.framework_files)[index]

    @property
    def system_file(self) -> str:
        return self.synthetic.system_files[0]

    def events_of(self, key: str, lines: list[str] | None = None) -> list[tuple]:
        """The complete events written in a framework file (or in some of its lines)."""
        node = fmt.FRAMEWORK_FILE_RE.match(posixpath.basename(key)).group("node")
        all_lines = self.lines(key)
        base = json.loads(all_lines[1].rstrip(","))["args"][fmt.ARG_START_TIME]
        out = []
        for line in all_lines if lines is None else lines:
            line = line.strip().rstrip(",")
            if line.startswith("{"):
                event = json.loads(line)
                if event["ph"] == "X":
                    start = base + event["ts"]
                    out.append((node, event["name"], start, start + event["dur"]))
        return out

    def getnext_lines(self, key: str) -> list[int]:
        return [i for i, line in enumerate(self.lines(key)) if "::GetNext" in line]

    def replace_line(self, key: str, index: int, new: str | bytes) -> tuple:
        """Replaces line `index` of a framework file; returns the event that was there."""
        lines = self.lines(key)
        event = self.events_of(key, [lines[index]])[0]
        raw = [line.encode() for line in lines]
        raw[index] = new if isinstance(new, bytes) else new.encode()
        self.write(key, b"\n".join(raw))
        return event

    def sibling_key(self, key: str, end_us_delta: int, suffix: str = "_pythontimeline.json") -> str:
        """A file name of the convention next to `key`, `end_us_delta` later."""
        folder, base = posixpath.split(key)
        match = fmt.FRAMEWORK_FILE_RE.match(base)
        return f"{folder}/{int(match.group('end_us')) + end_us_delta}_{match.group('node')}{suffix}"


# --- the cases --------------------------------------------------------------------------

def truncated_json(t: Trial) -> Broken:
    # A closed file cut in the middle of a line (a partial copy or download).
    key = t.framework_file(1)
    lines = t.lines(key)
    middle = len(lines) // 2
    kept = lines[:middle]
    cut = lines[middle][: len(lines[middle]) // 2]
    t.write(key, "\n".join(kept + [cut]))
    return Broken(lost=t.events_of(key, lines[middle:]),
                  lines={key: (1, r"line %d: not JSON" % (middle + 1))})


def writer_killed_mid_line(t: Trial) -> Broken:
    # The last file is left as the writer's .tmp: no closing bracket, the last line cut.
    key = t.framework_file(-1)
    lines = [line for line in t.lines(key) if line not in ("]", "")]
    node = fmt.FRAMEWORK_FILE_RE.match(posixpath.basename(key)).group("node")
    lost = t.events_of(key, lines[-1:])
    assert lost, "the cut line must be an event"
    tmp = fmt.framework_tmp_key(node)
    t.write(tmp, "\n".join(lines[:-1] + [lines[-1][:40]]))
    os.remove(t.path(key))
    return Broken(lost=lost, lines={tmp: (1, r"not JSON")})


def tmp_file_still_open(t: Trial) -> Broken:
    # The writer is still running: its .tmp file has complete lines but no closing bracket.
    key = t.framework_file(-1)
    lines = [line for line in t.lines(key) if line not in ("]", "")]
    node = fmt.FRAMEWORK_FILE_RE.match(posixpath.basename(key)).group("node")
    t.write(fmt.framework_tmp_key(node), "\n".join(lines) + "\n")
    os.remove(t.path(key))
    return Broken()


def corrupt_line_in_the_middle(t: Trial) -> Broken:
    key = t.framework_file(2)
    index = t.getnext_lines(key)[1]
    line = t.lines(key)[index]
    lost = t.replace_line(key, index, line.replace('"ph": "X"', '"ph": X#garbage'))
    return Broken(lost=[lost], lines={key: (1, r"line %d: not JSON" % (index + 1))})


def empty_framework_file(t: Trial) -> Broken:
    key = t.framework_file(3)
    lost = t.events_of(key)
    t.write(key, "")
    return Broken(lost=lost, files_skipped={key: r"^empty file$"}, read_delta=-1)


def empty_system_file(t: Trial) -> Broken:
    t.write(t.system_file, "  \n")
    return Broken(system_lost=t.synthetic.system_samples, files_skipped={t.system_file: r"^empty file$"},
                  read_delta=-1)


def empty_folders(t: Trial) -> Broken:
    for folder in ("framework/pevents/2026112999", "system/incremental/2026112999", "framework/pevents/x/y",
                   "system/empty"):
        os.makedirs(t.path(folder))
    return Broken()


def non_utf8_bytes(t: Trial) -> Broken:
    key = t.framework_file(1)
    index = t.getnext_lines(key)[0]
    line = t.lines(key)[index].encode()
    lost = t.replace_line(key, index, line.replace(b"::GetNext", b"::Get\xff\xfeNext"))
    lines = t.lines(t.system_file)
    lines[3] = lines[3].replace('"Name": "', '"Name": "\udcff', 1)
    with open(t.path(t.system_file), "wb") as handle:
        handle.write("\n".join(lines).encode("utf-8", "surrogateescape"))
    return Broken(lost=[lost], system_lost=1,
                  lines={key: (1, r"line %d: not JSON \(.*UTF-8" % (index + 1)),
                         t.system_file: (1, r"line 4: not JSON \(.*UTF-8")})


def file_of_only_metadata(t: Trial) -> Broken:
    # A file opened and closed before any event: read, with nothing in it.
    key = t.sibling_key(t.framework_file(0), -1)
    t.write(key, '[\n{"name": "process_name", "ph": "M", "pid": 0, "args": {"%s": %d}},\n'
                 '{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "DataLoaderIter"}},\n]\n'
            % (fmt.ARG_START_TIME, t.synthetic.events[0].start_us))
    return Broken(read_delta=1)


def negative_duration(t: Trial) -> Broken:
    key = t.framework_file(2)
    index = t.getnext_lines(key)[0]
    lost = t.replace_line(key, index, re.sub(r'"dur": \d+', '"dur": -5', t.lines(key)[index]))
    return Broken(lost=[lost], lines={key: (1, r"negative")})


def missing_duration(t: Trial) -> Broken:
    key = t.framework_file(2)
    index = t.getnext_lines(key)[-1]
    lost = t.replace_line(key, index, re.sub(r'"dur": \d+, ', "", t.lines(key)[index]))
    return Broken(lost=[lost], lines={key: (1, r"missing")})


def string_timestamp(t: Trial) -> Broken:
    key = t.framework_file(3)
    index = t.getnext_lines(key)[0]
    lost = t.replace_line(key, index, re.sub(r'"ts": (\d+)', r'"ts": "\1"', t.lines(key)[index]))
    return Broken(lost=[lost], lines={key: (1, r"non-numeric")})


def nan_infinity_and_strings_as_values(t: Trial) -> Broken:
    key = t.framework_file(1)
    first, second = t.getnext_lines(key)[:2]
    lost = [t.replace_line(key, first, re.sub(r'"dur": \d+', '"dur": NaN', t.lines(key)[first])),
            t.replace_line(key, second, re.sub(r'"ts": \d+', '"ts": Infinity', t.lines(key)[second]))]
    lines = t.lines(t.system_file)
    for index, value in ((2, "NaN"), (5, "-Infinity"), (7, '"37.5"')):
        lines[index] = re.sub(r'"Value": [^,]+', '"Value": ' + value, lines[index])
    t.write(t.system_file, "\n".join(lines))
    return Broken(lost=lost, system_lost=3,
                  lines={key: (2, r"non-finite"), t.system_file: (3, r"not JSON|not valid metric")})


def five_mb_line_of_a_valid_event(t: Trial) -> Broken:
    # Arguments the reader does not need, 5 MB of them on one line: the event is kept.
    key = t.framework_file(2)
    index = t.getnext_lines(key)[0]
    line = t.lines(key)[index]
    t.replace_line(key, index, line.replace('"args": {', '"args": {"blob": "%s", ' % ("x" * 5_000_000)))
    return Broken()


def five_mb_line_of_garbage(t: Trial) -> Broken:
    key = t.framework_file(2)
    lines = t.lines(key)
    lines.insert(4, '{"name": "' + "x" * 5_000_000)
    t.write(key, "\n".join(lines))
    return Broken(lines={key: (1, r"line 5: not JSON")})


def _deep(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def deeply_nested_args(t: Trial) -> Broken:
    # Far deeper than orjson's limit and Python's recursion limit; arguments the reader does
    # not need are ignored, so the event is kept.
    key = t.framework_file(1)
    for index in t.getnext_lines(key)[:2]:
        line = t.lines(key)[index]
        t.replace_line(key, index, line.replace('"args": {', '"args": {"nested": %s, ' % _deep(100_000)))
    return Broken()


def deeply_nested_args_next_to_a_corrupt_line(t: Trial) -> Broken:
    # The same, in a file that the corrupt line sends down the line-by-line path.
    key = t.framework_file(1)
    deep, corrupt = t.getnext_lines(key)[:2]
    line = t.lines(key)[deep]
    t.replace_line(key, deep, line.replace('"args": {', '"args": {"nested": [%s], ' % _deep(5_000)))
    lost = t.replace_line(key, corrupt, t.lines(key)[corrupt][:50])
    return Broken(lost=[lost], lines={key: (1, r"line %d: not JSON" % (corrupt + 1))})


def duplicated_files(t: Trial) -> Broken:
    # The same bytes under a second name, and gzipped under a third: read once.
    key = t.framework_file(2)
    copy = t.sibling_key(key, 1)
    shutil.copy(t.path(key), t.path(copy))
    with open(t.path(key), "rb") as handle:
        t.write(key + ".gz", gzip.compress(handle.read()))
    assert sorted([key, copy, key + ".gz"])[0] == key
    return Broken(files_skipped={copy: r"^duplicate of %s$" % re.escape(key),
                                 key + ".gz": r"^duplicate of %s$" % re.escape(key)})


def names_off_the_convention(t: Trial) -> Broken:
    folder = posixpath.dirname(t.framework_file(0))
    system_folder = posixpath.dirname(t.system_file)
    odd = {f"{folder}/trace-20001-algo-1.json": t.framework_file(0),
           f"{folder}/20001-algo-1_pythontimeline.json": t.framework_file(1),
           f"{system_folder}/metrics-algo-1.json": t.system_file,
           "pythontimeline.json": t.framework_file(2)}
    for new, old in odd.items():
        shutil.copy(t.path(old), t.path(new))
    return Broken(files_skipped={key: NOT_A_TRIAL_JSON for key in odd})


def unknown_suffixes(t: Trial) -> Broken:
    odd = [t.framework_file(0) + ".bak", t.framework_file(1) + ".swp", t.framework_file(2) + ".gz.part",
           t.system_file + ".old", t.system_file.replace(".json", ".csv"), "framework/pevents/README.txt"]
    for new in odd:
        t.write(new, "a,b\n1,2\n")
    return Broken(files_skipped={key: NOT_A_TRIAL_FILE for key in odd})


def missing_start_time_metadata(t: Trial) -> Broken:
    key = t.framework_file(3)
    lost = t.events_of(key)
    lines = t.lines(key)
    assert fmt.ARG_START_TIME in lines[1]
    t.write(key, "\n".join(lines[:1] + lines[2:]))
    return Broken(lost=lost, files_skipped={key: re.escape(fmt.ARG_START_TIME)}, read_delta=-1)


def unpaired_begin_end(t: Trial) -> Broken:
    # A B/E pair becomes one event; a B without its E (writer killed inside the event) and
    # an E without its B are reported.
    key = t.framework_file(-1)
    lines = t.lines(key)
    pid = json.loads(lines[t.getnext_lines(key)[0]].rstrip(","))["pid"]
    base = json.loads(lines[1].rstrip(","))["args"][fmt.ARG_START_TIME]
    node = fmt.FRAMEWORK_FILE_RE.match(posixpath.basename(key)).group("node")
    name = "_MultiProcessingDataLoaderIter::GetNext"
    added = [
        '{"name": "%s", "pid": %d, "ph": "B", "ts": 10, "args": {"pid": 1}},' % (name, pid),
        '{"name": "%s", "pid": %d, "ph": "E", "ts": 25, "args": {"pid": 1}},' % (name, pid),
        '{"name": "%s", "pid": %d, "ph": "E", "ts": 30, "args": {"pid": 1}},' % (name + "x", pid),
        '{"name": "%s", "pid": %d, "ph": "B", "ts": 40, "args": {"pid": 1}},' % (name, pid)]
    end = lines.index("]")
    t.write(key, "\n".join(lines[:end] + added + lines[end:]))
    return Broken(added=[(node, name, base + 10, base + 25)], lines={key: (2, r"B/E")})


def corrupt_gzip(t: Trial) -> Broken:
    key = t.framework_file(2)
    lost = t.events_of(key)
    with open(t.path(key), "rb") as handle:
        data = bytearray(gzip.compress(handle.read()))
    data[len(data) // 2: len(data) // 2 + 40] = b"\x00" * 40
    os.remove(t.path(key))
    t.write(key + ".gz", bytes(data))
    return Broken(lost=lost, files_skipped={key + ".gz": r"^not a valid gzip file"}, read_delta=-1)


def times_out_of_range(t: Trial) -> Broken:
    key = t.framework_file(1)
    first, second = t.getnext_lines(key)[:2]
    lost = [t.replace_line(key, first, re.sub(r'"ts": \d+', '"ts": 1e300', t.lines(key)[first])),
            t.replace_line(key, second, re.sub(r'"dur": \d+', '"dur": 1e19', t.lines(key)[second]))]
    lines = t.lines(t.system_file)
    lines[1] = re.sub(r'"Timestamp": [^}]+', '"Timestamp": -1e300', lines[1])
    t.write(t.system_file, "\n".join(lines))
    return Broken(lost=lost, system_lost=1,
                  lines={key: (2, r"time outside"), t.system_file: (1, r"out-of-range")})


CASES = [truncated_json, writer_killed_mid_line, tmp_file_still_open, corrupt_line_in_the_middle,
         empty_framework_file, empty_system_file, empty_folders, non_utf8_bytes, file_of_only_metadata,
         negative_duration, missing_duration, string_timestamp, nan_infinity_and_strings_as_values,
         five_mb_line_of_a_valid_event, five_mb_line_of_garbage, deeply_nested_args,
         deeply_nested_args_next_to_a_corrupt_line, duplicated_files, names_off_the_convention,
         unknown_suffixes, missing_start_time_metadata, unpaired_begin_end, corrupt_gzip,
         times_out_of_range]


def run_analyze(folder: str):
    return subprocess.run([sys.executable, os.path.join(ROOT, "app.py"), "analyze", folder, "--json"],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_broken_trial_keeps_every_valid_event(tmp_path, case):
    t = Trial(str(tmp_path))
    synthetic = t.synthetic
    intact = sorted((e.node, e.name, e.start_us, e.end_us) for e in synthetic.events)
    broken = case(t)
    assert set(broken.lost) <= set(intact), "the case must name events the generator wrote"
    expected = list(intact)
    for event in broken.lost:
        expected.remove(event)
    expected = sorted(expected + broken.added)

    trial = load_trial(str(tmp_path))
    fw = trial.framework
    got = sorted(zip(fw["process"].astype(str), fw["name"].astype(str), fw["start_us"].tolist(),
                     fw["end_us"].tolist()))
    assert got == expected
    assert len(trial.system) == synthetic.system_samples - broken.system_lost

    report = trial.report
    skipped = {s.path: s.reason for s in report.files_skipped}
    assert set(skipped) == set(broken.files_skipped), skipped
    for key, pattern in broken.files_skipped.items():
        assert re.search(pattern, skipped[key]), (key, skipped[key])
    with_bad_lines = {s.path: s.reason for s in report.files_with_skipped_lines}
    assert set(with_bad_lines) == set(broken.lines), with_bad_lines
    for key, (_, pattern) in broken.lines.items():
        assert re.search(pattern, with_bad_lines[key]), (key, with_bad_lines[key])
    assert report.lines_skipped == sum(count for count, _ in broken.lines.values())
    assert report.files_read == (len(synthetic.framework_files) + len(synthetic.system_files)
                                 + broken.read_delta)

    # The same files parsed in worker processes (a large trial's load from the command line)
    # keep and report exactly the same.
    forked = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "forked_load.py"), str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert forked.returncode == 0, forked.stderr
    forked_kept = json.loads(forked.stdout)
    assert forked_kept.pop("forked") == [2]
    assert forked_kept == json.loads(json.dumps(kept(trial)))

    done = run_analyze(str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    data = json.loads(done.stdout)
    assert data["getnext"]["count"] == sum(name.endswith("::GetNext") for _, name, _, _ in expected)
    assert data["lines_skipped"] == report.lines_skipped
    assert {s["path"]: s["reason"] for s in data["files"]["skipped"]} == skipped


def test_a_trial_whose_files_are_all_empty_reports_each(tmp_path):
    t = Trial(str(tmp_path))
    keys = t.synthetic.framework_files + t.synthetic.system_files
    for key in keys:
        t.write(key, "")
    trial = load_trial(str(tmp_path))
    assert len(trial.framework) == 0 and len(trial.system) == 0
    assert {s.path: s.reason for s in trial.report.files_skipped} == {key: "empty file" for key in keys}
    done = run_analyze(str(tmp_path))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["getnext"]["count"] == 0 and len(data["files"]["skipped"]) == len(keys)


def test_an_empty_trial_folder_is_a_clear_error(tmp_path):
    os.makedirs(tmp_path / "framework" / "pevents")
    os.makedirs(tmp_path / "system" / "incremental")
    with pytest.raises(NotATrialError, match="not a trial"):
        load_trial(str(tmp_path))
    done = run_analyze(str(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "not a trial" in done.stderr and "Traceback" not in done.stderr
