"""The study as a command: the real train.py end to end (2 arms x 4 trials, finals with 2 seeds), a driver
SIGKILLed mid-way and resumed, and trials through submitit's local executor."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from study_helpers import FAKE_COMMAND, REPO, driver_of, run_fake, smoke_spec, study_of, trials_of

pytestmark = pytest.mark.slow


def study_env(**extra) -> dict:
    env = dict(os.environ)
    env.update({"PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", **extra})
    return env


def study_command(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "study.py"), "study=smoke", *args]


@pytest.mark.extended  # make test-all
def test_a_smoke_study_of_the_real_train_py_runs_to_its_report(tmp_path, data_root):
    from mars.analysis.cli import report_main
    from mars.analysis.runs import find_run_dirs
    from mars.train.outcome import read_outcome

    study_dir = tmp_path / "smoke"
    proc = subprocess.run(
        study_command(f"study.dir={study_dir}", f"data.root={data_root}"),
        env=study_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = find_run_dirs(study_dir / "search") + find_run_dirs(study_dir / "final")
    assert len(runs) == 2 * 4 + 2 * 2
    for run in runs:  # ordinary run dirs of train.py
        assert (run / "metrics.jsonl").is_file() and (run / "ckpt").is_dir()
        assert read_outcome(run)["status"] == "completed"
    study = json.loads((study_dir / "report" / "study.json").read_text())
    assert study["arms"]["adamw"]["best_rank"] == 1 and study["verdict"]["paired"] is True
    text = (study_dir / "report" / "study.md").read_text()
    assert "## Verdict" in text and "## Budget" in text and "## Sensitivity" in text

    # the verdict is report.py on the same run dirs, as the printed command says
    args = shlex.split(study["verdict_command"])[2:]
    args[args.index("--out") + 1] = str(tmp_path / "by_hand")
    assert report_main(args) == 0
    assert json.loads((tmp_path / "by_hand" / "report.json").read_text()) == study["verdict"]


@pytest.mark.extended  # CI: the same kill and resume in process, tests/study/test_driver.py
def test_a_driver_killed_mid_way_resumes_with_only_the_missing_trials(tmp_path, data_root):
    study_dir, ledger = tmp_path / "killed", tmp_path / "ledger.txt"
    command = study_command(
        f"study.dir={study_dir}",
        f"data.root={data_root}",
        f"study.launcher.command=[{','.join(FAKE_COMMAND)}]",
    )
    env = study_env(FAKE_SLEEP="0.5", FAKE_LEDGER=str(ledger))
    driver = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and len(_lines(ledger)) < 7:  # some done, two running
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    for line in _lines(ledger):  # the trials it ran got SIGTERM (they die with their driver): wait for them
        _wait_gone(int(line.split()[2]))
    before = _lines(ledger)  # (a trial launched as its driver died and not yet in it dies before writing)
    assert 7 <= len(before) < 12

    resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = _lines(ledger)[len(before) :]
    runs = [tuple(line.split()[:2]) for line in before + after]  # (run dir, fresh | resume)
    fresh = [d for d, how in runs if how == "fresh"]
    assert len(fresh) == len(set(fresh))  # no trial starts from scratch twice
    assert len({d for d, _ in runs}) == 12  # every trial ran
    again = {line.split()[0] for line in after} & {line.split()[0] for line in before}
    assert len(again) <= 2  # only what was running when the driver died runs again ...
    assert all(how == "resume" for d, how in runs[len(before) :] if d in again)  # ... continued in its dir

    whole = run_fake(study_of(tmp_path / "whole"))  # the same spec and seed, never interrupted
    same = study_of(study_dir, base=[*smoke_spec()["base"], f"data.root={data_root}"])
    assert trials_of(driver_of(same)) == trials_of(whole)


@pytest.mark.extended  # make test-all
def test_trials_run_through_submitit(tmp_path, data_root):
    study_dir = tmp_path / "submitit"
    command = study_command(
        f"study.dir={study_dir}",
        f"data.root={data_root}",
        "study.trials=1",
        "study.final.seeds=[1]",
        "study.launcher.name=submitit",
        "+study.launcher.submitit.cluster=local",
        "+study.launcher.submitit.timeout_min=5",
        f"study.launcher.command=[{','.join(FAKE_COMMAND)}]",
    )
    proc = subprocess.run(command, env=study_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    study = json.loads((study_dir / "report" / "study.json").read_text())
    assert [len(study["arms"][a]["search"]) for a in ("adamw", "mars_adamw")] == [1, 1]
    assert all(t["status"] == "completed" for a in study["arms"].values() for t in a["search"] + a["finals"])
    assert any((study_dir / ".submitit").iterdir())


def _wait_gone(pid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"trial process {pid} outlived its killed driver by {timeout} s")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []
