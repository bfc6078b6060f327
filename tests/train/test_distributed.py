"""mars.train.distributed: the process group train.py sets up, and run_local_ranks (gloo CPU processes)."""

from __future__ import annotations

import os
import time

import pytest
import torch.multiprocessing as mp


def _rank(rank: int, port: int, timeout_min: float, out: str) -> None:
    import torch.distributed as dist

    from mars.train.distributed import cleanup, init_distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ["WORLD_SIZE"] = "2"
    info = init_distributed("cpu", timeout_min=timeout_min)
    assert info.world_size == 2 and info.rank == rank
    if rank == 1:  # never joins the barrier: rank 0 must give up after the timeout, not wait forever
        time.sleep(600)  # (killed by the test)
        return
    t0 = time.monotonic()
    try:
        dist.barrier()
        outcome = "returned"
    except RuntimeError:
        outcome = "timed out"
    with open(out, "w") as f:
        f.write(f"{outcome} {time.monotonic() - t0:.1f}")
    cleanup()
    os._exit(0)  # rank 1 is still asleep: do not wait for it at exit


def test_a_collective_fails_after_train_dist_timeout_min(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "rank0.txt"
    ctx = mp.start_processes(
        _rank, args=(port, 0.05, str(out)), nprocs=2, join=False, start_method="spawn"
    )  # 0.05 min = 3 s
    try:
        deadline = time.monotonic() + 300  # two spawned ranks importing torch, under any load
        while not out.exists() or not out.read_text():
            assert time.monotonic() < deadline, "rank 0 still waits in the barrier"
            time.sleep(0.5)
    finally:
        for p in ctx.processes:
            p.kill()
    outcome, seconds = out.read_text().rsplit(" ", 1)
    assert outcome == "timed out" and 2.0 <= float(seconds) < 120, out.read_text()  # not the default 30 min


def _rank_one_fails(rank: int, world: int) -> str:
    if rank == 1:
        raise ValueError("rank one broke")
    return "rank 0 done"


def test_run_local_ranks_returns_rank_0s_result_and_fails_with_a_failing_ranks_traceback():
    from mars.train.distributed import run_local_ranks

    assert run_local_ranks(_rank_one_fails, 1, timeout=60) == "rank 0 done"
    with pytest.raises(RuntimeError, match="(?s)a rank failed:.*ValueError: rank one broke"):
        run_local_ranks(_rank_one_fails, 2, timeout=60)


def test_peer_failure_names_a_lost_rank_in_the_backends_words():
    """What gloo raises when another rank is gone or silent becomes its first sentence, without the
    source location; any other exception is not a lost rank."""
    import torch.distributed as dist

    from mars.train.distributed import peer_failure

    closed = RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:3292. This is typically caused by a remote worker crashing. Check the logs of the "
        "remote worker before reporting an error."
    )
    assert peer_failure(closed) == "Connection closed by peer [127.0.0.1]:3292"
    silent = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv "
        "operation to complete"
    )
    assert peer_failure(silent) == "Timed out waiting 30000ms for recv operation to complete"
    assert peer_failure(dist.DistNetworkError("Broken pipe")) == "Broken pipe"
    assert peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert peer_failure(ValueError("gloo")) is None
