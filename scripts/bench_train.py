"""Training-step speed of the optimizers in the real training loop (model, loader, clip, step).

    python scripts/bench_train.py                                   # gpt2_tiny on the CPU, 10 steps each
    python scripts/bench_train.py --model llama_tiny                # any configs/model/NAME.yaml
    python scripts/bench_train.py --model gpt2_small --batch-size 16 --steps 30 --json bench.json   # a GPU

Runs the same config with AdamW, MARS-AdamW approximate, MARS-AdamW exact (two forward/backward
passes per step) and MARS-M, and prints ms/step and tokens/s with ratios to AdamW, plus the two
targets: approximate MARS >= 0.95x AdamW tokens/s, exact <= 2.1x approximate's step time.
The rows carry MFU (model FLOPs utilisation, the architecture's FLOPs per token) where the peak is
known: CUDA devices in mars.model.flops' table, or --peak-flops / $MARS_PEAK_FLOPS (FLOP/s of one
device; on a CPU there is no table entry). --json FILE writes the rows (CLI.md: "name", "ms_per_step",
"tokens_per_s", "ratio_to_baseline", "baseline", ...). Each row also splits the step into forward-backward
and optimizer step (the trainer's own timer, mars.train.step_time: means over the timed steps).
--average KIND adds, per optimizer, the same run with train.average=KIND: what the averaged weights cost
per step and their bytes per parameter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without pip install

# name -> optimizer overrides
OPTIMIZERS = {
    "adamw": ["optimizer=adamw"],
    "mars_adamw_approx": ["optimizer=mars_adamw", "optimizer.approx=true"],
    "mars_adamw_exact": ["optimizer=mars_adamw", "optimizer.approx=false"],
    "mars_adamw_diagnostics": ["optimizer=mars_adamw", "optimizer.diagnostics=true"],
    "mars_m": ["optimizer=mars_m"],
}
BASELINE = "adamw"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_one(
    name: str, overrides: list[str], steps: int, warmup: int, run_dir: Path, info=None, peak=None
) -> dict:
    from mars.data import ensure_prepared
    from mars.optim import state_bytes
    from mars.train.cli import compose_config
    from mars.train.distributed import DistInfo, resolve_device
    from mars.train.trainer import Trainer

    cfg = compose_config([*overrides, *OPTIMIZERS[name]])
    ensure_prepared(cfg.data)
    info = info or DistInfo(device=resolve_device(cfg.train.device))
    trainer = Trainer(cfg, run_dir / name, info)
    device = trainer.device
    for _ in range(warmup):  # compile, allocator and cache warm-up
        trainer.train_step()
    trainer.timer.collect()  # the split of the timed steps only
    times = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        trainer.train_step()  # ends with a host read of the grad norm, so the step is done
        _sync(device)
        times.append(time.perf_counter() - t0)
    ms = 1000 * statistics.median(times)
    tokens_per_s = trainer.tokens_per_step / (ms / 1000)
    forward_backward, optimizer, split = trainer.timer.collect()
    average = cfg.train.average if cfg.train.average != "off" else None
    n_params = sum(p.numel() for p in trainer.params)  # the whole model's, also of a sharded one
    average_bytes = 0
    if trainer.average is not None:
        from mars.optim._dist import local

        average_bytes = sum(local(t).numel() * t.element_size() for t in trainer.average.tensors().values())
    row = {
        "name": name if average is None else f"{name}+{average}",
        "average": average,
        "average_state_bytes": average_bytes,
        "average_bytes_per_param": average_bytes / n_params,
        "ms_forward_backward": 1000 * forward_backward / split if split else None,
        "ms_optimizer": 1000 * optimizer / split if split else None,
        "optimizer": cfg.optimizer.name,
        "exact": trainer.exact,
        "ms_per_step": ms,
        "ms_per_step_mean": 1000 * statistics.fmean(times),
        "tokens_per_s": tokens_per_s,
        "tokens_per_step": trainer.tokens_per_step,
        "steps": steps,
        "device": str(device),
        "model": f"{cfg.model.arch} {cfg.model.n_layer}L/{cfg.model.n_embd}d/T{cfg.model.block_size}",
        "parallel": cfg.train.parallel,
        "world_size": info.world_size,
        "optimizer_state_bytes": state_bytes(trainer.optimizer),
    }
    from mars.model.flops import mfu
    from mars.model.spec import spec_for

    row["flops_per_token"] = spec_for(cfg.model).flops_per_token(cfg.model, None)
    # tokens_per_s is the whole global batch's, over info.world_size devices
    row["mfu"] = mfu(tokens_per_s, row["flops_per_token"], device, info.world_size, peak)
    if device.type == "cuda":
        row["max_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        torch.cuda.reset_peak_memory_stats(device)
    del trainer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2_tiny", help="model config (configs/model/NAME.yaml)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per step (one micro-batch)")
    p.add_argument("--block-size", type=int, help="sequence length (default: the model's)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per optimizer (median reported)")
    p.add_argument(
        "--warmup", type=int, default=3, help="untimed steps first (TorchScript and torch.compile warm up)"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--optimizers", nargs="+", choices=list(OPTIMIZERS), default=list(OPTIMIZERS))
    p.add_argument(
        "--average",
        choices=["ema", "tail", "decay_sqrt"],
        help="also each optimizer with train.average=KIND (its extra time per step and state bytes)",
    )
    p.add_argument("--json", type=Path, help="write the rows as a JSON list")
    p.add_argument("--world-size", type=int, default=1, help="ranks (CPU processes with gloo, or GPUs)")
    p.add_argument(
        "--parallel", nargs="+", choices=["ddp", "fsdp"], default=["ddp"], help="layouts to measure (each)"
    )
    p.add_argument("--threads-per-rank", type=int, default=1, help="torch CPU threads of each rank")
    p.add_argument(
        "--peak-flops",
        type=float,
        help="peak FLOP/s of one device for MFU (default: $MARS_PEAK_FLOPS, the table)",
    )
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. data.root=/data")
    args = p.parse_args(argv)
    # the layout as an override (`train.parallel=fsdp`) means --parallel: fsdp needs a process group
    layouts = [o.split("=", 1)[1] for o in args.overrides if o.startswith("train.parallel=")]
    if layouts:
        if layouts[-1] not in ("ddp", "fsdp"):
            p.error(f"train.parallel={layouts[-1]}: choose ddp or fsdp")
        args.parallel = [layouts[-1]]
        args.overrides = [o for o in args.overrides if not o.startswith("train.parallel=")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    overrides = [
        f"model={args.model}",
        f"train.batch_size={args.batch_size}",
        f"train.global_batch_size={args.batch_size}",
        f"train.device={args.device}",
        "train.eval_steps=0",
        "train.progress=false",
        "logger=disabled",
        "schedule.warmup_steps=0",
    ]
    if args.block_size:
        overrides.append(f"model.block_size={args.block_size}")
    if args.compile != "auto":
        overrides.append(f"train.compile={'true' if args.compile == 'on' else 'false'}")
    overrides += args.overrides

    names = list(args.optimizers)
    if BASELINE not in names:
        names.insert(0, BASELINE)
    if args.world_size > 1 or args.parallel != ["ddp"]:
        rows = run_ranks(args, names, overrides)
    else:
        rows = []
        averaged = [f"train.average={args.average}", "train.average_start=0"] if args.average else None
        with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
            for name in names:  # the baseline first
                for extra in ([], averaged) if averaged else ([],):
                    row = bench_one(
                        name, [*overrides, *extra], args.steps, args.warmup, Path(tmp), peak=args.peak_flops
                    )
                    rows.append(row)
                    print(f"  {row['name']}: {row['ms_per_step']:.1f} ms/step", file=sys.stderr, flush=True)
                    with_ratios(rows, args.json)  # the rows so far, written at once (a killed run keeps them)
    with_ratios(rows, args.json)
    if args.world_size > 1 or args.parallel != ["ddp"]:  # the layout in each row
        print_layouts(rows, args)
    else:
        print_rows(rows, args)
    if args.json:
        print(f"wrote {args.json}")
    return 0


def with_ratios(rows: list[dict], json_path: Path | None) -> None:
    """Each row's ratios to the baseline of its layout; then the rows into `json_path`."""
    for r in rows:
        base = next(b for b in rows if b["name"] == BASELINE and b["parallel"] == r["parallel"])
        r["baseline"] = BASELINE
        r["ratio_to_baseline"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["step_time_ratio_to_baseline"] = r["ms_per_step"] / base["ms_per_step"]
    if json_path:
        json_path.write_text(json.dumps(rows, indent=2) + "\n")


def print_rows(rows: list[dict], args) -> None:
    print(
        f"\n{rows[0]['model']}, {rows[0]['tokens_per_step']} tokens/step on {rows[0]['device']}, "
        f"median of {args.steps} steps"
    )
    header = f"{'optimizer':<26}{'ms/step':>10}{'fwd-bwd':>9}{'optim':>8}{'tokens/s':>12}"
    header += f"{'x AdamW tok/s':>15}"
    has_mfu = any(r.get("mfu") is not None for r in rows)
    print(header + (f"{'MFU':>8}" if has_mfu else ""))
    for r in rows:
        split = (
            f"{r['ms_forward_backward']:>9.1f}{r['ms_optimizer']:>8.1f}"
            if r["ms_forward_backward"] is not None
            else f"{'-':>9}{'-':>8}"
        )
        line = f"{r['name']:<26}{r['ms_per_step']:>10.1f}{split}{r['tokens_per_s']:>12.0f}"
        line += f"{r['ratio_to_baseline']:>15.3f}"
        if has_mfu and r.get("mfu") is not None:
            line += f"{100 * r['mfu']:>7.1f}%"
        print(line)
    by = {r["name"]: r for r in rows}
    for r in rows:  # what train.average adds: per step (the optimizer part, where it runs) and in memory
        plain = by.get(r["name"].split("+")[0]) if r.get("average") else None
        if plain is not None:
            print(
                f"{r['name']}: {r['ms_per_step'] - plain['ms_per_step']:+.2f} ms/step (median), "
                f"{r['ms_optimizer'] - plain['ms_optimizer']:+.2f} ms in the optimizer part (mean), "
                f"{r['average_bytes_per_param']:.2f} bytes/param of averaged weights"
            )
    if "mars_adamw_approx" in by:
        ratio = by["mars_adamw_approx"]["ratio_to_baseline"]
        print(f"approx MARS tokens/s vs AdamW: {ratio:.3f}x (target >= 0.95x)")
        if "mars_adamw_exact" in by:
            ratio = by["mars_adamw_exact"]["ms_per_step"] / by["mars_adamw_approx"]["ms_per_step"]
            by["mars_adamw_exact"]["step_time_ratio_to_approx"] = ratio
            print(f"exact MARS step time vs approx: {ratio:.3f}x (target <= 2.1x)")
        if "mars_adamw_diagnostics" in by:
            ratio = by["mars_adamw_diagnostics"]["ms_per_step"] / by["mars_adamw_approx"]["ms_per_step"]
            print(f"MARS diagnostics on vs off: step time {ratio:.3f}x")


def print_layouts(rows: list[dict], args) -> None:
    """One row per (layout, optimizer): tokens/s and the optimizer state each rank holds."""
    first = rows[0]
    print(
        f"\n{first['model']}, {first['tokens_per_step']} tokens/step on {first['world_size']} rank(s) "
        f"({first['device'].split(':')[0]}), median of {args.steps} steps"
    )
    header = (
        f"{'layout':<8}{'optimizer':<24}{'ms/step':>10}{'tokens/s':>12}{'x AdamW':>9}{'state MB/rank':>15}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['parallel']:<8}{r['name']:<24}{r['ms_per_step']:>10.1f}{r['tokens_per_s']:>12.0f}"
            f"{r['ratio_to_baseline']:>9.3f}{r['optimizer_state_bytes_max'] / 2**20:>15.2f}"
        )


def _rank(
    rank: int, world: int, args, names: list[str], overrides: list[str], device_type: str
) -> list | None:
    """One rank of a --world-size run: every (layout, optimizer) row; rank 0 returns them with every
    rank's optimizer-state bytes."""
    import torch.distributed as dist

    from mars.train.distributed import DistInfo

    device = f"cuda:{rank}" if device_type == "cuda" else "cpu"
    torch.set_num_threads(args.threads_per_rank)
    info = DistInfo(rank=rank, local_rank=rank, world_size=world, device=device)
    gbs = f"train.global_batch_size={args.batch_size * world}"
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"bench_train_{rank}_") as tmp:
        averaged = [f"train.average={args.average}", "train.average_start=0"] if args.average else None
        for parallel in args.parallel:
            for name, average in [(n, a) for n in names for a in ([], averaged) if a is not None]:
                extra = [*overrides, *average, gbs, f"train.device={device}", f"train.parallel={parallel}"]
                rows.append(
                    bench_one(
                        name, extra, args.steps, args.warmup, Path(tmp) / parallel, info, args.peak_flops
                    )
                )
                if rank == 0:
                    print(
                        f"  {parallel} {name}: {rows[-1]['ms_per_step']:.1f} ms/step",
                        file=sys.stderr,
                        flush=True,
                    )
    gathered = [None] * world
    dist.all_gather_object(gathered, [r["optimizer_state_bytes"] for r in rows])
    for i, r in enumerate(rows):
        r["optimizer_state_bytes_per_rank"] = [g[i] for g in gathered]
        r["optimizer_state_bytes_max"] = max(g[i] for g in gathered)
    return rows if rank == 0 else None


def run_ranks(args, names: list[str], overrides: list[str]) -> list[dict]:
    """--world-size W / --parallel: W processes (gloo on CPU, nccl on GPUs), each `--threads-per-rank`."""
    from mars.data import ensure_prepared
    from mars.train.cli import compose_config
    from mars.train.distributed import run_local_ranks

    ensure_prepared(compose_config(overrides).data)  # once, before the ranks start
    cuda = torch.cuda.is_available() and args.device in ("auto", "cuda")
    backend = "nccl" if cuda else "gloo"
    return run_local_ranks(
        _rank, args.world_size, args, names, overrides, "cuda" if cuda else "cpu", backend=backend
    )


if __name__ == "__main__":
    sys.exit(main())
