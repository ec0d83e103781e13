"""The canonical frames: one schema for every format, defined here once.

framework: one row per event
    node (category)          framework node id, e.g. "20557-algo-1" or "0-algo-1"
    pid (Int64)              OS process id of the process that recorded the event
    phase (category)         trace phase, e.g. "DataLoaderIter", "Step:ModeKeys.TRAIN"
    name (category)          event name, e.g. "_MultiProcessingDataLoaderIter::GetNext"
    kind (category)          init | getnext | worker | step | fetch | other
    start_us, end_us (int64) absolute epoch microseconds
    duration_us (int64)
    worker_id (Int64)        -1 single-process, <NA> unknown
    num_workers (Int64), pin_memory (boolean), step (Int64), iterator_id (Int64)

system: one row per sample
    node (category), timestamp_us (int64, epoch us), type, name, dimension (category),
    value (float64)
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .. import format as fmt

_DICT = pa.dictionary(pa.int32(), pa.string())
FRAMEWORK_ARROW_SCHEMA = pa.schema([
    pa.field("node", _DICT),
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
])
SYSTEM_ARROW_SCHEMA = pa.schema([
    pa.field("node", pa.string()),
    pa.field("timestamp_us", pa.int64()),
    pa.field("type", pa.string()),
    pa.field("name", pa.string()),
    pa.field("dimension", pa.string()),
    pa.field("value", pa.float64()),
])
FRAMEWORK_COLUMNS = ["node", "pid", "phase", "name", "kind", "start_us", "end_us", "duration_us",
                     "worker_id", "num_workers", "pin_memory", "step", "iterator_id"]
SYSTEM_COLUMNS = [f.name for f in SYSTEM_ARROW_SCHEMA]
_CATEGORIES = ("node", "phase", "name")


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    for name in table.column_names:
        if pa.types.is_string(table.schema.field(name).type):
            index = table.schema.get_field_index(name)
            table = table.set_column(index, name, table.column(name).dictionary_encode())
    return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(),
                                         pa.bool_(): pd.BooleanDtype()}.get)


def _kind_of(phases: pd.Categorical, names: pd.Categorical) -> pd.Categorical:
    """Event kind per row, decided once per distinct (phase, name) pair of category codes."""
    width = len(names.categories) + 1
    pair = (phases.codes.astype(np.int64) + 1) * width + (names.codes.astype(np.int64) + 1)
    unique, inverse = np.unique(pair, return_inverse=True)
    phase_cats, name_cats = list(phases.categories), list(names.categories)
    kinds = []
    for key in unique:
        phase_code, name_code = divmod(int(key), width)
        kinds.append(fmt.KINDS.index(classify(phase_cats[phase_code - 1] if phase_code else "",
                                              name_cats[name_code - 1] if name_code else "")))
    codes = np.asarray(kinds, dtype=np.int8)[inverse.reshape(-1)]
    return pd.Categorical.from_codes(codes, categories=list(fmt.KINDS))


def classify(phase: str, name: str) -> str:
    """The kind of an event, from its phase or, for producers without phases, its name."""
    if phase == fmt.PHASE_ITER or fmt.GETNEXT_NAME_RE.search(name):
        return fmt.KIND_GETNEXT
    if phase == fmt.PHASE_INIT or fmt.INIT_NAME_RE.search(name):
        return fmt.KIND_INIT
    if phase == fmt.PHASE_WORKER or fmt.WORKER_NAME_RE.search(name):
        return fmt.KIND_WORKER
    if phase == fmt.PHASE_WORKER_FETCH:
        return fmt.KIND_FETCH
    if phase.startswith("Step:") or name.startswith("Step:") or name.startswith("ProfilerStep#"):
        return fmt.KIND_STEP
    return fmt.KIND_OTHER


def framework_frame(tables: list[pa.Table]) -> pd.DataFrame:
    """One framework frame from per-file Arrow tables, sorted by start time.

    Sorting and the duration column are done in Arrow, so pandas makes one copy only.
    """
    table = pa.concat_tables(tables) if tables else FRAMEWORK_ARROW_SCHEMA.empty_table()
    table = table.unify_dictionaries().sort_by("start_us")
    table = table.append_column("duration_us", pc.subtract(table.column("end_us"), table.column("start_us")))
    df = _to_pandas(table)
    for col in _CATEGORIES:
        df[col] = df[col].astype("category")
    for col in ("start_us", "end_us", "duration_us"):
        df[col] = df[col].astype("int64")
    df["kind"] = _kind_of(df["phase"].array, df["name"].array)
    return df[FRAMEWORK_COLUMNS]


def system_frame(tables: list[pa.Table]) -> pd.DataFrame:
    table = pa.concat_tables(tables) if tables else SYSTEM_ARROW_SCHEMA.empty_table()
    df = _to_pandas(table)
    for col in ("node", "type", "name", "dimension"):
        df[col] = df[col].astype("category")
    df["timestamp_us"] = df["timestamp_us"].astype("int64")
    df["value"] = df["value"].astype("float64")
    order = np.argsort(df["timestamp_us"].to_numpy(), kind="stable")
    return df.iloc[order].reset_index(drop=True)[SYSTEM_COLUMNS]


def empty_framework_frame() -> pd.DataFrame:
    return framework_frame([])


def empty_system_frame() -> pd.DataFrame:
    return system_frame([])
