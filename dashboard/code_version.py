"""What made a cached result: a digest of the dashboard package's source, Python's version and
the analysis libraries' versions. A process of another version computes its own result
instead of serving what older code made. Standard library only (the result cache's hit path
imports no pandas)."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import pathlib
import sys

# The libraries whose upgrade can change the numbers or the figures.
VERSIONED_PACKAGES = ("numpy", "pandas", "pyarrow", "scipy", "plotly", "dash", "msgspec")


@functools.cache
def code_version() -> str:
    root = pathlib.Path(__file__).resolve().parent
    digest = hashlib.sha256(sys.version.encode())
    for package in VERSIONED_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            digest.update(f"\0{package} {importlib.metadata.version(package)}".encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
