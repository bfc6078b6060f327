"""RUN_DIR/outcome.json: how a run ended, for launchers (the study tells divergence from failure by it)."""

from __future__ import annotations

import time

import pytest
import torch
from train_helpers import run_cli, tiny_overrides

from mars.train.outcome import read_outcome
from mars.train.trainer import Trainer


def test_a_divergence_is_recorded_and_another_failure_records_nothing(
    monkeypatch, capsys, tmp_path, data_root
):
    real = Trainer.forward_backward_step

    def nan_norm(self, step):
        loss, norm = real(self, step)
        return loss, torch.full_like(norm, float("nan"))

    monkeypatch.setattr(Trainer, "forward_backward_step", nan_norm)
    run, before = tmp_path / "run", time.time()
    args = [*tiny_overrides(data_root, max_steps=6, max_nonfinite_steps=2), f"hydra.run.dir={run}"]
    code, _, err = run_cli(monkeypatch, capsys, args)
    assert code == 1  # the same status as any other failure: the record tells them apart
    diverged = read_outcome(run, since=before)
    assert diverged["status"] == "diverged"
    assert diverged["message"].startswith("stopping at step 2: 2 steps in a row had a non-finite loss")

    missing = tmp_path / "missing"  # a resume from a checkpoint that is not there fails before training
    code, _, err = run_cli(monkeypatch, capsys, [*args, f"train.resume={missing}"])
    assert code != 0 and err.startswith("error: ")
    assert read_outcome(run) == diverged  # the earlier run's record, untouched: none of this attempt
    assert read_outcome(run, since=diverged["time"] + 1e-3) is None


def test_the_block_records_the_trainers_status_and_only_a_divergence_of_its_errors(tmp_path):
    from mars.train.outcome import recorded
    from mars.train.trainer import TrainingDivergedError

    with recorded(tmp_path) as outcome:
        outcome.status = "preempted"
    assert read_outcome(tmp_path)["status"] == "preempted"
    with pytest.raises(ValueError), recorded(tmp_path / "x"):
        raise ValueError("data/embedded is damaged")
    assert read_outcome(tmp_path / "x") is None
    with pytest.raises(TrainingDivergedError), recorded(tmp_path):
        raise TrainingDivergedError("stopping at step 9")
    assert read_outcome(tmp_path) | {"time": 0} == {
        "status": "diverged",
        "message": "stopping at step 9",
        "time": 0,
    }
    with recorded(None):  # not rank 0: nothing is written
        pass


@pytest.mark.parametrize("text", ["", "{", '{"status": "exploded"}', "[1]"])
def test_an_unreadable_record_is_none(tmp_path, text):
    (tmp_path / "outcome.json").write_text(text)
    assert read_outcome(tmp_path) is None
