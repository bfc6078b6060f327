"""RUN_DIR/outcome.json: how a run ended, for launchers (the study tells divergence from failure by it)."""

from __future__ import annotations

import time

import pytest
import torch
from train_helpers import run_cli, tiny_overrides

from mars.train.outcome import read_outcome
from mars.train.trainer import Trainer


def test_each_run_records_how_it_ended_and_a_failure_nothing(monkeypatch, capsys, tmp_path, data_root):
    run = tmp_path / "run"
    before = time.time()
    args = [*tiny_overrides(data_root, max_steps=2), f"hydra.run.dir={run}"]
    code, _, err = run_cli(monkeypatch, capsys, args)
    assert code == 0, err
    completed = read_outcome(run, since=before)
    assert completed["status"] == "completed"

    missing = tmp_path / "missing"  # a resume from a checkpoint that is not there fails before training
    args = [*tiny_overrides(data_root, max_steps=2), f"hydra.run.dir={run}", f"train.resume={missing}"]
    code, _, err = run_cli(monkeypatch, capsys, args)
    assert code != 0 and err.startswith("error: ")
    assert read_outcome(run) == completed  # the earlier run's record, untouched: no record of this attempt
    assert read_outcome(run, since=completed["time"] + 1e-3) is None

    real = Trainer.forward_backward_step

    def nan_norm(self, step):
        loss, norm = real(self, step)
        return loss, torch.full_like(norm, float("nan"))

    monkeypatch.setattr(Trainer, "forward_backward_step", nan_norm)
    again = time.time()
    args = tiny_overrides(data_root, max_steps=6, max_nonfinite_steps=2)
    code, _, err = run_cli(monkeypatch, capsys, [*args, f"hydra.run.dir={run}", "train.overwrite=true"])
    assert code == 1  # the same status as any other failure: the record tells them apart
    outcome = read_outcome(run, since=again)
    assert outcome["status"] == "diverged"
    assert outcome["message"].startswith("stopping at step 2: 2 steps in a row had a non-finite loss")


@pytest.mark.parametrize("text", ["", "{", '{"status": "exploded"}', "[1]"])
def test_an_unreadable_record_is_none(tmp_path, text):
    (tmp_path / "outcome.json").write_text(text)
    assert read_outcome(tmp_path) is None
