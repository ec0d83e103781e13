"""PyTorch profiler (Kineto) traces -> canonical framework rows.

A `torch.profiler` trace (`*.pt.trace.json`, `.pt.trace.json.gz`; one file per rank and
profiling cycle, as `tensorboard_trace_handler` writes them) is one JSON object whose
`traceEvents` are mostly `cpu_op` / `python_function` events: hundreds of MB that the
DataLoader analysis does not need. So the file is never parsed whole: the bytes are
scanned for the few events that matter and only those event objects are parsed.

Kept events, and what they become (so the existing `classify` and analyses apply):

| Kineto event (`ph` X, CPU side)                     | phase                 | kind    |
|-----------------------------------------------------|-----------------------|---------|
| `enumerate(DataLoader)#<IterClass>.__next__`        | `DataLoaderIter`      | getnext |
| `enumerate(DataPipe)#<Pipe>` (torch < 2.x), outermost only | `DataLoaderIter` | getnext |
| `ProfilerStep#<N>`                                  | `Step:ModeKeys.TRAIN` | step    |
| `aten::random_` just before a run of one loader's `__next__` | `DataLoaderCreated` | created |

- Times: wall clock = `baseTimeNanoseconds` + `ts` (float microseconds); traces without
  `baseTimeNanoseconds` must carry absolute `ts` (older Kineto did). An event outside
  1970..9999, or far from the file's median event time, is skipped and counted (a trace's
  name carries no time of the convention: tensorboard_trace_handler's is the export time, but
  any name is read).
- Identity: the host is the trace's `host_name` (on SageMaker that is `algo-N`, so the
  process joins that host's system metrics), else the host in a `tensorboard_trace_handler`
  file name (`<host>_<pid>.<ms>.pt.trace.json`), else `algo-1`. The rank is
  `distributedInfo.rank`, else the one in a Holistic Trace Analysis file name (`rank-3.json.gz`),
  else unknown (not distributed). The process id is the reference's `<rank>-<host>`, or
  `<pid>-<host>` without a rank.
- `ProfilerStep#N` marks are taken as training steps: `prof.step()` is called from the
  training loop.
- An iterator's creation shows only as its seed draw: `_BaseDataLoaderIter.__init__` runs
  `torch.empty((), dtype=torch.int64).random_(generator).item()` in the thread that then calls
  `__next__` (torch 2.x; a shuffling sampler draws once more as the iterator starts). An
  `aten::random_` in that thread after its previous `__next__` and before one that begins a run
  of an iterator class (the thread's first in the recording, or the first after another
  class's: where the analysis starts an iterator, dataloader.call_segments) becomes a `created`
  event (no duration): the recording saw that iterator's first batch as its first (a recording
  that begins mid-epoch does not), which the worker-count inference needs to place the rounds
  (analysis/diagnosis/rounds.py).
  In a recording that begins mid-epoch, a loop that draws with `random_` or `torch.randint`
  (its `aten::random_` nests in `aten::randint`, which is not kept) just before its first
  recorded `__next__` would pass for one: the rounds are then placed off by the batches the
  recording missed, which changes the worker a finding names, not the count inferred (the
  stalls' period).
- Kineto records no iterator initialization (its moment at most, above), no worker processes
  and no worker ids (`NOT_RECORDED`): worker_id is -1 for `_SingleProcessDataLoaderIter` and
  unknown (null) otherwise; num_workers is 0 for `_SingleProcessDataLoaderIter`, unknown
  otherwise.
- iterator_id numbers the recording window (one file), since Kineto has no iterator
  identity: batches of different profiling cycles are never joined into one batch time.
- DataPipe events nest (every pipe of a chain records its own `__next__`) and run inside
  a single-process DataLoader's `__next__`: only events not nested in another kept
  event of the same thread are kept, so no wait is counted twice. torch 2.x names pipe
  events `<Pipe>(<args>)`, which cannot be told from other annotations; they are not kept.
  A DataLoader `__next__` that spans its loader's next one has a wrong duration: it is skipped
  (and reported), not kept to swallow the calls after it (_outermost).
"""
from __future__ import annotations

from .. import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)

import bisect
import hashlib
import itertools
import math
import re
import zlib
from collections import Counter
from typing import Callable, Iterable, Iterator

import numpy as np
import orjson
import pyarrow as pa

from .. import format as fmt
from .frames import FRAMEWORK_ARROW_SCHEMA
from .smdebug_format import (_MAX_US, _MAX_YEAR, MAX_EVENT_BEFORE_FILE_US, ParsedFile, _as_number, _read_as,
                             gunzip_pieces, noted_ignored, place_in_time, stream_problem, structural_end)

KINETO_FILE_RE = re.compile(r"\.pt\.trace\.json(?:\.gz)?$")
# Any other JSON file may be a trace too (`prof.export_chrome_trace("trace.json")`, HTA's
# `rank-0.json.gz`): its content decides (kineto_markers).
JSON_FILE_RE = re.compile(r"\.json(?:\.gz)?$")
# tensorboard_trace_handler's default worker name is `<host>_<pid>`: `<host>_<pid>.<ms>.pt.trace.json`.
_HANDLER_NAME_RE = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json(?:\.gz)?$")
_RANK_NAME_RE = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(?P<rank>\d+)(?:[^0-9]|$)", re.IGNORECASE)
# Top-level fields only Kineto writes: a JSON file with traceEvents and one of them (or a
# ProfilerStep# event) is a PyTorch profiler trace.
_KINETO_FIELDS_RE = re.compile(rb'"(?:schemaVersion|deviceProperties|distributedInfo|baseTimeNanoseconds)"\s*:')
# What a Kineto trace does not record, by the names the report uses.
NOT_RECORDED = ("initialization", "workers", "worker_id")
DEFAULT_HOST = "algo-1"
NOT_A_TRACE = "not a PyTorch profiler trace"  # how the refusal of a JSON file that is not one begins

LOADER_PREFIX = "enumerate(DataLoader)#"
GETNEXT_PREFIXES = (LOADER_PREFIX, "enumerate(DataPipe)#")
STEP_PREFIX = "ProfilerStep#"
_KEPT_PREFIXES = GETNEXT_PREFIXES + (STEP_PREFIX,)

SEED_DRAW = "aten::random_"  # what an iterator's __init__ records (see the module's docstring)

# `"name": "<prefix>` of a kept event (group 1), or the seed draw's name; JSON allows whitespace
# around the colon.
_CANDIDATE_RE = re.compile(rb'"name"\s*:\s*"(?:(enumerate\(Data(?:Loader|Pipe)\)#|ProfilerStep#)|aten::random_")')
# Its value: a number in any JSON form (json.dumps of a float writes 1.790857026e+18), or text.
_BASE_TIME_RE = re.compile(rb'"baseTimeNanoseconds"\s*:\s*("(?:[^"\\]|\\.)*"|[-+.\deE]+)')
_HOST_RE = re.compile(rb'"host_name"\s*:\s*("(?:[^"\\]|\\.)*")')
_DIST_RE = re.compile(rb'"distributedInfo"\s*:\s*\{')
_TRACE_EVENTS = b'"traceEvents"'
# Decompressed bytes scanned at a time: bounds the memory of a .gz trace.
CHUNK_BYTES = 8 << 20
# Header and trailer (the top-level fields around traceEvents) looked at for metadata.
_EDGE_BYTES = 1 << 20
# An event object larger than this is not one of ours (ours are a few hundred bytes).
_MAX_EVENT_BYTES = 1 << 16
# ts below this (microseconds) is relative to baseTimeNanoseconds (1e14 us is 1973).
_ABSOLUTE_TS_US = 1e14


def is_kineto_key(key: str) -> bool:
    return KINETO_FILE_RE.search(key) is not None


def process_id(number: int, host: str) -> str:
    """`<rank>-<host>` or `<pid>-<host>`: the reference's `<rank>-algo-<N>` on a SageMaker host."""
    return f"{number}-{host}"


def name_identity(key: str) -> tuple[str | None, int | None]:
    """(host, rank) that a trace's file name carries, where it follows a known convention."""
    base = key.rsplit("/", 1)[-1]
    handler = _HANDLER_NAME_RE.match(base)
    ranked = _RANK_NAME_RE.search(base)
    return (handler.group("host") if handler else None), (int(ranked.group("rank")) if ranked else None)


def recording_id(key: str) -> int:
    """A stable id per trace file (one recording window), for the iterator_id column."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=7).digest(), "big")


def _object_at(buf: bytes, start: int, after: int):
    """(object, end) of the JSON object starting at buf[start] ('{').

    Tries each closing brace after `after` until the slice parses: Kineto writes `args`
    last, so the event's own brace is usually the second one. Returns (None, None) when
    the buffer ends first (more bytes are needed, or the file ends in the object) and
    (None, after) when no object that begins at `start` runs past `after` (a bad one, or one
    that closes before it).
    """
    end = after
    for _ in range(_BRACES_TRIED):
        end = buf.find(b"}", end)
        if end < 0:
            return None, None
        if end - start > _MAX_EVENT_BYTES:
            return None, after
        end += 1
        try:
            obj = orjson.loads(buf[start:end])
        except orjson.JSONDecodeError as exc:
            # Cut short by this brace (the end of the slice: an inner object's close, or one in
            # a string), a later one may end it. Broken before the end (`{...}, "name": ...`: an
            # object that closes before the name, or a bad one), no later brace mends it; nor
            # does one mend bytes that are not UTF-8 (orjson then names no text: an empty doc).
            # (pos counts characters of the decoded text, not bytes.)
            if not exc.doc or exc.pos < len(exc.doc):
                return None, after
            continue
        return (obj if isinstance(obj, dict) else None), end
    # Braces in its strings (a path, a repr): the object's own close found by its structure, so
    # no event costs more than a parse or two however many braces its strings hold (one parse
    # per brace made a 1.2 MB trace of 60 KB strings of "}" take half a minute).
    end = structural_end(buf, start, start + _MAX_EVENT_BYTES + 1, _MAX_EVENT_TOKENS)
    if end is None:
        if len(buf) > start + _MAX_EVENT_BYTES:
            return None, after  # larger than any of ours
        # Open at the buffer's end: cut by it (more bytes may end it), or broken before it (a
        # stray quote leaves its braces open to the end; taken for cut, the final chunk's scan
        # stopped there and lost every event after it, unsaid). At most 64 KB parsed to tell.
        try:
            orjson.loads(buf[start:])
        except orjson.JSONDecodeError as exc:
            if exc.doc and exc.pos >= len(exc.doc):
                return None, None
        return None, after
    if end <= after:
        return None, after
    try:
        obj = orjson.loads(buf[start:end])
    except orjson.JSONDecodeError:
        return None, after
    return (obj if isinstance(obj, dict) else None), end


# Braces tried by a parse each before the object's end is found by its structure; the braces and
# strings read so at most (an event of ours has tens).
_BRACES_TRIED = 8
_MAX_EVENT_TOKENS = 4096


def _event_around(buf: bytes, name_at: int, after: int):
    """(object, end) of the innermost JSON object around the name at buf[name_at] that runs
    past `after` (the name's end), as _object_at returns them.

    Kineto writes no object before an event's name, so the nearest "{" before it is the
    event's own. Other writers order the keys otherwise (json.dump's sort_keys puts "args"
    first): then the objects that close before the name (or a "{" in a string) are passed over,
    back to the "{" that begins an object holding the name, _MAX_EVENT_BYTES back at most.
    """
    start, floor = name_at, max(0, name_at - _MAX_EVENT_BYTES)
    for _ in range(_STARTS_TRIED):
        start = buf.rfind(b"{", floor, start)
        if start < 0:
            return None, after
        obj, end = _object_at(buf, start, after)
        if obj is not None or end is None:
            return obj, end
    return None, after  # no event of ours holds that many objects before its name


# Starts ("{") tried back from a name: an event's own is the first (Kineto's key order), or the
# first after the objects its arguments hold (sorted keys). Every "{" of 64 KB tried, each read
# by its braces, made a made-up trace of 100 KB take 30 s.
_STARTS_TRIED = 32


def _as_thread(value):
    return value if isinstance(value, (int, str)) else None


def _as_int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -2**63 <= value < 2**63 else None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


class _Scanner:
    """Scans a trace's bytes (whole, or decompressed chunk by chunk) for kept events."""

    def __init__(self):
        self.events: list[tuple] = []  # (name, pid, tid, ts, dur)
        self.bad = 0  # candidate events that are not valid events
        self.head = b""
        self.tail = b""
        self.stream_error: str | None = None  # the gzip stream broke off: what the file says of it
        # The fields of an event (by its id: the event itself is kept, or not, further on) whose
        # values were ignored: not of their type (_read_as).
        self.ignored_of: dict[int, list[str]] = {}

    def feed(self, buf: bytes, offset: int, resume: int, final: bool) -> tuple[int, int]:
        """Scans buf (the stream's bytes from `offset` on) from stream offset `resume`.

        Returns (keep_from, resume): bytes of buf from keep_from on must be scanned again
        with the next chunk (an event cut by the chunk's end, or room to look back for the
        start of one), and the stream offset from which the next scan looks for names.
        """
        for match in _CANDIDATE_RE.finditer(buf, max(0, resume - offset)):
            if offset + match.start() < resume:
                continue  # inside the event just taken (a "name" key written twice): one event
            obj, end = _event_around(buf, match.start(), match.end())
            if end is None:  # the event continues in the next chunk, or the file ends in it
                if final:
                    break
                # Scanned again from its name, with the bytes its start may lie in (the nearest
                # "{" is not its start where "args" comes first).
                return max(0, match.start() - _MAX_EVENT_BYTES), offset + match.start()
            resume = offset + end
            if obj is None:
                self.bad += match.group(1) is not None  # (a broken op is not one of ours)
                continue
            self._take(obj)
        if final:
            return len(buf), offset + len(buf)
        # A name cut by the chunk's end is found again; its event's start is looked up in
        # the bytes kept before it.
        return max(0, len(buf) - _MAX_EVENT_BYTES), max(resume, offset + len(buf) - 64)

    def _take(self, obj: dict) -> None:
        name, cat, ph = obj.get("name"), obj.get("cat"), obj.get("ph")
        if not isinstance(name, str) or not (name.startswith(_KEPT_PREFIXES) or name == SEED_DRAW):
            return
        if not isinstance(ph, str):  # an event of no phase is no event
            self.bad += name != SEED_DRAW
            return
        if ph != "X":
            return  # flow or instant events carry the name too
        if isinstance(cat, str) and cat.startswith("gpu_"):
            return  # the GPU-side copy of an annotation (gpu_user_annotation)
        ts, dur = _as_number(obj.get("ts")), _as_number(obj.get("dur"))
        if ts is None or dur is None or dur < 0:
            self.bad += name != SEED_DRAW
            return
        ignored: list[str] = []
        event = (name, _read_as(obj.get("pid"), _as_int, "pid", ignored),
                 _read_as(obj.get("tid"), _as_thread, "tid", ignored), ts, dur)
        self.events.append(event)
        if ignored:
            self.ignored_of[id(event)] = ignored


def _decoded(pieces: Iterable[bytes], gz: bool) -> Iterator[bytes]:
    return gunzip_pieces(pieces, CHUNK_BYTES) if gz else iter(pieces)


def _telling(chunks: Iterator[bytes], on_decoded: Callable[[bytes], None]) -> Iterator[bytes]:
    for chunk in chunks:
        on_decoded(chunk)
        yield chunk


def _scan(pieces: Iterable[bytes], gz: bool, on_decoded: Callable[[bytes], None] | None = None) -> _Scanner:
    """Scans the trace; a gzip stream that breaks off mid-way keeps what came before it.
    Errors of reading the pieces (OSError, TrialError) are the caller's."""
    scanner = _Scanner()
    carry, offset, resume = b"", 0, 0
    chunks = _decoded(pieces, gz)
    if on_decoded is not None:
        chunks = _telling(chunks, on_decoded)
    pending = next(chunks, b"")  # a file that is not gzip at all raises here
    while True:
        try:
            following = next(chunks, None)
        except (EOFError, zlib.error) as exc:
            following, scanner.stream_error = None, stream_problem(exc)
        final = following is None
        if len(scanner.head) < _EDGE_BYTES:
            scanner.head += pending[:_EDGE_BYTES - len(scanner.head)]
        scanner.tail = (scanner.tail + pending)[-_EDGE_BYTES:] if len(pending) < _EDGE_BYTES else \
            pending[-_EDGE_BYTES:]
        buf = carry + pending if carry else pending
        keep_from, resume = scanner.feed(buf, offset, resume, final)
        if final:
            return scanner
        carry = buf[keep_from:]
        offset += keep_from
        pending = following


# Where traceEvents may close: "]" after its last event's "}" (or its "[" when empty).
_EVENTS_CLOSE_RE = re.compile(rb"[}\[]\s*\]")
_CLOSES_TRIED = 8


def _ends_whole(tail: bytes) -> bool:
    """Whether the trace's last bytes close traceEvents and the top-level object (Kineto writes
    `}\n  ],"traceName": "..." }`). A trace cut anywhere else is truncated, however it ends: one
    cut just after an event's or its arguments' "}" once passed for whole, 1 cut in 50 or so."""
    closes = [m.end() for m in _EVENTS_CLOSE_RE.finditer(tail)][-_CLOSES_TRIED:]
    for end in reversed(closes):
        try:
            if isinstance(orjson.loads(b'{"traceEvents":[]' + tail[end:]), dict):
                return True
        except orjson.JSONDecodeError:
            continue
    return False


def _metadata(scanner: _Scanner) -> tuple[int | None, int | None, str | None, str | None, bytes | None]:
    """(base_ns, rank, host, error, base_text) from the top-level fields around traceEvents;
    rank None when the trace has no distributedInfo; base_text is baseTimeNanoseconds as
    written (base_ns None when it is no moment)."""
    head, tail = scanner.head, scanner.tail
    cut = head.find(_TRACE_EVENTS)
    if cut < 0:
        return None, None, None, f"{NOT_A_TRACE} (no traceEvents)", None
    edges = (head[:cut], tail)
    if not (any(_KINETO_FIELDS_RE.search(edge) for edge in edges)
            or any(e[0].startswith(STEP_PREFIX) for e in scanner.events)):
        return None, None, None, (f"{NOT_A_TRACE} (traceEvents without Kineto's "
                                  "schemaVersion, deviceProperties, distributedInfo, baseTimeNanoseconds "
                                  "or ProfilerStep# events)"), None
    base_ns = rank = host = base_text = None
    for edge in edges:
        found = _BASE_TIME_RE.search(edge)
        if base_text is None and found:
            base_text = found.group(1)
            base_ns = _base_time_ns(base_text)
        found = _HOST_RE.search(edge)
        if host is None and found:
            try:
                host = orjson.loads(found.group(1))
            except orjson.JSONDecodeError:
                host = None
        found = _DIST_RE.search(edge)
        if rank is None and found:
            info, _ = _object_at(edge, found.end() - 1, found.end())
            rank = _as_int(info.get("rank")) if isinstance(info, dict) else None
    host = host if isinstance(host, str) and host.strip() else None
    return base_ns, rank, host, None, base_text


def _base_time_ns(text: bytes) -> int | None:
    """baseTimeNanoseconds as written (a JSON number, integral or not, or its text), in whole
    nanoseconds; None when it is no moment (negative, not finite, not a number). A float's
    1.790857026e+18 is placed to its precision (256 ns), not read as its leading digit."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            return None
    if isinstance(value, float):
        value = int(value) if math.isfinite(value) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else None


def _outermost(events: list[tuple]) -> tuple[list[tuple], int, list[str]]:
    """The GetNext events not nested in another kept event of their thread (DataPipe chains, a
    pipe in a single-process DataLoader's `__next__`: one wait, counted once), and the steps;
    with the count of DataLoader events dropped, and why (pipes nested in a kept event are
    dropped by design, silently).

    A DataLoader `__next__` cannot hold the next `__next__` of its loader on its thread: the
    loop calls one after the other. One that does has a wrong duration (a wrong end; its start
    still has to lie near the file's median time, see _placed), and kept as the outermost it
    would swallow the calls that followed it, its thread's whole recording at worst. So it is
    the one dropped, and the calls it spans are judged among themselves. Kineto gives no
    iterator identity: a loader's calls are those of its name. (A loader iterated in the dataset
    of a single-process loader of the same class, in its thread, makes the outer calls look so:
    the inner calls are then counted instead, and the outer ones reported.)
    """
    ordered = sorted(events, key=lambda e: (e[3], -e[4]))
    suspect: set[int] = set()
    previous: dict = {}  # (pid, tid, name) -> index in `ordered` of its latest DataLoader call
    for at, (name, pid, tid, ts, _dur) in enumerate(ordered):
        if not name.startswith(LOADER_PREFIX):
            continue
        before = previous.get((pid, tid, name))
        if before is not None and ts < ordered[before][3] + ordered[before][4]:
            suspect.add(before)
        previous[(pid, tid, name)] = at
    kept, nested = [], 0
    open_until: dict = {}
    for at, event in enumerate(ordered):
        name, pid, tid, ts, dur = event
        if name.startswith(STEP_PREFIX):
            kept.append(event)
            continue
        if at in suspect:
            continue
        thread = (pid, tid)
        if ts < open_until.get(thread, -math.inf):
            nested += name.startswith(LOADER_PREFIX)
            continue
        open_until[thread] = ts + dur
        kept.append(event)
    problems = []
    if suspect:
        problems.append(f"{len(suspect)} DataLoader GetNext event(s) that span the next call of their loader in "
                        f"their thread (a wrong duration: one call cannot hold the next), skipped; the calls "
                        f"they span are kept")
    if nested:
        problems.append(f"{nested} DataLoader GetNext event(s) inside another GetNext of their thread (a loader "
                        f"iterated inside another's __next__, or the outer event's duration is wrong), "
                        f"counted once, as the outer one")
    return kept, len(suspect) + nested, problems


def _iterator_creations(events: list[tuple], draws: list[tuple]) -> list[tuple]:
    """A `created` event (name, pid, tid, ts, 0) for each GetNext that begins a thread's run of
    one iterator class and that a seed draw of that thread precedes, after the thread's GetNext
    before it (the latest such draw: a shuffling sampler's comes after __init__'s). `events`:
    the kept events, in time order."""
    if not draws:
        return []
    draws_of: dict = {}
    for _name, pid, tid, ts, dur in draws:
        draws_of.setdefault((pid, tid), []).append((ts, ts + dur))
    created, previous_name, previous_end = [], {}, {}
    for name, pid, tid, ts, dur in events:
        if name.startswith(STEP_PREFIX):
            continue
        thread = (pid, tid)
        if previous_name.get(thread) != name:
            after = previous_end.get(thread, -math.inf)
            inside = [start for start, end in draws_of.get(thread, ()) if start >= after and end <= ts]
            if inside:
                created.append((fmt.created_event_name(name.removesuffix(".__next__")), pid, tid, max(inside), 0.0))
        previous_name[thread], previous_end[thread] = name, ts + dur
    return created


def parse_kineto_file(data: bytes, key: str) -> ParsedFile:
    """Canonical framework rows (FRAMEWORK_ARROW_SCHEMA) of one Kineto trace file.

    `data` is the file as stored (gzip-compressed when `key` ends with .gz).
    """
    return parse_kineto_pieces([data], key)


def parse_kineto_pieces(pieces: Iterable[bytes], key: str,
                        on_decoded: Callable[[bytes], None] | None = None) -> ParsedFile:
    """parse_kineto_file of a file read in pieces (store.iter_chunks): only a few MB of it
    are in memory at a time, however large the trace. Errors of reading the pieces pass, and
    those on_decoded raises (it is given each piece once decompressed, in order: the trace's
    content, whichever way it was stored)."""
    pieces = iter(pieces)
    first = next(pieces, b"")
    gz = key.endswith(".gz") or first[:2] == b"\x1f\x8b"  # (a .gz renamed without its suffix too)
    try:
        scanner = _scan(itertools.chain([first], pieces), gz, on_decoded)
    except (EOFError, zlib.error) as exc:
        return ParsedFile(None, error=f"not a valid gzip file ({exc})")
    if not scanner.head.strip():
        return ParsedFile(None, error="empty file")
    base_ns, rank, host, error, base_text = _metadata(scanner)
    if error:
        return ParsedFile(None, error=error)
    problems: list[str] = []
    skipped = scanner.bad
    if scanner.bad:
        problems.append(f"{scanner.bad} DataLoader/step event(s) are not valid events")
    if scanner.stream_error:
        skipped += 1
        problems.append(scanner.stream_error)
    elif not _ends_whole(scanner.tail):
        skipped += 1
        problems.append("the trace ends early (truncated?): events after the last complete one are lost")
    events = scanner.events
    if not any(e[0] != SEED_DRAW for e in events):
        return ParsedFile(None, skipped, problems)
    if base_ns is None:
        if min(e[3] for e in events) < _ABSOLUTE_TS_US:
            written = "no baseTimeNanoseconds" if base_text is None else \
                f"baseTimeNanoseconds {base_text[:40].decode(errors='replace')} is no time in nanoseconds"
            return ParsedFile(None, skipped, problems, f"{written}: event times cannot be placed")
        base_ns = 0
    # Placed before nesting is looked at: a wrong time (a duration of 1e19) would swallow events.
    events, far = _placed(events, base_ns, problems)
    skipped += far
    draws = [e for e in events if e[0] == SEED_DRAW]
    events, dropped, why = _outermost([e for e in events if e[0] != SEED_DRAW])
    skipped += dropped
    problems += why
    if not events:
        return ParsedFile(None, skipped, problems)
    created = _iterator_creations(events, draws)

    named_host, named_rank = name_identity(key)
    host = host or named_host or DEFAULT_HOST
    rank = rank if rank is not None else named_rank
    pids = [pid for _, pid, _, _, _ in events if isinstance(pid, int) and not isinstance(pid, bool)]
    main_pid = max(set(pids), key=pids.count) if pids else None
    process = process_id(rank if rank is not None else main_pid if main_pid is not None else 0, host)
    recording = recording_id(key)
    steps = sorted((e[3], e[3] + e[4], _as_int(e[0][len(STEP_PREFIX):])) for e in events
                   if e[0].startswith(STEP_PREFIX))
    columns = {f.name: [] for f in FRAMEWORK_ARROW_SCHEMA}
    for at, (name, pid, _tid, ts, dur) in enumerate(events + created):
        start_ns = base_ns + round(ts * 1000)
        start_us = (start_ns + 500) // 1000
        end_us = (start_ns + round(dur * 1000) + 500) // 1000
        is_step = name.startswith(STEP_PREFIX)
        if is_step:
            phase, step = fmt.PHASE_STEP_TRAIN, _as_int(name[len(STEP_PREFIX):])
            worker_id = num_workers = None
        elif at >= len(events):
            phase, step = fmt.PHASE_CREATED, _containing_step(steps, ts)
            worker_id = num_workers = None
        else:
            single = fmt.SINGLE_PROCESS_ITER in name
            phase = fmt.PHASE_ITER
            step = _containing_step(steps, ts)
            worker_id, num_workers = (-1, 0) if single else (None, None)
        columns["process"].append(process)
        columns["rank"].append(rank)
        # A trace records one process: an event whose pid is not a number (ignored, counted) is
        # that process's, not a loader of its own (a second budget, a batch time lost).
        columns["pid"].append(main_pid if pid is None else pid)
        columns["phase"].append(phase)
        columns["name"].append(name)
        columns["start_us"].append(start_us)
        columns["end_us"].append(end_us)
        columns["worker_id"].append(worker_id)
        columns["num_workers"].append(num_workers)
        columns["pin_memory"].append(None)
        columns["step"].append(step)
        columns["iterator_id"].append(recording)
    for unrecorded in ("persistent_workers", "prefetch_factor", "in_order", "cpu_us", "runq_us", "local_rank"):
        columns[unrecorded] = [None] * len(columns["process"])
    ignored = Counter(field for event in events for field in scanner.ignored_of.get(id(event), ()))
    return ParsedFile(pa.Table.from_pydict(columns, schema=FRAMEWORK_ARROW_SCHEMA), skipped, problems,
                      values_ignored=noted_ignored(problems, ignored))


def _placed(events: list[tuple], base_ns: int, problems: list[str]) -> tuple[list[tuple], int]:
    """The events whose wall-clock times lie inside 1970..9999 and near the file's median event
    time (place_in_time; a trace's name carries no time), and the count of the others."""
    ts = np.array([e[3] for e in events], dtype=np.float64)
    start = ts + base_ns / 1000
    end = start + np.array([e[4] for e in events], dtype=np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf
        sane = np.isfinite(start) & np.isfinite(end) & (start >= 0) & (end < _MAX_US)
    outside = len(events) - int(np.count_nonzero(sane))
    if outside:
        problems.append(f"{outside} DataLoader/step event(s) with a time outside 1970..{_MAX_YEAR}")
    placed, far, problem = place_in_time(start, end, sane, None, MAX_EVENT_BEFORE_FILE_US,
                                         MAX_EVENT_BEFORE_FILE_US, what="DataLoader/step event(s)")
    if problem:
        problems.append(problem)
    if not outside and not far:
        return events, 0
    return [e for e, keep in zip(events, placed.tolist()) if keep], outside + far


def _containing_step(steps: list[tuple], ts: float) -> int | None:
    """N of the ProfilerStep#N that contains time ts (steps sorted by start), else None."""
    at = bisect.bisect_right(steps, (ts, math.inf, math.inf)) - 1
    if at >= 0 and steps[at][0] <= ts < steps[at][1]:
        return steps[at][2]
    return None
