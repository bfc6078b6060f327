"""Optimizer-step benchmark on GPT-2's parameters (the project's GPT; no forward pass, no data).

    python scripts/bench_optim.py                      # GPT-2 small shapes (124M parameters)
    python scripts/bench_optim.py --small --steps 10   # same shapes, 4 layers (~67M parameters)
    python scripts/bench_optim.py --json bench_optim.json --only adamw_fused,mars_adamw

Every row times optimizer.step() alone (gradients are fixed random tensors) as the median of
--steps steps after --warmup steps; the first step, which includes torch.compile warm-up, is
reported separately. Ratios are to torch.optim.AdamW(fused=True) on the same tensors, and for
MARS-Shampoo / MARS-M also to the matching baseline: Muon on the same tensors (all matrices,
embeddings included, as MARS-Shampoo) and Moonlight. state_bytes_per_param counts every tensor in
optimizer.state (gradients and parameters excluded).
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
from mars.optim import Muon, build_optimizer  # noqa: E402

# name -> (config overrides, description); configs are the reference GPT-2 small ones (configs/optimizer).
ROWS = {
    "adamw_fused": (
        {"name": "adamw", "lr": 6e-4, "betas": [0.9, 0.95], "weight_decay": 0.1, "fused": True},
        "torch AdamW(fused=True)",
    ),
    "lion": ({"name": "lion", "lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 1.0}, "Lion"),
    "mars_adamw": ({"name": "mars_adamw", "lr": 6e-3}, "MARS-AdamW approx"),
    "mars_adamw_foreach": (
        {"name": "mars_adamw", "lr": 6e-3, "fused": False},
        "MARS-AdamW, multi-tensor path",
    ),
    "mars_lion": ({"name": "mars_lion", "lr": 6e-3}, "MARS-Lion approx"),
    "mars_lion_foreach": ({"name": "mars_lion", "lr": 6e-3, "fused": False}, "MARS-Lion, multi-tensor path"),
    "muon": ({"name": "muon", "lr": 0.02, "weight_decay": 0.0}, "Muon (embeddings/head/1-D on AdamW)"),
    "muon_same_tensors": (None, "Muon on every matrix incl. embeddings"),
    "mars_shampoo": ({"name": "mars_shampoo", "lr": 6e-3}, "MARS-Shampoo approx"),
    "moonlight": ({"name": "moonlight", "lr": 6e-3, "weight_decay": 0.1, "nesterov": False}, "Moonlight"),
    "mars_m": ({"name": "mars_m", "lr": 6e-3, "weight_decay": 0.01}, "MARS-M approx"),
}
BASELINES = {"mars_shampoo": "muon_same_tensors", "mars_m": "moonlight"}


def build(name: str, model: nn.Module):
    overrides, _ = ROWS[name]
    if overrides is None:  # Muon with MARS-Shampoo's split: every matrix orthogonalised, 1-D on AdamW
        groups = [
            {"params": [p for p in model.parameters() if p.ndim == 2], "use_muon": True},
            {"params": [p for p in model.parameters() if p.ndim != 2], "use_muon": False},
        ]
        return Muon(groups, lr=0.02)
    return build_optimizer(model, overrides)  # the optimizer's own defaults for the keys not given


def state_bytes(opt) -> int:
    return sum(
        v.numel() * v.element_size()
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_row(name, model, n_params, steps, warmup, device):
    opt = build(name, model)
    sync(device)
    t0 = time.perf_counter()
    opt.step()
    sync(device)
    first = time.perf_counter() - t0
    for _ in range(max(warmup - 1, 0)):
        opt.step()
    times = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    row = {
        "name": name,
        "description": ROWS[name][1],
        "ms_per_step": 1e3 * statistics.median(times),
        "first_step_ms": 1e3 * first,
        "state_bytes_per_param": state_bytes(opt) / n_params,
    }
    del opt
    return row


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
    args = ap.parse_args(argv)
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

    rows = {}
    for name in names:
        rows[name] = time_row(name, model, n_params, args.steps, args.warmup, device)
    adamw_ms = rows["adamw_fused"]["ms_per_step"]
    header = (
        f"{'optimizer':<20} {'ms/step':>10} {'x AdamW':>8} {'x base':>7} {'baseline':<18} "
        f"{'1st step ms':>11} {'B/param':>8}"
    )
    print(header)
    print("-" * len(header))
    for name, row in rows.items():
        base = BASELINES.get(name, "adamw_fused")
        row["baseline"] = base
        row["ratio_to_baseline"] = row["ms_per_step"] / rows[base]["ms_per_step"]
        row["ratio_to_adamw"] = row["ms_per_step"] / adamw_ms
        print(
            f"{name:<20} {row['ms_per_step']:>10.1f} {row['ratio_to_adamw']:>8.2f} "
            f"{row['ratio_to_baseline']:>7.2f} {base:<18} {row['first_step_ms']:>11.0f} "
            f"{row['state_bytes_per_param']:>8.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(list(rows.values()), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
