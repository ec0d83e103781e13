"""Constants of the trial format (SageMaker Debugger profiler output).

Standard library only: the collector imports this inside training jobs, which
may not have pandas or Dash installed.
"""
from __future__ import annotations

import re

# Phases: the trace "process_name" that a small trace pid maps to.
PHASE_INIT = "DataLoaderIterInitialize"
PHASE_ITER = "DataLoaderIter"
PHASE_WORKER = "DataLoaderWorker"
PHASE_STEP_TRAIN = "Step:ModeKeys.TRAIN"
PHASE_STEP_EVAL = "Step:ModeKeys.EVAL"
# Written by this project's collector only (the reference never had them). Their names
# avoid "DataLoaderWorker" and "DataLoaderIter": the reference selects events by regex
# search on those words and would count them as workers or iterators.
PHASE_WORKER_FETCH = "DataLoaderFetch"
PHASE_FIRST_BATCH = "DataLoaderFirstBatch"
# The next() that ends an epoch (StopIteration): its start is the end of the epoch's last
# step, so training time needs no estimate of that step's compute.
PHASE_EPOCH_END = "DataLoaderEpochEnd"
# Written by the Kineto importer only: the moment a torch.profiler trace shows an iterator being
# created (its __init__'s seed draw, dashboard/trial/kineto_format.py), with no duration (the
# trace does not show where __init__ begins or ends). It says that the recording saw the
# iterator's first batch as its first, which Kineto's GetNexts alone cannot tell.
PHASE_CREATED = "DataLoaderCreated"
# The fetch phase's name in trials of the collector's first version: still read as fetches.
LEGACY_PHASE_WORKER_FETCH = "DataLoaderWorkerFetch"

# Event kinds the analysis cares about; everything else is "other".
# The iterator of a DataLoader of num_workers=0: its class alone says it has no workers.
SINGLE_PROCESS_ITER = "_SingleProcessDataLoaderIter"

KIND_INIT = "init"
KIND_GETNEXT = "getnext"
KIND_WORKER = "worker"
KIND_STEP = "step"
KIND_FETCH = "fetch"
KIND_EPOCH_END = "epoch_end"
KIND_CREATED = "created"
KIND_OTHER = "other"
KINDS = (KIND_INIT, KIND_GETNEXT, KIND_WORKER, KIND_STEP, KIND_FETCH, KIND_EPOCH_END, KIND_CREATED, KIND_OTHER)

# Event names, by iterator class ("_MultiProcessingDataLoaderIter", ...).
def init_event_name(iter_class: str) -> str:
    return f"{iter_class}.__init__"


def getnext_event_name(iter_class: str) -> str:
    return f"{iter_class}::GetNext"


def worker_event_name(iter_class: str) -> str:
    return f"{iter_class}.worker"


def epoch_end_event_name(iter_class: str) -> str:
    return f"{iter_class}.epoch_end"


def created_event_name(iter_class: str) -> str:
    return f"{iter_class}.created"


# Recognising events by name, for producers that did not name the phase.
GETNEXT_NAME_RE = re.compile(r"(DataLoaderIter::GetNext|DataLoaderIter\.__next__|::GetNext$)")
INIT_NAME_RE = re.compile(r"DataLoaderIter\.__init__$")
WORKER_NAME_RE = re.compile(r"DataLoaderIter\.worker$")
# In the DataLoaderIter phase an event is a GetNext (one batch) only if its name says so: the
# phase may hold other iterator events. What writes GetNexts there: the reference and this
# collector `<IterClass>::GetNext` (any iterator class, `_BaseDataLoaderIter` too), the Kineto
# reader `enumerate(DataLoader)#<IterClass>.__next__` and `enumerate(DataPipe)#<Pipe>`.
ITER_PHASE_GETNEXT_NAME_RE = re.compile(GETNEXT_NAME_RE.pattern + r"|^enumerate\(Data(?:Loader|Pipe)\)#")

# Event args keys.
ARG_PID = "pid"
ARG_STEP = "step_num"
ARG_WORKER_ID = "worker_id"
ARG_NUM_WORKERS = "num_workers"
ARG_PIN_MEMORY = "pin_memory"
ARG_ITERATOR_ID = "iterator_id"  # collector: one id per iterator instance
ARG_PERSISTENT = "persistent_workers"
ARG_PREFETCH = "prefetch_factor"
ARG_IN_ORDER = "in_order"
# collector fetch events: the worker process's CPU time during the fetch (a fetch that
# takes far longer than its CPU time waits on storage, the network or a lock)
ARG_CPU_US = "cpu_us"
# ...and the time it was runnable but waited for a core (Linux schedstat): CPU contention,
# told apart from waiting on storage or the network
ARG_RUNQ_US = "runq_us"
ARG_START_TIME = "start_time_since_epoch_in_micros"
# collector init events: the process's training rank and local rank, when the job is
# distributed (the node id's number alone cannot say whether it is a rank or a pid)
ARG_RANK = "rank"
ARG_LOCAL_RANK = "local_rank"

# Layout of a trial.
FRAMEWORK_DIR = "framework"
PEVENTS_DIR = "framework/pevents"
SYSTEM_DIR = "system/incremental"
FRAMEWORK_SUFFIXES = ("_pythontimeline.json", "_model_timeline.json", "_horovod_timeline.json",
                      "_smdataparallel_timeline.json")
# <END_US>_<NODE>_pythontimeline.json
FRAMEWORK_FILE_RE = re.compile(r"^(?P<end_us>\d+)_(?P<node>.+?)_(?:python|model|horovod|smdataparallel)timeline\.json(?:\.gz)?$")
# <NODE>_pythontimeline.json.tmp (file still being written)
FRAMEWORK_TMP_RE = re.compile(r"^(?P<node>.+?)_(?:python|model|horovod|smdataparallel)timeline\.json\.tmp$")
# <EPOCH_S>.<NODE>.json
SYSTEM_FILE_RE = re.compile(r"^(?P<epoch_s>\d+)\.(?P<node>.+?)\.json(?:\.gz|\.tmp)?$")


def hour_folder(epoch_us: int) -> str:
    """YYYYMMDDHH (UTC) of a time, the folder a closed file goes into."""
    import time

    return time.strftime("%Y%m%d%H", time.gmtime(epoch_us / 1e6))


def framework_file_key(end_us: int, node: str) -> str:
    return f"{PEVENTS_DIR}/{hour_folder(end_us)}/{end_us}_{node}_pythontimeline.json"


def framework_tmp_key(node: str) -> str:
    return f"{FRAMEWORK_DIR}/{node}_pythontimeline.json.tmp"


def system_file_key(epoch_s: int, node: str) -> str:
    return f"{SYSTEM_DIR}/{hour_folder(epoch_s * 1_000_000)}/{epoch_s}.{node}.json"


def framework_node_id(pid_or_rank: int, host_index: int = 1) -> str:
    """`<pid>-algo-<host>` or `<rank>-algo-<host>` as the reference names nodes."""
    return f"{pid_or_rank}-algo-{host_index}"


def system_node_id(host_index: int = 1) -> str:
    return f"algo-{host_index}"
