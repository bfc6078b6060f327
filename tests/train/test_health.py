"""The divergence rule (mars/train/health.py) and what it decides: which checkpoints are unhealthy, and
that a preempted run always resumes unless it stopped because of divergence (docs/reliability.md)."""

from __future__ import annotations

import json
import logging
import math
import signal

import pytest
import torch
from train_helpers import compose, tiny_overrides

import mars.checkpoint as ckpt
from mars.train import health
from mars.train.distributed import DistInfo
from mars.train.health import HealthMonitor
from mars.train.rundir import choose_start
from mars.train.trainer import Trainer, TrainingDivergedError

pytestmark = pytest.mark.usefixtures("one_thread", "restore_logging")


@pytest.fixture
def early_verdicts(monkeypatch):
    """Spike verdicts after 3 steps instead of 10: shorter training runs."""
    monkeypatch.setattr(health, "MIN_HISTORY", 3)


def monitor_after(norms: list[float], window: int = 20) -> HealthMonitor:
    h = HealthMonitor(window=window, spike_factor=10.0, spike_loss=1.0)
    for step, norm in enumerate(norms, 1):
        h.on_step(step, norm)
    return h


def test_a_lone_spike_is_no_alarm_but_dates_the_trouble_of_one_that_follows():
    h = monitor_after([1.0] * 20 + [15.0])  # step 21: 15x the median, the loss falling
    assert h.last_alarm is None and h.healthy(21) and h.spike_pending() == 21
    assert h.on_loss(25, 5.0) is None and h.on_loss(30, 5.5) is None  # a rise below spike_loss
    for step in range(22, 41):
        h.on_step(step, 1.0)
    assert h.spike_pending() == 21  # pending for `window` steps (21-40), forgotten after
    h.on_step(41, 1.0)
    assert h.spike_pending() is None and h.last_alarm is None

    nan = monitor_after([1.0] * 20 + [15.0, 1.0, math.nan])  # a spike, then a non-finite step
    assert (nan.last_alarm, nan.episode_start) == (23, 21) and not nan.healthy(23)

    loss = monitor_after([1.0] * 20 + [15.0])
    loss.on_loss(20, 4.0)
    message = loss.on_loss(30, 5.2)  # a spike, then the loss 1.2 nats above its best
    assert message == "step 30: train loss 5.2000 is 1.20 nats above its best (the trouble began at step 21)"
    assert (loss.last_alarm, loss.episode_start) == (30, 21)


def test_spikes_that_recur_are_no_alarm_but_a_norm_that_stays_high_is():
    # as in a high-lr run of the CPU-scale study that trained on to a normal loss: five spikes of 10-150x
    # in 20 steps, the norm back near its median after each
    recurring = monitor_after([1.0] * 20 + [25, 1, 1, 110, 14, 1, 1, 1, 1, 1, 1, 1, 14, 1, 1, 22, 1])
    assert recurring.last_alarm is None and recurring.pending == [21, 24, 25, 33, 36]

    h = monitor_after([1.0] * 20 + [15.0, 1.0, 20.0, 30.0])
    assert h.last_alarm is None and h.spike_pending() == 21  # two spike steps in a row: still pending
    message = h.on_step(25, 40.0)
    assert message.startswith("step 25: gradient norm 40 is 40x the median of the last")
    assert message.endswith("; 3 steps in a row above 10x the median")
    assert (h.last_alarm, h.episode_start) == (25, 21) and not h.healthy(44) and h.healthy(45)
    assert h.on_step(30, 40.0).endswith("within 20 steps of the last alarm")  # the trouble goes on
    assert (h.last_alarm, h.episode_start) == (30, 21)

    restored = HealthMonitor(window=20)
    restored.load_state_dict(json.loads(json.dumps(h.state_dict())))
    assert restored.state_dict() == h.state_dict()
    older = HealthMonitor(window=20)
    older.load_state_dict({"norms": [1.0] * 12, "best_loss": 3.0, "last_alarm": None, "episode_start": None})
    assert older.spike_pending() is None and older.on_step(13, 15.0) is None  # a state of the one-step rule


def grad_spike_at(tr: Trainer, step: int, factor: float = 30.0, nan_from: int | None = None) -> None:
    """Scale the gradient (not the loss) of 0-based optimizer step `step` by `factor`; NaN from `nan_from`."""
    forward = tr.raw_model.forward

    def spiky(x, y=None):
        logits, loss = forward(x, y)
        if loss is not None and torch.is_grad_enabled():
            if tr.state.step == step:
                loss = loss * factor - (factor - 1) * loss.detach()  # the same value, a factor x gradient
            elif nan_from is not None and tr.state.step >= nan_from:
                loss = loss * float("nan")
        return logits, loss

    tr.raw_model.forward = spiky


def sigterm_during(tr: Trainer, step: int) -> None:
    """SIGTERM arrives during 0-based optimizer step `step`: the run saves after it and stops."""
    real = tr.train_step

    def step_and_maybe_signal():
        if tr.state.step == step:
            tr._on_signal(signal.SIGTERM, None)
        return real()

    tr.train_step = step_and_maybe_signal


def test_a_run_preempted_after_a_benign_spike_resumes(data_root, tmp_path, caplog, early_verdicts):
    run = tmp_path / "run"
    args = tiny_overrides(data_root, max_steps=10, log_interval=3, max_nonfinite_steps=2)
    cfg = compose(args)
    tr = Trainer(cfg, run, DistInfo())
    grad_spike_at(tr, 4)  # step 5: about 30x the median, the loss keeps falling
    sigterm_during(tr, 5)
    assert tr.fit() == "preempted"
    losses = [r["train/loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
              if "train/loss" in r]  # fmt: skip
    assert losses == sorted(losses, reverse=True)
    (step6,) = ckpt.list_checkpoints(run / "ckpt")
    assert tr.health.spike_pending() == 5 and tr.health.last_alarm is None
    meta = ckpt.read_meta(step6)
    assert (meta["healthy"], meta["preempted"], meta["spike_pending"]) == (True, True, 5)
    resume = compose([*args, "train.resume=auto"])
    assert choose_start(resume, run, 1) == step6

    # even an unhealthy checkpoint (a real alarm before the signal) is continued when the signal stopped
    # the run there: the preemption, not the divergence checks, ended it
    ckpt.update_meta(step6, healthy=False)
    with caplog.at_level(logging.INFO, logger="mars.train"):
        assert choose_start(resume, run, 1) == step6
    assert f"{step6} is marked unhealthy" in caplog.text and "stopped there by a signal" in caplog.text

    # a run that then stops because of divergence withdraws that: resume=auto refuses, naming it
    resumed = Trainer(cfg, run, DistInfo(), resume_from=step6)
    grad_spike_at(resumed, -1, nan_from=6)
    with pytest.raises(TrainingDivergedError):
        resumed.fit()
    assert ckpt.read_meta(step6)["preempted"] is False
    with pytest.raises(ckpt.CheckpointError, match=r"every usable checkpoint .* is marked unhealthy") as e:
        choose_start(resume, run, 1)
    assert "step_00000006" in str(e.value) and "train.overwrite=true" in str(e.value)


def test_an_alarm_marks_the_checkpoints_saved_since_its_spike_and_rotation_kept_one_before(
    data_root, tmp_path, caplog, early_verdicts
):
    tr = Trainer(
        compose(tiny_overrides(data_root, max_steps=12, ckpt_interval=1, keep_last=1, max_nonfinite_steps=3)),
        tmp_path,
        DistInfo(),
    )
    grad_spike_at(tr, 4, factor=1e4, nan_from=6)  # step 5 spikes, step 6 is fine, 7-9 are NaN
    with caplog.at_level(logging.INFO), pytest.raises(TrainingDivergedError, match="began at step 5"):
        tr.fit()
    root = tmp_path / "ckpt"
    kept = {p.name: ckpt.is_healthy(p) for p in ckpt.list_checkpoints(root)}
    # keep_last=1, yet step 4 survived: steps 5 and 6 were saved while the spike was pending
    assert kept == {"step_00000004": True, "step_00000008": False}
    assert (
        f"{root / 'step_00000006'} marked unhealthy: the trouble of the alarm at step 7 began at 5"
        in caplog.text
    )


def test_resume_auto_refuses_when_no_checkpoint_can_be_continued_and_moves_nothing(data_root, tmp_path):
    """Every checkpoint damaged is refused like every checkpoint unhealthy: starting over would move the
    run's checkpoints aside, and only the user knows whether a good copy exists."""
    run = tmp_path / "run"
    args = tiny_overrides(data_root, max_steps=2, ckpt_interval=1, keep_last=2)
    Trainer(compose(args), run, DistInfo()).fit()
    step1, step2 = ckpt.list_checkpoints(run / "ckpt")
    for step_dir in (step1, step2):
        state = step_dir / "train_state.pt"
        state.write_bytes(state.read_bytes()[:200])
    before = sorted(p.name for p in run.iterdir())
    resume = compose([*args, "train.max_steps=4", "train.resume=auto"])
    with pytest.raises(ckpt.CheckpointError) as e:
        choose_start(resume, run, 1)
    message = str(e.value)
    assert message.startswith(f"train.resume=auto: no checkpoint in {run / 'ckpt'} can be continued (")
    assert f"{step2 / 'train_state.pt'} has 200 bytes" in message and f"{step1 / 'train_state.pt'}" in message
    assert "put back a good copy of one" in message and "train.overwrite=true" in message
    assert "\n" not in message and sorted(p.name for p in run.iterdir()) == before  # nothing moved

    ckpt.update_meta(step1, healthy=False)  # one damaged, one unhealthy: both named, and both fixes
    with pytest.raises(ckpt.CheckpointError) as e:
        choose_start(resume, run, 1)
    assert f"{step1.name}: marked unhealthy" in str(e.value)
    assert f"continue an unhealthy one anyway with train.resume={step1}" in str(e.value)
