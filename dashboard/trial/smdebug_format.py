"""Reference-format (SageMaker Debugger) files -> Arrow tables of canonical rows.

Framework files are Chrome-trace JSON arrays written one event per line; system files are
JSON lines. The fast path decodes a whole file with msgspec into typed structs (the fields the
reader uses, nothing else: unknown fields are skipped, not built) and turns them into columns;
it is about 1.4x cheaper in CPU than Arrow's JSON reader was on these files (bench/parse_speed.py).
Anything it refuses (a corrupt or truncated line, a value of an unexpected type) goes through a
line-by-line path that keeps every valid event and counts what it drops. Both paths end in the
same raw table and the same conversion, so they cannot disagree.
"""
from __future__ import annotations

from .. import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)

import dataclasses
import gzip
from collections import Counter
import io
import keyword
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from .. import format as fmt
from ..display import iso_utc
from .errors import TrialTooLargeError, size_text
from .frames import FRAMEWORK_ARROW_SCHEMA, SYSTEM_ARROW_SCHEMA

_ARG_FIELDS = [
    pa.field(fmt.ARG_PID, pa.int64()),
    pa.field(fmt.ARG_WORKER_ID, pa.int64()),
    pa.field(fmt.ARG_NUM_WORKERS, pa.int64()),
    pa.field(fmt.ARG_PIN_MEMORY, pa.bool_()),
    pa.field(fmt.ARG_STEP, pa.string()),
    pa.field("name", pa.string()),
    pa.field(fmt.ARG_START_TIME, pa.int64()),
    pa.field(fmt.ARG_ITERATOR_ID, pa.int64()),
    pa.field(fmt.ARG_PERSISTENT, pa.bool_()),
    pa.field(fmt.ARG_PREFETCH, pa.int64()),
    pa.field(fmt.ARG_IN_ORDER, pa.bool_()),
    pa.field(fmt.ARG_CPU_US, pa.int64()),
    pa.field(fmt.ARG_RUNQ_US, pa.int64()),
    pa.field(fmt.ARG_RANK, pa.int64()),
    pa.field(fmt.ARG_LOCAL_RANK, pa.int64()),
]
RAW_TRACE_SCHEMA = pa.schema([
    pa.field("name", pa.string()),
    pa.field("ph", pa.string()),
    pa.field("pid", pa.int64()),
    pa.field("ts", pa.float64()),
    pa.field("dur", pa.float64()),
    pa.field("args", pa.struct(_ARG_FIELDS)),
])
_TRACE_PARSE = pj.ParseOptions(explicit_schema=RAW_TRACE_SCHEMA, unexpected_field_behavior="ignore")
_SYSTEM_PARSE = pj.ParseOptions(explicit_schema=pa.schema([
    pa.field("Type", pa.string()), pa.field("Name", pa.string()), pa.field("Dimension", pa.string()),
    pa.field("Value", pa.float64()), pa.field("NodeId", pa.string()), pa.field("Timestamp", pa.float64()),
]), unexpected_field_behavior="ignore")
# A column of the raw rows read line by line: the fields of each whose values were ignored
# (_read_as), comma-separated; counted for the rows kept (kept_ignored).
IGNORED = "ignored"
_RAW_TRACE_READ = RAW_TRACE_SCHEMA.append(pa.field(IGNORED, pa.string()))
_SYSTEM_READ = _SYSTEM_PARSE.explicit_schema.append(pa.field(IGNORED, pa.string()))
# Lines nested deeper than orjson's and msgspec's limits go to Arrow's JSON reader, which
# skips fields outside its schema however deep they nest (see _rescue_with).
_READ = pj.ReadOptions(use_threads=False, block_size=16 << 20)


# --- fast path: typed structs, decoded in one go --------------------------------------

_PYTHON_TYPES = {pa.int64(): int, pa.bool_(): bool, pa.string(): str, pa.float64(): float}


def _struct_of(name: str, schema_fields, overrides: dict, forbid_unknown_fields: bool = False):
    """A msgspec struct of the raw table's fields, each optional (None when absent).

    msgspec checks every value against its field's type as it decodes, strictly: a string
    where a number should be is refused, never converted, so the fast path keeps exactly what
    the line-by-line path keeps unchanged, and leaves everything else to it. gc=False: the
    structs hold no cycles, and hundreds of thousands of tracked objects would wake Python's
    cycle collector over and over during a decode."""
    return msgspec.defstruct(name, [(f.name, overrides.get(f.name) or (_PYTHON_TYPES[f.type] | None), None)
                                    for f in schema_fields], gc=False, forbid_unknown_fields=forbid_unknown_fields)


@dataclass(frozen=True)
class _TraceDecoding:
    """A decoder of trace files whose events' arguments are among `arg_fields` (the other
    argument columns are null), and the arguments of an event without any."""
    decoder: msgspec.json.Decoder
    arg_fields: frozenset[str]
    no_args: msgspec.Struct


def _trace_decoding(arg_fields: list[pa.Field], forbid_unknown_fields: bool) -> _TraceDecoding:
    # step_num is a string in the reference's files, a number in some others: both kept (as text).
    args = _struct_of("_TraceArgs", arg_fields, {fmt.ARG_STEP: str | int | None}, forbid_unknown_fields)
    event = _struct_of("_TraceEvent", RAW_TRACE_SCHEMA, {"args": args | None})
    return _TraceDecoding(msgspec.json.Decoder(list[event]), frozenset(f.name for f in arg_fields), args())


# The arguments the reference's writer gives its events. A file of these alone (every file of a
# reference trial) is decoded first into structs of these fields: an event then costs less to
# decode, and the other argument columns are nulls, not values read from every struct (300k
# GetNexts' files: 0.45 s instead of 0.55 s of CPU). A file with any other argument (this
# project's collector writes the iterator's settings and the fetches' measures) is refused
# at its first such event, and decoded with them all.
_REFERENCE_ARGS = (fmt.ARG_PID, fmt.ARG_WORKER_ID, fmt.ARG_NUM_WORKERS, fmt.ARG_PIN_MEMORY, fmt.ARG_STEP, "name",
                   fmt.ARG_START_TIME)
_TRACE_DECODINGS = (_trace_decoding([f for f in _ARG_FIELDS if f.name in _REFERENCE_ARGS], True),
                    _trace_decoding(_ARG_FIELDS, False))
_SystemRecord = _struct_of("_SystemRecord", _SYSTEM_PARSE.explicit_schema, {})
_SYSTEM_DECODER = msgspec.json.Decoder(list[_SystemRecord])
# What a refused decode raises: a value of another type, bad JSON or UTF-8, nesting too deep.
_REFUSED = (msgspec.DecodeError, RecursionError)
# What a column of decoded values may raise: an integer beyond int64.
_NOT_A_COLUMN = (OverflowError, pa.ArrowInvalid, pa.ArrowTypeError)


def _values_reader(name: str):
    """A function from decoded structs to a list of their `name` values: a list comprehension
    compiled for the field, whose attribute read the interpreter specialises for a struct's
    slot. Reading the values is most of turning structs into columns, and this reads them 1.4-1.7x
    faster than map(attrgetter(name)) (20 columns of the 300k trial's files, one run)."""
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"not a field name to read this way: {name!r}")
    return eval(f"lambda objects: [o.{name} for o in objects]", {})  # noqa: S307 (a field's name alone)


_VALUES_OF = {f.name: _values_reader(f.name)
              for f in (*RAW_TRACE_SCHEMA, *_ARG_FIELDS, *_SYSTEM_PARSE.explicit_schema)}


def _column(objects: list, field: pa.Field) -> pa.Array:
    """The field's values, of decoded structs, as an Arrow array."""
    values = _VALUES_OF[field.name](objects)
    if field.name == fmt.ARG_STEP:
        try:
            return pa.array(values, pa.string())
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # numbers among them: as the line path writes them
            values = [v if v is None or isinstance(v, str) else str(v) for v in values]
    return pa.array(values, field.type)


def _typed_trace_table(array: bytes) -> pa.Table | None:
    """The raw table of a trace file's events (a JSON array), or None when msgspec refuses it."""
    for decoding in _TRACE_DECODINGS:
        try:
            events = decoding.decoder.decode(array)
            break
        except _REFUSED:
            continue
    else:
        return None
    try:
        args = [decoding.no_args if event.args is None else event.args for event in events]
        columns = [_column(events, f) for f in RAW_TRACE_SCHEMA if f.name != "args"]
        columns.append(pa.StructArray.from_arrays(
            [_column(args, f) if f.name in decoding.arg_fields else pa.nulls(len(args), f.type) for f in _ARG_FIELDS],
            fields=_ARG_FIELDS))
    except _NOT_A_COLUMN:
        return None
    return pa.Table.from_arrays(columns, schema=RAW_TRACE_SCHEMA)


def _typed_system_table(body: bytes) -> pa.Table | None:
    """The raw table of a JSON-lines system file, or None when msgspec refuses it."""
    try:
        # One array of all lines, each newline a comma: a raw newline is never inside a JSON string.
        records = _SYSTEM_DECODER.decode(b"[" + body.replace(b"\n", b",") + b"]")
    except _REFUSED:
        return None
    if len(records) != body.count(b"\n") + 1:  # a record over lines that the commas made valid JSON of
        return None
    schema = _SYSTEM_PARSE.explicit_schema
    try:
        return pa.Table.from_arrays([_column(records, f) for f in schema], schema=schema)
    except _NOT_A_COLUMN:
        return None


@dataclass
class ParsedFile:
    table: pa.Table | None  # canonical rows (FRAMEWORK_ARROW_SCHEMA or SYSTEM_ARROW_SCHEMA)
    lines_skipped: int = 0
    problems: list[str] = field(default_factory=list)  # why lines were skipped, or values ignored
    error: str | None = None  # why the whole file was skipped
    # The error may pass (the file was removed or rewritten since the listing, or could not be
    # read): a load that skipped it is not the whole trial the listing names.
    transient: bool = False
    # Values of kept events (or samples) read as missing: not of their field's type (a worker
    # id that is text, a number beyond int64). Said in problems, as skipped lines are.
    values_ignored: int = 0

    @property
    def rows(self) -> int:
        return self.table.num_rows if self.table is not None else 0


def gunzip_pieces(pieces: Iterable[bytes], chunk_bytes: int) -> Iterator[bytes]:
    """The decompressed bytes of gzip data read in pieces (members concatenated), chunk_bytes
    at most at a time. A stream that breaks off raises EOFError after yielding all it had;
    data that is not gzip raises zlib.error before yielding anything (corrupt data, on the
    piece where the corruption shows)."""
    step = max(1, chunk_bytes // 8)
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    # Members ended (each checked against its CRC), the first two bytes after the last (a
    # member's magic, or bytes after the stream that begin none: BytesAfterTheStream), and
    # whether the member after them gave anything yet (then unchecked: its error is corruption).
    members, after, gave = 0, b"", False
    for piece in pieces:
        view = memoryview(piece)
        for pos in range(0, len(view), step):
            pending = view[pos:pos + step]
            while pending:
                if members and len(after) < 2:
                    after += bytes(pending[:2 - len(after)])
                try:
                    out = inflater.decompress(pending, chunk_bytes)
                except zlib.error as exc:
                    if members and not gave:  # what the members before gave is whole, and checked
                        raise BytesAfterTheStream(str(exc)) from None
                    raise
                if out:
                    gave = True
                    yield out
                if inflater.eof:  # a member ends; another may follow
                    members, after, gave = members + 1, b"", False
                    pending = inflater.unused_data
                    if pending:
                        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
                else:
                    pending = inflater.unconsumed_tail
    if not inflater.eof:
        if members and not _GZIP_MAGIC.startswith(after):  # (a lone newline after the stream too)
            raise BytesAfterTheStream(f"{len(after)}+ byte(s) that begin no gzip member")
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")


_GZIP_MAGIC = b"\x1f\x8b"


class BytesAfterTheStream(zlib.error):
    """Bytes after a gzip stream's complete members that begin no member (a copy with trailing
    garbage): what the members gave is whole and checked, as a stream cut short's is."""


def stream_problem(exc: Exception) -> str:
    """What a file says of its gzip stream's early end (gunzip_pieces' EOFError or zlib.error)."""
    if isinstance(exc, BytesAfterTheStream):
        return f"bytes after the gzip stream are not gzip ({exc}): skipped"
    return f"the gzip stream breaks off ({exc}): events after it are lost"


def decompress(key: str, data: bytes, max_size: int | None = None) -> tuple[bytes, str | None]:
    """The file's bytes, gunzipped when the key ends with .gz, and what ends them early
    (stream_problem; None: they are whole).

    A gzip file cut short (a copy or an upload broken off, a full disk) gives the bytes before
    the cut, as a Kineto trace's does: they are valid, and the parse counts the line the cut
    broke (broken_off). Corrupt data is not cut short: what inflates before the error shows
    may be wrong already, so it raises. Raises OSError, EOFError or zlib.error for a file that
    is not gzip, is corrupt, or gives nothing (cut inside its header), and TrialTooLargeError
    when it inflates to more than `max_size` bytes (a few MB can inflate to many GB).
    """
    # Gzip by its name, or by its magic bytes (a .json written gzipped): no JSON text begins
    # with byte 0x1f, a control character.
    if not key.endswith(".gz") and not data.startswith(b"\x1f\x8b"):
        return data, None
    try:
        if max_size is None:
            return gzip.decompress(data), None
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            out = stream.read(max_size + 1)
    except (EOFError, gzip.BadGzipFile) as exc:
        # Decompressed again, streaming, to keep what came before the cut, or before bytes that
        # follow the stream and are not gzip: only such a file pays for that. Anything else
        # gzip refused (not gzip at all, a CRC that fails) is refused as it said.
        try:
            out, ended = _before_the_break(key, data, max_size)
        except zlib.error:
            raise exc from None
        if not out or ended is None:
            raise
        return out, stream_problem(ended)
    if len(out) > max_size:
        raise _too_large(key, max_size)
    return out, None


_GUNZIP_CHUNK_BYTES = 8 << 20


def _before_the_break(key: str, data: bytes, max_size: int | None) -> tuple[bytes, Exception | None]:
    """The bytes that gzip data cut short, or followed by bytes that are not gzip, decompresses
    to; and what ended them (gunzip_pieces' EOFError or BytesAfterTheStream; None: the stream
    ends whole)."""
    chunks, size, ended = [], 0, None
    try:
        for chunk in gunzip_pieces([data], _GUNZIP_CHUNK_BYTES):
            size += len(chunk)
            if max_size is not None and size > max_size:
                raise _too_large(key, max_size)
            chunks.append(chunk)
    except (EOFError, BytesAfterTheStream) as exc:
        ended = exc
    return b"".join(chunks), ended


def _too_large(key: str, max_size: int) -> TrialTooLargeError:
    return TrialTooLargeError(f"{key}: decompresses to more than the limit of {size_text(max_size)}")


def broken_off(parsed: ParsedFile, data: bytes, problem: str) -> ParsedFile:
    """The parse of a file whose gzip stream broke off, or is followed by bytes that are not gzip
    (decompress's problem), the break counted as one skipped line and said. That line is the one the break cut, which the parse counted
    already where it is left broken; a break between lines, or just after an event (which the
    parse kept), is counted here."""
    last = data[data.rfind(b"\n") + 1:].strip().strip(b"[],").strip()
    try:  # the line the break cut, unless it fell between lines or just after an event
        counted = bool(last) and not isinstance(orjson.loads(last), dict)
    except orjson.JSONDecodeError:
        counted = True
    return dataclasses.replace(parsed, lines_skipped=parsed.lines_skipped + (not counted),
                               problems=[*parsed.problems, problem])


# Latest event end accepted, in epoch microseconds: far beyond any real trace, far inside int64.
_MAX_YEAR = 9999
_MAX_US = 253_402_300_800_000_000.0  # 10000-01-01T00:00:00Z


# --- placing events in time ---------------------------------------------------------
# A time inside 1970..9999 can still be far from the trial's (a clock jump, a corrupt value):
# one such event made a trial billions of seconds long. So an event must also lie near its
# file's own time: the time in the file's name, else the median of its events.

_HOUR_US = 3_600_000_000
_DAY_US = 24 * _HOUR_US
# How long before its file's time an event may start. Both writers (the reference's, and
# collector/writer.py) name a framework file after the end of one of its events and close it
# when the UTC hour changes at the latest (else every 60 s or 10 MB), so a file's events *end*
# within about an hour of its time; but an event is written when it ends, so it *starts* as long
# before as it lasted, and the longest last a whole job: a persistent worker's lifetime (the
# collector's and the reference's DataLoaderWorker event, written when the worker exits).
# SageMaker stops a training job after 28 days at most (MaxRuntimeInSeconds): a month loses
# no event of a real job and still keeps a wrong clock from stretching a trial by years.
MAX_EVENT_BEFORE_FILE_US = 31 * _DAY_US
# How long after its file's time an event may end. The collector names a file after its latest
# event end (0 would do); the reference after the end of its last *written* event, which one
# written before it may outlast (a duration computed by the caller); its hour rotation bounds that.
MAX_EVENT_AFTER_FILE_US = _HOUR_US
# How far from its file's time a system sample may lie: a system file holds one minute of
# samples and is named after that minute (the reference writes one file per minute; the
# collector's SystemMetricsWriter puts each sample in the file of its 60 s bucket; the slowest
# sampling is every 60 s), so an hour either side is ample, and bounds what a wrong clock stretches.
MAX_SAMPLE_FROM_FILE_US = _HOUR_US


def duration_text(us: int) -> str:
    days, hours = us // _DAY_US, us // _HOUR_US
    return f"{days} days" if days > 1 else f"{hours} hour{'s' if hours != 1 else ''}"


def sane_name_time(us: int | None) -> int | None:
    """A file name's time, or None when it cannot be an event time (before 1970, after 9999)."""
    return us if us is not None and 0 <= us < _MAX_US else None


def place_in_time(start_us: np.ndarray, end_us: np.ndarray, sane: np.ndarray, name_time_us: int | None,
                  before_us: int, after_us: int, named_after_an_end: bool = False,
                  what: str = "event(s)") -> tuple[np.ndarray, int, str | None]:
    """(placed, far, problem): which rows lie near their file's time, how many sane rows do not,
    and why (None when none).

    start_us, end_us: float64 epoch microseconds; sane: rows to place (valid, inside 1970..9999).
    With name_time_us (the time in the file's name), a row must start at most before_us before it
    and end at most after_us after it. Without one, the file's time is the median end of its rows,
    which a few wrong times cannot move, and rows may lie before_us to either side (the median may
    be anywhere in the span a file covers). named_after_an_end: the writer names the file after
    the end of one of its events; if that event is far from the rest of the file (their median
    is outside the name's window), the name carries that event's wrong time: the median places it.
    """
    rows = int(np.count_nonzero(sane))
    if not rows:
        return sane, 0, None
    name_note = ""
    with np.errstate(invalid="ignore"):  # NaN times are never sane: those rows stay False
        if name_time_us is not None:
            low, high = name_time_us - before_us, name_time_us + after_us
            placed = sane & (start_us >= low) & (end_us <= high)
            far = rows - int(np.count_nonzero(placed))
            if not far:  # the usual case: no median needed
                return placed, 0, None
            median = float(np.median(end_us[sane]))
            if not (named_after_an_end and not low <= median <= high
                    and bool(np.any(end_us[sane] == name_time_us))):
                return placed, far, (f"{far} {what} more than {duration_text(before_us)} before or "
                                     f"{duration_text(after_us)} after the file's time "
                                     f"({iso_utc(name_time_us)}, from its name)")
            name_note = (f"; its name's time, {iso_utc(name_time_us)}, is the end of one of the "
                         f"events far from it")
        else:
            median = float(np.median(end_us[sane]))
        placed = sane & (start_us >= median - before_us) & (end_us <= median + before_us)
    far = rows - int(np.count_nonzero(placed))
    return placed, far, (f"{far} {what} more than {duration_text(before_us)} from the file's median "
                         f"event time ({iso_utc(median)}{name_note})" if far else None)


# --- line-by-line path --------------------------------------------------------------

_OUTSIDE_STRINGS = re.compile(rb'[{}"]')
_INSIDE_STRING = re.compile(rb'["\\]')


def structural_end(buf: bytes, start: int, limit: int, max_tokens: int | None = None) -> int | None:
    """The end (after its "}") of the JSON object that begins at buf[start], found by its
    braces outside strings; None when buf[:limit] ends first, or when it takes more than
    max_tokens braces and strings. Whether it is valid JSON is the parse's to say."""
    depth, at, tokens = 0, start, 0
    while True:
        token = _OUTSIDE_STRINGS.search(buf, at, limit)
        tokens += 1
        if token is None or (max_tokens is not None and tokens > max_tokens):
            return None
        at = token.end()
        if token.group() == b'"':
            while True:  # to the string's closing quote, over its escapes
                inside = _INSIDE_STRING.search(buf, at, limit)
                if inside is None:
                    return None
                at = inside.end()
                if inside.group() == b'"':
                    break
                at += 1  # the escaped character
        elif token.group() == b"{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return at


def _json_objects(data: bytes, rescue=None) -> tuple[list[dict], int, str | None]:
    """Every JSON object of a trace array or JSON-lines file, the count of bad lines and
    why they are bad (the first few, by line number).

    rescue(line) -> dict | None: a second reader for lines orjson refuses: nested deeper than
    its limit, or with NaN or Infinity for a number (read as such, then reported as a
    non-finite value, not as a broken line).
    """
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get(TRACE_EVENTS), list):  # Chrome's object form
        doc = doc[TRACE_EVENTS]
    if isinstance(doc, list):
        return _array_objects(doc)
    if isinstance(doc, dict):
        return [doc], 0, None
    good, bad, examples = [], 0, []
    # Consecutive lines that are no object (number, line as written, why), read again by their
    # objects' braces where that finds any: a file written otherwise than one object per line
    # (json.dump on one line, or indented) lost every object to one bad one, or to a cut, and
    # objects written one after another on a line were one bad line. Runs alone: a line cut
    # short holds its braces open, and read with the good lines after it would swallow them.
    run: list[tuple[int, bytes, str]] = []
    # Bytes a file may have read by their braces: Python steps brace by brace, and a file of
    # nothing but "{" would take seconds a MB.
    by_structure = _MAX_STRUCTURE_BYTES

    def end_run() -> None:
        nonlocal bad, by_structure
        text = b"\n".join(line for _, line, _ in run)
        if (len(run) > 1 or text.count(b"{") > 1) and len(text) <= by_structure:
            by_structure -= len(text)
            found, broken = _objects_by_structure(text, rescue)
            if found:
                good.extend(found)
                bad += broken
                if broken and len(examples) < 3:
                    where = f"line {run[0][0]}" if len(run) == 1 else f"lines {run[0][0]}-{run[-1][0]}"
                    examples.append(f"{where}: {broken} object(s) that are not valid JSON "
                                    f"(read by their braces: not one object per line)")
                run.clear()
                return
        for number, _, why in run:
            bad += 1
            if len(examples) < 3:
                examples.append(f"line {number}: {why}")
        run.clear()

    for number, written in enumerate(data.split(b"\n"), 1):
        line = written.strip().rstrip(b",").strip()
        if line in (b"", b"[", b"]"):
            continue
        if line.startswith(b"["):
            line = line[1:]
        if line.endswith(b"]"):
            line = line[:-1].rstrip(b",")
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            obj = rescue(line) if rescue is not None else None
            why = f"not JSON ({exc.msg})"
        else:
            why = "not a JSON object"
        if isinstance(obj, dict):
            if run:
                end_run()
            good.append(obj)
        else:
            run.append((number, written, why))
    if run:
        end_run()
    if not bad:
        return good, 0, None
    more = ", ..." if bad > len(examples) else ""
    return good, bad, f"{bad} line(s) are not JSON objects ({'; '.join(examples)}{more})"


# Files written otherwise than one object per line are rare (hand-made, or another writer's);
# beyond this, such a file keeps what its lines give. (About 2 s of a file of "{" alone.)
_MAX_STRUCTURE_BYTES = 4 << 20


def _objects_by_structure(data: bytes, rescue=None) -> tuple[list[dict], int]:
    """The JSON objects of data found by their braces (structural_end), each parsed alone, and
    the count of those that are not valid: one cut short by the file's end included."""
    good, bad, at = [], 0, 0
    while (start := data.find(b"{", at)) >= 0:
        end = structural_end(data, start, len(data))
        if end is None:
            return good, bad + 1
        text = data[start:end]
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError:
            obj = rescue(text) if rescue is not None else None
        if isinstance(obj, dict):
            good.append(obj)
        else:
            bad += 1
        at = end
    return good, bad


TRACE_EVENTS = "traceEvents"
_UTF8_BOM = b"\xef\xbb\xbf"


def _array_objects(doc: list) -> tuple[list[dict], int, str | None]:
    """A JSON array's objects, the count of its other elements, and why they are skipped."""
    good = [e for e in doc if isinstance(e, dict)]
    bad = len(doc) - len(good)
    return good, bad, f"{bad} array element(s) are not JSON objects" if bad else None


def _object_form_events(data: bytes) -> list | None:
    """The traceEvents of a file in Chrome's object form, else None."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    events = doc.get(TRACE_EVENTS) if isinstance(doc, dict) else None
    return events if isinstance(events, list) else None


def _rescue_with(parse_options):
    def rescue(line: bytes) -> dict | None:
        # Arrow ignores fields outside the schema however deep they nest. It does not check
        # UTF-8 (a line orjson refused for it is refused here too).
        if not line.isascii():
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return None
        try:
            rows = pj.read_json(io.BytesIO(line + b"\n"), read_options=_READ,
                                parse_options=parse_options).to_pylist()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
            return None
        return rows[0] if len(rows) == 1 else None
    return rescue


def _as_int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        value = int(value) if math.isfinite(value) and value.is_integer() else None
    elif isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return None
    if isinstance(value, int) and -2**63 <= value < 2**63:
        return value
    return None


def _as_number(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = float(value)
        return value if math.isfinite(value) else None
    return None


def _as_bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def _as_text(value):
    return value if isinstance(value, str) else None


def _as_step_text(value):
    return None if isinstance(value, (dict, list)) else str(value)


def _read_as(value, kind, field: str, ignored: list[str]):
    """kind(value), or None; a value there that is not of the field's type adds the field to
    `ignored`, the event's (counted once the event is kept, and reported: noted_ignored),
    not dropped unsaid."""
    if value is None:
        return None
    read = kind(value)
    if read is None:
        ignored.append(field)
    return read


def kept_ignored(fields_of_rows: pa.Array, ignored: Counter) -> None:
    """Counts, by field, the ignored values of the rows kept (IGNORED's values of those rows)."""
    for fields in fields_of_rows.drop_null().to_pylist():
        ignored.update(fields.split(","))


# The arguments of an event by how each is read (_raw_trace_row): the columns of the raw table.
_ARG_READERS = ((fmt.ARG_PID, _as_int), (fmt.ARG_WORKER_ID, _as_int), (fmt.ARG_NUM_WORKERS, _as_int),
                (fmt.ARG_PIN_MEMORY, _as_bool), (fmt.ARG_STEP, _as_step_text), ("name", _as_text),
                (fmt.ARG_START_TIME, _as_int), (fmt.ARG_ITERATOR_ID, _as_int), (fmt.ARG_PERSISTENT, _as_bool),
                (fmt.ARG_PREFETCH, _as_int), (fmt.ARG_IN_ORDER, _as_bool), (fmt.ARG_CPU_US, _as_int),
                (fmt.ARG_RUNQ_US, _as_int), (fmt.ARG_RANK, _as_int), (fmt.ARG_LOCAL_RANK, _as_int))


def _raw_trace_row(event: dict) -> dict:
    """The event's raw row. Its name, phase and times, read as missing where not of their type,
    make it a bad event (trace_rows skips and counts it); its other values are named in its
    IGNORED where they are not of their field's type."""
    ignored: list[str] = []
    args = event.get("args")
    if not isinstance(args, dict):
        if args is not None:
            ignored.append("args")
        args = {}
    return {
        "name": _as_text(event.get("name")),
        "ph": _as_text(event.get("ph")),
        "pid": _read_as(event.get("pid"), _as_int, "pid", ignored),
        "ts": _as_number(event.get("ts")),
        "dur": _as_number(event.get("dur")),
        "args": {name: _read_as(args.get(name), kind, f"args.{name}", ignored) for name, kind in _ARG_READERS},
        IGNORED: ",".join(ignored) or None,
    }


def noted_ignored(problems: list[str], ignored: Counter) -> int:
    """A file's values_ignored: the count of `ignored` (by field), said in its problems (how
    many of which field) where there are any."""
    total = sum(ignored.values())
    if total:
        fields = ", ".join(f"{name} {count}" for name, count in sorted(ignored.items(), key=lambda item: -item[1]))
        problems.append(f"{total} value(s) not of their field's type, read as missing ({fields})")
    return total


def _raw_trace_table(data: bytes) -> tuple[pa.Table, int, str | None]:
    """The raw table of a trace file: fast path first, line by line when it refuses (its rows
    then with their IGNORED column, _raw_trace_row). Also the lines skipped, and why."""
    # A closed file is one JSON array as it lies, decoded without a copy: stripping and
    # bracketing it copied each file four times, 12 % of the 300k trial's parse. One that ends
    # in anything but its bracket (a file still being written, which a followed job's every
    # refresh reads again) is not: no decoding would take it as it lies, after reading it all.
    if data.startswith(_UTF8_BOM):  # (Windows editors write one; a copy, for such a file only)
        data = data[len(_UTF8_BOM):]
    tail = data[-64:].rstrip()
    if not tail or tail.endswith(b"]"):
        table = _typed_trace_table(data)
        if table is not None:
            return table, 0, None
    elif data[:64].lstrip().startswith(b"{") and (events := _object_form_events(data)) is not None:
        # Chrome's other form, {"traceEvents": [...], ...}: the fast path would take the whole
        # object for one event, of no name or phase. (Cut short, it is read line by line.)
        objects, bad, problem = _array_objects(events)
        return pa.Table.from_pylist([_raw_trace_row(e) for e in objects], schema=_RAW_TRACE_READ), bad, problem
    # A file still being written (.tmp) has no closing bracket and ends in a comma.
    body = data.strip()
    opened, closed = body.startswith(b"["), body.endswith(b"]")
    inner = body[1 if opened else 0:len(body) - 1 if closed else len(body)].strip()
    events = inner.rstrip(b",")
    if not events:
        return RAW_TRACE_SCHEMA.empty_table(), 0, None
    # Bracketed anew only where that changes the array: a closed file the fast path refused
    # has a bad line, and a second full decode of the same array would refuse it again.
    if not (opened and closed) or len(events) != len(inner):
        table = _typed_trace_table(b"[" + events + b"]")
        if table is not None:
            return table, 0, None
    objects, bad, problem = _json_objects(data, _rescue_with(_TRACE_PARSE))
    return pa.Table.from_pylist([_raw_trace_row(e) for e in objects], schema=_RAW_TRACE_READ), bad, problem


# --- raw table -> canonical rows ------------------------------------------------------

def _pair_begin_end(raw: pa.Table) -> tuple[pa.Table, int]:
    """Turns B/E pairs into X rows (matched per trace pid and name, innermost first).

    Returns the table and the count of B and E events left without their other half
    (a writer killed inside an event, a pair split over two files).
    """
    rows = raw.to_pylist()
    open_by_key: dict = {}
    out = []
    unpaired = 0
    for row in rows:
        ph = row["ph"]
        if ph == "B":
            open_by_key.setdefault((row["pid"], row["name"]), []).append(row)
        elif ph == "E":
            stack = open_by_key.get((row["pid"], row["name"]))
            if stack and row["ts"] is not None and stack[-1]["ts"] is not None:
                begin = stack.pop()
                begin = dict(begin, ph="X", dur=row["ts"] - begin["ts"])
                out.append(begin)
            else:
                unpaired += 1
        else:
            out.append(row)
    unpaired += sum(len(stack) for stack in open_by_key.values())
    return pa.Table.from_pylist(out, schema=raw.schema), unpaired


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


class _RowsKept:
    """Keeps the rows `valid` says of an array of a file's rows (Arrow or numpy). When they are
    its last rows (the usual file: its metadata events first, then only valid events), a slice,
    which copies nothing; else a filter (a filter of the 15 argument columns, the names and the
    times was a third of trace_rows on the 300k trial's files)."""

    def __init__(self, valid: pa.Array):
        self.valid, self.mask = valid, valid.to_numpy(zero_copy_only=False)
        first = len(self.mask) - int(np.count_nonzero(self.mask))
        self.first = first if self.mask[first:].all() else None

    def __call__(self, array):
        if self.first is not None:
            return array[self.first:]
        return array[self.mask] if isinstance(array, np.ndarray) else pc.filter(array, self.valid)


def _dictionary_of_codes(codes: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    """values[code] per row (code -1: null) as `pa.array(...).dictionary_encode()` makes it: its
    dictionary the values used, in order of first use."""
    used = codes >= 0
    rows = np.flatnonzero(used)
    first = np.full(len(values), len(codes))
    first[codes[rows][::-1]] = rows[::-1]  # each code's first row (the last write is the earliest)
    in_order = [code for code in np.argsort(first, kind="stable").tolist() if first[code] < len(codes)]
    index_of = np.full(len(values) + 1, -1, dtype=np.int32)  # (the last: code -1)
    index_of[in_order] = np.arange(len(in_order), dtype=np.int32)
    indices = pa.array(index_of[codes], mask=None if used.all() else ~used)
    return pa.DictionaryArray.from_arrays(indices, pa.array([values[code] for code in in_order], pa.string()))


def _measured(values: pa.Array) -> pa.Array:
    """A measure's values, a negative one (the collector's "not measured") as none."""
    if values.null_count == len(values):  # (most files: no measures)
        return values
    return pc.if_else(pc.less(values, 0), None, values)


def trace_rows(raw: pa.Table, process: str, file_time_us: int | None = None, ignored: Counter | None = None,
               ) -> tuple[pa.Table | None, int, list[str], str | None]:
    """Canonical framework rows of one file's raw table.

    file_time_us: the end time in the file's name (None for a .tmp file): events far from it
    are skipped (place_in_time).
    ignored: where given, counts (by field) the kept events' values read as missing: those the
    raw table names (its IGNORED column), and a step number that is no whole number.
    Returns (table, lines_skipped, problems, error): error set when the file as a whole
    cannot be placed in time.
    """
    problems: list[str] = []
    if raw.num_rows == 0:
        return None, 0, problems, None
    unpaired = 0
    if pc.any(pc.is_in(raw.column("ph"), pa.array(["B", "E"]))).as_py():
        raw, unpaired = _pair_begin_end(raw)
        if unpaired:
            problems.append(f"{unpaired} begin/end (B/E) event(s) without their other half")
    # Plain arrays (not chunked) so that filters keep struct fields addressable; a decoded file's
    # columns are one chunk each, taken as they are (combining them copied the 15 argument
    # columns: 13 % of this function on the 300k trial's files).
    ph, args, pids, names, ts, dur = (_one_array(raw.column(c)) for c in ("ph", "args", "pid", "name", "ts", "dur"))
    is_meta = pc.equal(ph, "M").fill_null(False)

    # Where the file's relative times start (first metadata event carrying it).
    start_times = pc.drop_null(pc.filter(args.field(fmt.ARG_START_TIME), is_meta))
    base_us = start_times[0].as_py() if len(start_times) else None

    # Phase of each trace pid, from "process_name" metadata in file order.
    defines = pc.and_(pc.and_(is_meta, pc.equal(names, "process_name").fill_null(False)),
                      pc.is_valid(args.field("name")))
    def_rows = np.nonzero(defines.to_numpy(zero_copy_only=False))[0]
    pid_np = pids.to_numpy(zero_copy_only=False)
    # Each row's phase as a code into phase_codes' keys (-1: none), not a string per row.
    phase_codes: dict[str, int] = {}
    phase_of_row = np.full(raw.num_rows, -1, dtype=np.int32)
    arg_names = args.field("name")
    by_pid: dict = {}
    for row in def_rows:
        phase = arg_names[int(row)].as_py()
        by_pid.setdefault(pid_np[row], []).append((row, phase_codes.setdefault(phase, len(phase_codes))))
    for trace_pid, defs in by_pid.items():
        rows_of_pid = np.nonzero(pid_np == trace_pid)[0]
        if len(defs) == 1:
            phase_of_row[rows_of_pid] = defs[0][1]
        else:  # a pid re-defined mid-file: each event takes the latest definition
            at = np.array([r for r, _ in defs])
            which = np.maximum(np.searchsorted(at, rows_of_pid, side="right") - 1, 0)
            phase_of_row[rows_of_pid] = np.array([p for _, p in defs], dtype=np.int32)[which]

    # Chrome's other phases (instant, counter, flow events) are not ours to read; an event of
    # no phase, or one not of text, is a bad event.
    no_phase = ph.null_count
    if no_phase:
        problems.append(f"{no_phase} event(s) without a phase (ph) of text")
    keep = pc.equal(ph, "X").fill_null(False)
    n_events = pc.sum(keep).as_py() or 0
    finite = pc.and_(pc.is_finite(ts).fill_null(False), pc.is_finite(dur).fill_null(False))
    valid = pc.and_(pc.and_(keep, finite), pc.greater_equal(dur, 0).fill_null(False))
    valid = pc.and_(valid, pc.is_valid(names))
    bad = n_events - (pc.sum(valid).as_py() or 0)
    if bad:
        problems.append(f"{bad} event(s) with a missing, non-numeric, negative or non-finite time "
                        f"or duration, or no name")
    bad += unpaired + no_phase
    if not pc.any(valid).as_py():
        return None, bad, problems, None

    ts_valid = pc.filter(ts, valid)
    if base_us is None:
        # Without the start-time metadata, only already-absolute times can be placed.
        if pc.min(ts_valid).as_py() < 1e14:
            return None, 0, problems, f"no {fmt.ARG_START_TIME} metadata: event times cannot be placed"
        base_us = 0
    # Absolute times must be epoch microseconds that int64 holds (a corrupt 1e300 is not).
    start_f = pc.add(ts, float(base_us))
    in_range = pc.and_(pc.greater_equal(start_f, 0.0),
                       pc.less(pc.add(start_f, dur), _MAX_US)).fill_null(False)
    out_of_range = pc.sum(pc.and_(valid, pc.invert(in_range))).as_py() or 0
    if out_of_range:
        problems.append(f"{out_of_range} event(s) with a time outside 1970..{_MAX_YEAR}")
        bad += out_of_range
        valid = pc.and_(valid, in_range)
        if not pc.any(valid).as_py():
            return None, bad, problems, None
    start_np = pc.fill_null(start_f, math.nan).to_numpy(zero_copy_only=False)
    start_rounded = np.round(start_np)
    dur_rounded = np.round(pc.fill_null(dur, math.nan).to_numpy(zero_copy_only=False))
    # Rounded as the canonical rows are: the name's time is exactly the end of an event.
    end_np = start_rounded + dur_rounded
    placed, far, problem = place_in_time(start_np, end_np, valid.to_numpy(zero_copy_only=False),
                                         sane_name_time(file_time_us), MAX_EVENT_BEFORE_FILE_US,
                                         MAX_EVENT_AFTER_FILE_US, named_after_an_end=True)
    if far:
        problems.append(problem)
        bad += far
        valid = pa.array(placed)
        if not placed.any():
            return None, bad, problems, None
    kept = _RowsKept(valid)
    if ignored is not None and IGNORED in raw.column_names:
        kept_ignored(kept(_one_array(raw.column(IGNORED))), ignored)
    # (Inside int64, as checked above; rounded half to even, as Arrow's round.)
    start = kept(start_rounded).astype(np.int64)
    end = start + kept(dur_rounded).astype(np.int64)
    fargs = kept(args)
    steps = fargs.field(fmt.ARG_STEP)
    try:
        step = pc.cast(steps, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        step = pa.array([_as_int(s) for s in steps.to_pylist()], pa.int64())
        if ignored is not None:
            ignored[f"args.{fmt.ARG_STEP}"] += step.null_count - steps.null_count
    n = len(start)
    # Strings dictionary-encoded per file: a few distinct values over many rows.
    table = pa.table({
        "process": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([process])),
        "pid": fargs.field(fmt.ARG_PID),
        "phase": _dictionary_of_codes(kept(phase_of_row), list(phase_codes)),
        "name": kept(names).dictionary_encode(),
        "start_us": start,
        "end_us": end,
        "worker_id": fargs.field(fmt.ARG_WORKER_ID),
        "num_workers": fargs.field(fmt.ARG_NUM_WORKERS),
        "pin_memory": fargs.field(fmt.ARG_PIN_MEMORY),
        "step": step,
        "iterator_id": fargs.field(fmt.ARG_ITERATOR_ID),
        "persistent_workers": fargs.field(fmt.ARG_PERSISTENT),
        "prefetch_factor": fargs.field(fmt.ARG_PREFETCH),
        "in_order": fargs.field(fmt.ARG_IN_ORDER),
        "cpu_us": _measured(fargs.field(fmt.ARG_CPU_US)),
        "runq_us": _measured(fargs.field(fmt.ARG_RUNQ_US)),
        "rank": fargs.field(fmt.ARG_RANK),
        "local_rank": fargs.field(fmt.ARG_LOCAL_RANK),
    }, schema=FRAMEWORK_ARROW_SCHEMA)
    return table, bad, problems, None


def parse_trace_file(data: bytes, process: str, file_time_us: int | None = None) -> ParsedFile:
    """file_time_us: the end time in the file's name, None when it has none (a .tmp file)."""
    raw, bad_lines, problem = _raw_trace_table(data)
    ignored: Counter = Counter()
    table, bad_events, problems, error = trace_rows(raw, process, file_time_us, ignored)
    if problem:
        problems.insert(0, problem)
    return ParsedFile(table, bad_lines + bad_events, problems, error,
                      values_ignored=noted_ignored(problems, ignored) if table is not None else 0)


# --- system metrics -----------------------------------------------------------------

def _raw_system_row(obj: dict):
    """The record's raw row, or None (not a valid metric record); its Dimension and NodeId are
    named in its IGNORED where they are not text (then none, and the file's node)."""
    value, ts = _as_number(obj.get("Value")), _as_number(obj.get("Timestamp"))
    kind, name = obj.get("Type"), obj.get("Name")
    if value is None or ts is None or not isinstance(kind, str) or not isinstance(name, str):
        return None
    ignored: list[str] = []
    dimension = _read_as(obj.get("Dimension"), _as_text, "Dimension", ignored)
    node = _read_as(obj.get("NodeId"), _as_text, "NodeId", ignored)
    return {"Type": kind, "Name": name, "Dimension": "" if dimension is None else dimension,
            "Value": value, "NodeId": node, "Timestamp": ts, IGNORED: ",".join(ignored) or None}


def parse_system_file(data: bytes, node: str, file_time_us: int | None = None) -> ParsedFile:
    """file_time_us: the time in the file's name (`<EPOCH_S>` in microseconds)."""
    body = data.strip()
    if not body:
        return ParsedFile(None)
    bad = 0
    problems = []
    ignored: Counter = Counter()
    raw = _typed_system_table(body)
    if raw is None:
        objects, bad, problem = _json_objects(data, _rescue_with(_SYSTEM_PARSE))
        if problem:
            problems.append(problem)
        rows = [_raw_system_row(o) for o in objects]
        good = [r for r in rows if r is not None]
        if len(rows) - len(good):
            problems.append(f"{len(rows) - len(good)} record(s) are not valid metric records")
        bad += len(rows) - len(good)
        raw = pa.Table.from_pylist(good, schema=_SYSTEM_READ)
    if raw.num_rows == 0:
        return ParsedFile(None, bad, problems)
    value, ts = raw.column("Value"), raw.column("Timestamp")
    valid = pc.and_(pc.is_finite(value).fill_null(False), pc.is_finite(ts).fill_null(False))
    in_range = pc.and_(pc.greater_equal(ts, 0.0), pc.less(ts, _MAX_US / 1e6)).fill_null(False)
    valid = pc.and_(pc.and_(valid, in_range),
                    pc.and_(pc.is_valid(raw.column("Type")), pc.is_valid(raw.column("Name"))))
    dropped = raw.num_rows - (pc.sum(valid).as_py() or 0)
    if dropped:
        bad += dropped
        problems.append(f"{dropped} record(s) with a missing, non-finite or out-of-range value or "
                        f"timestamp, or no Type or Name")
    ts_us = pc.multiply(pc.fill_null(ts, math.nan), 1e6).to_numpy()
    placed, far, problem = place_in_time(ts_us, ts_us, valid.to_numpy(), sane_name_time(file_time_us),
                                         MAX_SAMPLE_FROM_FILE_US, MAX_SAMPLE_FROM_FILE_US, what="record(s)")
    if far:
        bad += far
        problems.append(problem)
        valid = pa.array(placed)
    raw = raw.filter(valid)
    if raw.num_rows == 0:
        return ParsedFile(None, bad, problems)
    if IGNORED in raw.column_names:
        kept_ignored(_one_array(raw.column(IGNORED)), ignored)
    table = pa.table({
        "node": pc.fill_null(raw.column("NodeId"), node),
        "timestamp_us": pc.cast(pc.round(pc.multiply(raw.column("Timestamp"), 1e6)), pa.int64()),
        "type": raw.column("Type"),
        "name": raw.column("Name"),
        "dimension": pc.fill_null(raw.column("Dimension"), ""),
        "value": raw.column("Value"),
    }, schema=SYSTEM_ARROW_SCHEMA)
    return ParsedFile(table, bad, problems, values_ignored=noted_ignored(problems, ignored))
