"""Averaged weights: an average of the parameters over the run, kept next to the model, updated on the
device after every step and evaluated at every evaluation (val/loss_avg next to val/loss).

    train.average=ema         a <- a + (1 - d) (w - a) after every step, d = train.average_decay, from the
                              initial weights (Levanter's EmaModelAveraging; the EPFL benchmark's EMA)
    train.average=tail        the mean of the weights after each step past step S (S = train.average_start:
                              a step, or a fraction of train.max_steps; null: where the lr decay begins), the
                              weights themselves until then (modded-nanogpt's and AlgoPerf's tail average)
    train.average=decay_sqrt  Levanter's EmaDecaySqrtModelAveraging: the mean of the weights after every
                              step weighted by 1 - d until step S, then by 1 - sqrt((t - S) / (T - S)) for
                              the step of index t of a run of T steps (S: as for tail; null: where the lr
                              decay begins), so the average leans on the start of the decay and the last
                              weights count for nothing. As in Levanter, the weight 1 - d is constant, so up
                              to S this is a running mean of every step, not an exponential one: d only
                              sets how much the steps before S count against those of the decay.

tail and decay_sqrt are the running weighted mean a <- a + (v_t / V_t) (w - a), V_t = v_1 + ... + v_t,
with the step weights v_t above (tail: 0 before S, 1 after); while V_t is 0 the average is the weights.

Every update is one multi-tensor lerp on the device (torch._foreach_lerp_), gated by the step's found_inf
verdict (mars.optim.found_inf): a skipped step (non-finite gradient norm) leaves the average and its
weight sum unchanged, and nothing is read back. The average is kept in float32 as the parameters of a
second instance of the model (the average model), built from the model's spec and laid out like it
(fsdp: sharded on the same mesh, so each rank keeps and updates its own shards); its buffers are the
model's own. Checkpoints hold it (mars.checkpoint: average.safetensors, or the sharded files), so a
resume, a fork (a cooldown branch continues its trunk's average) and a resharded resume continue it
bit for bit.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

log = logging.getLogger(__name__)

KINDS = ("off", "ema", "tail", "decay_sqrt")
STARTS = ("tail", "decay_sqrt")  # the kinds that take train.average_start


def start_step(average_start: float | None, max_steps: int, schedule_cfg) -> int:
    """train.average_start as a step count S (the weights after steps S+1 .. T are averaged): a fraction
    (< 1) of max_steps, a whole step, or (None) where the lr decay begins (schedule.decay_start)."""
    if average_start is None:
        from mars.train.schedule import decay_start

        return decay_start(max_steps, schedule_cfg)
    if average_start < 1:
        return math.floor(average_start * max_steps)
    return int(average_start)


def check(train_cfg, schedule_cfg) -> None:
    """ValueError (one line naming the key and the fix) for an average that cannot work; run by the
    config's validation before anything is built."""
    from mars.checks import choice

    kind = train_cfg.average
    choice("train.average", kind, KINDS)
    if kind == "off":
        return
    decay = train_cfg.average_decay
    if kind in ("ema", "decay_sqrt") and not (
        isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0 < decay < 1
    ):
        raise ValueError(
            f"train.average_decay={_text(decay)} must lie in (0, 1) (the share of the average kept each "
            "step, e.g. 0.999: about the last 1000 steps)"
        )
    if kind not in STARTS:
        return
    start, max_steps = train_cfg.average_start, int(train_cfg.max_steps)
    if start is not None:
        if (
            isinstance(start, bool)
            or not isinstance(start, (int, float))
            or not math.isfinite(start)
            or start < 0
            or (start >= 1 and start != int(start))
        ):
            raise ValueError(
                f"train.average_start={_text(start)} must be a whole step (>= 1) or a fraction of "
                "train.max_steps in [0, 1) (e.g. 0.8: the last fifth of the run)"
            )
    step = start_step(start, max_steps, schedule_cfg)
    if step >= max_steps:
        given = (
            f"train.average_start={_text(start)} (step {step})"
            if start is not None
            else f"train.average_start=null (where schedule={schedule_cfg.name}'s decay begins: step {step})"
        )
        raise ValueError(
            f"{given} is at or beyond the end of the run (train.max_steps={max_steps}): train.average={kind} "
            f"would average nothing; give a step below {max_steps} or a fraction such as 0.8"
        )


def _text(value) -> str:
    """A number as typed (6, not 6.0; 0.999), anything else as repr."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g}"
    return repr(value)


class WeightAverage:
    """The averaged weights of `params` (the model's trainable parameters, in that order), held as the
    parameters of `average_model` of the same names, and the rule that updates them (train.average)."""

    def __init__(self, train_cfg, schedule_cfg, model: nn.Module, average_model: nn.Module):
        self.kind = train_cfg.average
        self.decay = float(train_cfg.average_decay)
        self.max_steps = int(train_cfg.max_steps)
        self.start = (
            start_step(train_cfg.average_start, self.max_steps, schedule_cfg) if self.kind in STARTS else None
        )
        self.model = average_model
        for p in average_model.parameters():
            p.requires_grad_(False)
        mine = dict(average_model.named_parameters())
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        params = dict(model.named_parameters())
        # each rank's own pieces (a DTensor's local shard is a view: writes go to the DTensor)
        with torch.no_grad():
            self._params = [_local(params[n]) for n in self.names]
            self._average = [_local(mine[n]) for n in self.names]
        self._buffers = [(b, dict(model.named_buffers())[n]) for n, b in average_model.named_buffers()]
        device = self._average[0].device if self._average else torch.device("cpu")
        self.weight_sum = torch.zeros((), dtype=torch.float64, device=device)  # V_t (tail, decay_sqrt)
        self.copy_from_model()

    @torch.no_grad()
    def copy_from_model(self) -> None:
        """The average restarted at the model's weights (nothing averaged yet)."""
        torch._foreach_copy_(self._average, self._params)
        self.weight_sum.zero_()
        self.copy_buffers()

    @torch.no_grad()
    def copy_buffers(self) -> None:
        """The model's buffers (per-layer values, rotary tables: never trained) into the average model."""
        for mine, theirs in self._buffers:
            mine.copy_(theirs)

    def step_weight(self, index: int) -> float:
        """v_t of the step of 0-based index `index` (tail, decay_sqrt)."""
        if self.kind == "tail":
            return 1.0 if index >= self.start else 0.0
        if index < self.start:
            return 1.0 - self.decay
        span = self.max_steps - self.start
        return 1.0 - math.sqrt(min(1.0, (index - self.start) / span))

    @torch.no_grad()
    def update(self, index: int, taken: torch.Tensor | bool) -> None:
        """After the optimizer step of 0-based index `index`: fold the new weights in. `taken` is the step's
        gate: a 0-dim float tensor on the device (1: taken, 0: skipped, the optimizer's found_inf verdict)
        or a host bool. Device work only: one lerp over every tensor, its weight computed on the device."""
        if isinstance(taken, bool):
            if not taken:
                return
            taken = torch.ones((), device=self.weight_sum.device)
        if self.kind == "ema":
            alpha = taken.to(torch.float32) * (1.0 - self.decay)
        else:
            v = taken.to(torch.float64) * self.step_weight(index)
            self.weight_sum += v
            alpha = torch.where(self.weight_sum > 0, v / self.weight_sum, 1.0).to(torch.float32)
        torch._foreach_lerp_(self._average, self._params, [alpha] * len(self._average))

    def state_dict(self) -> dict:
        """The rule and its running sum (plain data for train_state.pt); the averaged tensors themselves are
        `tensors()`, written by mars.checkpoint."""
        return {
            "kind": self.kind,
            "decay": self.decay,
            "start": self.start,
            "weight_sum": self.weight_sum.detach().cpu().clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.weight_sum.copy_(state["weight_sum"].to(self.weight_sum.device, torch.float64))

    def tensors(self) -> dict[str, torch.Tensor]:
        """The averaged parameters by the model's parameter names (DTensors under fsdp)."""
        mine = dict(self.model.named_parameters())
        return {n: mine[n] for n in self.names}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t.detach()
