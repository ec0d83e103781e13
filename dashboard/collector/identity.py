"""Who is recording: node ids of this process, following the trial format's conventions.

Framework node: `<rank>-algo-<host>` in a distributed job (torch.distributed initialised,
or RANK set by torchrun / SageMaker), else `<pid>-algo-<host>`. System node: `algo-<host>`,
written by local rank 0 only (LOCAL_RANK, or Open MPI's local rank) so that a host's
metrics are recorded once; ranks with no local rank known leave it to rank 0.

The host index comes from SageMaker's SM_CURRENT_HOST (`algo-N`), else torchrun's
GROUP_RANK / NODE_RANK (0-based, so +1), else 1.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Mapping

from .. import format as fmt


_LOCAL_RANK_KEYS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


@dataclass(frozen=True)
class Identity:
    node: str  # framework node id
    system_node: str | None  # None: another local rank records this host's system metrics
    rank: int | None
    host_index: int
    local_rank: int | None = None


def host_index(env: Mapping[str, str]) -> int:
    match = re.fullmatch(r"algo-(\d+)", env.get("SM_CURRENT_HOST", "").strip())
    if match:
        return int(match.group(1))
    for key in ("GROUP_RANK", "NODE_RANK"):
        value = env.get(key, "").strip()
        if value.isdigit():
            return int(value) + 1
    return 1


def _dist_rank() -> int | None:
    """The torch.distributed rank when a process group is initialised (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a half-initialised group: fall back to the environment
        return None
    return None


def identify(env: Mapping[str, str] | None = None, pid: int | None = None) -> Identity:
    env = os.environ if env is None else env
    pid = os.getpid() if pid is None else pid
    host = host_index(env)
    rank = _dist_rank()
    if rank is None and env.get("RANK", "").strip().isdigit():
        rank = int(env["RANK"])
    local_rank = next((env[k].strip() for k in _LOCAL_RANK_KEYS if env.get(k, "").strip().isdigit()), None)
    if local_rank is not None:
        records_system = int(local_rank) == 0
    else:  # ranks without a local rank: only rank 0, so that two never write one host's files
        records_system = rank is None or rank == 0
    node = fmt.framework_node_id(rank if rank is not None else pid, host)
    return Identity(node=node, system_node=fmt.system_node_id(host) if records_system else None,
                    rank=rank, host_index=host, local_rank=None if local_rank is None else int(local_rank))
