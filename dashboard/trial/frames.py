"""The canonical frames: one schema for every format, defined here once.

framework: one row per event
    node (category)          the host, e.g. "algo-1" (SageMaker) or a host name
    process (category)       the process on its host, as the reference names framework nodes:
                             "<pid>-<host>", or "<rank>-<host>" in a distributed job
    rank (Int64)             the process's training rank, <NA> when unknown or not distributed
    local_rank (Int64)       its rank on its host, <NA> when unknown
    pid (Int64)              OS process id of the process that recorded the event
    phase (category)         trace phase, e.g. "DataLoaderIter", "Step:ModeKeys.TRAIN"
    name (category)          event name, e.g. "_MultiProcessingDataLoaderIter::GetNext"
    kind (category)          init | getnext | worker | step | fetch | epoch_end | created | other
    start_us, end_us (int64) absolute epoch microseconds
    duration_us (int64)
    worker_id (Int64)        -1 single-process, <NA> unknown
    num_workers (Int64), pin_memory (boolean), step (Int64), iterator_id (Int64)
    persistent_workers (boolean), prefetch_factor (Int64), in_order (boolean)
                             the DataLoader's settings, on iterator inits (this project's collector)
    cpu_us (Int64)           fetch events: the worker's process CPU time during the fetch
    runq_us (Int64)          fetch events: the time the worker was runnable, waiting for a core

system: one row per sample (system metrics belong to a host)
    node (category: the host), timestamp_us (int64, epoch us), type, name, dimension (category),
    value (float64)
"""
from __future__ import annotations

from .. import arrow_memory  # (first: before pandas and pyarrow, see there)

import numpy as np
import pandas as pd
import pyarrow as pa

from .. import format as fmt

_DICT = pa.dictionary(pa.int32(), pa.string())
FRAMEWORK_ARROW_SCHEMA = pa.schema([
    pa.field("process", _DICT),
    pa.field("pid", pa.int64()),
    pa.field("phase", _DICT),
    pa.field("name", _DICT),
    pa.field("start_us", pa.int64()),
    pa.field("end_us", pa.int64()),
    pa.field("worker_id", pa.int64()),
    pa.field("num_workers", pa.int64()),
    pa.field("pin_memory", pa.bool_()),
    pa.field("step", pa.int64()),
    pa.field("iterator_id", pa.int64()),
    pa.field("persistent_workers", pa.bool_()),
    pa.field("prefetch_factor", pa.int64()),
    pa.field("in_order", pa.bool_()),
    pa.field("cpu_us", pa.int64()),
    pa.field("runq_us", pa.int64()),
    pa.field("rank", pa.int64()),  # where the file says (collector init events, Kineto's distributedInfo)
    pa.field("local_rank", pa.int64()),
])
SYSTEM_ARROW_SCHEMA = pa.schema([
    pa.field("node", pa.string()),
    pa.field("timestamp_us", pa.int64()),
    pa.field("type", pa.string()),
    pa.field("name", pa.string()),
    pa.field("dimension", pa.string()),
    pa.field("value", pa.float64()),
])
FRAMEWORK_COLUMNS = ["node", "process", "rank", "local_rank", "pid", "phase", "name", "kind", "start_us", "end_us", "duration_us",
                     "worker_id", "num_workers", "pin_memory", "step", "iterator_id",
                     "persistent_workers", "prefetch_factor", "in_order", "cpu_us", "runq_us"]
SYSTEM_COLUMNS = [f.name for f in SYSTEM_ARROW_SCHEMA]


class _ColumnBuilder:
    """One column of the frame, filled table by table (_columns_of): int64 as Int64 and bool
    as boolean (plain numpy where never_null), strings and dictionaries as categoricals (the
    categories in order of first appearance, as Arrow's dictionary unification has them),
    floats as float64 (NaN missing)."""

    def __init__(self, field: pa.Field, length: int, never_null: bool):
        self.name, self.type, self.never_null = field.name, field.type, never_null
        self.categorical = pa.types.is_dictionary(self.type) or pa.types.is_string(self.type)
        self.categories: dict[str, int] = {}
        if self.categorical:
            self.data = np.empty(length, dtype=np.int32)
        else:
            dtype = (np.bool_ if pa.types.is_boolean(self.type) else
                     np.int64 if pa.types.is_integer(self.type) else np.float64)
            # Zeros from calloc: a column that has no value in a table (most of the settings
            # columns, set on initializations only) is never written there, and its pages cost
            # no memory until they are.
            self.data = np.empty(length, dtype=dtype) if never_null else np.zeros(length, dtype=dtype)
        self.valid = None if never_null or self.categorical or self.data.dtype == np.float64 else (
            np.zeros(length, dtype=bool))

    def fill(self, span: slice | np.ndarray, chunk: pa.Array) -> None:
        """Writes the chunk's values at span: its rows' places in the frame (a slice, or their
        positions where the frame's order is not the tables')."""
        if self.categorical:
            if not pa.types.is_dictionary(chunk.type):
                chunk = chunk.dictionary_encode()
            mapping = np.array([self.categories.setdefault(value, len(self.categories))
                                for value in chunk.dictionary.to_pylist()] + [-1], dtype=np.int32)
            indices = chunk.indices.fill_null(-1) if chunk.null_count else chunk.indices
            self.data[span] = mapping[indices.to_numpy(zero_copy_only=False)]
        elif self.never_null:
            if chunk.null_count:
                raise ValueError(f"{self.name}: a column that is never null has {chunk.null_count} nulls")
            self.data[span] = chunk.to_numpy(zero_copy_only=False)
        elif self.valid is None:  # floats: NaN where missing
            self.data[span] = chunk.to_numpy(zero_copy_only=False)
        elif chunk.null_count < len(chunk):
            self.data[span] = (chunk.fill_null(False if self.data.dtype == np.bool_ else 0) if chunk.null_count
                               else chunk).to_numpy(zero_copy_only=False)
            self.valid[span] = chunk.is_valid().to_numpy(zero_copy_only=False) if chunk.null_count else True

    def array(self):
        if self.categorical:
            return pd.Categorical.from_codes(self.data, categories=list(self.categories))
        if self.valid is None:
            return self.data
        kind = pd.arrays.BooleanArray if self.data.dtype == np.bool_ else pd.arrays.IntegerArray
        # A column with every value (pid, step): its mask of zeros from calloc, never written.
        return kind(self.data, np.zeros(len(self.valid), dtype=bool) if self.valid.all() else ~self.valid)


TRIM_EVERY_BYTES = 8 << 20  # of tables copied into the frame (_columns_of)


def _columns_of(tables: list[pa.Table], schema: pa.Schema, never_null: tuple[str, ...] = (),
                order_by: str | None = None) -> dict:
    """The columns of per-file tables (of one schema), as the frame holds them (_ColumnBuilder),
    their rows in the tables' order, or in a stable sort of the never-null column `order_by`.

    Filled table by table, each table dropped from the list once copied: the memory is the
    frame and one table, not the frame and all the tables (pyarrow's concatenation, dictionary
    unification and pandas conversion held both, and copied each of a 3M-GetNext trial's 587
    chunks a column into a masked array: 2.1-3.3 s of its warm load, this 0.85 s). A sorted
    frame is written in its order at once, each row at its place: copying the columns in the
    tables' order, then each column again in the sort's, wrote every byte of the frame twice."""
    for table in tables:
        if not table.schema.equals(schema):  # (what concatenating them checked)
            raise ValueError(f"a table of another schema than the frame's: {table.schema}")
    length = sum(table.num_rows for table in tables)
    builders = [_ColumnBuilder(field, length, field.name in never_null) for field in schema]
    place = _places_in_order(tables, order_by) if order_by is not None else None
    at = freed = 0
    while tables:
        table = tables.pop(0)
        for builder, column in zip(builders, table.columns):
            offset = at
            for chunk in column.chunks:  # (empty ones too: their dictionaries are categories)
                span = slice(offset, offset + len(chunk))
                builder.fill(span if place is None else place[span], chunk)
                offset += len(chunk)
        at += table.num_rows
        freed += table.nbytes
        del table, column
        # A table parsed in a forked process came pickled: its buffers are bytes on the C heap,
        # which glibc keeps when freed in its middle, so the frame grew beside all the tables
        # (a 300k-GetNext load peaked at 270 MB, 200 MB handing them back). Every few MB: a trim
        # walks the whole heap (0.2 ms at 300k GetNexts, more on a larger one).
        if freed >= TRIM_EVERY_BYTES:
            arrow_memory.trim_c_heap()
            freed = 0
    return {builder.name: builder.array() for builder in builders}


def _places_in_order(tables: list[pa.Table], key: str) -> np.ndarray | None:
    """Each row's place (of the tables' rows, one after another) in a stable sort of the key
    column, or None where they are in that order already."""
    chunks = [chunk for table in tables for chunk in table.column(key).chunks]
    nulls = sum(chunk.null_count for chunk in chunks)
    if nulls:  # (as _ColumnBuilder says it of a never-null column)
        raise ValueError(f"{key}: a column that is never null has {nulls} nulls")
    values = np.concatenate([np.empty(0, dtype=np.int64)] + [chunk.to_numpy() for chunk in chunks])
    del chunks
    if not len(values) or not bool(np.any(values[1:] < values[:-1])):
        return None
    order = np.argsort(values, kind="stable")
    # (Made while every table is held, the load's peak: the keys let go first, the places in
    # 32 bits where they fit, 16 bytes a row at most here.)
    del values
    place = np.empty(len(order), dtype=np.int32 if len(order) < 2**31 else np.int64)
    place[order] = np.arange(len(order), dtype=place.dtype)
    return place


def missing_column(length: int, dtype) -> pd.api.extensions.ExtensionArray:
    """A nullable column (Int64 or boolean) without a value: zeros from calloc under an all-true
    mask. Its data pages are never written, so they cost no memory (of 21 framework columns,
    8 are empty on a reference trial's events: settings and measures this project's collector adds)."""
    data = np.zeros(length, dtype=dtype.numpy_dtype)
    kind = pd.arrays.BooleanArray if isinstance(dtype, pd.BooleanDtype) else pd.arrays.IntegerArray
    return kind(data, np.ones(length, dtype=bool))


def take_column(values, positions: np.ndarray):
    """A column's values at those positions; where it has no value at any of them (a column
    without a value, or the settings columns at the GetNexts of a reference trial), they stay
    unwritten (missing_column) instead of being copied."""
    if isinstance(values, (pd.arrays.IntegerArray, pd.arrays.BooleanArray)) and bool(values.isna()[positions].all()):
        return missing_column(len(positions), values.dtype)
    return values.take(positions)


def take_rows(frame: pd.DataFrame, positions: np.ndarray) -> pd.DataFrame:
    """The rows of a frame at those positions (frame[mask] for np.flatnonzero(mask)), its
    empty columns kept unwritten (take_column)."""
    def values(series: pd.Series):
        return series.array if isinstance(series.dtype, pd.api.extensions.ExtensionDtype) else series.to_numpy()

    return pd.DataFrame({name: take_column(values(frame[name]), positions) for name in frame.columns},
                        index=frame.index[positions], copy=False)


def _kind_of(phases: pd.Categorical, names: pd.Categorical) -> pd.Categorical:
    """Event kind per row: from the phase where it decides, in the DataLoaderIter phase from
    the name (kind_in_iter_phase), else from the name; each classification runs once per
    category, not per row."""
    other = fmt.KINDS.index(fmt.KIND_OTHER)
    by_phase = np.array([fmt.KINDS.index(k) if k else -1
                         for k in map(kind_of_phase, phases.categories)] + [-1], dtype=np.int8)
    by_name = np.array([fmt.KINDS.index(kind_of_name(n)) for n in names.categories] + [other], dtype=np.int8)
    codes = by_phase[phases.codes]
    undecided = codes < 0
    if fmt.PHASE_ITER in phases.categories:
        in_iter_phase = phases.codes == phases.categories.get_loc(fmt.PHASE_ITER)
        by_iter_name = np.array([fmt.KINDS.index(kind_in_iter_phase(n)) for n in names.categories] + [other],
                                dtype=np.int8)
        codes[in_iter_phase] = by_iter_name[names.codes[in_iter_phase]]
        undecided &= ~in_iter_phase
    codes[undecided] = by_name[names.codes[undecided]]
    return pd.Categorical.from_codes(codes, categories=list(fmt.KINDS))


def kind_of_phase(phase: str) -> str | None:
    """The kind a phase implies, or None when the phase does not say (DataLoaderIter: the
    name says, see kind_in_iter_phase)."""
    return {fmt.PHASE_INIT: fmt.KIND_INIT, fmt.PHASE_WORKER: fmt.KIND_WORKER,
            fmt.PHASE_WORKER_FETCH: fmt.KIND_FETCH, fmt.LEGACY_PHASE_WORKER_FETCH: fmt.KIND_FETCH,
            fmt.PHASE_EPOCH_END: fmt.KIND_EPOCH_END, fmt.PHASE_CREATED: fmt.KIND_CREATED}.get(
        phase, fmt.KIND_STEP if phase.startswith("Step:") else None)


def kind_in_iter_phase(name: str) -> str:
    """The kind of an event of the DataLoaderIter phase: a GetNext only if its name says so
    (fmt.ITER_PHASE_GETNEXT_NAME_RE), else "other": counting it would add a batch that never was."""
    return fmt.KIND_GETNEXT if fmt.ITER_PHASE_GETNEXT_NAME_RE.search(name) else fmt.KIND_OTHER


def kind_of_name(name: str) -> str:
    """The kind of an event from its name alone, for producers without phases."""
    if fmt.GETNEXT_NAME_RE.search(name):
        return fmt.KIND_GETNEXT
    if fmt.INIT_NAME_RE.search(name):
        return fmt.KIND_INIT
    if fmt.WORKER_NAME_RE.search(name):
        return fmt.KIND_WORKER
    if name.startswith("Step:") or name.startswith("ProfilerStep#"):
        return fmt.KIND_STEP
    return fmt.KIND_OTHER


def classify(phase: str, name: str) -> str:
    """The kind of an event: its phase decides, else its name."""
    if phase == fmt.PHASE_ITER:
        return kind_in_iter_phase(name)
    return kind_of_phase(phase) or kind_of_name(name)


def framework_frame(tables: list[pa.Table]) -> pd.DataFrame:
    """One framework frame from per-file Arrow tables, sorted by start time.

    Memory matters on large trials: the list is emptied as the tables are converted (the
    caller holds no other reference to them), and each row is written at its sorted place.
    """
    columns = _columns_of(tables, FRAMEWORK_ARROW_SCHEMA, never_null=("start_us", "end_us"), order_by="start_us")
    columns["duration_us"] = columns["end_us"] - columns["start_us"]
    columns["kind"] = _kind_of(pd.Categorical(columns["phase"]), pd.Categorical(columns["name"]))
    columns.update(_identity(pd.Categorical(columns["process"]), columns["rank"], columns["local_rank"],
                             columns["pid"], columns["kind"]))
    return pd.DataFrame({name: columns[name] for name in FRAMEWORK_COLUMNS}, copy=False)


def identity_order(host: str, rank: int | None, pid: int | None, process: str) -> tuple:
    """How every list of processes is ordered: by host, then rank, then pid (unknowns last),
    then process id."""
    far = 2**62
    return host, far if rank is None else rank, far if pid is None else pid, process


def host_of(process: str) -> str:
    """The host of a process id: '20557-algo-1' -> 'algo-1'; a name without the number is a host."""
    head, sep, rest = process.partition("-")
    return rest if sep and head.isdigit() else process


def process_number(process: str) -> int | None:
    """The number a process id starts with (a pid or a rank): '3-algo-1' -> 3."""
    head, sep, _ = process.partition("-")
    return int(head) if sep and head.isdigit() else None


_MAIN_KINDS = (fmt.KIND_GETNEXT, fmt.KIND_INIT, fmt.KIND_STEP, fmt.KIND_EPOCH_END, fmt.KIND_CREATED)


def _identity(process: pd.Categorical, rank, local_rank, pid, kind: pd.Categorical) -> dict:
    """The host of every row, and the rank and local rank of its process: one value per
    process, spread to its rows (each computed once per category, not per row).

    A rank is what a file says (the collector's init events, Kineto's distributedInfo). Else the
    number of the reference's node id `<N>-<host>` is a rank when it is not the pid of the process's
    training-loop events (the reference and the collector name a process by its pid when the job is
    not distributed, by its rank when it is)."""
    names = [str(c) for c in process.categories]
    codes = np.asarray(process.codes)  # (as they are: an index of any integer type; -1 the last)
    hosts = sorted({host_of(n) for n in names})
    host_codes = np.array([hosts.index(host_of(n)) for n in names] + [-1], dtype=np.int32)
    node = pd.Categorical.from_codes(host_codes[codes], categories=hosts)
    count = len(names)
    known = codes >= 0

    def per_process(values) -> np.ndarray:
        """The first non-null value of each process, NaN where none."""
        values = pd.array(values, dtype="Int64")
        rows = np.flatnonzero(known & ~values.isna())
        out = np.full(count + 1, np.nan)
        first = rows[np.unique(codes[rows], return_index=True)[1]] if len(rows) else rows
        out[codes[first]] = values[first].to_numpy(dtype=np.float64)
        return out

    explicit = per_process(rank)
    numbers = np.array([process_number(n) if process_number(n) is not None else -1 for n in names] + [-1],
                       dtype=np.int64)
    main = known & np.isin(np.asarray(kind.codes), [fmt.KINDS.index(k) for k in _MAIN_KINDS])
    pids = np.asarray(pd.array(pid, dtype="Int64").to_numpy(dtype=np.int64, na_value=-2))
    main_codes = codes[main]  # (the main rows alone from here: their codes and pids)
    has_main = np.bincount(main_codes, minlength=count + 1) > 0
    named_by_pid = np.bincount(main_codes[pids[main] == numbers[main_codes]], minlength=count + 1) > 0
    inferred = np.where(has_main & ~named_by_pid & (numbers >= 0), numbers.astype(np.float64), np.nan)
    by_process = np.where(np.isnan(explicit), inferred, explicit)[:count + 1]
    by_process[count] = np.nan  # code -1: no process
    local = per_process(local_rank)
    local[count] = np.nan

    def spread(values: np.ndarray):
        """A value per process (NaN: none) to its rows, as Int64: taken from the processes'
        few values, not converted row by row."""
        if np.isnan(values).all():
            return missing_column(len(codes), pd.Int64Dtype())
        return pd.array(values, dtype="Float64").astype("Int64").take(codes, allow_fill=False)

    return {"node": node, "rank": spread(by_process), "local_rank": spread(local)}


def system_frame(tables: list[pa.Table]) -> pd.DataFrame:
    df = pd.DataFrame(_columns_of(tables, SYSTEM_ARROW_SCHEMA, never_null=("timestamp_us",)), copy=False)
    order = np.argsort(df["timestamp_us"].to_numpy(), kind="stable")
    return df.iloc[order].reset_index(drop=True)[SYSTEM_COLUMNS]


def empty_framework_frame() -> pd.DataFrame:
    return framework_frame([])


def empty_system_frame() -> pd.DataFrame:
    return system_frame([])
