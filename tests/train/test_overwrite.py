"""train.overwrite=true where it meets outcome.json and forks: the earlier run's outcome goes aside with
the rest of it, a fork never moves its own source, and a fork's report and plot find their parent by its
checksum hash (drawing the parent where it was moved, or none). And train.resume=PATH of another run dir
with a changed fixed key is refused before the run dir exists, as a fork is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from train_helpers import assert_one_line, run_cli, tiny_overrides

import mars.checkpoint as ckpt
from mars.train.outcome import read_outcome
from mars.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread", "restore_logging")


def train(monkeypatch, capsys, data_root, run_dir: Path, *extra: str, max_steps: int = 4) -> tuple[int, str]:
    args = [*tiny_overrides(data_root, max_steps=max_steps, ckpt_interval=2), f"hydra.run.dir={run_dir}"]
    code, _, err = run_cli(monkeypatch, capsys, [*args, *extra])
    return code, err


def killed_at_step(monkeypatch, step: int) -> None:
    """The run's process dies (no outcome recorded) when it reaches `step` (after its checkpoint there)."""
    real = Trainer.train_step

    def die(self):
        if self.state.step == step:
            raise SystemExit(137)
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", die)


@pytest.fixture
def trunk(monkeypatch, capsys, data_root, tmp_path) -> Path:
    """A finished 4-step run (outcome.json "completed") with checkpoints at steps 2 and 4."""
    run = tmp_path / "trunk"
    assert train(monkeypatch, capsys, data_root, run)[0] == 0
    assert read_outcome(run)["status"] == "completed"
    return run


def test_an_overwritten_runs_outcome_goes_aside_with_it(monkeypatch, capsys, data_root, trunk):
    """A killed overwrite run no longer reads "completed": the earlier run's outcome.json moved with it."""
    killed_at_step(monkeypatch, 3)
    code, _ = train(monkeypatch, capsys, data_root, trunk, "train.overwrite=true", "train.seed=7")
    assert code == 137
    assert read_outcome(trunk) is None  # this run recorded nothing: it was killed
    (moved,) = trunk.glob("replaced-*")
    assert read_outcome(moved)["status"] == "completed"


def test_a_killed_overwrite_of_a_diverged_run_can_be_requeued(monkeypatch, capsys, data_root, tmp_path):
    """After a divergence stop, a healthy overwrite run under the same settings that is then killed is
    continued by train.resume=auto, not refused as "stopped for divergence under these same settings"."""
    real = Trainer.forward_backward_step

    def nan_from_step_3(self, step):
        loss, norm = real(self, step)
        return (loss, torch.full_like(norm, float("nan"))) if step >= 2 else (loss, norm)

    run, limits = tmp_path / "run", ["train.max_nonfinite_steps=2", "train.health_window=1"]
    monkeypatch.setattr(Trainer, "forward_backward_step", nan_from_step_3)
    code, err = train(monkeypatch, capsys, data_root, run, *limits, max_steps=6)
    assert code == 1 and read_outcome(run)["status"] == "diverged", err
    monkeypatch.setattr(Trainer, "forward_backward_step", real)
    killed_at_step(monkeypatch, 3)  # the overwrite run is healthy, and killed after its step-2 checkpoint
    assert train(monkeypatch, capsys, data_root, run, *limits, "train.overwrite=true", max_steps=6)[0] == 137
    monkeypatch.undo()
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        [*tiny_overrides(data_root, max_steps=6, ckpt_interval=2), *limits, f"hydra.run.dir={run}",
         "train.overwrite=true", "train.resume=auto"],
    )  # fmt: skip
    assert code == 0, err
    assert f"continuing from {run / 'ckpt' / 'step_00000002'}" in out
    assert read_outcome(run)["status"] == "completed"


@pytest.mark.parametrize("key", ["train.fork_from", "train.init_from"])
def test_a_run_never_moves_its_own_source_aside(monkeypatch, capsys, data_root, trunk, key):
    """A fork (or init) with train.overwrite=true into its parent's own run dir is refused before anything
    moves, instead of moving the parent aside and then failing to find its source."""
    before = sorted(p.name for p in (trunk / "ckpt").iterdir())
    source = trunk / "ckpt" / "step_00000002"
    code, err = train(
        monkeypatch, capsys, data_root, trunk, f"{key}={source}", "train.overwrite=true", max_steps=6
    )
    assert code == 2
    assert_one_line(err, f"{key}={source} lies in hydra.run.dir={trunk}", "another hydra.run.dir")
    assert sorted(p.name for p in (trunk / "ckpt").iterdir()) == before and not list(trunk.glob("replaced-*"))
    assert read_outcome(trunk)["status"] == "completed"


def test_a_forks_plot_and_report_follow_its_parent_by_its_hash(
    monkeypatch, capsys, data_root, tmp_path, trunk
):
    """The parent overwritten after the fork: the fork's lineage line says so and names where the parent
    went; its plot draws the moved parent, not the run that replaced it; with the moved copy gone too,
    no parent is drawn and the line says it cannot be found."""
    from mars.analysis.runs import load_run

    fork = tmp_path / "fork"
    assert (
        train(monkeypatch, capsys, data_root, fork, f"train.fork_from={trunk / 'ckpt' / 'step_00000002'}")[0]
        == 0
    )
    parent_losses = [(p.tokens, p.seconds, p.value) for p in load_run(trunk).metrics["train/loss"][:2]]
    assert load_run(fork).parent_points("train/loss") == parent_losses
    assert load_run(fork).lineage_line() == f"{fork}: fork of {trunk.resolve()} at step 2"

    assert train(monkeypatch, capsys, data_root, trunk, "train.overwrite=true", "train.seed=7")[0] == 0
    (moved,) = trunk.glob("replaced-*")
    run = load_run(fork)
    assert run.parent_points("train/loss") == parent_losses  # the moved parent, not the new seed's run
    assert run.lineage_line() == (
        f"{fork}: fork of {trunk.resolve()} at step 2 (its run dir was overwritten since: the parent run is "
        f"now in {moved.resolve()})"
    )
    shutil.rmtree(moved)
    run = load_run(fork)
    assert run.parent_points("train/loss") == []
    assert "no longer matches lineage.json: the parent was replaced or changed since" in run.lineage_line()


def test_a_damaged_lineage_step_is_one_line(monkeypatch, capsys, data_root, tmp_path, trunk):
    from mars.analysis.cli import plot_curves_main

    fork = tmp_path / "fork"
    assert (
        train(monkeypatch, capsys, data_root, fork, f"train.fork_from={trunk / 'ckpt' / 'step_00000002'}")[0]
        == 0
    )
    record = json.loads((fork / "lineage.json").read_text())
    (fork / "lineage.json").write_text(json.dumps({**record, "step": "two"}))
    code = plot_curves_main([str(fork), "--out", str(tmp_path / "c.png")])
    err = capsys.readouterr().err
    assert code == 2
    assert_one_line(err, f"{fork / 'lineage.json'}: \"step\" is 'two', not a step number", "repair it")


def test_resume_of_another_runs_checkpoint_with_a_changed_seed_is_refused_before_the_run_dir(
    monkeypatch, capsys, data_root, tmp_path, trunk
):
    new = tmp_path / "new"
    step2 = trunk / "ckpt" / "step_00000002"
    code, err = train(monkeypatch, capsys, data_root, new, f"train.resume={step2}", "train.seed=7")
    assert code == 2
    assert_one_line(
        err, f"train.resume={step2}: the fork would change train.seed: 1337 -> 7", "train.seed=1337"
    )
    assert not new.exists()
    assert [p.name for p in ckpt.list_checkpoints(trunk / "ckpt")] == ["step_00000002", "step_00000004"]
