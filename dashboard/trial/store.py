"""Where a trial lives: a local folder or an S3 prefix. Lists files and reads bytes.

The only module that talks to boto3. Credentials come from boto3's standard chain,
and boto3 itself honours AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (MinIO, moto, ...).
"""
from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Sequence

from .errors import TrialAccessError, TrialError, TrialNotFoundError

READ_THREADS = 16


@dataclass(frozen=True)
class FileInfo:
    key: str  # path relative to the trial root, '/'-separated
    size: int
    version: str  # ETag (S3) or mtime_ns (local): changes when the content does


def fingerprint(files: Iterable[FileInfo]) -> str:
    """A digest of a listing: equal listings, equal trial content."""
    digest = hashlib.sha256()
    for info in sorted(files, key=lambda f: f.key):
        digest.update(f"{info.key}\0{info.size}\0{info.version}\n".encode())
    return digest.hexdigest()


def is_s3_path(path: str) -> bool:
    return path.startswith("s3://")


class LocalStore:
    """A trial folder on disk, optionally confined to allowed roots."""

    def __init__(self, path: str, roots: Sequence[str] | None = None):
        self.path = path
        root = os.path.realpath(os.path.expanduser(path))
        if roots is not None:
            allowed = [os.path.realpath(os.path.expanduser(r)) for r in roots]
            if not any(root == r or root.startswith(r.rstrip(os.sep) + os.sep) for r in allowed):
                raise TrialAccessError(
                    f"{path}: outside the allowed data roots ({', '.join(roots) or 'none configured'})")
        self.roots = roots
        self.root = root
        if not os.path.exists(root):
            raise TrialNotFoundError(f"{path}: no such folder")
        if not os.path.isdir(root):
            raise TrialNotFoundError(f"{path}: not a folder (a trial is a folder with framework/ and system/)")

    def list(self) -> list[FileInfo]:
        files = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            dirnames.sort()
            for name in filenames:
                full = os.path.join(dirpath, name)
                key = os.path.relpath(full, self.root).replace(os.sep, "/")
                try:
                    st = os.stat(full)
                except OSError:
                    continue  # removed (rotated) between listing and stat
                files.append(FileInfo(key, st.st_size, str(st.st_mtime_ns)))
        return files

    def resolve(self, key: str) -> str:
        """The real path of a file of the trial; refuses links that lead out of the trial."""
        full = os.path.realpath(os.path.join(self.root, key))
        if not full.startswith(self.root + os.sep):
            raise TrialAccessError(f"{key}: links outside the trial folder")
        return full

    def read(self, key: str) -> bytes:
        with open(self.resolve(key), "rb") as handle:
            return handle.read()


def _s3_client(max_pool_connections: int = READ_THREADS):
    import boto3
    from botocore.config import Config

    # Retries and timeouts live on the client: standard mode retries throttling,
    # 5xx and connection errors with backoff.
    config = Config(retries={"max_attempts": 4, "mode": "standard"}, connect_timeout=5,
                    read_timeout=30, max_pool_connections=max_pool_connections)
    return boto3.session.Session().client("s3", config=config)


class S3Store:
    """A trial under s3://bucket/prefix."""

    def __init__(self, path: str, client=None):
        self.path = path
        rest = path[len("s3://"):]
        self.bucket, _, prefix = rest.partition("/")
        if not self.bucket:
            raise TrialNotFoundError(f"{path}: no bucket in the S3 path")
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.client = client or _s3_client()

    def _error(self, exc) -> TrialError:
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchBucket", "404", "NotFound"):
                return TrialNotFoundError(f"{self.path}: bucket {self.bucket!r} does not exist")
            if code in ("AccessDenied", "403", "AllAccessDisabled", "InvalidAccessKeyId",
                        "SignatureDoesNotMatch", "ExpiredToken"):
                return TrialAccessError(f"{self.path}: access denied to bucket {self.bucket!r} ({code})")
            return TrialError(f"{self.path}: S3 error {code or type(exc).__name__}")
        if isinstance(exc, BotoCoreError):
            # The message names the endpoint, never the credentials.
            return TrialError(f"{self.path}: cannot reach S3 ({type(exc).__name__}: {exc})")
        return TrialError(f"{self.path}: {type(exc).__name__}: {exc}")

    def list(self) -> list[FileInfo]:
        from botocore.exceptions import BotoCoreError, ClientError

        files = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    key = obj["Key"][len(self.prefix):]
                    if key and not key.endswith("/"):
                        files.append(FileInfo(key, int(obj["Size"]), obj.get("ETag", "").strip('"')))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc) from None
        return files

    def read(self, key: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                # Removed between listing and reading (a running job's rotation): skip it.
                raise FileNotFoundError(f"{key}: removed since listing") from None
            raise self._error(exc) from None
        except BotoCoreError as exc:
            raise self._error(exc) from None


Store = LocalStore | S3Store


def open_store(path: str, roots: Sequence[str] | None = None, s3_client=None,
               s3_buckets: Sequence[str] | None = None) -> Store:
    """The store for a trial path: `s3://bucket/prefix` or a local folder.

    roots: when given, local paths must lie inside one of them.
    s3_buckets: when given, only these buckets may be read.
    """
    path = (path or "").strip()
    if not path:
        raise TrialNotFoundError("no trial path given")
    if is_s3_path(path):
        store = S3Store(path, client=s3_client)
        if s3_buckets is not None and store.bucket not in s3_buckets:
            raise TrialAccessError(f"{path}: bucket {store.bucket!r} is not in the allowed buckets")
        return store
    return LocalStore(path, roots=roots)


def read_many(store: Store, keys: Sequence[str], threads: int = READ_THREADS):
    """Yields (key, bytes or OSError) for each key, reading concurrently.

    An OSError (a file gone or unreadable) is the caller's to report as skipped; a
    TrialError (S3 unreachable, access denied) fails the whole read.
    """
    def one(key):
        try:
            return key, store.read(key)
        except OSError as exc:
            return key, exc

    if len(keys) <= 1:
        yield from map(one, keys)
        return
    with ThreadPoolExecutor(max_workers=min(threads, len(keys))) as pool:
        yield from pool.map(one, keys)
