"""Process-group setup and the few collectives the trainer needs.

One process (plain `python train.py`) or DDP under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set
by the launcher; nccl on CUDA, gloo on CPU). Every helper is a no-op in a single process.
`run_local_ranks` starts ranks on this machine without torchrun (the benchmarks, the tests).
Under torchrun: `die_with_agent` (a rank does not outlive its agent), `peer_failure` (a collective
that failed because another rank is gone) and `agent_options` (how the agent was started, for the
command that continues a run on several nodes).
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def adopt_slurm_env() -> None:
    """Under a SLURM job with several tasks (e.g. hydra-submitit-launcher, or `srun python train.py`),
    export the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) from
    SLURM's, so that every task joins one process group. A no-op under torchrun or outside SLURM."""
    if (
        "RANK" in os.environ
        or int(os.environ.get("SLURM_NTASKS", "1")) <= 1
        or "SLURM_PROCID" not in os.environ
    ):
        return
    try:  # submitit knows the job's node list and a free port convention
        from submitit.helpers import TorchDistributedEnvironment

        TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        return
    except Exception:  # noqa: BLE001 - not under submitit: derive the same from SLURM's variables
        pass
    import subprocess

    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "localhost")
    try:
        hosts = subprocess.run(
            ["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True
        )
        master = hosts.stdout.split()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        master = nodes.split(",")[0]
    os.environ.update(
        RANK=os.environ["SLURM_PROCID"],
        WORLD_SIZE=os.environ["SLURM_NTASKS"],
        LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"),
        MASTER_ADDR=os.environ.get("MASTER_ADDR", master),
        MASTER_PORT=os.environ.get(
            "MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000)
        ),
    )


def die_with_agent() -> None:
    """Under torchrun, make this rank die with its agent (Linux). torchrun starts each rank in a
    session of its own and stops it only when the agent itself gets to act (a signal it handles, a
    failed rank): an agent killed outright (SIGKILL, the OOM killer) would leave its ranks training
    with nobody to report their status, and the other nodes' agents waiting for it. The rank gets
    SIGKILL, as it would with its node: the other ranks' next collective fails, they stop with one
    line (mars.train.cli) and the run resumes from its last checkpoint. A no-op elsewhere."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the rank behaves as torchrun made it
        pass


_BACKEND_SOURCE = re.compile(r"^\[[^\]]*\]\s*")  # "[.../gloo/transport/tcp/pair.cc:553] "


def peer_failure(e: BaseException) -> str | None:
    """The backend's own words when `e` is a collective (or the store) failing because another rank
    is gone or does not answer: gloo's "Connection closed by peer ...", a timeout after
    train.dist_timeout_min, NCCL's errors. None for any other exception."""
    text = str(e)
    if not (isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and "gloo" in text)):
        return None
    first = _BACKEND_SOURCE.sub("", text.strip().splitlines()[0] if text.strip() else type(e).__name__)
    return first.split(". ")[0].rstrip(".")


def agent_options() -> list[str] | None:
    """The torchrun options this rank's agent was started with (`--nnodes=2 --rdzv_backend=c10d ...`,
    as typed, up to the training script) followed by the script (or `-m` module), read from the
    agent's command line (Linux /proc). None when not under torchrun or when it cannot be read."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return None
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    start = None
    for i, arg in enumerate(argv[:3]):
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] in ("torch.distributed.run", "torchrun"):
            start = i + 2
            break
        if os.path.basename(arg) == "torchrun":
            start = i + 1
            break
    if start is None:
        return None
    rest = argv[start:]
    from torch.distributed.run import get_args_parser

    try:
        parsed = get_args_parser().parse_args(rest)
    except SystemExit:  # argparse's own exit on a command line it cannot read
        return None
    return rest[: len(rest) - len(parsed.training_script_args)]


def launched_distributed() -> bool:
    """True under torchrun (or any launcher that sets RANK and WORLD_SIZE > 1)."""
    return "RANK" in os.environ and env_world_size() > 1


def resolve_device(device: str) -> str:
    """One device with its index (mars.device.resolve): auto -> cuda:N or cpu; under torchrun each rank
    takes cuda:LOCAL_RANK, one process cuda:0."""
    from mars.device import resolve

    return resolve(device)


def _single_process_group_env() -> None:
    """torch.distributed's env:// rendezvous for a world of one (FSDP2 needs a process group even
    then): this host, a free port."""
    import socket

    if "MASTER_PORT" not in os.environ:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")


def init_distributed(
    device: str = "auto", backend: str | None = None, need_group: bool = False, timeout_min: float = 30.0
) -> DistInfo:
    """Set the device and, under a launcher (or when `need_group`: FSDP2 in one process), the process
    group, whose collectives fail after `timeout_min` minutes. Returns this process's rank, world size
    and device."""
    device = resolve_device(device)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))  # the index is always there (resolve_device)
    if not launched_distributed() and not need_group:
        return DistInfo(device=device)
    if not launched_distributed():
        _single_process_group_env()
    rank, world_size = env_rank(), env_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend is None:
        backend = "nccl" if device.startswith("cuda") else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            device_id=torch.device(device) if backend == "nccl" else None,
            timeout=timedelta(minutes=timeout_min),
        )
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


_HOST_GROUP: list = []


def host_group():
    """The process group for a few bytes of host memory every step (a preemption's stop flag): gloo, so
    that agreeing on them reads nothing back from a GPU. The default group when it is gloo already;
    otherwise a gloo group over every rank, created on first use (by every rank: a collective call)."""
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    if not _HOST_GROUP:
        _HOST_GROUP.append(dist.new_group(backend="gloo"))
    return _HOST_GROUP[0]


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _HOST_GROUP.clear()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks, in place, and return it."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s (picklable, trusted: it comes from our own process) object, on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _local_rank_entry(rank: int, world: int, backend: str, tmp: str, fn: Callable, args: tuple) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{tmp}/init", rank=rank, world_size=world)
    # Every rank is connected before any runs `fn`: a rank whose `fn` needs no collective could
    # otherwise exit while a slower rank is still in gloo's handshake with it, which then fails there
    # ("Connection closed by peer") instead of running its own `fn`.
    dist.barrier()
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            Path(tmp, "result.pkl").write_bytes(pickle.dumps(result))
    except BaseException:
        Path(tmp, f"error{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_local_ranks(
    fn: Callable, world: int, *args: Any, backend: str = "gloo", timeout: float | None = None
) -> Any:
    """`fn(rank, world, *args)` in `world` spawned processes on this machine, joined in one process group
    (gloo; or nccl with rank r on cuda:r); returns what rank 0's call returned. `fn` must be a
    module-level function. A rank that raises fails the call with that rank's traceback, and so do
    ranks still running after `timeout` seconds (they are killed): a hang fails instead of waiting."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="ranks_") as tmp:
        ctx = mp.start_processes(
            _local_rank_entry,
            args=(world, backend, tmp, fn, args),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not ctx.join(timeout=5):
                if deadline is not None and time.monotonic() > deadline:
                    for p in ctx.processes:
                        p.kill()
                    raise RuntimeError(f"the {world} ranks did not finish in {timeout} s")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            errors = sorted(Path(tmp).glob("error*.txt"))
            detail = "\n".join(p.read_text() for p in errors) or str(e)
            raise RuntimeError(f"a rank failed:\n{detail}") from None
        # written by our own rank 0 into this private directory a moment ago
        return pickle.loads(Path(tmp, "result.pkl").read_bytes())
