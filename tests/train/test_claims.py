"""A run holds its run dir, and a -m sweep its sweep dir and every job dir, before Hydra writes anything,
wherever a `${hydra:...}` expression puts them; a refused run or sweep leaves every file as it was
(docs/reliability.md). The training task is replaced by one that records where Hydra ran each job:
these tests train nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import assert_one_line, lock_holder, run_cli

from mars.train import cli, runlock

pytestmark = pytest.mark.usefixtures("restore_logging")


def fake_run(run_dir: Path, lr: str = "0.001") -> None:
    """What a finished run leaves in its run dir (its Hydra record, metrics and log), without training."""
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(f"- optimizer.lr={lr}\n")
    (run_dir / ".hydra" / "config.yaml").write_text(f"optimizer:\n  lr: {lr}\n")
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "train/loss": 10.8}\n')
    (run_dir / "train.log").write_text("trained\n")


def files(root: Path) -> dict[str, bytes]:
    """Every file under root (lock files aside) with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".run.lock"
    }


@pytest.fixture
def jobs_seen(monkeypatch) -> list[tuple[Path, bool]]:
    """Each job Hydra runs, in place of training: (its run dir, whether this process holds its lock)."""
    seen = []

    def task(cfg) -> None:
        from hydra.core.hydra_config import HydraConfig

        run_dir = Path(HydraConfig.get().runtime.output_dir)
        seen.append((run_dir, runlock.held(run_dir)))

    monkeypatch.setattr(cli, "_task", task)
    return seen


@pytest.mark.parametrize(
    "expression, leaf, again",
    [
        ("${hydra:runtime.choices.optimizer}", "adamw", ["optimizer.lr=0.005"]),  # another lr, same dir
        ("${hydra:job.override_dirname}", "optimizer=adamw", []),  # the same command again
    ],
)
def test_a_refused_run_leaves_the_run_it_was_refused_for_as_it_was(
    monkeypatch, capsys, tmp_path, jobs_seen, expression, leaf, again
):
    args = ["optimizer=adamw", f"hydra.run.dir={tmp_path}/runs/{expression}"]
    assert run_cli(monkeypatch, capsys, args)[0] == 0
    run = tmp_path / "runs" / leaf
    assert jobs_seen == [(run, True)]  # Hydra wrote where the lock was taken
    fake_run(run)
    before = files(run)
    code, _, err = run_cli(monkeypatch, capsys, [*args, *again])
    assert code == 1
    assert_one_line(err, f"run dir {run} already holds a run")
    assert files(run) == before  # .hydra/config.yaml and overrides.yaml still those of the first run
    assert len(jobs_seen) == 1


def test_a_sweep_never_moves_or_rewrites_a_live_run(monkeypatch, capsys, tmp_path, jobs_seen):
    sweep = tmp_path / "sweep"
    for job in ("0", "1"):
        fake_run(sweep / job)
    before = files(sweep)
    args = ["-m", "train.seed=1,2", f"hydra.sweep.dir={sweep}"]
    with lock_holder(sweep / "0") as live:  # e.g. job 0 continued by hand with train.resume=auto
        for extra in ("train.overwrite=true", "train.resume=auto"):
            code, _, err = run_cli(monkeypatch, capsys, [*args, extra])
            assert code == 1
            assert_one_line(
                err, f"hydra.sweep.dir={sweep}: its job dir 0/ is in use by a live run (process {live.pid}"
            )
            assert files(sweep) == before  # nothing of either job moved, no Hydra record rewritten
    assert jobs_seen == []
    code, _, err = run_cli(monkeypatch, capsys, [*args, "train.overwrite=true"])  # the run has ended
    assert code == 0, err
    for job in ("0", "1"):
        (moved,) = (sweep / job).glob("replaced-*")
        assert files(moved) == {k[2:]: v for k, v in before.items() if k.startswith(f"{job}/")}
    assert jobs_seen == [(sweep / "0", True), (sweep / "1", True)]  # held from before Hydra wrote them


def test_a_sweep_claims_job_dirs_that_a_hydra_expression_places(monkeypatch, capsys, tmp_path, jobs_seen):
    sweep = tmp_path / "sweep"
    args = ["-m", "optimizer=adamw,lion", f"hydra.sweep.dir={sweep}"]
    args.append("hydra.sweep.subdir=${hydra:runtime.choices.optimizer}/${hydra.job.num}")
    assert run_cli(monkeypatch, capsys, args)[0] == 0
    assert jobs_seen == [(sweep / "adamw" / "0", True), (sweep / "lion" / "1", True)]
    fake_run(sweep / "lion" / "1")
    before = files(sweep)
    code, _, err = run_cli(monkeypatch, capsys, [*args, "optimizer.lr=0.005"])
    assert code == 1
    assert_one_line(err, f"hydra.sweep.dir={sweep} already holds runs (lion/1/)")
    assert files(sweep) == before
    code, _, err = run_cli(monkeypatch, capsys, ["-m", "train.seed=1,2", "hydra.sweep.subdir=same"])
    assert code == 2
    assert_one_line(err, "hydra.sweep.subdir: sweep jobs 0 and 1 would both write into")


def test_a_lock_file_that_is_a_directory_is_one_line(monkeypatch, capsys, tmp_path, jobs_seen):
    (tmp_path / "run" / ".run.lock").mkdir(parents=True)
    code, _, err = run_cli(monkeypatch, capsys, [f"hydra.run.dir={tmp_path}/run"])
    assert code == 1
    assert_one_line(err, f"{tmp_path}/run/.run.lock is a directory", "rmdir", "another hydra.run.dir")
    assert jobs_seen == []
