"""Arrow tables written without their columns of nulls alone, and made whole again when read.

Most of a reference trial's framework columns have no value in its files (the settings and
measures this project's collector adds), and Arrow gives such a column of a fixed-width type 8
bytes a row of zeros all the same: 54 % of a 3M-GetNext trial's tables. The tables parse workers
send back (load.parse_file_for_client) and the columnar cache's files (columnar_cache.py)
leave those columns out; the reader makes each again over zeros that no page holds (a
mapping never written), which no reader of a column of nulls looks at.
"""
from __future__ import annotations

from .. import arrow_memory  # noqa: F401  (before pandas and pyarrow: see there)

import mmap
import threading

import pyarrow as pa

# The metadata keys under which a written table keeps its whole schema and the places in it of
# the columns of nulls alone that were left out.
_WHOLE_SCHEMA = b"dashboard.null-columns.whole-schema"
_LEFT_OUT = b"dashboard.null-columns.left-out"
# One read-only private mapping of zeros under every column made again, grown (doubled) when a
# table needs more: a mapping per table ran a load of 45,000 files out of the kernel's 65,530
# mappings a process may hold. Unwritable, its pages cost nothing, not even a commit charge;
# reading them maps the kernel's one zero page.
_ZEROS_MIN_BYTES = 16 << 20
_zeros: pa.Buffer | None = None
_zeros_lock = threading.Lock()


def _zeros_of(size: int) -> pa.Buffer:
    """A read-only buffer of at least `size` zero bytes."""
    global _zeros
    with _zeros_lock:
        if _zeros is None or _zeros.size < size:
            length = max(size, 2 * _zeros.size if _zeros is not None else 0, _ZEROS_MIN_BYTES)
            mapping = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
            _zeros = pa.py_buffer(memoryview(mapping).toreadonly())
        return _zeros


def _fixed_width(type_: pa.DataType) -> bool:
    """A type whose array is a validity bitmap and a buffer of fixed-width values."""
    return pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)


def without_null_columns(table: pa.Table) -> pa.Table:
    """The table without its fixed-width columns of nulls alone, its whole schema and their places
    in its metadata."""
    left_out = [i for i, (field, column) in enumerate(zip(table.schema, table.columns))
                if _fixed_width(field.type) and len(column) and column.null_count == len(column)]
    if not left_out:
        return table
    narrow = table.select(sorted(set(range(table.num_columns)) - set(left_out)))
    return narrow.replace_schema_metadata({**(narrow.schema.metadata or {}),
                                           _WHOLE_SCHEMA: table.schema.serialize().to_pybytes(),
                                           _LEFT_OUT: ",".join(map(str, left_out)).encode()})


def with_null_columns(table: pa.Table) -> pa.Table:
    """The table without_null_columns made, whole again: each column it left out made of nulls
    over a mapping of zeros that is never written (_zeros_of). ValueError (or KeyError, Arrow's
    errors; OSError where no mapping can be made) where its metadata does not say that of it."""
    metadata = table.schema.metadata or {}
    if _WHOLE_SCHEMA not in metadata:
        return table
    schema = pa.ipc.read_schema(pa.py_buffer(metadata[_WHOLE_SCHEMA]))
    left_out = {int(i) for i in metadata[_LEFT_OUT].split(b",")}
    # (Checked, not trusted: Arrow makes an array of any type over these buffers, and one of a
    # type that needs others, a dictionary's, would crash the process when read.)
    if len(left_out) + table.num_columns != len(schema) or not left_out <= set(range(len(schema))) \
            or not all(_fixed_width(schema.field(i).type) for i in left_out):
        raise ValueError("a table whose columns left out do not make its whole schema")
    rows = table.num_rows
    zeros = _zeros_of(8 * rows)
    bitmap = (rows + 7) // 8

    def nulls(type_: pa.DataType) -> pa.Array:
        values = bitmap if pa.types.is_boolean(type_) else rows * type_.bit_width // 8
        return pa.Array.from_buffers(type_, rows, [zeros.slice(0, bitmap), zeros.slice(0, values)], null_count=rows)

    written = iter(table.columns)
    return pa.Table.from_arrays([nulls(field.type) if i in left_out else next(written)
                                 for i, field in enumerate(schema)], schema=schema)
