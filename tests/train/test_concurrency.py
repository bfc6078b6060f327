"""Real processes: two runs started at the same moment in one run dir (one trains, the other is refused
naming it), and SIGTERM to torchrun's agent (the ranks save and exit 0; torchrun itself exits 1, as
docs/reliability.md says). Marked slow."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
import yaml
from test_e2e import TRAIN
from train_helpers import PYTHON, subprocess_env, tiny_overrides

from mars.checkpoint import latest_checkpoint, list_checkpoints

pytestmark = pytest.mark.slow

# imports first, then wait for the start signal, so that both processes reach the run dir together
RACE = """
import os, sys, time
go = sys.argv.pop(1)
from mars.train.cli import main
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
sys.argv[0] = {train!r}
main()
"""


def _wait_for_lines(path, n: int, procs, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not (path.is_file() and path.read_text().count("\n") >= n):
        assert time.time() < deadline and all(p.poll() is None for p in procs), "training did not start"
        time.sleep(0.1)


def test_two_runs_started_at_once_in_one_run_dir(data_root, tmp_path):
    run_dir, go = tmp_path / "run", tmp_path / "go"
    driver = tmp_path / "race.py"
    driver.write_text(RACE.format(train=TRAIN))
    overrides = tiny_overrides(data_root, max_steps=100000, eval_steps=0)
    procs = {}
    for lr in ("0.001", "0.002"):
        args = [PYTHON, str(driver), str(go), *overrides, f"optimizer.lr={lr}", f"hydra.run.dir={run_dir}"]
        procs[lr] = subprocess.Popen(
            args,
            cwd=tmp_path,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        for p in procs.values():
            assert p.stdout.readline().strip() == "ready"
        go.touch()  # both start now
        # the refused one exits within seconds; the winner trains on until SIGTERM
        deadline = time.time() + 180
        while all(p.poll() is None for p in procs.values()):
            assert time.time() < deadline, "neither run was refused"
            time.sleep(0.1)
        loser_lr = next(lr for lr, p in procs.items() if p.poll() is not None)
        winner_lr = next(lr for lr in procs if lr != loser_lr)
        winner, loser = procs[winner_lr], procs[loser_lr]
        _, loser_err = loser.communicate(timeout=60)
        assert loser.returncode == 1, loser_err
        lines = [line for line in loser_err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), loser_err
        assert f"hydra.run.dir={run_dir} is in use by a live run (process {winner.pid} on" in lines[0]
        _wait_for_lines(run_dir / "metrics.jsonl", 3, [winner])
        winner.send_signal(signal.SIGTERM)
        _, winner_err = winner.communicate(timeout=120)
        assert winner.returncode == 0, winner_err[-2000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    # one run in the run dir: its config, its metrics (each step once), its checkpoints
    assert f"optimizer.lr={winner_lr}" in yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    # past the 2 warmup steps, every line has the winner's lr (the loser's is twice or half of it)
    assert all(abs(r["lr"] / float(winner_lr) - 1) < 1e-3 for r in records if r["step"] >= 3)
    step_dir = latest_checkpoint(run_dir / "ckpt")
    assert len(list_checkpoints(run_dir / "ckpt")) == 1
    assert yaml.safe_load((step_dir / "config.yaml").read_text())["optimizer"]["lr"] == float(winner_lr)


def test_sigterm_to_torchrun_saves_and_the_ranks_exit_cleanly(data_root, tmp_path):
    run_dir = tmp_path / "run"
    overrides = tiny_overrides(data_root, max_steps=100000, batch_size=1, global_batch_size=2, eval_steps=0)
    args = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", TRAIN, *overrides]
    proc = subprocess.Popen(
        [*args, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_lines(run_dir / "metrics.jsonl", 2, [proc])
        proc.send_signal(signal.SIGTERM)  # to the agent, as a scheduler does
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    # torchrun re-raises the signal it got (SignalException): its own status is 1 ...
    assert proc.returncode == 1 and "SignalException" in err
    # ... while the ranks finished the step, saved, and said how to continue; no rank failed
    assert "ChildFailedError" not in err and "exitcode" not in err, err[-3000:]
    line = next(s for s in out.splitlines() if "stopped by SIGTERM at step" in s)
    step = int(line.split("at step ")[1].split(",")[0])
    assert latest_checkpoint(run_dir / "ckpt").name == f"step_{step:08d}"
    assert "continue with: torchrun --nproc_per_node=2 " in line and f"hydra.run.dir={run_dir}" in line
