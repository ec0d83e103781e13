"""Where a trial lives: a local folder or an S3 prefix. Lists files and reads bytes.

The only module that talks to boto3. Credentials come from boto3's standard chain,
and boto3 itself honours AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (MinIO, moto, ...).
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

from .errors import FileOutsideTrialError, NotAFileError, TrialAccessError, TrialError, TrialNotFoundError

READ_THREADS = 16
# A large file read in pieces of this size (a Kineto trace of GBs never whole in memory).
READ_CHUNK_BYTES = 8 << 20
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux; S3 keys are at most 1024 bytes


class _RedactCredentials(logging.Filter):
    """botocore's debug log shows the access key id, session tokens and request signatures
    (a signed request can be replayed for minutes): keep them out of any log a deployment
    turns on."""

    _SECRET = re.compile(r"(?i)(signature[=:]\s*|credential=|x-amz-security-token['\"]?[=:]\s*b?['\"]?|"
                         r"awsaccesskeyid=|authorization['\"]?:\s*b?['\"]?)[^\s,'\"&]+")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = self._SECRET.sub(r"\1<redacted>", message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


for _name in ("botocore.auth", "botocore.endpoint", "botocore.httpsession", "botocore.parsers",
              "urllib3.connectionpool"):
    logging.getLogger(_name).addFilter(_RedactCredentials())


@dataclass(frozen=True)
class FileInfo:
    key: str  # path relative to the trial root, '/'-separated
    size: int
    version: str  # ETag (S3) or local_version: changes when the content does


def local_version(st: os.stat_result) -> str:
    """A local file's version: its mtime, and its ctime, which a copy that keeps the mtime
    (cp -p, rsync -t, tar x: os.utime) cannot set back. A file rewritten at its old size and
    time was read as unchanged, every cache serving the old content."""
    return f"{st.st_mtime_ns}.{st.st_ctime_ns}"


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
        if "\0" in path:
            raise TrialNotFoundError(f"{path!r}: not a valid path (it contains a NUL character)")
        root = os.path.realpath(os.path.expanduser(path))
        if roots is not None:
            allowed = [os.path.realpath(os.path.expanduser(r)) for r in roots]
            if not any(root == r or root.startswith(r.rstrip(os.sep) + os.sep) for r in allowed):
                # Named as typed, never with the roots: they tell a visitor the server's layout.
                raise TrialAccessError(f"{path}: outside the allowed data roots"
                                       + ("" if roots else " (none configured)"))
        self.roots = roots
        self.root = root
        if not os.path.exists(root):
            raise TrialNotFoundError(f"{path}: no such file or folder")
        # A single file is a trial of one file (a PyTorch profiler trace given as the path):
        # its folder is the store's, and that one file all it lists.
        self.single_file = os.path.basename(root) if os.path.isfile(root) else None
        if not self.single_file and not os.path.isdir(root):
            raise TrialNotFoundError(f"{path}: not a folder or a regular file")
        self.folder = os.path.dirname(root) if self.single_file else root
        # (key, reason) of what the last list() left out: links to folders are not followed.
        self.skipped: list[tuple[str, str]] = []

    @property
    def canonical_path(self) -> str:
        """The one name of this trial, however its path was spelled (`/data/x/`, `/data/./x`,
        `/data//x`, a link to it): what caches key it by, so that each spelling is not a read."""
        return self.root

    def list(self) -> list[FileInfo]:
        if self.single_file:
            st = os.stat(self.root)
            self.skipped = []
            return [FileInfo(self.single_file, st.st_size, local_version(st))]
        files, skipped = [], []
        # A stack, not os.walk: Python 3.11's os.walk recurses once per folder level, and a
        # folder 3,000 deep ended the load in a RecursionError.
        folders = [self.root]
        while folders:
            folder = folders.pop()
            key = os.path.relpath(folder, self.root).replace(os.sep, "/")
            try:
                with os.scandir(folder) as scan:
                    entries = sorted(scan, key=lambda e: e.name)
            except FileNotFoundError:
                continue  # removed (rotated) since its parent was listed
            except OSError as exc:  # no permission, a path over PATH_MAX
                skipped.append((key, f"cannot list this folder ({exc.strerror or exc})"))
                continue
            below = []
            for entry in entries:
                key = os.path.relpath(entry.path, self.root).replace(os.sep, "/")
                try:
                    is_folder = entry.is_dir()  # follows links, as os.walk does
                except OSError:
                    is_folder = False
                if is_folder:
                    if entry.is_symlink():
                        target = os.path.realpath(entry.path)
                        where = "inside" if target.startswith(self.root + os.sep) else "outside"
                        skipped.append((key, f"a link to a folder {where} the trial folder: not followed"))
                    else:
                        below.append(entry.path)
                    continue
                try:
                    st = os.stat(entry.path)
                except OSError:
                    if not entry.is_symlink():
                        continue  # removed (rotated) between listing and stat
                    st = os.lstat(entry.path)  # a broken link: listed, so that reading it says why
                files.append(FileInfo(key, st.st_size, local_version(st)))
            folders.extend(reversed(below))  # depth first, in name order
        self.skipped = skipped
        return files

    def resolve(self, key: str) -> str:
        """The real path of a file of the trial; refuses links that lead out of the trial."""
        full = os.path.realpath(os.path.join(self.folder, key))
        inside = full == self.root if self.single_file else full.startswith(self.root + os.sep)
        if not inside:
            raise FileOutsideTrialError(f"{key}: links outside the trial folder")
        return full

    def _open(self, key: str):
        """The trial's file `key`, open for reading, once it is known to be a regular file."""
        full = self.resolve(key)
        # Checked before opening, so that no device is ever opened (opening one can act:
        # a tape rewinds, a terminal becomes ours); and again after, on what was opened.
        _refuse_unless_regular(os.stat(full).st_mode)
        # O_NONBLOCK: a FIFO put in the file's place meanwhile opens at once instead of waiting
        # for a writer for ever (it changes nothing for a regular file). O_NOCTTY: a terminal
        # never becomes this process's.
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            _refuse_unless_regular(os.fstat(fd).st_mode)
            return open(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def read(self, key: str, size: int | None = None) -> bytes:
        """The file's bytes, at most `size` of them (the size its listing saw: a file that grew
        since is read as listed, the version the listing's fingerprint names); without `size`,
        as large as it is now. OSError for a file shorter than `size` (changed since)."""
        return b"".join(self.iter_chunks(key, chunk_bytes=None, size=size))

    def iter_chunks(self, key: str, chunk_bytes: int | None = READ_CHUNK_BYTES,
                    size: int | None = None) -> Iterator[bytes]:
        """The file's bytes, chunk_bytes at a time (None: in one piece), for files too large to
        hold whole; at most `size` of them, as read() reads. The file is opened (and its path
        checked) now; reading it may raise OSError later."""
        handle = self._open(key)
        bound = os.fstat(handle.fileno()).st_size if size is None else size

        def chunks():
            with handle:
                yield from _read_at_most(handle.read, bound, chunk_bytes)
        return chunks()


_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _refuse_unless_regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
        raise NotAFileError(f"{kind}, not a regular file: not read")


class FileChangedError(OSError):
    """A file holds fewer bytes than its listing saw: rewritten since. Skipped, as a file
    removed since the listing is; never kept as the version the listing names."""


def _read_at_most(read: Callable[[int], bytes], size: int, chunk_bytes: int | None) -> Iterator[bytes]:
    """`size` bytes from read(n), chunk_bytes at a time (None: in one piece), never asking for
    more; OSError when they end before `size`."""
    left = size
    while left > 0:
        piece = read(min(chunk_bytes or left, left))
        if not piece:
            raise FileChangedError(f"{size - left:,} of the {size:,} bytes listed: changed since the listing")
        left -= len(piece)
        yield piece


def _s3_client(max_pool_connections: int = READ_THREADS):
    import boto3
    from botocore.config import Config

    # Retries and timeouts live on the client: standard mode retries throttling, 5xx and
    # connection errors, 3 attempts in all with a random backoff of at most 1 s, then 2 s.
    # So a request to a dead endpoint fails within about 3 s (connection refused) or
    # 3 x 2 s + 3 s (connect unanswered), to a server that stops answering mid-request
    # within 3 x 10 s + 3 s.
    config = Config(retries={"total_max_attempts": 3, "mode": "standard"}, connect_timeout=2,
                    read_timeout=10, max_pool_connections=max_pool_connections)
    return boto3.session.Session().client("s3", config=config)


class S3Store:
    """A trial under s3://bucket/prefix."""

    def __init__(self, path: str, client=None):
        self.path = path
        rest = path[len("s3://"):]
        self.bucket, _, prefix = rest.partition("/")
        if not self.bucket:
            raise TrialNotFoundError(f"{path}: no bucket in the S3 path")
        if _has_dot_segment(prefix):
            # S3 keys are literal, but a proxy or S3-compatible server may normalise them
            # into another bucket: no way around the bucket allow-list.
            raise TrialAccessError(f"{path}: '.' and '..' are not allowed in an S3 path")
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        # Where the listed keys are: the prefix, or the folder of a single object given as the
        # path (a PyTorch profiler trace), which is then all the trial lists.
        self._read_prefix = self.prefix
        self.client = client or _s3_client()
        self.skipped: list[tuple[str, str]] = []  # (key, reason) left out by the last list()

    @property
    def canonical_path(self) -> str:
        """The one name of this trial: `s3://bucket/prefix/` (`s3://b/p` and `s3://b/p/` list
        the same keys)."""
        return f"s3://{self.bucket}/{self.prefix}"

    def _error(self, exc) -> TrialError:
        from botocore.exceptions import (BotoCoreError, ClientError, NoCredentialsError,
                                         ParamValidationError)

        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchBucket", "404", "NotFound"):
                return TrialNotFoundError(f"{self.path}: bucket {self.bucket!r} does not exist")
            if code in ("AccessDenied", "403", "AllAccessDisabled", "InvalidAccessKeyId",
                        "SignatureDoesNotMatch", "ExpiredToken"):
                return TrialAccessError(f"{self.path}: access denied to bucket {self.bucket!r} ({code})")
            return TrialError(f"{self.path}: S3 error {code or type(exc).__name__}")
        if isinstance(exc, NoCredentialsError):
            return TrialAccessError(f"{self.path}: no AWS credentials found")
        if isinstance(exc, ParamValidationError):
            return TrialNotFoundError(f"{self.path}: not a valid S3 path ({redact(str(exc))})")
        if isinstance(exc, BotoCoreError):
            # The message names the endpoint, never the credentials or a query string.
            return TrialError(f"{self.path}: cannot reach S3 ({type(exc).__name__}: {redact(str(exc))})")
        return TrialError(f"{self.path}: {type(exc).__name__}: {redact(str(exc))}")

    def list(self) -> list[FileInfo]:
        from botocore.exceptions import BotoCoreError, ClientError

        files, skipped = [], []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    key = obj["Key"][len(self.prefix):]
                    if _has_dot_segment(key):
                        skipped.append((key, "refused: '.' or '..' in the key"))
                    elif key and not key.endswith("/"):
                        files.append(FileInfo(key, int(obj["Size"]), obj.get("ETag", "").strip('"')))
            if not files and not skipped and self.prefix:
                files = self._single_object()
        except (ClientError, BotoCoreError, OSError) as exc:
            raise self._error(exc) from None
        self.skipped = skipped
        return files

    def _single_object(self) -> list[FileInfo]:
        """The object named by the path itself, when nothing lies under it as a folder."""
        from botocore.exceptions import ClientError

        key = self.prefix.rstrip("/")
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return []
            raise
        folder, _, name = key.rpartition("/")
        self._read_prefix = folder + "/" if folder else ""
        return [FileInfo(name, int(head["ContentLength"]), head.get("ETag", "").strip('"'))]

    def read(self, key: str, size: int | None = None) -> bytes:
        """The object's bytes, at most `size` of them (the size its listing saw)."""
        return b"".join(self.iter_chunks(key, chunk_bytes=None, size=size))

    def iter_chunks(self, key: str, chunk_bytes: int | None = READ_CHUNK_BYTES,
                    size: int | None = None) -> Iterator[bytes]:
        """The object's bytes, chunk_bytes at a time (None: in one piece), at most `size` of
        them. The request is made now; a connection lost while reading the body raises
        TrialError later, an object shorter than `size` (replaced since) FileChangedError."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._read_prefix + key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                # Removed between listing and reading (a running job's rotation): skip it.
                raise FileNotFoundError(f"{key}: removed since listing") from None
            raise self._error(exc) from None
        except (BotoCoreError, OSError) as exc:
            raise self._error(exc) from None
        body = response["Body"]
        bound = int(response.get("ContentLength") or 0) if size is None else size

        def chunks():
            try:
                yield from _read_at_most(body.read, bound, chunk_bytes)
            except FileChangedError:
                raise
            except (BotoCoreError, OSError) as exc:
                # A connection lost mid-body must fail the load, never skip the file as if gone.
                raise self._error(exc) from None
            finally:
                body.close()
        return chunks()

    def put_file(self, key: str, local_path: str) -> None:
        """Upload a local file as `key` under the trial prefix (the collector's closed files)."""
        from boto3.exceptions import S3UploadFailedError
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            # In the calling thread: the transfer's own threads are not daemons, so a process
            # whose uploads hang on an S3 that never answers could not exit while they wait.
            self.client.upload_file(local_path, self.bucket, self.prefix + key,
                                    Config=TransferConfig(use_threads=False))
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc) from None
        except S3UploadFailedError as exc:
            cause = exc.__cause__ or exc.__context__  # boto3 wraps the ClientError
            if isinstance(cause, ClientError):
                raise self._error(cause) from None
            raise TrialError(f"{self.path}: upload of {key} failed ({exc})") from None


Store = LocalStore | S3Store

# A URL's userinfo ("user:password@" after its scheme, as in an endpoint such as
# AWS_ENDPOINT_URL=http://user:secret@host), found after every scheme in the message, one inside
# another URL's path too; and a URL up to its query string, then the query string.
# A userinfo is text up to an "@" before the next "/", or "user:password@" whose password holds
# "/" (an AWS secret key may: base64), "@" excluded, and does not begin as a port does (digits,
# then "/": http://minio:9000/bucket/user@example.com/trial is a host, a port and a path).
# Linear in the message: a scheme starts only where a word does; the first form is looked for
# up to the next "/" (which ends the scheme's own "//" of the next URL), the second's password
# for at most MAX_PASSWORD_CHARS, without going back (possessive), so no search scans more than
# that much of the text again; and once a URL's scheme is found the query's match cannot fail.
MAX_PASSWORD_CHARS = 128
_USERINFO = re.compile(r"""\b(\w+://)([^\s"'/]*|[^\s"'/:@]++:(?!\d*/)[^\s"'@]{0,%d}+)@""" % MAX_PASSWORD_CHARS)
_URL_QUERY = re.compile(r"""(\b\w+://[^\s"'?]*)(?:\?[^\s"']*)?""")


def redact(message: str) -> str:
    """A message without the userinfo (user:password@) and the query strings (a presigned URL's
    signature) of the URLs in it. A userinfo is cut wherever the message repeats it too: a path
    typed as s3://key:secret@bucket comes back in a bucket's name. So is each "/"-piece of one
    with a "/" (s3://key:sec/ret@bucket names the bucket "key:sec"), of 4 characters or more
    (a shorter one tells little, and would cut ordinary words)."""
    userinfos = {found.group(2) for found in _USERINFO.finditer(message) if found.group(2)}
    message = _URL_QUERY.sub(r"\1", _USERINFO.sub(r"\1", message))
    repeats = {userinfo + "@" for userinfo in userinfos}
    repeats.update(piece for userinfo in userinfos if "/" in userinfo
                   for piece in userinfo.split("/") if len(piece) >= 4)
    # The longest first (a shorter one inside a longer one would leave most of it), the first
    # MAX_USERINFOS of them, each a pass over the message (a message of thousands of userinfos,
    # typed to stall a server, would take them all times its length).
    for repeat in sorted(repeats, key=lambda text: (-len(text), text))[:MAX_USERINFOS]:
        message = message.replace(repeat, "")
    return message


MAX_USERINFOS = 64


def _has_dot_segment(key: str) -> bool:
    return any(part in (".", "..") for part in key.split("/"))


def open_store(path: str, roots: Sequence[str] | None = None, s3_client=None,
               s3_buckets: Sequence[str] | None = None) -> Store:
    """The store for a trial path: `s3://bucket/prefix` or a local folder.

    roots: when given, local paths must lie inside one of them.
    s3_buckets: when given, only these buckets may be read.
    """
    path = (path or "").strip()
    if not path:
        raise TrialNotFoundError("no trial path given")
    if len(path) > MAX_PATH_CHARS:
        # Path resolution gets quadratically slower with length: refuse before touching it.
        raise TrialNotFoundError(f"{path[:100]}...: a path of {len(path):,} characters "
                                 f"(the limit is {MAX_PATH_CHARS:,})")
    if is_s3_path(path):
        store = S3Store(path, client=s3_client)
        if s3_buckets is not None and store.bucket not in s3_buckets:
            raise TrialAccessError(f"{path}: bucket {store.bucket!r} is not in the allowed buckets")
        return store
    return LocalStore(path, roots=roots)
