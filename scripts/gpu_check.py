"""GPU check: the riskiest CUDA paths first, then the CUDA tests and the benchmarks, in a time budget, in one
report.

    python scripts/gpu_check.py [OUT_DIR] [--dry-run] [--budget S] [--only STEP,...]   (make gpu-check)

The STEPS run one by one, riskiest first: the README's own command on a GPU (training, validation, a
checkpoint, a resume), fsdp on one GPU, a 1.5B-parameter memory probe, then the CUDA tests and the
benchmarks. Each has a cap; a step runs for its cap or what is left of the budget, whichever is less;
their caps add up to the budget (BUDGET_S: one 10-minute call of a lent GPU machine). At its timeout a
step gets SIGINT (pytest still writes the JUnit XML of the tests it finished), GRACE_S later its
process group SIGKILL. The report (OUT_DIR, else $OUT, else ./gpu_check) is rewritten after every step
(a check killed midway leaves the steps it finished), from the tests' JUnit XML (their measurements:
record_property), the benchmarks' JSON (written row by row) and the training runs' metrics.jsonl.
Without a visible CUDA device it says so in one line, writes a report of steps not run and exits 1;
--dry-run runs every step on the CPU with tiny sizes (make test-all runs it). See docs/gpu_check.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GRACE_S, MIN_STEP_S, TAIL_CHARS = 15.0, 20.0, 3000
PYTEST = "-m pytest -m cuda -rfEs -p no:cacheprovider -o junit_family=xunit1 --junitxml={out}.xml"
OPTIM = "scripts/bench_optim.py --json {out}.json"
TRAIN = "scripts/bench_train.py --json {out}.json"
RUN = "train.py logger=disabled train.progress=false hydra.run.dir={run} {data}"
# The README's command on GPT-2 small (bf16, compiled blocks): 40 steps of 16 x 1024 tokens with a validation
# and a checkpoint every 20, then the same run resumed to 50 (the checkpoint, its RNG states, the run dir).
SMALL = (
    "model=gpt2_small train.batch_size=16 train.eval_interval=20 train.eval_steps=8 train.ckpt_interval=20"
)
TINY = (
    "model.n_layer=1 model.n_embd=32 model.n_head=2 model.block_size=32 train.batch_size=2 "
    "train.eval_interval=1 train.eval_steps=2 train.ckpt_interval=1 schedule.warmup_steps=0 "
    "optimizer.fused=false"
)


@dataclass(frozen=True)
class Step:
    cap: int  # seconds
    what: str
    cuda: tuple[str, ...]  # the arguments of `python` for each command, on CUDA
    dry: tuple[str, ...] = ()  # in the dry run (CPU, tiny); () runs the CUDA commands (tests skip)


STEPS = {
    "train-readme": Step(
        120,
        "`python train.py` on GPT-2 small: bf16, compiled blocks, validation, a checkpoint; then resumed",
        (f"{RUN} {SMALL} train.max_steps=40", f"{RUN} {SMALL} train.max_steps=50 train.resume=auto"),
        (f"{RUN} {TINY} train.max_steps=2", f"{RUN} {TINY} train.max_steps=3 train.resume=auto"),
    ),
    "train-fsdp": Step(
        60,
        "`python train.py train.parallel=fsdp` in one process: a nccl group, FSDP2 in bf16, compiled blocks",
        (f"{RUN} {SMALL} train.parallel=fsdp train.max_steps=30",),
        (f"{RUN} {TINY} train.parallel=fsdp train.max_steps=2",),
    ),
    "memory-1.5b": Step(
        120,
        "`scripts/bench_train.py --model gpt2_xl`: peak memory and tokens/s of AdamW and MARS-AdamW "
        "approximate and exact on 1.5B parameters (4 x 1024 tokens per step)",
        (
            f"{TRAIN} --model gpt2_xl --batch-size 4 --steps 3 --warmup 2 --device cuda "
            "--optimizers mars_adamw_approx mars_adamw_exact -- {data}",
        ),
        (
            f"{TRAIN} --model gpt2_tiny --batch-size 1 --block-size 32 --steps 1 --warmup 0 --device cpu "
            "--compile off --optimizers mars_adamw_approx mars_adamw_exact -- model.n_layer=1 "
            "optimizer.fused=false {data}",
        ),
    ),
    "cuda-optim": Step(
        80,
        "pytest: every optimizer's compiled (Triton) kernels against its multi-tensor path; Newton-Schulz",
        (f"{PYTEST} tests/cuda/test_optim_cuda.py tests/cuda/test_newton_schulz_cuda.py",),
    ),
    "bench-optim": Step(
        40,
        "`scripts/bench_optim.py`: the optimizer step on GPT-2 small's parameters, ratios to fused AdamW",
        (f"{OPTIM} --device cuda --steps 10 --warmup 2",),
        (f"{OPTIM} --device cpu --n-layer 1 --steps 1 --warmup 1 --only mars_adamw_foreach",),
    ),
    "bench-train": Step(
        60,
        "`scripts/bench_train.py --model gpt2_small`: the training step, tokens/s, MFU, peak memory",
        (f"{TRAIN} --model gpt2_small --batch-size 16 --steps 20 --warmup 3 --device cuda -- {{data}}",),
        (
            f"{TRAIN} --model gpt2_tiny --batch-size 1 --block-size 32 --steps 1 --warmup 0 --device cpu "
            "--compile off --optimizers adamw mars_adamw_approx -- model.n_layer=1 optimizer.fused=false "
            "{data}",
        ),
    ),
    "cuda-train": Step(
        45,
        "pytest: 20 compiled bf16 steps of every optimizer family",
        (f"{PYTEST} tests/cuda/test_train_cuda.py",),
    ),
    "cuda-parallel": Step(
        45,
        "pytest: FSDP2 on one GPU against one process; with 2+ GPUs torchrun ddp and fsdp",
        (f"{PYTEST} tests/cuda/test_parallel_cuda.py",),
    ),
}
BUDGET_S = float(sum(step.cap for step in STEPS.values()))  # 570 s: one 10-minute call, with the grace
BENCHMARKS = ("bench-optim", "bench-train", "memory-1.5b")


def environment() -> dict:
    import torch

    def first_line(*cmd: str) -> str | None:  # of what cmd prints; None when it fails
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=20)
            return (r.stdout.splitlines() or [""])[0].strip() if r.returncode == 0 else None

    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count() if cuda else 0)]
    triton = next((d.version for d in importlib.metadata.distributions(name="triton")), None)
    return {
        "python": f"{platform.python_version()} ({sys.executable}), {os.cpu_count()} CPU cores",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "gpus": [f"{g.name} ({g.total_memory / 2**30:.0f} GiB, sm_{g.major}{g.minor})" for g in gpus],
        "driver": first_line("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"),
        "triton": triton,
        "git": first_line("git", "describe", "--always", "--dirty"),
    }


def run(name: str, cmd: list[str] | list[list[str]], timeout_s: float, logs: Path, env: dict) -> dict:
    """Run one step (a command, or several one after the other while each succeeds), its output into
    logs/NAME.log, within `timeout_s` for them all."""
    cmds = cmd if cmd and isinstance(cmd[0], list) else [cmd]
    t0, timed_out, returncode = time.monotonic(), False, 0
    with open(logs / f"{name}.log", "wb") as out:
        for one in cmds:
            left = timeout_s - (time.monotonic() - t0)
            out.write(f"$ {shlex.join(one)}\n".encode())
            out.flush()
            kw = dict(
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
            proc = subprocess.Popen(one, **kw)
            try:
                proc.wait(timeout=max(left, 0.1))
            except subprocess.TimeoutExpired:
                timed_out = True
                proc.send_signal(signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=GRACE_S)
            finally:  # what is left of the group: compile workers, torchrun ranks, a hung step
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            returncode = proc.returncode
            if timed_out or returncode:
                break
    took = round(time.monotonic() - t0, 1)
    status = "timeout" if timed_out else "failed" if returncode else "passed"
    r = {"name": name, "status": status, "seconds": took, "log": f"logs/{name}.log"}
    return r | {
        "timeout_s": round(timeout_s),
        "returncode": returncode,
        "command": " && ".join(map(shlex.join, cmds)),
    }


def number(text: str):
    """A property's value: record_property stores str(value), so numbers come back as numbers."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def read_junit(path: Path) -> list[dict]:
    """The tests a JUnit XML file reports: outcome, seconds, message, recorded properties."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase") if path.is_file() else []:
        if case.get("name"):  # (the test a SIGINT interrupted has none)
            bad = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
            message = "" if bad is None else (bad.get("message") or bad.text or "").strip()[:TAIL_CHARS]
            tests.append(
                {
                    "file": case.get("file"),
                    "name": case.get("name"),
                    "outcome": "passed" if bad is None else {"failure": "failed"}.get(bad.tag, bad.tag),
                    "seconds": float(case.get("time", 0)),
                    "message": message,
                    "properties": {p.get("name"): number(p.get("value")) for p in case.iter("property")},
                }
            )
    return tests


def finish(r: dict, out: Path, dry: bool) -> tuple[list[dict], list[dict]]:
    """Set the step's status and summary from what it wrote: (its tests, its rows: a benchmark's, or the
    training runs' last line). Rows written before a timeout are kept."""
    output = (out / r["log"]).read_text(errors="replace")
    tests, rows = [], []
    if r["name"] in BENCHMARKS:
        path = out / "logs" / f"{r['name']}.json"
        rows = json.loads(path.read_text()) if path.is_file() else []
        r["status"] = "failed" if r["status"] == "passed" and not rows else r["status"]
        r["summary"] = f"{len(rows)} rows" if rows else f"no rows in {path.name}"
        peak = [x["max_memory_gb"] for x in rows if x.get("max_memory_gb") is not None]
        r["summary"] += f"; peak memory {max(peak):.1f} GB" if peak else ""
    elif r["name"].startswith("train"):
        rows = run_rows(r["name"], out / "runs" / r["name"])
        if rows:
            last = rows[-1]
            r["summary"] = f"{last['step']} steps, {last.get('tokens_per_s') or 0:,.0f} tokens/s"
            r["summary"] += "".join(
                f", {k} {last[k]:.3g}"
                for k in ("mfu", "max_memory_gb", "val/loss")
                if last.get(k) is not None
            )
        else:
            r["summary"] = "no metrics.jsonl line"
        if "resume=auto" in r["command"] and r["status"] == "passed":
            r["summary"] += "; resumed" if "resumed from" in output else "; NOT resumed"
            r["status"] = r["status"] if "resumed from" in output else "failed"
    else:
        tests = [{"step": r["name"], **t} for t in read_junit(out / "logs" / f"{r['name']}.xml")]
        counts = collections.Counter(t["outcome"] for t in tests)
        m = re.search(r"collected (\d+) items?(?: / (\d+) deselected)?", output)
        counts["not run"] = int(m[1]) - int(m[2] or 0) - len(tests) if m else 0
        r["tests"] = {k: n for k, n in counts.items() if n}
        r["summary"] = ", ".join(f"{n} {k}" for k, n in r["tests"].items()) or "no test reported"
        skips = collections.Counter(t["message"] for t in tests if t["outcome"] == "skipped")
        r["summary"] += f" ({'; '.join(f'{why}: {n}' for why, n in skips.items())})" if skips else ""
        r["summary"] += "" if (out / "logs" / f"{r['name']}.xml").is_file() else "; no JUnit XML (killed)"
        if r["status"] == "passed" and not counts["passed"]:  # on a CUDA machine, all skipped is a failure
            r["status"] = "skipped" if dry else "failed"
    r["output_tail"] = output[-TAIL_CHARS:] if r["status"] not in ("passed", "skipped") else ""
    return tests, rows


def run_rows(name: str, run_dir: Path) -> list[dict]:
    """A training step's rows: the last training line of its run with the validation loss logged at that
    step (what the run measured: tokens/s, MFU, peak memory, loss)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    train = [x for x in lines if "train/loss" in x]
    if not train:
        return []
    val = {x["step"]: x["val/loss"] for x in lines if "val/loss" in x}
    keep = (
        "step",
        "tokens",
        "train/loss",
        "ms_per_step",
        "tokens_per_s",
        "mfu",
        "max_memory_gb",
        "grad_norm",
    )
    return [{"name": name, **{k: train[-1].get(k) for k in keep}, "val/loss": val.get(train[-1]["step"])}]


def table(rows: list[dict], keys: list[str]) -> list[str]:
    def cell(v) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return "" if v is None else ", ".join(map(str, v)) if isinstance(v, list) else str(v)

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    return lines + ["| " + " | ".join(cell(r.get(k)).replace("|", "/") for k in keys) + " |" for r in rows]


COLUMNS = {
    "bench-optim": "name ms_per_step ratio_to_adamw ratio_to_baseline baseline first_step_ms",
    "bench-train": "name model ms_per_step tokens_per_s ratio_to_baseline mfu max_memory_gb",
    "memory-1.5b": "name model ms_per_step tokens_per_s ratio_to_baseline mfu max_memory_gb",
    "train-readme": "name step tokens_per_s ms_per_step mfu max_memory_gb train/loss val/loss",
    "train-fsdp": "name step tokens_per_s ms_per_step mfu max_memory_gb train/loss val/loss",
}


def markdown(report: dict) -> str:
    out = [f"# GPU check: {'PASSED' if report['ok'] else 'FAILED'}", ""]
    dry = "; a DRY RUN on the CPU (tiny sizes, the CUDA tests skip)" if report["dry_run"] else ""
    out += [f"Started {report['started']}; {report['duration_s']:.0f} of {report['budget_s']:.0f} s{dry}."]
    env = [{"what": k, "value": v} for k, v in report["environment"].items()]
    out += ["", "## Environment", "", *table(env, ["what", "value"]), "", "## Steps", ""]
    out += table(report["steps"], ["name", "status", "seconds", "timeout_s", "summary"])
    for name, rows in report["benchmarks"].items():
        if rows:
            out += ["", f"## {name}: {STEPS[name].what}", "", *table(rows, COLUMNS[name].split())]
    ran = [t for t in report["tests"] if t["outcome"] != "skipped"]
    for func in dict.fromkeys(t["name"].split("[")[0] for t in ran):  # a table per test function
        rows = [
            t | {"case": t["name"][len(func) :].strip("[]")} for t in ran if t["name"].split("[")[0] == func
        ]
        props = list(dict.fromkeys(k for t in rows for k in t["properties"]))
        rows = [t | t["properties"] for t in rows]
        out += ["", f"## {rows[0]['file']}::{func}", "", *table(rows, ["case", "outcome", "seconds", *props])]
    for t in (t for t in ran if t["message"]):
        out += ["", f"## {t['outcome']}: {t['name']}", "", "```", t["message"], "```"]
    for s in (s for s in report["steps"] if s.get("output_tail")):
        out += ["", f"## {s['name']} {s['status']}: the end of {s['log']}", "", "```", s["output_tail"]]
        out += ["```"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "out_dir", nargs="?", type=Path, help="the report's folder (default: $OUT, else gpu_check)"
    )
    ap.add_argument("--dry-run", action="store_true", help="every step on the CPU, tiny sizes")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all the steps together")
    ap.add_argument("--only", type=lambda s: s.split(","), default=list(STEPS), help=",".join(STEPS))
    ap.add_argument("--data-root", type=Path, default=REPO / "data", help="where the corpus is prepared")
    args = ap.parse_args(argv)
    if unknown := set(args.only) - set(STEPS):
        ap.error(f"--only: unknown step(s) {', '.join(sorted(unknown))}; the steps: {', '.join(STEPS)}")
    t0, started = time.monotonic(), datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if args.dry_run:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU run, even on a GPU machine
    try:
        env = environment()
    except ImportError as e:
        print(f"gpu_check: torch does not import ({e}); install torch first")
        return 2
    out = (args.out_dir or Path(os.environ.get("OUT") or "gpu_check")).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    report = {
        "schema": 3,
        "started": started,
        "budget_s": args.budget,
        "dry_run": args.dry_run,
        "environment": env,
    }
    report |= {
        "steps": [],
        "tests": [],
        "benchmarks": {name: [] for name in (*BENCHMARKS, "train-readme", "train-fsdp")},
    }
    no_cuda = not args.dry_run and not env["cuda_available"]
    if no_cuda:  # asked to check CUDA, and there is none: say so, report every step as not run
        build = f"torch {env['torch']}, CUDA build: {env['torch_cuda'] or 'no'}"
        print(f"gpu_check: no CUDA device visible ({build}); nothing checked (--dry-run: the CPU run)")
        report["steps"] = [not_run(name, step, "no CUDA device visible") for name, step in STEPS.items()]
        return write(report, out, t0, status=1, quiet=True)
    data = args.data_root.resolve()
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    child_env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", GPU_CHECK_DATA_ROOT=str(data))
    child_env.update(WANDB_MODE="disabled", HF_HUB_OFFLINE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (and the steps get theirs back)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"gpu_check: {'a DRY RUN on the CPU' if args.dry_run else 'CUDA'}; {args.budget:.0f} s; {out}")
    interrupted = False
    for name, step in STEPS.items():
        fields = {"out": out / "logs" / name, "run": out / "runs" / name, "data": f"data.root={data}"}
        cmds = [
            [sys.executable, *(a.format(**fields) for a in shlex.split(c))]
            for c in (args.dry_run and step.dry or step.cuda)
        ]
        left = t0 + args.budget - time.monotonic() - GRACE_S
        if name not in args.only:
            r = not_run(name, step, "not selected (--only)") | {"status": "skipped"}
        elif interrupted or left < MIN_STEP_S:
            r = not_run(
                name, step, "interrupted" if interrupted else f"the {args.budget:.0f} s budget is spent"
            )
        else:
            r = not_run(name, step, "interrupted")
            try:
                r = run(name, cmds, min(step.cap, left), out / "logs", child_env)
                step_tests, rows = finish(r, out, args.dry_run)
                report["tests"] += step_tests
                if name in report["benchmarks"]:
                    report["benchmarks"][name] = rows
            except KeyboardInterrupt:
                interrupted, r["summary"] = True, f"interrupted; its output so far: logs/{name}.log"
        r["what"] = step.what
        report["steps"].append(r)
        print(f"  {name:<13} {r['status']:<8} {r['seconds']:>6.1f} s  {r['summary']}", flush=True)
        write(report, out, t0, status=None, quiet=True)  # what has run so far, in case the check is killed
    status = (
        130 if interrupted else 0 if all(r["status"] in ("passed", "skipped") for r in report["steps"]) else 1
    )
    return write(report, out, t0, status)


def not_run(name: str, step: Step, why: str) -> dict:
    return {
        "name": name,
        "status": "not run",
        "seconds": 0.0,
        "timeout_s": step.cap,
        "summary": f"not run: {why}",
    }


def write(report: dict, out: Path, t0: float, status: int | None, quiet: bool = False) -> int:
    """The report (gpu_check.json, gpu_check.md) as it stands; status None: the check is still running."""
    report["duration_s"] = round(time.monotonic() - t0, 1)
    report["ok"], report["exit_status"], report["finished"] = status == 0, status, status is not None
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(report))
    if not quiet:
        print(
            f"gpu_check: {'PASSED' if status == 0 else 'FAILED'} in {report['duration_s']:.0f} s; see {out}"
        )
    return status if status is not None else 0


if __name__ == "__main__":
    sys.exit(main())
