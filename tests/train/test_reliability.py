"""A run never silently trains something other than its config says, never loses a good checkpoint,
and every bad input gets one clear line (docs/reliability.md)."""

from __future__ import annotations

import errno
import json
import logging
import shlex
import signal
from pathlib import Path

import pytest
import torch
from train_helpers import assert_one_line, compose, lock_holder, run_cli, tiny_overrides

import mars.checkpoint as ckpt
from mars.train.distributed import DistInfo
from mars.train.trainer import Trainer, TrainingDivergedError

pytestmark = pytest.mark.usefixtures("one_thread", "restore_logging")


def trainer(data_root, run_dir, extra=(), resume_from=None, **train) -> Trainer:
    return Trainer(compose([*tiny_overrides(data_root, **train), *extra]), run_dir, DistInfo(), resume_from)


def records(run_dir: Path, key: str) -> dict[int, float]:
    lines = [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in lines if key in r}


# ----------------------------------------------------------------------------- the run dir


def test_a_new_run_refuses_a_run_dir_that_holds_a_run(monkeypatch, capsys, tmp_path, data_root):
    run = tmp_path / "run"
    args = [*tiny_overrides(data_root, max_steps=2), f"hydra.run.dir={run}"]
    assert run_cli(monkeypatch, capsys, args)[0] == 0
    first = (run / "metrics.jsonl").read_text()

    code, _, err = run_cli(monkeypatch, capsys, args)
    assert code == 1
    assert_one_line(err, f"run dir {run} already holds a run", "train.resume=auto", "hydra.run.dir")
    assert (run / "metrics.jsonl").read_text() == first  # untouched

    code, _, err = run_cli(monkeypatch, capsys, [*args, "train.overwrite=true"])
    assert code == 0, err
    moved = [p for p in run.iterdir() if p.name.startswith("replaced-")]
    assert len(moved) == 1
    assert (moved[0] / "metrics.jsonl").read_text() == first  # the old run is kept, apart
    assert (moved[0] / "ckpt" / "step_00000002" / "meta.json").is_file()
    assert sorted(records(run, "train/loss")) == [1, 2]  # the new metrics are not mixed with the old


def test_resume_refuses_a_config_that_changes_the_run(monkeypatch, capsys, tmp_path, data_root):
    run = tmp_path / "run"
    trainer(data_root, run, max_steps=2).fit()
    for change, fragment in [
        (["optimizer=adamw"], "optimizer.name: 'mars_adamw' -> 'adamw'"),
        (["train.global_batch_size=8"], "train.global_batch_size: 4 -> 8"),
        (["train.data_seed=7"], "train.data_seed: 1337 -> 7"),
    ]:
        args = [*tiny_overrides(data_root, max_steps=3), *change, "train.resume=auto", f"hydra.run.dir={run}"]
        code, _, err = run_cli(monkeypatch, capsys, args)
        assert code == 1
        assert_one_line(err, "cannot resume", fragment)


def test_resume_applies_the_new_hyperparameters_and_logs_what_the_optimizer_used(data_root, tmp_path):
    old = ["schedule=constant", "schedule.warmup_steps=0", "optimizer.lr=1e-3", "optimizer.betas=[0.9,0.99]"]
    tr = trainer(data_root, tmp_path, old, max_steps=2)
    tr.fit()
    step_dir = ckpt.latest_checkpoint(tmp_path / "ckpt")
    new = ["schedule=constant", "schedule.warmup_steps=0", "optimizer.lr=4e-4", "optimizer.betas=[0.8,0.9]"]
    resumed = trainer(data_root, tmp_path, new, resume_from=step_dir, max_steps=4)
    resumed.fit()
    group = resumed.optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(4e-4) and group["betas"] == (0.8, 0.9)
    assert group["lr_1d"] == pytest.approx(3e-3 * 4e-4 / 4e-4)  # lr_1d keeps the new config's value
    assert records(tmp_path, "lr") == {1: 1e-3, 2: 1e-3, 3: pytest.approx(4e-4), 4: pytest.approx(4e-4)}


# ----------------------------------------------------------------------------- corrupt checkpoints


def flip_a_weight_bit(weights: Path) -> None:
    """A bit flip in the lowest mantissa byte of a float32 in the middle of model.safetensors: the value
    stays finite, so only the checksum can tell."""
    data = bytearray(weights.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # after the JSON header
    data[start + 4 * ((len(data) - start) // 8)] ^= 1
    weights.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["truncated train_state.pt", "a bit flip in the weights"])
def test_resume_auto_falls_back_past_a_corrupt_checkpoint_and_says_so(
    monkeypatch, capsys, tmp_path, data_root, damage
):
    run = tmp_path / "run"
    trainer(data_root, run, max_steps=4, ckpt_interval=2, keep_last=3).fit()
    bad = run / "ckpt" / "step_00000004"
    if damage == "truncated train_state.pt":
        state = bad / "train_state.pt"
        state.write_bytes(state.read_bytes()[:200])
        fragment = f"{state} has 200 bytes"
    else:
        flip_a_weight_bit(bad / "model.safetensors")
        fragment = f"{bad / 'model.safetensors'}: its bytes do not match the xxh3_128 checksum"

    explicit = [*tiny_overrides(data_root, max_steps=5), f"train.resume={bad}", f"hydra.run.dir={run}"]
    code, _, err = run_cli(monkeypatch, capsys, explicit)
    assert code == 1
    assert_one_line(err, fragment)

    args = [*tiny_overrides(data_root, max_steps=5), "train.resume=auto", f"hydra.run.dir={run}"]
    code, out, err = run_cli(monkeypatch, capsys, args)
    assert code == 0, err
    assert f"skipping {bad}" in out and "continuing from" in out and "step_00000002" in out
    assert [p.name for p in ckpt.list_checkpoints(run / "ckpt")][-1] == "step_00000005"
    assert sorted(records(run, "train/loss")) == [1, 2, 3, 4, 5]  # steps 3-4 redone, logged once
    moved = next(p for p in run.iterdir() if p.name.startswith("replaced-"))
    assert (moved / "ckpt" / "step_00000004" / "meta.json").is_file()  # kept, out of the way


def test_full_disk_stops_with_one_line_and_keeps_the_previous_checkpoint(
    monkeypatch, capsys, tmp_path, data_root
):
    import mars.checkpoint.save as save_module

    run = tmp_path / "run"
    real_save = save_module.torch.save

    def save_once_then_full(obj, path, *a, **k):
        if "step_00000004" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(save_module.torch, "save", save_once_then_full)
    args = [*tiny_overrides(data_root, max_steps=4, ckpt_interval=2), f"hydra.run.dir={run}"]
    code, _, err = run_cli(monkeypatch, capsys, args)
    assert code == 1
    assert_one_line(err, "no space left on the device", "previous checkpoint is intact")
    assert [p.name for p in (run / "ckpt").iterdir()] == ["step_00000002"]


# ----------------------------------------------------------------------------- divergence


def spike_then_nan(tr: Trainer, spike: int, nan_from: int) -> None:
    """Scale the loss by 1e4 at optimizer step `spike` (a gradient-norm spike), NaN from `nan_from` on."""
    forward = tr.raw_model.forward

    def poisoned(x, y=None):
        logits, loss = forward(x, y)
        if loss is not None and torch.is_grad_enabled():
            if tr.state.step == spike:
                loss = loss * 1e4
            elif tr.state.step >= nan_from:
                loss = loss * float("nan")
        return logits, loss

    tr.raw_model.forward = poisoned


def test_divergence_keeps_and_names_the_last_healthy_checkpoint(data_root, tmp_path):
    tr = trainer(
        data_root,
        tmp_path,
        max_steps=30,
        ckpt_interval=1,
        keep_last=2,
        max_nonfinite_steps=3,
        health_window=3,
    )
    spike_then_nan(tr, spike=12, nan_from=13)  # step 13 spikes, steps 14-16 are NaN
    with pytest.raises(TrainingDivergedError) as e:
        tr.fit()
    healthy = tmp_path / "ckpt" / "step_00000012"
    message = str(e.value)
    assert "The trouble began at step 13" in message
    assert f"train.resume={healthy} optimizer.lr=" in message
    kept = [p.name for p in ckpt.list_checkpoints(tmp_path / "ckpt")]
    assert kept == ["step_00000012", "step_00000014", "step_00000015"]  # rotation kept the healthy one
    assert ckpt.is_healthy(healthy) and not ckpt.is_healthy(tmp_path / "ckpt" / "step_00000015")


# ----------------------------------------------------------------------------- bad input before any work


def test_cuda_device_without_cuda_is_one_line_before_the_run_dir(monkeypatch, capsys, tmp_path, data_root):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = tmp_path / "run"
    code, _, err = run_cli(
        monkeypatch, capsys, [*tiny_overrides(data_root), "train.device=cuda", f"hydra.run.dir={run}"]
    )
    assert code == 2
    assert_one_line(err, "train.device=cuda", "use train.device=cpu")
    assert not run.exists()


@pytest.mark.parametrize("where", ["file", "proc"])
def test_a_run_dir_that_cannot_be_created_is_one_line(monkeypatch, capsys, tmp_path, data_root, where):
    if where == "file":
        (tmp_path / "notes.txt").write_text("x")
        run, fragment = tmp_path / "notes.txt" / "run", "is a file, not a directory"
    else:
        run, fragment = Path("/proc/mars-run"), "cannot create directories in /proc"
    code, _, err = run_cli(monkeypatch, capsys, [*tiny_overrides(data_root), f"hydra.run.dir={run}"])
    assert code == 2
    assert_one_line(err, "hydra.run.dir=", fragment)


# ----------------------------------------------------------------------------- one run per run dir


def test_a_live_run_owns_its_run_dir_and_its_lock_dies_with_it(monkeypatch, capsys, tmp_path, data_root):
    run, sweep = tmp_path / "run", tmp_path / "sweep"
    args = tiny_overrides(data_root, max_steps=1)
    with lock_holder(run) as holder:
        for extra in ([], ["train.resume=auto"]):  # a second run, and resume=auto of the live one
            code, _, err = run_cli(monkeypatch, capsys, [*args, *extra, f"hydra.run.dir={run}"])
            assert code == 1
            assert_one_line(
                err,
                f"hydra.run.dir={run} is in use by a live run (process {holder.pid} on",
                "another hydra.run.dir",
            )
        assert [p.name for p in run.iterdir()] == [".run.lock"]  # nothing was written
        with lock_holder(sweep) as sweeper:  # a sweep owns its sweep dir
            code, _, err = run_cli(
                monkeypatch, capsys, ["-m", *args, "train.seed=1,2", f"hydra.sweep.dir={sweep}"]
            )
            assert code == 1
            assert_one_line(err, f"hydra.sweep.dir={sweep} is in use by a live run (process {sweeper.pid}")
        holder.kill()  # SIGKILL: nothing of the holder runs, yet its lock is gone with it
        holder.wait()
        code, _, err = run_cli(monkeypatch, capsys, [*args, f"hydra.run.dir={run}"])
        assert code == 0, err
        assert (run / "ckpt" / "step_00000001" / "meta.json").is_file()


def test_a_checkpoint_at_or_past_max_steps(monkeypatch, capsys, tmp_path, data_root):
    run = tmp_path / "run"
    trainer(data_root, run, max_steps=4, ckpt_interval=2).fit()
    metrics = (run / "metrics.jsonl").read_text()
    resume = ["train.resume=auto", f"hydra.run.dir={run}"]
    code, _, err = run_cli(monkeypatch, capsys, [*tiny_overrides(data_root, max_steps=2), *resume])
    assert code == 1
    assert_one_line(
        err, "train.max_steps=2 is below the step of", "step_00000004 (4)", "raise train.max_steps above 4"
    )
    code, out, err = run_cli(monkeypatch, capsys, [*tiny_overrides(data_root, max_steps=4), *resume])
    assert code == 0, err
    assert "nothing to train: " in out and "step_00000004 is at step 4 = train.max_steps" in out
    assert (run / "metrics.jsonl").read_text() == metrics
    assert [p.name for p in ckpt.list_checkpoints(run / "ckpt")] == ["step_00000002", "step_00000004"]


def test_another_split_of_the_shared_corpus_is_refused_and_nothing_is_rewritten(
    monkeypatch, capsys, tmp_path, data_root
):
    run = tmp_path / "run"
    trainer(data_root, run, max_steps=2).fit()
    corpus = {p.name: p.stat().st_mtime_ns for p in (data_root / "embedded").iterdir()}
    inside = sorted(p.name for p in run.iterdir())
    args = [
        *tiny_overrides(data_root, max_steps=4),
        "data.val_tokens=5000",
        "train.resume=auto",
        f"hydra.run.dir={run}",
    ]
    code, _, err = run_cli(monkeypatch, capsys, args)
    assert code == 1
    assert_one_line(err, "data.val_tokens=20000, not data.val_tokens=5000", "data.dir=embedded_val5000")
    assert {p.name: p.stat().st_mtime_ns for p in (data_root / "embedded").iterdir()} == corpus
    assert sorted(p.name for p in run.iterdir()) == inside  # the run dir is untouched too


def test_an_unwritable_data_root_is_one_line_before_the_run_dir(monkeypatch, capsys, tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli(
        monkeypatch, capsys, [*tiny_overrides(Path("/proc/mars-data")), f"hydra.run.dir={run}"]
    )
    assert code == 1
    assert_one_line(err, "data.root=/proc/mars-data", "cannot be written", "choose a writable data.root")
    assert not run.exists()


def test_resume_auto_skips_unhealthy_checkpoints_and_says_which_it_continues(tmp_path, data_root, caplog):
    from mars.train.rundir import choose_start

    run = tmp_path / "run"
    trainer(data_root, run, max_steps=3, ckpt_interval=1, keep_last=3).fit()
    root = run / "ckpt"

    def mark_unhealthy(step: int) -> None:  # as a save within train.health_window of an alarm does
        path = root / f"step_{step:08d}" / "meta.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "healthy": False}))

    mark_unhealthy(3)
    mark_unhealthy(2)
    cfg = compose([*tiny_overrides(data_root, max_steps=5), "train.resume=auto"])
    with caplog.at_level(logging.INFO, logger="mars.train"):
        assert choose_start(cfg, run, 1) == root / "step_00000001"
    said = caplog.text
    assert f"skipping {root / 'step_00000003'}: marked unhealthy" in said
    assert f"skipping {root / 'step_00000002'}: marked unhealthy" in said
    assert f"train.resume=auto: continuing from {root / 'step_00000001'} (step 1)" in said
    assert [p.name for p in ckpt.list_checkpoints(root)] == ["step_00000001"]  # the others moved aside
    moved = next(p for p in run.iterdir() if p.name.startswith("replaced-"))
    assert sorted(p.name for p in (moved / "ckpt").iterdir()) == ["step_00000002", "step_00000003"]

    mark_unhealthy(1)  # no healthy checkpoint left: refused, nothing moved
    with pytest.raises(ckpt.CheckpointError, match=r"every usable checkpoint .* is marked unhealthy") as e:
        choose_start(cfg, run, 1)
    assert f"train.resume={root / 'step_00000001'}" in str(e.value)
    assert [p.name for p in ckpt.list_checkpoints(root)] == ["step_00000001"]


def test_divergence_advice_is_a_command_that_runs_as_printed(monkeypatch, capsys, tmp_path, data_root):
    real = Trainer.forward_backward_step
    poisoned = {"on": True}

    def nan_from_step_13(self, step):  # steps 13, 14, 15 (0-based 12-14) get a non-finite grad norm
        loss, norm = real(self, step)
        return (loss, torch.full_like(norm, float("nan"))) if poisoned["on"] and step >= 12 else (loss, norm)

    monkeypatch.setattr(Trainer, "forward_backward_step", nan_from_step_13)
    run = tmp_path / "run"
    args = tiny_overrides(data_root, max_steps=16, ckpt_interval=1, max_nonfinite_steps=3, health_window=3)
    code, _, err = run_cli(monkeypatch, capsys, [*args, f"hydra.run.dir={run}"])
    assert code == 1
    assert_one_line(
        err, "The trouble began at step 13", f"{run / 'ckpt' / 'step_00000012'}", "e.g. python train.py "
    )
    argv = shlex.split(err.strip().split("e.g. ", 1)[1])
    assert argv[:2] == ["python", "train.py"]
    assert f"train.resume={run / 'ckpt' / 'step_00000012'}" in argv and f"hydra.run.dir={run}" in argv

    poisoned["on"] = False
    code, out, err = run_cli(monkeypatch, capsys, argv[2:])  # exactly as printed
    assert code == 0, err
    assert f"resumed from {run / 'ckpt' / 'step_00000012'} at step 12" in out
    lr = records(run, "lr")
    assert sorted(lr) == list(range(1, 17)) and lr[13] < 0.6 * lr[12]  # the lower lr applies from step 13


def test_resume_auto_does_not_replay_a_divergence_under_the_same_settings(
    monkeypatch, capsys, tmp_path, data_root
):
    """A job script that requeues on any failure with train.resume=auto would replay the same steps into
    the same divergence, forever: that resume is refused as the divergence it would repeat (exit 1, one
    line with the stop's advice, outcome.json "diverged" again); with a setting changed it goes on."""
    from mars.train.outcome import read_outcome

    real = Trainer.forward_backward_step

    def nan_from_step_5(self, step):  # a deterministic divergence, as an exact replay would meet it
        loss, norm = real(self, step)
        return (loss, torch.full_like(norm, float("nan"))) if step >= 4 else (loss, norm)

    monkeypatch.setattr(Trainer, "forward_backward_step", nan_from_step_5)
    run = tmp_path / "run"
    args = [
        *tiny_overrides(data_root, max_steps=8, ckpt_interval=2, max_nonfinite_steps=2, health_window=2),
        f"hydra.run.dir={run}",
        "train.resume=auto",
    ]
    code, _, err = run_cli(monkeypatch, capsys, args)
    assert code == 1 and "The trouble began at step 5" in err
    first = read_outcome(run)
    checkpoints, metrics = ckpt.list_checkpoints(run / "ckpt"), (run / "metrics.jsonl").read_text()

    code, _, err = run_cli(monkeypatch, capsys, args)  # the requeued job: the same command
    assert code == 1
    assert_one_line(err, "train.resume=auto: this run stopped for divergence under these same settings",
                    "The stop said: stopping at step 6", "The trouble began at step 5")  # fmt: skip
    again = read_outcome(run)
    assert again["status"] == "diverged" and again["time"] > first["time"]
    assert again["settings"] == first["settings"]
    assert ckpt.list_checkpoints(run / "ckpt") == checkpoints
    assert (run / "metrics.jsonl").read_text() == metrics
    code, _, err = run_cli(monkeypatch, capsys, args)  # requeued again: the same line, not one quoting it
    assert code == 1 and err.count("The stop said:") == 1 and read_outcome(run)["message"] == again["message"]

    monkeypatch.setattr(Trainer, "forward_backward_step", real)
    code, out, err = run_cli(monkeypatch, capsys, [*args, "optimizer.lr=0.0005"])  # a lower lr: it goes on
    assert code == 0, err
    assert "continuing from" in out and read_outcome(run)["status"] == "completed"


def test_a_second_ctrl_c_stops_at_once_with_one_line(monkeypatch, capsys, tmp_path, data_root):
    real = Trainer.train_step

    def ctrl_c_twice_at_step_3(self):
        if self.state.step == 2:
            self._on_signal(signal.SIGINT, None)  # the first Ctrl-C asks for a checkpoint at the step's end
            self._on_signal(signal.SIGINT, None)  # the second stops at once
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", ctrl_c_twice_at_step_3)
    run = tmp_path / "run"
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        [*tiny_overrides(data_root, max_steps=5, ckpt_interval=1), f"hydra.run.dir={run}"],
    )
    assert code == 130
    assert_one_line(
        err, "interrupted by Ctrl-C: stopped at once, without saving", "continue with python train.py"
    )
    assert f"hydra.run.dir={run}" in err
    assert [p.name for p in ckpt.list_checkpoints(run / "ckpt")] == ["step_00000001", "step_00000002"]


def test_a_sweep_into_a_sweep_dir_that_holds_runs_is_refused_before_hydra_writes(
    monkeypatch, capsys, tmp_path, data_root
):
    sweep = tmp_path / "sweep"
    args = ["-m", *tiny_overrides(data_root, max_steps=1), "train.seed=1", f"hydra.sweep.dir={sweep}"]
    assert run_cli(monkeypatch, capsys, args)[0] == 0
    recorded = (sweep / "0" / ".hydra" / "config.yaml").read_text()
    code, _, err = run_cli(monkeypatch, capsys, [*args, "optimizer.lr=1e-4"])
    assert code == 1
    assert_one_line(err, f"hydra.sweep.dir={sweep} already holds runs (0/)", "train.resume=auto")
    assert (sweep / "0" / ".hydra" / "config.yaml").read_text() == recorded  # the old record is intact
    code, out, err = run_cli(monkeypatch, capsys, [*args, "train.resume=auto"])  # continuing it is fine
    assert code == 0, err
    assert "nothing to train" in out
