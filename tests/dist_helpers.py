"""Run a function on W CPU processes joined in one gloo process group (torch.distributed tests).

Spawning ranks costs seconds (each imports torch), so a test spawns once and checks many things in
the same group. `fn(rank, world, *args)` must be a module-level function; what rank 0 returns comes
back, and any exception on any rank (or a hang past `timeout`) fails the call with that rank's
traceback. The launcher is the project's own (mars.train.distributed.run_local_ranks); here each
rank computes on one thread (2 cores, up to 4 ranks).
"""

from __future__ import annotations

import os

import torch

from mars.train.distributed import run_local_ranks


def _one_thread(rank: int, world: int, fn, *args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    return fn(rank, world, *args)


def run_ranks(world: int, fn, *args, timeout: float = 300):
    """fn(rank, world, *args) on `world` spawned one-thread gloo processes; returns rank 0's result."""
    return run_local_ranks(_one_thread, world, fn, *args, timeout=timeout)
