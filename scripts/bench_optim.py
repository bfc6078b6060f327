"""Optimizer-step benchmark on GPT-2's parameters (the project's GPT; no forward pass, no data).

    python scripts/bench_optim.py                      # GPT-2 small shapes (124M parameters)
    python scripts/bench_optim.py --small --steps 10   # same shapes, 4 layers (~67M parameters)
    python scripts/bench_optim.py --json bench_optim.json --only adamw_fused,mars_adamw

Every row times optimizer.step() alone (gradients are fixed random tensors) as the median of
--steps steps after --warmup steps; the first step, which includes torch.compile warm-up, is
reported separately. Ratios are to torch.optim.AdamW(fused=True) on the same tensors, stepped right
before each timed step of the row (paired: both medians under the same load of a shared machine),
and for MARS-Shampoo / MARS-M also to the matching baseline: Muon on the same tensors (all
matrices, embeddings included, as MARS-Shampoo) and Moonlight; MARS-AdamW with diagnostics on is
compared with MARS-AdamW. state_bytes_per_param counts every tensor in optimizer.state (gradients and
parameters excluded). The row average_ema is not an optimizer: it times what train.average adds to every
step (mars.train.average: one torch._foreach_lerp_ of the float32 averaged weights toward the parameters,
gated on the device; ema, tail and decay_sqrt alike), its state the averaged weights themselves.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mars.model import GPT, GPTConfig  # noqa: E402
from mars.optim import Muon, build_optimizer, registered, state_bytes  # noqa: E402

# name -> (config overrides, description): each optimizer with its config's defaults (the reference
# GPT-2 small values, mars.optim's config dataclasses) and the row's own option.
ROWS = {
    "adamw_fused": ({"name": "adamw", "fused": True}, "torch AdamW(fused=True)"),
    "lion": ({"name": "lion"}, "Lion"),
    "mars_adamw": ({"name": "mars_adamw"}, "MARS-AdamW approx"),
    "mars_adamw_diagnostics": (
        {"name": "mars_adamw", "diagnostics": True},
        "MARS-AdamW approx with optimizer.diagnostics=true (the cost of the diagnostics)",
    ),
    "mars_adamw_foreach": ({"name": "mars_adamw", "fused": False}, "MARS-AdamW, multi-tensor path"),
    "mars_lion": ({"name": "mars_lion"}, "MARS-Lion approx"),
    "mars_lion_foreach": ({"name": "mars_lion", "fused": False}, "MARS-Lion, multi-tensor path"),
    "muon": ({"name": "muon"}, "Muon (embeddings/head/1-D on AdamW)"),
    "muon_same_tensors": (None, "Muon on every matrix incl. embeddings"),
    "mars_shampoo": ({"name": "mars_shampoo"}, "MARS-Shampoo approx"),
    "moonlight": ({"name": "moonlight"}, "Moonlight"),
    "mars_m": ({"name": "mars_m"}, "MARS-M approx"),
    "average_ema": ("average", "train.average=ema's update alone (tail, decay_sqrt: the same lerp)"),
}
BASELINES = {
    "mars_adamw_diagnostics": "mars_adamw",
    "mars_shampoo": "muon_same_tensors",
    "mars_m": "moonlight",
}


class AverageStep:
    """train.average's per-step update as a row: step() folds the parameters into their average."""

    def __init__(self, model: nn.Module):
        from types import SimpleNamespace

        from mars.train.average import WeightAverage

        settings = SimpleNamespace(average="ema", average_decay=0.999, average_start=None, max_steps=10**9)
        average_model = GPT(model.config).to(next(model.parameters()).device)
        self.average = WeightAverage(settings, None, model, average_model)
        self.taken = torch.ones((), device=next(model.parameters()).device)  # the found_inf gate
        self.state, self.index = {}, 0

    def step(self) -> None:
        self.average.update(self.index, self.taken)
        self.index += 1

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.average.tensors().values())


def build(name: str, model: nn.Module, process_group=None):
    overrides, _ = ROWS[name]
    if overrides == "average":
        return AverageStep(model)
    if overrides is None:  # Muon with MARS-Shampoo's split: every matrix orthogonalised, 1-D on AdamW
        groups = [
            {"params": [p for p in model.parameters() if p.ndim == 2], "use_muon": True},
            {"params": [p for p in model.parameters() if p.ndim != 2], "use_muon": False},
        ]
        muon = registered("muon")
        return Muon(groups, **muon.keywords(muon.config()), process_group=process_group)
    # the optimizer's own defaults for the keys not given
    return build_optimizer(model, overrides, process_group=process_group)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_step(opt, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    opt.step()
    sync(device)
    return time.perf_counter() - t0


def time_row(name, model, n_params, steps, warmup, device, process_group=None, paired=None):
    """Median step time of row `name`. paired: another optimizer (fused AdamW) stepped right before
    each timed step of this one, so that both medians are taken under the same machine load (a
    shared machine's load moves within seconds); its median is returned as "paired_ms_per_step"."""
    opt = build(name, model, process_group)
    first = _timed_step(opt, device)
    for _ in range(max(warmup - 1, 0)):
        opt.step()
    times, paired_times = [], []
    for _ in range(steps):
        if paired is not None:
            paired_times.append(_timed_step(paired, device))
        times.append(_timed_step(opt, device))
    row = {
        "name": name,
        "description": ROWS[name][1],
        "ms_per_step": 1e3 * statistics.median(times),
        "first_step_ms": 1e3 * first,
        "state_bytes_per_param": _state_bytes(opt) / n_params,
        "state_bytes": _state_bytes(opt),
    }
    if paired is not None:
        row["paired_ms_per_step"] = 1e3 * statistics.median(paired_times)
    del opt
    return row


def _state_bytes(opt) -> int:
    return opt.state_bytes() if isinstance(opt, AverageStep) else state_bytes(opt)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="4 layers instead of 12 (~67M parameters)")
    ap.add_argument("--n-layer", type=int, default=None, help="number of layers (overrides --small)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per optimizer (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps, the first (compile) one included")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--only", default=None, help="comma-separated row names; default all: " + ",".join(ROWS))
    ap.add_argument("--json", type=Path, default=None, help="write the rows as a JSON list")
    ap.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="W > 1: W CPU processes (gloo), Newton-Schulz divided over them; per-rank ms/step against W=1",
    )
    ap.add_argument(
        "--parallel",
        choices=["ddp", "fsdp"],
        default="ddp",
        help="with --world-size: replicated parameters (ddp) or FSDP2 shards (fsdp: state bytes per rank)",
    )
    args = ap.parse_args(argv)
    if args.world_size > 1:
        return run_distributed(args)
    names = list(ROWS) if args.only is None else args.only.split(",")
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        ap.error(f"unknown row(s) {unknown}; choose from {list(ROWS)}")
    if "adamw_fused" not in names:
        names.insert(0, "adamw_fused")
    for name, base in BASELINES.items():
        if name in names and base not in names:
            names.insert(names.index(name), base)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    n_layer = args.n_layer or (4 if args.small else 12)
    torch.manual_seed(0)
    with torch.device(device):  # the trainer's own model: its exact parameter names, shapes and tying
        model = GPT(GPTConfig(n_layer=n_layer))
    n_params = sum(p.numel() for p in model.parameters())
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    print(
        f"GPT-2 shapes, {n_layer} layers, {n_params / 1e6:.1f}M parameters, {device}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; {args.steps} timed steps"
    )

    rows = {"adamw_fused": time_row("adamw_fused", model, n_params, args.steps, args.warmup, device)}
    ratios(rows, "adamw_fused", args.json)
    adamw = build("adamw_fused", model)  # stepped alongside every other row: its ratio is paired
    for _ in range(args.warmup):
        adamw.step()
    for name in names:
        if name != "adamw_fused":
            rows[name] = time_row(name, model, n_params, args.steps, args.warmup, device, paired=adamw)
            ratios(rows, name, args.json)  # the rows so far, written at once (a killed run keeps them)
    del adamw
    header = (
        f"{'optimizer':<24} {'ms/step':>10} {'x AdamW':>8} {'x base':>7} {'baseline':<18} "
        f"{'1st step ms':>11} {'B/param':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        base = row["baseline"]
        print(
            f"{name:<24} {row['ms_per_step']:>10.1f} {row['ratio_to_adamw']:>8.2f} "
            f"{row['ratio_to_baseline']:>7.2f} {base:<18} {row['first_step_ms']:>11.0f} "
            f"{row['state_bytes_per_param']:>8.2f}"
        )
    if args.json:
        print(f"wrote {args.json}")
    return 0


def ratios(rows: dict, name: str, json_path: Path | None) -> None:
    """Row `name`'s ratios to fused AdamW (paired) and to its own baseline; then every row so far into
    `json_path`."""
    row, base = rows[name], BASELINES.get(name, "adamw_fused")
    row["baseline"] = base
    row["ratio_to_adamw"] = row["ms_per_step"] / row.get(
        "paired_ms_per_step", rows["adamw_fused"]["ms_per_step"]
    )
    row["ratio_to_baseline"] = (
        row["ms_per_step"] / rows[base]["ms_per_step"] if base != "adamw_fused" else row["ratio_to_adamw"]
    )
    if json_path:
        json_path.write_text(json.dumps(list(rows.values()), indent=2) + "\n")


# ----------------------------------------------------------------------------- --world-size W

DIVIDED_ROWS = ("muon", "mars_shampoo", "mars_m")


def _model(n_layer: int, shard=None):
    from mars.train.trainer import build_model

    return build_model(GPTConfig(n_layer=n_layer), torch.device("cpu"), seed=0, shard=shard)


def _random_grads(model) -> None:
    """The same gradients on every rank (and in the W=1 run): drawn whole, sliced for DTensor shards."""
    from mars.model.lm import copy_full_

    gen = torch.Generator().manual_seed(1)
    for p in model.parameters():
        full = torch.randn(p.shape, generator=gen) * 1e-3
        p.grad = torch.zeros_like(p)
        copy_full_(p.grad, full)


def _rank(rank: int, world: int, args) -> list | None:
    """One rank of a --world-size run: every row timed here; rank 0 returns all ranks' rows."""
    import torch.distributed as dist

    torch.set_num_threads(args.threads or 1)
    n_layer = args.n_layer or (4 if args.small else 12)
    shard = None
    if args.parallel == "fsdp":
        from mars.train.parallel import device_mesh, fsdp_sharder

        shard = fsdp_sharder(device_mesh(world, 1, "cpu"), mixed_precision=False)

    model = _model(n_layer, shard)
    _random_grads(model)
    n_params = sum(p.numel() for p in model.parameters())
    group = dist.group.WORLD if args.parallel == "ddp" else None
    rows = [
        time_row(name, model, n_params, args.steps, args.warmup, torch.device("cpu"), group)
        for name in args.names
    ]
    gathered = [None] * world
    dist.all_gather_object(gathered, rows)
    return gathered if rank == 0 else None


def run_distributed(args) -> int:
    """Per-rank optimizer step time with W ranks (each `--threads`, default 1: one rank stands for one
    device) against one process with the same threads, and optimizer-state bytes per rank."""
    from mars.train.distributed import run_local_ranks

    args.names = args.only.split(",") if args.only else list(DIVIDED_ROWS)
    unknown = [n for n in args.names if n not in ROWS]
    if unknown:
        raise SystemExit(f"error: unknown row(s) {unknown}; choose from {list(ROWS)}")
    threads = args.threads or 1
    torch.set_num_threads(threads)
    n_layer = args.n_layer or (4 if args.small else 12)
    single = _model(n_layer)
    _random_grads(single)
    n_params = sum(p.numel() for p in single.parameters())
    base = {
        n: time_row(n, single, n_params, args.steps, args.warmup, torch.device("cpu")) for n in args.names
    }
    del single
    per_rank = run_local_ranks(_rank, args.world_size, args)
    print(
        f"GPT-2 shapes, {n_layer} layers, {n_params / 1e6:.1f}M parameters; W={args.world_size} gloo CPU "
        f"ranks ({args.parallel}) x {threads} thread(s) against 1 process x {threads} thread(s); "
        f"median of {args.steps}"
    )
    header = (
        f"{'optimizer':<20} {'W=1 ms':>9} {'per-rank ms (max)':>18} {'x W=1':>7} "
        f"{'state MB/rank (max)':>20} {'state MB, W=1':>14}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for i, name in enumerate(args.names):
        ranks = [r[i] for r in per_rank]
        ms = max(r["ms_per_step"] for r in ranks)
        state = max(r["state_bytes"] for r in ranks)
        row = {
            "name": name,
            "world_size": args.world_size,
            "parallel": args.parallel,
            "threads_per_rank": threads,
            "ms_per_step": ms,
            "ms_per_step_per_rank": [r["ms_per_step"] for r in ranks],
            "baseline": f"{name} W=1",
            "baseline_ms_per_step": base[name]["ms_per_step"],
            "ratio_to_baseline": ms / base[name]["ms_per_step"],
            "state_bytes_per_rank": [r["state_bytes"] for r in ranks],
            "state_bytes_w1": base[name]["state_bytes"],
            "state_bytes_per_param": state / n_params,
        }
        rows.append(row)
        print(
            f"{name:<20} {row['baseline_ms_per_step']:>9.1f} {ms:>18.1f} {row['ratio_to_baseline']:>7.2f} "
            f"{state / 2**20:>20.1f} {base[name]['state_bytes'] / 2**20:>14.1f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
