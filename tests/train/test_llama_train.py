"""The LLaMA family through the training stack: one process (a few steps, MFU), 2 gloo ranks (ddp and
fsdp) equal to one process for MARS-AdamW and MARS-M, the micro study's presets, and a checkpoint of
one architecture refused for the other. (Exact resume after SIGKILL: test_e2e, per architecture.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import assert_one_line, compose, run_cli, tiny_overrides

from mars.train.distributed import DistInfo
from mars.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread", "restore_logging")

# on top of tiny_overrides' 1 layer, 32 wide, 32 tokens: 4 query heads share 2 key/value heads (of 8)
LLAMA = ["model=llama_tiny", "model.n_head=4", "model.n_kv_head=2"]
# optimizer overrides and the largest loss gap allowed between 2 ranks and 1 process
OPTIMIZERS = {
    "mars_adamw": (["optimizer=mars_adamw"], 1e-5),
    "mars_m": (["optimizer=mars_m"], 1e-3),
    "adamw_mup": (["optimizer=adamw", "model.parametrization=mup", "model.mup_base_width=16"], 1e-5),
}


def records(run_dir: Path, key: str) -> dict[int, float]:
    lines = [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in lines if key in r}


def test_llama_trains_in_one_process_and_logs_mfu_with_a_known_peak(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv("MARS_PEAK_FLOPS", "1e12")
    cfg = compose(
        [
            *tiny_overrides(data_root, max_steps=8, eval_interval=4),
            *LLAMA,
            "optimizer=adamw",
            "optimizer.lr=1e-2",
            "schedule.warmup_steps=0",  # all 8 steps at the peak (a warmup's step 0 runs at lr 0)
        ]
    )
    tr = Trainer(cfg, tmp_path, DistInfo())
    assert type(tr.raw_model).__name__ == "Llama" and tr.raw_model.config.n_kv_head == 2
    tr.fit()
    val = records(tmp_path, "val/loss")
    assert sorted(val) == [0, 4, 8] and val[8] < val[0] - 0.5  # it learns
    mfu = records(tmp_path, "mfu")
    assert len(mfu) == 8 and all(0 < v < 1 for v in mfu.values())
    saved = json.loads((tmp_path / "ckpt" / "step_00000008" / "model.json").read_text())
    assert saved["arch"] == "llama" and saved["n_kv_head"] == 2


def _overrides(data_root: str, optimizer: str) -> list[str]:
    return [
        *tiny_overrides(
            data_root, max_steps=6, batch_size=1, global_batch_size=4, eval_interval=3, eval_steps=4
        ),
        *LLAMA,
        "model.n_layer=2",
        *OPTIMIZERS[optimizer][0],
    ]


def _ranks(rank: int, world: int, data_root: str, root: str) -> None:
    """Every (layout, optimizer) run on 2 ranks; rank 0 writes the metrics."""
    info = DistInfo(rank=rank, local_rank=rank, world_size=world, device="cpu")
    for parallel in ("ddp", "fsdp"):
        for optimizer in OPTIMIZERS:
            cfg = compose([*_overrides(data_root, optimizer), f"train.parallel={parallel}"])
            Trainer(cfg, Path(root) / f"{parallel}_{optimizer}", info).fit()


@pytest.mark.slow
def test_two_ranks_ddp_and_fsdp_equal_one_process(data_root, tmp_path):
    """Global batch 4: 2 ranks x 2 micro-steps of 1 against 1 process x 4 micro-steps of 1; under fsdp
    the model, its gradients and the optimizer state are sharded, the clip and Newton-Schulz divided."""
    from dist_helpers import run_ranks

    run_ranks(2, _ranks, str(data_root), str(tmp_path), timeout=600)
    for optimizer, (_, tol) in OPTIMIZERS.items():
        single = tmp_path / f"single_{optimizer}"
        Trainer(compose(_overrides(data_root, optimizer)), single, DistInfo()).fit()
        for parallel in ("ddp", "fsdp"):
            other = tmp_path / f"{parallel}_{optimizer}"
            for key in ("train/loss", "val/loss"):
                want, got = records(single, key), records(other, key)
                assert sorted(got) == sorted(want) and len(want) >= 3
                gap = max(abs(got[s] - want[s]) for s in want)
                assert gap < tol, (parallel, optimizer, key, gap, got, want)
        assert records(single, "val/loss")[6] < records(single, "val/loss")[0]  # it trains


def test_the_micro_study_takes_model_llama_tiny():
    """experiment=micro/* sets the shape keys both families share; model=llama_tiny keeps its own."""
    from omegaconf import OmegaConf

    from mars.train.config import validate

    for experiment in ("micro/adamw", "micro/mars_adamw"):
        cfg = compose([f"experiment={experiment}", "model=llama_tiny"])
        validate(cfg)
        m = OmegaConf.to_object(cfg.model)
        assert type(m).__name__ == "LlamaConfig"
        assert (m.n_layer, m.n_head, m.n_kv_head, m.n_embd, m.block_size) == (2, 2, 2, 64, 64)
        assert cfg.train.max_steps == 400 and not m.tie_embeddings
    assert type(OmegaConf.to_object(compose(["experiment=micro/adamw"]).model)).__name__ == "GPTConfig"


@pytest.mark.parametrize(
    "first, then, theirs, ours",
    [([], LLAMA, "gpt2", "llama"), (LLAMA, ["model=gpt2_tiny"], "llama", "gpt2")],
    ids=["gpt2-as-llama", "llama-as-gpt2"],
)
def test_a_checkpoint_of_one_architecture_is_refused_for_the_other(
    monkeypatch, capsys, tmp_path, data_root, first, then, theirs, ours
):
    run = tmp_path / "run"
    base = [*tiny_overrides(data_root, max_steps=1, eval_steps=0), f"hydra.run.dir={run}"]
    assert run_cli(monkeypatch, capsys, [*base, *first])[0] == 0
    metrics = (run / "metrics.jsonl").read_text()
    # auto: found in the run dir (exit 1); a path: checked before Hydra makes a run dir (2: a config error)
    for resume, status in (("train.resume=auto", 1), (f"train.resume={run / 'ckpt'}", 2)):
        code, _, err = run_cli(monkeypatch, capsys, [*base, *then, resume])
        assert code == status
        assert_one_line(
            err,
            f"holds a model.arch={theirs} model",
            f"asks for model.arch={ours}",
            f"model={theirs}_* preset",
        )
        assert (run / "metrics.jsonl").read_text() == metrics  # nothing ran
    # resuming it in a new run dir: refused before that run dir is made
    new = tmp_path / "new"
    code, _, err = run_cli(monkeypatch, capsys, [*base, *then, f"train.resume={run}", f"hydra.run.dir={new}"])
    assert code == 2 and not new.exists()
    assert_one_line(err, f"holds a model.arch={theirs} model")


@pytest.mark.parametrize(
    "args, fragments",
    [
        (
            ["model=llama_tiny", "model.arch=mamba"],
            ["model.arch='mamba' is not a known architecture", "gpt2, llama"],
        ),
        (
            ["model.arch=llama"],
            ["model.arch=llama, but the model preset is a model.arch=gpt2 one", "model=llama_"],
        ),
        (
            ["model=gpt2_tiny", "model.n_kv_head=2"],
            ["model.n_kv_head: model.arch=gpt2 has no key", "model=llama_"],
        ),
        (["model=llama_tiny", "model.bias=true"], ["model.bias: model.arch=llama has no key", "model=gpt2_"]),
        (["model=llama_tiny", "model.n_kv_head=3"], ["model.n_kv_head=3 must divide model.n_head=4"]),
        (["model=llama_tiny", "model.n_embd=36", "model.n_head=4"], ["36 / 4 = 9 is odd", "even head size"]),
        (["model=llama_tiny", "model.mlp_hidden=0"], ["model.mlp_hidden=0 must be positive"]),
    ],
    ids=[
        "unknown-arch",
        "arch-override",
        "llama-key-on-gpt2",
        "gpt2-key-on-llama",
        "kv-heads",
        "odd-head",
        "mlp",
    ],
)
def test_bad_model_settings_are_one_line_before_the_run_dir(monkeypatch, capsys, tmp_path, args, fragments):
    run = tmp_path / "run"
    code, _, err = run_cli(monkeypatch, capsys, [*args, f"hydra.run.dir={run}"])
    assert code == 2 and not run.exists()
    assert_one_line(err, *fragments)
