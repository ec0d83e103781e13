"""Hardening, round two (issue 15): files that are not files, caches that lie, a collector that
waits on a dead S3, and the server's smaller guards. Real parts: FIFOs and device nodes made here,
the moto S3 server of tests/conftest.py, real sockets, `python app.py ...` in processes of its own.

Expected numbers come from the generator's events and from the files as written (read with the
standard library), never from the reader under test.
"""
from __future__ import annotations

import errno
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from dashboard.synthetic import write_trial
from dashboard.trial.load import load_trial
from dashboard.trial.store import LocalStore, open_store
from tests.conftest import ROOT, CountingStore, upload_folder

APP = os.path.join(ROOT, "app.py")
LOAD_WITHIN_S = 20  # "within seconds" on a loaded 2-core machine; a FIFO used to block for ever
CLI_WITHIN_S = 120  # the CLI's imports (pandas, pyarrow) take a while on a busy machine


def framework_events(path: str) -> list[dict]:
    """The complete events of a framework file, read with the standard library."""
    with open(path, encoding="utf-8") as handle:
        return [e for e in json.load(handle) if e.get("ph") == "X"]


def getnexts_in(path: str) -> int:
    return sum(e["name"].endswith("::GetNext") for e in framework_events(path))


# --- 1. only regular files are read -------------------------------------------------------------


def make_char_device(path: str) -> None:
    """/dev/null's device node (1, 3) at `path`: a character device that reads as empty, so that a
    reader which opens it does no harm (/dev/zero's, which reads without end, filled memory)."""
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")


@pytest.fixture
def trial_with_special_files(tmp_path):
    """A trial with a FIFO named as a framework file, a character device named as a system file and
    a FIFO named as a Kineto trace (read in pieces): each is read by another path of the loader."""
    folder = tmp_path / "trial"
    written = write_trial(str(folder), epochs=1, rotate_s=0.1)
    first = written.framework_files[0]
    directory, base = first.rsplit("/", 1)
    stamp, rest = base.split("_", 1)
    fifo_key = f"{directory}/{int(stamp) + 1}_{rest}"  # a framework file's name, 1 us later
    device_key = written.system_files[0].replace(".algo-1.json", ".algo-9.json")
    trace_key = "rank0.pt.trace.json"
    os.mkfifo(folder / fifo_key)
    os.mkfifo(folder / trace_key)
    make_char_device(str(folder / device_key))
    yield folder, written, {fifo_key: "a FIFO", trace_key: "a FIFO", device_key: "a character device"}
    # A reader that still waits in open() on a FIFO (the failure) is let go: a writer comes.
    for key in (fifo_key, trace_key):
        try:
            os.close(os.open(folder / key, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # no reader waits


def test_fifos_and_a_character_device_in_a_trial_are_refused_and_the_rest_is_read(trial_with_special_files):
    folder, written, special = trial_with_special_files
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(trial=load_trial(str(folder))), daemon=True)
    thread.start()
    thread.join(LOAD_WITHIN_S)
    assert not thread.is_alive(), f"the load still runs after {LOAD_WITHIN_S} s (blocked on a FIFO?)"
    trial = outcome["trial"]
    skipped = {s.path: s.reason for s in trial.report.files_skipped}
    assert skipped == {key: f"refused: {kind}, not a regular file: not read" for key, kind in special.items()}
    assert trial.report.complete  # refused for good: such a trial may be cached
    assert trial.report.files_read == len(written.framework_files) + len(written.system_files)
    getnexts = trial.framework["name"].str.endswith("::GetNext").sum()
    assert getnexts == len(written.of_kind("getnext"))
    assert len(trial.system) == written.system_samples


def test_the_cli_refuses_them_too_and_finishes(trial_with_special_files):
    folder, written, special = trial_with_special_files
    try:
        done = subprocess.run([sys.executable, APP, "analyze", str(folder), "--json"], capture_output=True,
                              text=True, timeout=CLI_WITHIN_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"`app.py analyze` still ran after {CLI_WITHIN_S} s") from None
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    reasons = {s["path"]: s["reason"] for s in data["files"]["skipped"]}
    assert reasons == {key: f"refused: {kind}, not a regular file: not read" for key, kind in special.items()}
    assert data["getnext"]["count"] == len(written.of_kind("getnext"))


def test_a_file_is_read_no_further_than_its_listing_saw(tmp_path):
    """A file that grew after the listing is read as listed (the version the listing's fingerprint
    names, within the size the limits were checked against); one that shrank is an error that
    says so, which the loader reports as a skip that may pass."""
    (tmp_path / "f.json").write_bytes(b"0123456789")
    store = LocalStore(str(tmp_path))
    [info] = store.list()
    with open(tmp_path / "f.json", "ab") as handle:
        handle.write(b"grown since" * 1000)
    assert store.read("f.json", size=info.size) == b"0123456789"
    assert b"".join(store.iter_chunks("f.json", 3, size=info.size)) == b"0123456789"
    assert [len(p) for p in store.iter_chunks("f.json", 4, size=info.size)] == [4, 4, 2]
    (tmp_path / "f.json").write_bytes(b"01234")
    with pytest.raises(OSError, match="5 of the 10 bytes listed: changed since the listing"):
        store.read("f.json", size=info.size)


def test_a_gzip_kineto_traces_limit_counts_its_bytes_decompressed(tmp_path):
    """--max-trial-mb bounds what a load holds and scans: a Kineto trace's bytes once inflated. A
    67 kB .pt.trace.json.gz of 6.4 MB was loaded under a limit of 0.3 MB (its pieces were counted
    as stored)."""
    import gzip

    from dashboard.trial.errors import TrialTooLargeError

    padding = {"pad": "x" * 200}
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 7, "tid": 7, "ts": 1000.0 + i * 10,
               "dur": 2.0, "args": padding} for i in range(20_000)]
    events += [{"ph": "X", "cat": "user_annotation", "pid": 7, "tid": 7, "ts": 1000.0 + i * 2000, "dur": 50.0,
                "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"} for i in range(100)]
    document = json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": 1_795_986_600_000_000_000,
                           "traceEvents": events}).encode()
    trace = tmp_path / "host_7.1700000000000.pt.trace.json.gz"
    trace.write_bytes(gzip.compress(document))
    stored = trace.stat().st_size
    assert stored * 20 < len(document)
    for limit in (stored * 4, len(document) - 1):
        with pytest.raises(TrialTooLargeError) as caught:
            load_trial(str(tmp_path), max_bytes=limit)
        message = str(caught.value)
        assert message.startswith(f"{tmp_path}: trial is over the limit of ") and message.endswith(" once decompressed")
    trial = load_trial(str(tmp_path), max_bytes=len(document))
    assert (trial.framework["kind"] == "getnext").sum() == 100


# --- 2. one canonical key per trial -------------------------------------------------------------


def spellings(folder: str) -> list[str]:
    parent, name = os.path.split(folder)
    return [folder, folder + "/", f"{parent}/./{name}", f"{parent}//{name}", f" {folder} "]


def test_five_spellings_of_a_path_share_one_read_in_the_library(tmp_path):
    folder = str(tmp_path / "data" / "x")
    written = write_trial(folder, epochs=1, rotate_s=0.1)
    files = len(written.framework_files) + len(written.system_files)
    file_cache: dict = {}
    reads = []
    for path in spellings(folder):
        store = CountingStore(open_store(path))
        trial = load_trial(path, store=store, file_cache=file_cache)
        reads.append(len(store.reads))
        assert trial.framework["name"].str.endswith("::GetNext").sum() == len(written.of_kind("getnext"))
    assert reads == [files, 0, 0, 0, 0]


def test_five_spellings_of_a_path_share_one_read_in_the_server_cache(tmp_path, monkeypatch):
    from dashboard.web import cache as cache_module

    folder = str(tmp_path / "data" / "x")
    written = write_trial(folder, epochs=1, rotate_s=0.1)
    files = len(written.framework_files) + len(written.system_files)
    stores: list[CountingStore] = []

    def counting_open_store(path, **options):
        stores.append(CountingStore(open_store(path, **options)))
        return stores[-1]

    monkeypatch.setattr(cache_module, "open_store", counting_open_store)
    trials = cache_module.TrialCache(str(tmp_path / "cache"))
    loads = [trials.load(path, roots=[str(tmp_path)]) for path in spellings(folder)]
    assert [len(store.reads) for store in stores] == [files, 0, 0, 0, 0]
    assert len({key for key, _, _ in loads}) == 1
    assert [cached for _, _, cached in loads] == [False, True, True, True, True]


# --- 3. a cache entry holds only complete reads -------------------------------------------------


def test_s3_objects_deleted_after_the_listing_are_shown_but_not_cached_and_a_reload_reads_them(
        s3_client, tmp_path):
    from dashboard.web.cache import TrialCache

    folder = tmp_path / "trial"
    written = write_trial(str(folder), epochs=2, rotate_s=0.05)
    upload_folder(s3_client, str(folder), "hardening-two", "job")
    victims = written.framework_files[1:4]
    lost = sum(getnexts_in(str(folder / key)) for key in victims)
    assert lost > 0
    trials = TrialCache(str(tmp_path / "cache"))
    path = "s3://hardening-two/job"

    def delete_after_listing(_count):
        for key in victims:
            s3_client.delete_object(Bucket="hardening-two", Key=f"job/{key}")

    def getnexts(trial) -> int:
        return int(trial.framework["name"].str.endswith("::GetNext").sum())

    partial_key, partial, cached = trials.load(path, on_listed=delete_after_listing)
    assert not cached and not partial.report.complete
    assert {s.path for s in partial.report.files_skipped} == set(victims)
    assert all(s.transient and s.reason.startswith("cannot read") for s in partial.report.files_skipped)
    assert getnexts(partial) == len(written.of_kind("getnext")) - lost
    assert trials.trial(partial_key) is not None  # the page draws what was read, by its key

    for key in victims:  # restored as they were: same bytes, same ETag, same listing
        s3_client.upload_file(str(folder / key), "hardening-two", f"job/{key}")
    key, whole, cached = trials.load(path)  # Refresh
    assert not cached and key != partial_key
    assert whole.report.files_skipped == [] and whole.report.complete
    assert getnexts(whole) == len(written.of_kind("getnext"))
    again_key, _, cached = trials.load(path)
    assert cached and again_key == key  # the whole trial is kept


def test_a_trial_with_bad_lines_is_cached_with_its_report(tmp_path):
    from dashboard.web.cache import TrialCache

    folder = tmp_path / "trial"
    written = write_trial(str(folder), epochs=1, rotate_s=0.1)
    key = written.framework_files[0]
    lines = (folder / key).read_text().split("\n")
    lines[4] = lines[4][:20]  # a line cut short: skipped for good
    (folder / key).write_text("\n".join(lines))
    trials = TrialCache(str(tmp_path / "cache"))
    first_key, first, cached = trials.load(str(folder), roots=[str(tmp_path)])
    assert not cached and first.report.lines_skipped == 1 and first.report.complete
    second_key, second, cached = trials.load(str(folder), roots=[str(tmp_path)])
    assert cached and second_key == first_key
    assert second.report.lines_skipped == 1
    assert [s.path for s in second.report.files_with_skipped_lines] == [key]


# --- 5. folder depth ----------------------------------------------------------------------------


DEPTH = 3_000


def make_deep(top: str, depth: int) -> None:
    """`depth` nested folders `d` under `top`, made through folder descriptors (the whole path is
    longer than PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
    finally:
        os.close(fd)


def remove_deep(top: str) -> None:
    """Removes what make_deep made, without recursion (shutil.rmtree recurses per level)."""
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        while True:
            try:
                fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
            except FileNotFoundError:
                break
        while len(fds) > 1:
            os.close(fds.pop())
            os.rmdir("d", dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


def test_a_folder_3000_deep_is_listed_without_recursion(tmp_path):
    folder = tmp_path / "trial"
    written = write_trial(str(folder), epochs=1, rotate_s=0.1)
    make_deep(str(folder), DEPTH)
    try:
        trial = load_trial(str(folder))
    finally:
        remove_deep(str(folder))
    assert trial.framework["name"].str.endswith("::GetNext").sum() == len(written.of_kind("getnext"))
    [deep] = trial.report.files_skipped  # where the path grows past PATH_MAX: said, not a crash
    assert deep.path.startswith("d/d/") and deep.reason == f"cannot list this folder ({os.strerror(errno.ENAMETOOLONG)})"


# --- 4. the collector's upload wait has a bound ----------------------------------------------------


TRAIN = """
import sys, time
import torch
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=1)
batches = sum(1 for _ in loader)
with open(sys.argv[1], "w") as out:
    out.write(f"{batches} {time.time()}")
"""
UPLOAD_TIMEOUT_S = 3
# Past the upload timeout: the last flush, closing the files, the interpreter's exit, on a loaded
# machine. The job used to exit 217 s after training ended.
EXIT_MARGIN_S = 20


def test_a_job_whose_s3_hangs_exits_within_the_upload_timeout_and_says_what_stayed_local(tmp_path):
    from tests.conftest import SilentServer

    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with SilentServer(lifetime_s=UPLOAD_TIMEOUT_S + EXIT_MARGIN_S + 120) as server:
        # TMPDIR: the job's staging folder is made under tmp_path, and removed with it.
        env.update(PYTHONPATH=ROOT, AWS_ENDPOINT_URL_S3=server.url, AWS_ACCESS_KEY_ID="testing",
                   AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1", TMPDIR=str(tmp_path))
        command = [sys.executable, "-m", "dashboard.collector", "--out", "s3://hanging/job", "--no-system",
                   "--upload-timeout-s", str(UPLOAD_TIMEOUT_S), "--", str(script), str(tmp_path / "trained")]
        try:
            done = subprocess.run(command, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                                  timeout=UPLOAD_TIMEOUT_S + EXIT_MARGIN_S + 100)
        except subprocess.TimeoutExpired:
            raise AssertionError("the job did not exit in minutes") from None
        exited = time.time()
        assert server.accepted >= 1  # the uploads reached the endpoint, which never answered
    assert done.returncode == 0, done.stderr
    batches, trained = (tmp_path / "trained").read_text().split()
    assert int(batches) == 8
    waited = exited - float(trained)
    assert UPLOAD_TIMEOUT_S <= waited <= UPLOAD_TIMEOUT_S + EXIT_MARGIN_S, (waited, done.stderr)
    warning = next(line for line in done.stderr.splitlines() if "stayed local in " in line)
    staging, named = warning.split("stayed local in ")[1].split(": ", 1)
    assert os.path.dirname(staging) == str(tmp_path)
    keys = named.split(", ")
    assert keys and all(key.startswith("framework/pevents/") for key in keys), warning
    getnexts = sum(getnexts_in(os.path.join(staging, key)) for key in keys)
    assert getnexts == 8  # every batch, kept


# --- 6. a cache disk that fills up ----------------------------------------------------------------


def in_tmpfs(size_mib: int, mountpoint: str, command: list[str]) -> list[str]:
    """`command` in a mount namespace of its own, with a tmpfs of size_mib at `mountpoint`: a small
    disk that fills up, gone with the process (the machine's mounts are untouched)."""
    mount = f'mount -t tmpfs -o size={size_mib}m,mode=0700 tmpfs "$0" && exec "$@"'
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--propagation", "private", "sh", "-c", mount, mountpoint, *command]


@pytest.fixture(scope="module")
def small_disks(tmp_path_factory):
    probe = subprocess.run(in_tmpfs(1, str(tmp_path_factory.mktemp("probe")), ["true"]), capture_output=True,
                           text=True)
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace of its own: {probe.stderr.strip()}")


FILLING = """
import json, shutil, sys
sys.path.insert(0, sys.argv[1])
from dashboard.web.cache import TrialCache, free_space_reserve

cache_dir, root, paths = sys.argv[2], sys.argv[3], sys.argv[4:]
cache, keys, out = TrialCache(cache_dir), {}, []
for path in paths:
    key, trial, _ = cache.load(path, roots=[root])
    keys[path] = key
    usage = shutil.disk_usage(cache_dir)
    out.append({"getnexts": int(trial.framework["name"].str.endswith("::GetNext").sum()),
                "not_kept": cache.not_kept(), "free": usage.free, "reserve": free_space_reserve(usage.total),
                "kept": [f"trial:{keys[p]}" in cache.disk for p in paths if p in keys]})
again = TrialCache(cache_dir).trial(keys[paths[-1]])  # another process's view of the last one
print(json.dumps({"loads": out, "again": None if again is None else
                  int(again.framework["name"].str.endswith("::GetNext").sum())}))
"""


def test_a_cache_on_a_small_disk_culls_for_room_and_serves_what_it_cannot_keep(small_disks, tmp_path):
    """A 32 MiB disk, 16 MiB of it kept free for the job store: trial A (9.4 MB pickled; its empty
    columns take no room, web/cache.compact_pickle) is kept;
    B, as large, is kept by culling A (the cache's size limit, 2 GB, never would); C (20 MB) does
    not fit at all: it is loaded all the same, not kept, with the reason, and another process
    reads it again. Before, B's and C's loads failed ("database or disk is full", or ENOSPC) and
    the disk stayed full. (Sizes leave 5 MB either way for SQLite's own pages.)"""
    data = tmp_path / "data"
    written = {name: write_trial(str(data / name), epochs=epochs, train_batches=batches)
               for name, epochs, batches in (("a", 17, 4000), ("b", 17, 4000), ("c", 29, 5000))}
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    done = subprocess.run(in_tmpfs(32, str(cache_dir), [sys.executable, "-c", FILLING, ROOT, str(cache_dir),
                                                        str(data), *(str(data / name) for name in written)]),
                          capture_output=True, text=True, timeout=CLI_WITHIN_S)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    loads = found["loads"]
    assert [load["getnexts"] for load in loads] == [len(w.of_kind("getnext")) for w in written.values()]
    # C's load culls nothing: no culling would make room for it, so B stays. (The files' columns,
    # dashboard/trial/columnar_cache.py, yield to the trials on a disk this small: none is kept.)
    assert [load["kept"] for load in loads] == [[True], [False, True], [False, True, False]]
    assert loads[0]["not_kept"] is None and loads[1]["not_kept"] is None
    assert loads[2]["not_kept"].startswith("no room for it: ")
    # Values' files never go into the reserve; SQLite's rows and write-ahead log (about 4 MB a
    # database) may: that is what it is for.
    assert all(load["free"] >= load["reserve"] - 4 * 2**20 for load in loads), loads
    assert found["again"] == len(written["c"].of_kind("getnext"))


# --- 5. the smaller items -----------------------------------------------------------------------


def test_a_refused_path_is_named_as_typed_without_the_servers_roots(tmp_path):
    from dashboard.trial.errors import TrialAccessError

    root = tmp_path / "secret-layout" / "data"
    root.mkdir(parents=True)
    typed = "/etc/../etc"
    with pytest.raises(TrialAccessError) as caught:
        open_store(typed, roots=[str(root)])
    assert str(caught.value) == f"{typed}: outside the allowed data roots"
    assert "secret-layout" not in str(caught.value)


def modes(folder: str) -> dict[str, int]:
    """Permission bits of every file and folder under `folder` (its own included), by path."""
    found = {folder: stat.S_IMODE(os.stat(folder).st_mode)}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            found[os.path.join(dirpath, name)] = stat.S_IMODE(os.lstat(os.path.join(dirpath, name)).st_mode)
    return found


def test_the_cache_folder_is_made_private_and_its_files_0600(tmp_path):
    import diskcache

    from dashboard.web.cache import TrialCache
    from dashboard.web.server import ServerOptions, create_app

    cache_dir = tmp_path / "cache"
    old = os.umask(0o022)  # as a default login has it: 0755 folders, 0644 files
    try:
        os.makedirs(cache_dir / "trials")
        diskcache.Cache(str(cache_dir / "trials")).close()  # a cache an earlier version made
        assert modes(str(cache_dir))[str(cache_dir / "trials" / "cache.db")] == 0o644
        folder = tmp_path / "data" / "trial"
        write_trial(str(folder), epochs=2, train_batches=500)  # parses over diskcache's 32 kB: files
        create_app(ServerOptions(cache_dir=str(cache_dir), data_roots=[str(tmp_path / "data")]))
        TrialCache(str(cache_dir)).load(str(folder), roots=[str(tmp_path / "data")])  # values of files
    finally:
        os.umask(old)
    found = modes(str(cache_dir))
    value_files = [p for p in found if p.endswith(".val")]
    assert value_files, "the load kept parses large enough for files of their own"
    for name in (str(cache_dir), str(cache_dir / "trials"), str(cache_dir / "jobs")):
        assert found[name] == 0o700, name
    loose = {p: oct(m) for p, m in found.items() if os.path.isfile(p) and m != 0o600}
    assert loose == {}


def _cache_folder_of_another_user(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    os.chown(cache_dir, 54321, 54321)
    return cache_dir


def test_a_cache_folder_of_another_user_is_refused(tmp_path):
    from dashboard.web.cache import TrialCache

    cache_dir = _cache_folder_of_another_user(tmp_path)
    with pytest.raises(PermissionError, match="belongs to another user"):
        TrialCache(str(cache_dir))


def test_a_file_count_limit_refuses_the_trial_with_a_clear_message(tmp_path, monkeypatch):
    from dashboard.trial.errors import TrialTooLargeError
    from dashboard.web.cache import TrialCache
    from dashboard.web.options import DEFAULT_MAX_FILES
    from dashboard.web.server import options_from_environment

    folder = tmp_path / "trial"
    written = write_trial(str(folder), epochs=1, rotate_s=0.1)
    files = len(written.framework_files) + len(written.system_files)
    message = f"{folder}: trial holds {files:,} files, over the limit of {files - 1:,} files"
    with pytest.raises(TrialTooLargeError) as caught:
        load_trial(str(folder), max_files=files - 1)
    assert str(caught.value) == message
    assert len(load_trial(str(folder), max_files=files).framework)
    from dashboard.web import cache as cache_module

    stores: list[CountingStore] = []

    def counting_open_store(path, **options):
        stores.append(CountingStore(open_store(path, **options)))
        return stores[-1]

    monkeypatch.setattr(cache_module, "open_store", counting_open_store)
    with pytest.raises(TrialTooLargeError) as caught:
        TrialCache(str(tmp_path / "cache"), max_files=files - 1).load(str(folder))
    assert str(caught.value) == message
    assert len(stores) == 1 and stores[0].reads == []  # refused before a file is read
    done = subprocess.run([sys.executable, APP, "analyze", str(folder), "--max-files", str(files - 1)],
                          capture_output=True, text=True, timeout=CLI_WITHIN_S)
    assert done.returncode == 2 and done.stderr.strip() == f"error: {message}"
    assert options_from_environment({}).max_files == DEFAULT_MAX_FILES
    assert options_from_environment({"DASHBOARD_MAX_FILES": "7"}).max_files == 7


def test_the_allowed_hosts_default_follows_the_bind():
    from dashboard.web.options import add_serve_arguments
    from dashboard.web.server import ServerOptions, options_from_args, options_from_environment
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert options_from_args(parser.parse_args([])).host_allow_list() == ["localhost", "127.0.0.1", "[::1]", "::1"]
    assert options_from_args(parser.parse_args(["--host", "0.0.0.0"])).host_allow_list() is None
    chosen = options_from_args(parser.parse_args(["--host", "0.0.0.0", "--allowed-host", "dash.example"]))
    assert chosen.host_allow_list() == ["dash.example"]
    assert ServerOptions(allowed_hosts=["*"]).host_allow_list() is None
    # gunicorn's bind is not known to the app: any host, unless DASHBOARD_ALLOWED_HOSTS says.
    assert options_from_environment({}).host_allow_list() is None
    assert options_from_environment({"DASHBOARD_ALLOWED_HOSTS": "a.example, b.example"}).host_allow_list() == [
        "a.example", "b.example"]


def test_max_loads_comes_from_the_core_count_the_command_line_or_the_environment():
    import argparse

    from dashboard.web.options import add_serve_arguments, default_max_loads
    from dashboard.web.server import options_from_args, options_from_environment

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert default_max_loads() == len(os.sched_getaffinity(0))
    assert options_from_args(parser.parse_args([])).max_loads == default_max_loads()
    assert options_from_args(parser.parse_args(["--max-loads", "3"])).max_loads == 3
    assert options_from_environment({}).max_loads == default_max_loads()
    assert options_from_environment({"DASHBOARD_MAX_LOADS": "0"}).max_loads == 0  # no limit
    with pytest.raises(ValueError, match="DASHBOARD_MAX_LOADS"):
        options_from_environment({"DASHBOARD_MAX_LOADS": "many"})


class Served:
    """`python app.py serve ARGS` on a free port of 127.0.0.1; its log in a file. wrap(command):
    the command line that runs it (in_tmpfs, say)."""

    def __init__(self, tmp_path, *args: str, wrap=lambda command: command):
        from tests.conftest import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"server-{self.port}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONUNBUFFERED="1")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(wrap([sys.executable, APP, "serve", "--port", str(self.port), *args]),
                                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 90) -> "Served":
        import requests

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log()
            try:
                requests.get(self.url + "/healthz", timeout=2)
                return self
            except requests.RequestException:
                time.sleep(0.2)
        raise AssertionError(f"the server did not answer within {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def raw_get(port: int, host_header: str, path: str = "/") -> tuple[int, dict]:
    """A GET over a plain socket with exactly this Host header (requests would set its own)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in head[1:])
    return int(head[0].split()[1]), headers


def test_the_host_header_is_checked_and_every_response_has_the_security_headers(tmp_path):
    import requests

    from tests.dash_http import DashSession

    served = Served(tmp_path).wait_ready()
    chosen = Served(tmp_path, "--allowed-host", "dash.example").wait_ready()
    try:
        for host in (f"127.0.0.1:{served.port}", f"localhost:{served.port}", "[::1]"):
            assert raw_get(served.port, host)[0] == 200, host
        status, headers = raw_get(served.port, f"rebound.example:{served.port}", "/x%0Aforged")
        assert status == 400
        assert headers["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        assert raw_get(chosen.port, f"dash.example:{chosen.port}")[0] == 200
        assert raw_get(chosen.port, f"127.0.0.1:{chosen.port}")[0] == 400

        page = DashSession(served.url + "/").open()
        responses = [requests.get(served.url + path, timeout=30) for path in ("/", "/healthz", "/_dash-layout",
                                                                              "/_dash-dependencies", "/assets/no-such-file.css")]
        responses.append(requests.post(served.url + "/_dash-update-component", params={"endId": page.end_id},
                                       json={"inputs": []}, timeout=30))
        assert [r.status_code for r in responses] == [200, 200, 200, 200, 404, 500]
        for response in responses:
            assert response.headers["X-Frame-Options"] == "DENY", response.url
            policy = response.headers["Content-Security-Policy"]
            assert "script-src 'self' 'unsafe-inline' 'unsafe-eval'" in policy and "default-src 'self'" in policy
    finally:
        served.stop()
        chosen.stop()
    log = served.log()
    rejected = [line for line in log.splitlines() if "rejected" in line]
    assert len(rejected) == 2, log  # one line per rejected request
    assert not any(line.startswith("forged") for line in log.splitlines())  # a newline in the URL, escaped
    assert "Host 'rebound.example:" in rejected[0] and "KeyError: 'output'" in rejected[1]
    assert "Traceback" not in log


@pytest.mark.browser
def test_the_page_loads_under_the_content_security_policy(dash_duo, tmp_path):
    """The policy lets Dash, plotly and the grid run: the sample trial is drawn, and the browser
    reports no violation of it."""
    from dashboard.web.server import SAMPLE_TRIAL, ServerOptions, create_app
    from tests.conftest import free_port

    app = create_app(ServerOptions(cache_dir=str(tmp_path / "cache")))
    dash_duo.start_server(app, port=free_port())
    trial = load_trial(SAMPLE_TRIAL)
    getnexts = int(trial.framework["name"].str.endswith("::GetNext").sum())
    dash_duo.wait_for_text_to_equal("#getnext-count", f"{getnexts:,}", timeout=60)
    dash_duo.wait_for_element("#getnext-histogram .js-plotly-plot .main-svg", timeout=30)
    policy = dash_duo.driver.execute_script(
        "return fetch(window.location.href).then(r => r.headers.get('Content-Security-Policy'))")
    assert "script-src" in policy
    violations = [entry["message"] for entry in dash_duo.driver.get_log("browser")
                  if "Content Security Policy" in entry["message"] or "Refused to" in entry["message"]]
    assert violations == []


@pytest.mark.browser
def test_a_full_cache_disk_is_said_on_the_page_and_the_trial_still_shown(small_disks, dash_duo, tmp_path):
    """The server's cache on a 40 MiB disk that something else fills: a trial loaded before is
    still served from the cache; a new one is shown, with a message that the cache could not
    keep it. Before, every load on a full cache disk ended without a word (HTTP 204)."""
    data = tmp_path / "data"
    small = write_trial(str(data / "small"), epochs=1)
    big = write_trial(str(data / "big"), epochs=4, train_batches=2000)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    served = Served(tmp_path, "--cache-dir", str(cache_dir), "--data-root", str(data),
                    wrap=lambda command: in_tmpfs(40, str(cache_dir), command)).wait_ready()
    try:
        def show(path, written):
            dash_duo.wait_for_page(f"{served.url}/?trial={path}", timeout=30)
            dash_duo.wait_for_text_to_equal("#getnext-count", str(len(written.of_kind("getnext"))), timeout=60)
            return dash_duo.find_element("#error-message").text

        assert show(data / "small", small) == ""
        # Something else fills the disk, to 2 MiB free: far below what the cache keeps free
        # (16 MiB), enough for the job store's small writes.
        disk = f"/proc/{served.process.pid}/root{cache_dir}"
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        with open(f"{disk}/filler", "wb") as filler:
            for _ in range((free - 2 * 2**20) // 2**20):
                filler.write(b"\0" * 2**20)
        message = show(data / "big", big)
        assert message.startswith("The server's cache could not keep this trial (no room for it: "), message
        assert "it is shown, and read again when needed" in message
        assert show(data / "small", small) == ""  # kept before: still served from the cache
    finally:
        served.stop()
    assert "Traceback" not in served.log(), served.log()



@pytest.mark.browser
def test_the_url_names_the_trial_in_its_one_spelling_and_opens_the_same_trial(dash_duo, tmp_path):
    """?trial= spelled `/data/./x/` loads the trial and the URL then says `/data/x`, the spelling
    its cache key is made from; that URL opened again is the same trial, read once."""
    from urllib.parse import parse_qs, urlsplit

    import diskcache

    from dashboard.web.server import ServerOptions, create_app
    from tests.conftest import free_port

    folder = tmp_path / "data" / "x"
    written = write_trial(str(folder), epochs=1)
    cache_dir = tmp_path / "cache"
    app = create_app(ServerOptions(cache_dir=str(cache_dir), data_roots=[str(tmp_path / "data")]))
    dash_duo.start_server(app, port=free_port())
    getnexts = str(len(written.of_kind("getnext")))

    def trial_in_url() -> str:
        return parse_qs(urlsplit(dash_duo.driver.current_url).query).get("trial", [""])[0]

    dash_duo.wait_for_page(f"{dash_duo.server_url}/?trial={tmp_path}/data/./x/", timeout=30)
    dash_duo.wait_for_text_to_equal("#getnext-count", getnexts, timeout=60)
    deadline = time.monotonic() + 10
    while trial_in_url() != str(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert trial_in_url() == str(folder)
    dash_duo.wait_for_page(dash_duo.driver.current_url, timeout=30)  # the copied link, opened
    dash_duo.wait_for_text_to_equal("#getnext-count", getnexts, timeout=60)
    assert trial_in_url() == str(folder)
    with diskcache.Cache(str(cache_dir / "trials")) as disk:  # (the page first opened the sample)
        ours = [k for k in disk if str(k).startswith("trial:") and disk[k].path.startswith(str(tmp_path))]
    assert len(ours) == 1  # one key, one read


def test_serve_on_a_cache_folder_of_another_user_says_so_in_one_line(tmp_path):
    # It raised out of `serve` with a traceback; a server that cannot start says why in one line.
    cache_dir = _cache_folder_of_another_user(tmp_path)
    done = subprocess.run([sys.executable, APP, "serve", "--cache-dir", str(cache_dir),
                           "--port", "0"], capture_output=True, text=True, timeout=CLI_WITHIN_S)
    assert done.returncode == 2, done
    assert done.stderr.strip().splitlines() == [
        f"error: the cache folder {cache_dir} belongs to another user (uid 54321); give the cache a folder of its own"]
