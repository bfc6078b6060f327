"""Every entry point's CUDA branches, through the real entry point, on a machine of stand-in GPUs
(standin_cuda.py: torch.cuda's entry points enforce torch's rules, CUDA memory is the CPU's). Each run
trains, evaluates and checkpoints as far as the CPU can go; the record says what was asked of CUDA.
Marked slow (subprocesses, torchrun)."""

from __future__ import annotations

import json

import pytest
from standin_helpers import REPO, TINY, calls, run_standin

pytestmark = pytest.mark.slow

TRAIN = str(REPO / "train.py")


def ok(proc) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def one_line(proc, *fragments: str) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def gpu_run(data_root, tmp_path_factory):
    """`python train.py` on one GPU, defaults (train.device=auto): 2 steps, validation, a checkpoint."""
    tmp = tmp_path_factory.mktemp("one_gpu")
    run_dir, log = tmp / "run", tmp / "auto.json"
    proc = run_standin(
        [TRAIN, *TINY, f"data.root={data_root}", "train.max_steps=2", f"hydra.run.dir={run_dir}"], log
    )
    return proc, run_dir, log


def test_python_train_py_on_one_gpu_trains_checkpoints_and_resumes(gpu_run, data_root, tmp_path):
    proc, run_dir, log = gpu_run
    ok(proc)
    assert calls(log, "set_device") == [{"call": "set_device", "device": "cuda:0", "index": 0}]
    assert calls(log, "autocast") == [{"call": "autocast", "device_type": "cuda", "dtype": "torch.bfloat16"}]
    (end,) = calls(log, "exit")
    assert end["matmul_tf32"] and end["current_device"] == 0
    assert calls(log, "pin_memory")  # batches go to the GPU from pinned memory
    assert not calls(log, "init_process_group")  # one process, ddp: no process group
    text = (run_dir / "train.log").read_text()
    assert "device cuda:0" in text and "training without torch.compile" in text  # no Triton here
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "val/loss" in r] == [0, 2]
    train = next(r for r in lines if "train/loss" in r)
    assert "mfu" in train and "max_memory_gb" in train  # a GPU's peak FLOP/s is known, its memory counted
    # the step's split from CUDA events, read at the log step after a synchronize (elapsed_time before it
    # would have failed the run)
    assert train["ms_forward_backward"] > 0 and train["ms_optimizer"] > 0
    # three timing events, recorded again every step (read at each log step: log_interval=1)
    assert calls(log, "Event") == [{"call": "Event", "enable_timing": True}] * 3
    assert lines[0]["hardware"] == "1 x NVIDIA H200 (stand-in)"
    assert (run_dir / "ckpt" / "step_00000002").is_dir()

    # the same run continued with train.device=cuda and train.dtype=float32 (the checkpoint's CUDA RNG
    # states restored through set_rng_state_all; float32 turns TF32 off)
    resumed = tmp_path / "resume.json"
    more = [f"data.root={data_root}", "train.max_steps=3", "train.resume=auto", "train.device=cuda"]
    ok(run_standin([TRAIN, *TINY, *more, "train.dtype=float32", f"hydra.run.dir={run_dir}"], resumed))
    assert "resumed from" in (run_dir / "train.log").read_text()
    assert calls(resumed, "set_device")[0]["index"] == 0 and not calls(resumed, "autocast")
    assert calls(resumed, "exit")[0]["matmul_tf32"] is False


def test_fsdp_in_one_process_takes_a_nccl_group_on_its_gpu(data_root, tmp_path):
    log = tmp_path / "fsdp.json"
    args = [TRAIN, *TINY, f"data.root={data_root}", "train.max_steps=2", "train.parallel=fsdp"]
    ok(run_standin([*args, f"hydra.run.dir={tmp_path / 'run'}"], log))
    assert calls(log, "set_device")[0]["index"] == 0
    (init,) = calls(log, "init_process_group")
    assert init["backend"] == "nccl" and init["device"] == 0
    assert calls(log, "init_device_mesh")[0]["device_type"] == "cuda"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torchrun_on_two_gpus_puts_each_rank_on_its_own(data_root, tmp_path, parallel):
    log = tmp_path / "ranks.json"
    args = [TRAIN, *TINY, f"data.root={data_root}", "train.max_steps=2", f"train.parallel={parallel}"]
    ok(run_standin([*args, f"hydra.run.dir={tmp_path / 'run'}"], log, devices=2, ranks=2))
    for rank in (0, 1):
        mine = tmp_path / f"ranks.json.{rank}"
        assert calls(mine, "set_device")[0]["index"] == rank
        assert calls(mine, "init_process_group")[0] == {
            "call": "init_process_group",
            "backend": "nccl",
            "device": rank,
            "rank": str(rank),
        }
        if parallel == "ddp":
            assert calls(mine, "DistributedDataParallel") == [
                {"call": "DistributedDataParallel", "device_ids": [rank]}
            ]
        else:
            assert calls(mine, "init_device_mesh")[0]["device"] == rank
    assert (tmp_path / "run" / "ckpt" / "step_00000002").is_dir()


def test_python_m_eval_on_the_gpu_scores_under_bfloat16(gpu_run, tmp_path):
    _, run_dir, _ = gpu_run
    log, out = tmp_path / "eval.json", tmp_path / "scores"
    ok(
        run_standin(
            ["-m", "eval", f"ckpt={run_dir}", "tasks=smoke", "limit=4", "device=cuda", f"out={out}"], log
        )
    )
    assert calls(log, "set_device") == [] or calls(log, "set_device")[0]["index"] == 0
    assert calls(log, "autocast") == [{"call": "autocast", "device_type": "cuda", "dtype": "torch.bfloat16"}]
    request = json.loads((out / "results.json").read_text())["mars"]["request"]
    assert request["dtype"] == "bfloat16"


def test_the_benchmarks_run_on_the_gpu(data_root, tmp_path):
    rows = tmp_path / "train.json"
    bench_train = [
        str(REPO / "scripts" / "bench_train.py"),
        *("--device", "cuda", "--steps", "1", "--warmup", "0", "--batch-size", "1", "--block-size", "32"),
        *("--optimizers", "adamw", "mars_adamw_exact", "--json", str(rows), "--"),
        *("model.n_layer=1", "model.n_embd=32", "model.n_head=2", f"data.root={data_root}"),
    ]
    ok(run_standin(bench_train, tmp_path / "bench_train.json"))
    got = json.loads(rows.read_text())
    assert {r["device"] for r in got} == {"cuda:0"} and all(r["mfu"] is not None for r in got)
    assert calls(tmp_path / "bench_train.json", "synchronize")  # steps are timed between syncs
    bench_optim = [
        str(REPO / "scripts" / "bench_optim.py"),
        *("--device", "cuda", "--n-layer", "1", "--steps", "1", "--warmup", "1"),
        *("--only", "adamw_fused,mars_adamw_foreach", "--json", str(tmp_path / "optim.json")),
    ]
    ok(run_standin(bench_optim, tmp_path / "bench_optim.json"))
    assert {r["name"] for r in json.loads((tmp_path / "optim.json").read_text())} >= {"mars_adamw_foreach"}


def test_a_device_the_machine_lacks_is_one_line_before_anything_is_built(data_root, tmp_path):
    args = [TRAIN, *TINY, f"data.root={data_root}", f"hydra.run.dir={tmp_path / 'run'}"]
    line = one_line(run_standin([*args, "train.device=cuda:7"], tmp_path / "a.json"), "train.device=cuda:7")
    assert (
        "this machine has cpu and 1 CUDA device (cuda:0, NVIDIA H200" in line
        and "use train.device=cuda:0" in line
    )
    one_line(
        run_standin([*args, "train.device=mps"], tmp_path / "b.json"), "train.device='mps'", "device=auto"
    )
    # torchrun with more processes than GPUs: said once (by rank 0), before anything is built
    proc = run_standin([*args, "train.device=auto"], tmp_path / "c.json", devices=1, ranks=2)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr[-3000:]
    assert "2 processes on this node" in errors[0] and "--nproc_per_node=1" in errors[0]
    assert not (tmp_path / "run").exists()
