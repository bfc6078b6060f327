"""End-to-end runs of train.py in subprocesses: DDP (torchrun, gloo) against one process, resume after
SIGKILL, SIGTERM, a -m sweep with its summary and plots. Marked slow: about a minute on 2 cores."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_helpers import PYTHON, REPO, compose, subprocess_env, tiny_overrides

from mars.checkpoint import latest_checkpoint, load_train_state
from mars.train.distributed import DistInfo
from mars.train.trainer import Trainer

pytestmark = pytest.mark.slow
TRAIN = str(REPO / "train.py")


def run(args, cwd, timeout=240, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        args, cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
    return proc


def losses(run_dir: Path, key: str = "train/loss") -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if key in rec:
            assert rec["step"] not in out, f"step {rec['step']} logged twice in {run_dir}"
            out[rec["step"]] = rec[key]
    return out


def final_weights(run_dir: Path) -> tuple[dict[str, torch.Tensor], float]:
    """The weights of a run's newest checkpoint (either format), gathered into this process, and its lr."""
    from mars.checkpoint import load_model

    model, info = load_model(run_dir)
    return model.state_dict(), info["config"]["optimizer"]["lr"]


# Tolerances of the layout tests (ddp, fsdp, HSDP against one process, or against each other). A layout
# adds the same per-sequence gradients in another order (over 2 ranks (g1 + g2) + (g3 + g4), in one
# process ((g1 + g2) + g3) + g4), so the runs may part by float32 rounding, and by no more:
# - grad_norm at step 1 within 4 float32 ulps (relative 4.8e-7): the weights are still the same, only the
#   gradient's sum differs, and the norm is within an ulp of exact in every layout (mars.train.grad_norm;
#   torch's CPU norm kernel had put fsdp's 1.8e-6 (relative) above one process's at step 1 of test_fsdp);
# - grad_norm at a later step within 64 ulps (relative 7.6e-6): by then the weights have parted by the
#   rounding of the steps before, and the norms part further. How far depends on the CPU's kernels: 4.05
#   ulps at step 6 of the 2-rank ddp test on an AVX-512 Xeon, within 4 on the machine that set the
#   bound. A real error (a micro-batch lost or counted twice) moves the norm by percents;
# - final weights within lr / 300: Adam moves a weight by about lr a step whatever its gradient's size,
#   so the rounding of a near-zero gradient entry can move it by a small part of lr (seen: lr / 3500);
#   a real error (a micro-batch lost or counted twice, a shard out of place) moves weights by ~lr.
NORM_REL = 4 * torch.finfo(torch.float32).eps
NORM_REL_LATER = 64 * torch.finfo(torch.float32).eps
WEIGHT_LR_FRACTION = 1 / 300


def norm_tolerance(step: int) -> float:
    """The relative tolerance of a layout's grad_norm at `step` (see above)."""
    return NORM_REL if step == 1 else NORM_REL_LATER


def assert_same_training(got_dir: Path, want_dir: Path, label: str = "") -> None:
    """got's grad_norm at each of its logged steps and its final weights equal want's (see above)."""
    got, want = losses(got_dir, "grad_norm"), losses(want_dir, "grad_norm")
    for step, norm in got.items():
        assert abs(norm - want[step]) <= norm_tolerance(step) * want[step], (label, step, norm, want[step])
    (got_w, _), (want_w, lr) = final_weights(got_dir), final_weights(want_dir)
    assert got_w.keys() == want_w.keys()
    gaps = {k: float((w - want_w[k]).abs().max()) for k, w in got_w.items()}
    worst = max(gaps, key=gaps.get)
    assert gaps[worst] <= lr * WEIGHT_LR_FRACTION, (label, worst, gaps[worst])


def in_process(overrides, run_dir: Path) -> Path:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the subprocesses (OMP_NUM_THREADS=1)
    try:
        Trainer(compose(overrides), run_dir, DistInfo()).fit()
    finally:
        torch.set_num_threads(before)
    return run_dir


@pytest.mark.parametrize("mode", ["approx", "exact"])
def test_two_process_ddp_equals_one_process(data_root, tmp_path, mode):
    """Same global batch (4 sequences): 2 ranks x 2 micro-steps of 1 vs 1 process x 4 micro-steps of 1."""
    overrides = [
        *tiny_overrides(
            data_root, max_steps=10, batch_size=1, global_batch_size=4, eval_interval=5, eval_steps=4
        ),
        f"optimizer.approx={'true' if mode == 'approx' else 'false'}",
    ]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    run([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", TRAIN, *overrides], cwd)
    # every rank used rank 0's time-stamped run dir: exactly one dir, nothing else in the cwd
    assert [p.name for p in cwd.iterdir()] == ["outputs"]
    run_dirs = [p for p in (cwd / "outputs").glob("*/*") if p.is_dir()]
    assert len(run_dirs) == 1, run_dirs
    ddp = run_dirs[0]
    assert (ddp / ".hydra" / "config.yaml").is_file() and (ddp / "ckpt" / "step_00000010").is_dir()

    single = in_process(overrides, tmp_path / "single")
    want, got = losses(single), losses(ddp)
    assert sorted(got) == list(range(1, 11))
    for step in want:
        assert abs(got[step] - want[step]) < 1e-4, (step, got[step], want[step])
    for step, val in losses(single, "val/loss").items():
        assert abs(losses(ddp, "val/loss")[step] - val) < 1e-4
    assert want[10] < want[1]  # it trains
    assert_same_training(ddp, single, label=mode)


KILL_AFTER_CHECKPOINT = """
import os, signal, sys
import mars.checkpoint.save as checkpoint

save = checkpoint.save_checkpoint

def save_then_die(run_dir, step, *args, **kwargs):
    path = save(run_dir, step, *args, **kwargs)
    if step == {step}:
        os.kill(os.getpid(), signal.SIGKILL)
    return path

checkpoint.save_checkpoint = save_then_die
from mars.train.cli import main
sys.argv[0] = {train!r}
main()
"""


LLAMA_SMALL = ["model=llama_tiny", "model.n_head=4", "model.n_kv_head=2"]


@pytest.mark.parametrize(
    "model",
    [pytest.param([], id="gpt2"), pytest.param(LLAMA_SMALL, id="llama", marks=pytest.mark.extended)],
)
def test_resume_after_sigkill_reproduces_the_straight_run(data_root, tmp_path, model):
    overrides = [*tiny_overrides(data_root, max_steps=20, ckpt_interval=10, eval_interval=10), *model]
    straight = in_process(overrides, tmp_path / "straight")

    split = tmp_path / "split"
    driver = tmp_path / "kill_after_checkpoint.py"
    driver.write_text(KILL_AFTER_CHECKPOINT.format(step=10, train=TRAIN))
    killed = run([PYTHON, str(driver), *overrides, f"hydra.run.dir={split}"], tmp_path, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert latest_checkpoint(split / "ckpt").name == "step_00000010"

    run([PYTHON, TRAIN, *overrides, "train.resume=auto", f"hydra.run.dir={split}"], tmp_path)
    want, got = losses(straight), losses(split)
    assert sorted(got) == list(range(1, 21))  # each step logged once across the two processes
    assert [got[s] for s in range(1, 21)] == [want[s] for s in range(1, 21)]
    assert losses(split, "val/loss") == losses(straight, "val/loss")
    assert latest_checkpoint(split / "ckpt").name == "step_00000020"


def test_sigterm_finishes_the_step_saves_and_exits_cleanly(data_root, tmp_path):
    run_dir = tmp_path / "run"
    args = [
        PYTHON,
        TRAIN,
        *tiny_overrides(data_root, max_steps=100000, eval_steps=0),
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 120
        while not (
            (run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").read_text().count("\n") >= 2
        ):
            assert proc.poll() is None and time.time() < deadline, "training did not start"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "stopped by SIGTERM" in out
    step_dir = latest_checkpoint(run_dir / "ckpt")
    step = json.loads((step_dir / "meta.json").read_text())["step"]
    assert step >= 2 and max(losses(run_dir)) <= step
    from mars.checkpoint import load_model

    model, info = load_model(run_dir)
    assert info["step"] == step and model.config.n_embd == 32
    state = load_train_state(step_dir)
    assert state["counters"]["step"] == step and "optimizer" in state and "rng" in state


def _load_script(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.extended  # make test-all
def test_two_by_two_sweep_runs_and_summarizes(data_root, tmp_path):
    sweep = tmp_path / "sweep"
    overrides = tiny_overrides(data_root, max_steps=3, log_interval=1)
    run(
        [
            PYTHON,
            TRAIN,
            "-m",
            "optimizer.gamma=0,0.025",
            "optimizer.lr=1e-3,3e-3",
            *overrides,
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
    )
    jobs = sorted(p for p in sweep.iterdir() if (p / "metrics.jsonl").is_file())
    assert len(jobs) == 4

    summarize = _load_script("summarize_sweep")
    assert summarize.main([str(sweep)]) == 0
    swept, rows = summarize.summarize(sweep)
    assert swept == ["optimizer.gamma", "optimizer.lr"]
    assert {(r["optimizer.gamma"], r["optimizer.lr"]) for r in rows} == {
        ("0", "0.001"),
        ("0", "0.003"),
        ("0.025", "0.001"),
        ("0.025", "0.003"),
    }
    for r in rows:
        vals = losses(Path(r["run_dir"]), "val/loss")
        assert r["best_val_loss"] == min(vals.values()) and r["final_val_loss"] == vals[3]
        assert r["steps"] == 3
    csv_lines = (sweep / "summary.csv").read_text().splitlines()
    assert (
        csv_lines[0].startswith("optimizer.gamma,optimizer.lr,final_val_loss,best_val_loss")
        and len(csv_lines) == 5
    )
    assert (sweep / "summary_heatmap.png").stat().st_size > 10_000

    plot = _load_script("plot_curves")
    out = tmp_path / "plots" / "curves.png"
    assert (
        plot.main([*map(str, jobs), "--out", str(out), "--logy", "--zoom", "100", "400", "10.5", "10.9"]) == 0
    )
    assert out.stat().st_size > 20_000 and out.with_suffix(".pdf").stat().st_size > 5_000
    curve = plot.read_run(jobs[0])
    assert curve.label.startswith("MARS-AdamW (approx)") and len(curve.train) == 3 and len(curve.val) == 2


def test_unknown_option_is_one_line_from_the_real_command(tmp_path):
    proc = run([PYTHON, TRAIN, "optimizer=adamm"], tmp_path, check=False)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Could not find 'optimizer/adamm'" in lines[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and not (tmp_path / "outputs").exists()


@pytest.mark.extended  # make test-all
def test_parallel_launcher_runs_two_cpu_jobs_at_once(tmp_path):
    """hydra/launcher=parallel: both jobs of a 2-job sweep run at the same time, each in its own dir;
    the data is not prepared yet, as on a fresh clone: the first job prepares it with tokenizer worker
    processes of its own (inside a joblib worker, whose default start method a child cannot use)."""
    sweep = tmp_path / "sweep"
    overrides = tiny_overrides(tmp_path / "data", max_steps=6, eval_steps=0, cpu_threads=1)
    run(
        [PYTHON, TRAIN, "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "train.seed=1,2",
         *overrides, f"hydra.sweep.dir={sweep}"],
        tmp_path,
    )  # fmt: skip
    jobs = sorted(p for p in sweep.iterdir() if (p / "metrics.jsonl").is_file())
    assert [p.name for p in jobs] == ["0", "1"]
    spans = []
    for job in jobs:
        lines = [json.loads(s) for s in (job / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in lines if "train/loss" in r] == [1, 2, 3, 4, 5, 6]
        start = (job / ".hydra" / "config.yaml").stat().st_mtime
        end = (job / "ckpt" / "step_00000006" / "meta.json").stat().st_mtime
        spans.append((start, end))
    (s0, e0), (s1, e1) = spans
    assert s0 < e1 and s1 < e0, spans  # the two time intervals overlap
    import yaml

    seeds = [yaml.safe_load((j / ".hydra" / "config.yaml").read_text())["train"]["seed"] for j in jobs]
    assert seeds == [1, 2]
