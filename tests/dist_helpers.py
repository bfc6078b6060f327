"""Run a function on W CPU processes joined in one gloo process group (torch.distributed tests).

Spawning ranks costs seconds (each imports torch), so a test spawns once and checks many things in
the same group. `fn(rank, world, *args)` must be a module-level function; what rank 0 returns comes
back (through a file), and any exception on any rank fails the call with that rank's traceback.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, init_file: str, out_dir: str, fn, args) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            Path(out_dir, "result.pkl").write_bytes(pickle.dumps(result))
    except BaseException:
        Path(out_dir, f"error{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(world: int, fn, *args, timeout: float = 300):
    """fn(rank, world, *args) on `world` spawned processes; returns rank 0's result. Fails when a rank
    fails, or when the ranks have not all finished after `timeout` seconds."""
    with tempfile.TemporaryDirectory(prefix="ranks_") as tmp:
        init_file = os.path.join(tmp, "init")
        ctx = mp.start_processes(
            _entry, args=(world, init_file, tmp, fn, args), nprocs=world, join=False, start_method="spawn"
        )
        try:
            deadline = time.monotonic() + timeout
            while not ctx.join(timeout=5):
                if time.monotonic() > deadline:  # a hang (a collective one rank never joins) fails
                    for p in ctx.processes:
                        p.kill()
                    raise AssertionError(f"the ranks did not finish in {timeout} s")
        except AssertionError:
            raise
        except Exception as e:
            errors = sorted(Path(tmp).glob("error*.txt"))
            detail = "\n".join(p.read_text() for p in errors) or str(e)
            raise AssertionError(f"a rank failed:\n{detail}") from None
        return pickle.loads(Path(tmp, "result.pkl").read_bytes())
