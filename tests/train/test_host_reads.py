"""The host-read budget of the training step: a step that does not log, evaluate or checkpoint reads
nothing back from the device, for every optimizer family, exact MARS, averaged weights, ddp and fsdp on
2 ranks; at a read point the reads happen (the counter sees them).

A read is a call that needs the tensor's value on the host, which on a GPU waits for the device:
.item(), .tolist(), bool()/float()/int() of a tensor, .cpu(), .numpy(), and .to("cpu"). Counted here on
the CPU with a TorchFunctionMode around the step (every such call goes through it). The optimizers'
step counters are CPU scalars on every device (torch's convention: reading one never waits for a GPU),
so reads of them are not counted.
"""

from __future__ import annotations

import traceback

import pytest
import torch
from dist_helpers import run_ranks
from torch.overrides import TorchFunctionMode
from train_helpers import compose, tiny_overrides

from mars.train.distributed import DistInfo

READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
}


class HostReads(TorchFunctionMode):
    """Records every read of a tensor's value on the host (with where it came from), except of `exempt`."""

    def __init__(self, exempt=()):
        super().__init__()
        self.exempt = {id(t) for t in exempt}
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        to_host = func is torch.Tensor.to and any(
            torch.device(a).type == "cpu" for a in (*args[1:2], kwargs.get("device")) if isinstance(a, str)
        )
        if (func in READS or to_host) and id(args[0]) not in self.exempt:
            frames = [f for f in traceback.extract_stack()[:-1] if "/mars/" in f.filename]
            where = f"{frames[-1].filename.split('/mars/')[-1]}:{frames[-1].lineno}" if frames else "?"
            self.reads.append(f"{getattr(func, '__name__', func)} at {where}")
        return func(*args, **kwargs)


def step_counters(optimizer) -> list[torch.Tensor]:
    """The optimizer's CPU step counters (not device memory anywhere)."""
    return [s["step"] for s in optimizer.state.values() if isinstance(s.get("step"), torch.Tensor)]


CASES = {
    "adamw": ["optimizer=adamw"],
    "mars_adamw": ["optimizer=mars_adamw"],
    "mars_adamw_exact": ["optimizer=mars_adamw", "optimizer.approx=false"],
    "mars_adamw_diagnostics": ["optimizer=mars_adamw", "optimizer.diagnostics=true"],
    "mars_m": ["optimizer=mars_m"],
    "muon": ["optimizer=muon"],
    "lion": ["optimizer=lion"],
    # the averaged weights' update: one lerp on the device, gated by the same found_inf verdict
    "adamw_ema": ["optimizer=adamw", "train.average=ema"],
    "mars_adamw_tail": ["optimizer=mars_adamw", "train.average=tail", "train.average_start=1"],
}


def count_reads(cfg, run_dir, info: DistInfo) -> dict:
    """Reads in a step between read points (after two warm-up steps), and in a read point's settle + log."""
    from mars.train.metrics import Progress
    from mars.train.trainer import Trainer

    trainer = Trainer(cfg, run_dir, info)
    trainer.progress = Progress(cfg.train.max_steps, 0, enabled=False)  # as fit() sets it
    for _ in range(2):  # the first steps create the optimizer state
        trainer.train_step()
    trainer.settle()
    quiet = HostReads(exempt=step_counters(trainer.optimizer))
    with quiet:
        for _ in range(2):
            out = trainer.train_step()
    at_read_point = HostReads(exempt=step_counters(trainer.optimizer))
    with at_read_point:
        trainer._log_train(trainer.window, out.lr)
    return {"step": quiet.reads, "read_point": at_read_point.reads}


def overrides(data_root, name: str, *extra: str) -> list[str]:
    return [
        *tiny_overrides(data_root, max_steps=20, log_interval=100),
        "model.n_layer=1",
        *CASES[name],
        *extra,
    ]


@pytest.mark.parametrize("name", list(CASES))
def test_a_step_between_read_points_reads_nothing_back(data_root, tmp_path, name):
    counts = count_reads(compose(overrides(data_root, name)), tmp_path, DistInfo())
    assert counts["step"] == [], counts["step"]
    # the counter does see reads: the log line reads the norms (settle), the loss and the metrics
    assert any("settle" in r or "trainer.py" in r for r in counts["read_point"]), counts["read_point"]


def _ranks(rank: int, world: int, data_root, run_dir, names: list[str]) -> dict:
    torch.set_num_threads(1)
    info = DistInfo(rank=rank, local_rank=rank, world_size=world, device="cpu")
    out = {}
    for parallel in ("ddp", "fsdp"):
        for name in names:
            extra = [f"train.parallel={parallel}", "train.global_batch_size=4"]
            cfg = compose(overrides(data_root, name, *extra))
            out[(parallel, name)] = count_reads(cfg, f"{run_dir}/{parallel}_{name}", info)["step"]
    return out


def test_ddp_and_fsdp_steps_read_nothing_back_on_2_ranks(data_root, tmp_path):
    names = ["adamw", "mars_adamw", "mars_adamw_exact", "mars_m", "mars_adamw_tail"]
    counts = run_ranks(2, _ranks, data_root, str(tmp_path), names)
    assert counts == {(p, n): [] for p in ("ddp", "fsdp") for n in names}
