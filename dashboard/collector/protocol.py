"""The byte stream from a training process to its sink (see sink.py).

A frame is a 5-byte header, `<kind:1 byte><length:uint32 little-endian>`, then the payload:

    G  GetNext records: int64 little-endian triples (start_ns, end_ns, source), where
       source = iterator_id << 16 | (worker_id + 2): worker_id -1 single-process,
       -2 unknown (torch internals without a worker id), else the worker (< 65534)
    C  one control record, JSON: {"t": "init" | "adopt", ...}
    Q  end of the stream (the training process called stop())

The stream also ends at EOF: when the training process dies, the sink writes what it
received and closes every file, so a crash loses at most the last flush interval.
Standard library only.
"""
from __future__ import annotations

import json
import struct
import sys
from array import array

GETNEXT = b"G"
CONTROL = b"C"
QUIT = b"Q"
HEADER = struct.Struct("<cI")
RECORD_FIELDS = 3
WORKER_UNKNOWN = -2
WORKER_BITS = 16
MAX_WORKER_ID = (1 << WORKER_BITS) - 3
MAX_FRAME = 64 << 20
# How long a job's end waits for its last S3 uploads (a file a minute rotates, so few are left;
# each takes well under a second on a working S3). An S3 that accepts connections and never
# answers held a finished job for minutes; past this the files stay local, named in a warning.
# The training process and its sink share it.
DEFAULT_UPLOAD_TIMEOUT_S = 30.0
_LITTLE = sys.byteorder == "little"


def source(iterator_id: int, worker_id: int) -> int:
    """The third number of a GetNext record."""
    return (iterator_id << WORKER_BITS) | (worker_id + 2)


def split_source(value: int) -> tuple[int, int]:
    """(iterator_id, worker_id) of a GetNext record's third number."""
    return value >> WORKER_BITS, (value & ((1 << WORKER_BITS) - 1)) - 2


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def getnext_frame(records: array) -> bytes:
    """A G frame from an array('q') of triples."""
    if not _LITTLE:
        records = array("q", records)
        records.byteswap()
    return frame(GETNEXT, records.tobytes())


def control_payload(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


def getnext_records(payload: bytes) -> array:
    records = array("q")
    usable = len(payload) - len(payload) % (8 * RECORD_FIELDS)
    records.frombytes(payload[:usable])
    if not _LITTLE:
        records.byteswap()
    return records


class FrameReader:
    """Splits a byte stream into (kind, payload) frames; keeps an incomplete tail."""

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self._buffer += data
        frames = []
        offset = 0
        size = len(self._buffer)
        while size - offset >= HEADER.size:
            kind, length = HEADER.unpack_from(self._buffer, offset)
            if length > MAX_FRAME:
                raise ValueError(f"frame of {length} bytes: the stream is corrupt")
            if size - offset - HEADER.size < length:
                break
            start = offset + HEADER.size
            frames.append((kind, bytes(self._buffer[start:start + length])))
            offset = start + length
        del self._buffer[:offset]
        return frames

    @property
    def pending(self) -> int:
        return len(self._buffer)
