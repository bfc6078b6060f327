"""GPU check: the CUDA tests and the two benchmarks of a CUDA machine, in a time budget, in one report.

    python scripts/gpu_check.py [OUT_DIR] [--dry-run] [--budget S] [--only STEP,...]   (make gpu-check)

The STEPS run one by one, most valuable first, each with a timeout: its cap, or what is left of the
budget. At its timeout a step gets SIGINT (pytest still writes the JUnit XML of the tests it finished),
GRACE_S later its process group SIGKILL. The report (OUT_DIR, else $OUT, else ./gpu_check) is read
from the tests' JUnit XML (their measurements: record_property) and the benchmarks' JSON. Without CUDA
it prints one line and exits 0; --dry-run runs every step on the CPU, tiny. See docs/gpu_check.md.
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S, GRACE_S, MIN_STEP_S, TAIL_CHARS = 480.0, 15.0, 20.0, 3000
PYTEST = "-m pytest -m cuda -rfEs -p no:cacheprovider -o junit_family=xunit1 --junitxml={out}.xml"
OPTIM = "scripts/bench_optim.py --json {out}.json"
TRAIN = "scripts/bench_train.py --json {out}.json"
# name: (cap in seconds, the arguments of `python` on CUDA, in the dry run if others); most valuable first
STEPS = {
    "cuda-optim": (180, f"{PYTEST} tests/cuda/test_optim_cuda.py tests/cuda/test_newton_schulz_cuda.py", ""),
    "cuda-train": (150, f"{PYTEST} tests/cuda/test_train_cuda.py", ""),
    "bench-optim": (  # GPT-2 small's parameters; the dry run compiles no CPU kernels (minutes)
        100,
        f"{OPTIM} --device cuda --steps 10 --warmup 2",
        f"{OPTIM} --device cpu --n-layer 1 --steps 1 --warmup 1 --only mars_adamw_foreach",
    ),
    "bench-train": (  # gpt2_small, 16 x 1024 tokens per step
        150,
        f"{TRAIN} --model gpt2_small --batch-size 16 --steps 20 --warmup 3 --device cuda -- {{data}}",
        f"{TRAIN} --model gpt2_tiny --batch-size 1 --block-size 32 --steps 1 --warmup 0 --device cpu "
        "--compile off --optimizers adamw mars_adamw_approx -- model.n_layer=1 optimizer.fused=false {data}",
    ),
    "cuda-parallel": (120, f"{PYTEST} tests/cuda/test_parallel_cuda.py", ""),
}


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


def run(name: str, cmd: list[str], timeout_s: float, logs: Path, env: dict) -> dict:
    """Run one step, its output into logs/NAME.log."""
    t0, timed_out = time.monotonic(), False
    with open(logs / f"{name}.log", "wb") as out:
        out.write(f"$ {shlex.join(cmd)}\n".encode())
        out.flush()
        kw = dict(cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        proc = subprocess.Popen(cmd, **kw)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=GRACE_S)
        finally:  # what is left of the group: compile workers, torchrun ranks, a hung step
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    took = round(time.monotonic() - t0, 1)
    status = "timeout" if timed_out else "failed" if proc.returncode else "passed"
    r = {"name": name, "status": status, "seconds": took, "log": f"logs/{name}.log"}
    return r | {"timeout_s": round(timeout_s), "returncode": proc.returncode, "command": shlex.join(cmd)}


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
    """Set the step's status and summary from what it wrote: (its tests, its benchmark rows)."""
    output = (out / r["log"]).read_text(errors="replace")
    if r["name"].startswith("bench"):
        path = out / "logs" / f"{r['name']}.json"
        rows = json.loads(path.read_text()) if r["status"] == "passed" and path.is_file() else []
        r["status"] = "failed" if r["status"] == "passed" and not rows else r["status"]
        r["summary"], tests = f"{len(rows)} rows" if rows else f"no rows in {path.name}", []
    else:
        tests, rows = [{"step": r["name"], **t} for t in read_junit(out / "logs" / f"{r['name']}.xml")], []
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
            out += ["", f"## {name}: {STEPS[name][1].split()[0]}", "", *table(rows, COLUMNS[name].split())]
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
    ap.add_argument("--dry-run", action="store_true", help="every step on the CPU with tiny sizes (as CI)")
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
    if not args.dry_run and not env["cuda_available"]:
        build = f"torch {env['torch']}, CUDA build: {env['torch_cuda'] or 'no'}"
        print(f"gpu_check: no CUDA device visible ({build}); nothing to check (--dry-run: the CPU run)")
        return 0
    out = (args.out_dir or Path(os.environ.get("OUT") or "gpu_check")).resolve()
    data = args.data_root.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    child_env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", GPU_CHECK_DATA_ROOT=str(data))
    child_env.update(WANDB_MODE="disabled", HF_HUB_OFFLINE="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (and the steps get theirs back)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"gpu_check: {'a DRY RUN on the CPU' if args.dry_run else 'CUDA'}; {args.budget:.0f} s; {out}")
    steps, tests, benchmarks, interrupted = [], [], {"bench-optim": [], "bench-train": []}, False
    for name, (cap, cuda_args, dry_args) in STEPS.items():
        fields = {"out": out / "logs" / name, "data": f"data.root={data}"}
        cmd = [a.format(**fields) for a in shlex.split(args.dry_run and dry_args or cuda_args)]
        r = {"name": name, "status": "not run", "seconds": 0.0, "command": shlex.join([sys.executable, *cmd])}
        left = t0 + args.budget - time.monotonic() - GRACE_S
        if name not in args.only:
            r |= {"status": "skipped", "summary": "not selected (--only)"}
        elif interrupted or left < MIN_STEP_S:
            r["summary"] = "not run: " + (
                "interrupted" if interrupted else f"the {args.budget:.0f} s budget is spent"
            )
        else:
            try:
                r = run(name, [sys.executable, *cmd], min(cap, left), out / "logs", child_env)
                step_tests, rows = finish(r, out, args.dry_run)
                tests += step_tests
                benchmarks.update({name: rows} if name in benchmarks else {})
            except KeyboardInterrupt:
                interrupted, r["summary"] = True, f"interrupted; its output so far: logs/{name}.log"
        steps.append(r)
        print(f"  {name:<13} {r['status']:<8} {r['seconds']:>6.1f} s  {r['summary']}", flush=True)
    status = 130 if interrupted else 0 if all(r["status"] in ("passed", "skipped") for r in steps) else 1
    report = {"schema": 2, "started": started, "duration_s": round(time.monotonic() - t0, 1)}
    report |= {"budget_s": args.budget, "dry_run": args.dry_run, "ok": status == 0, "exit_status": status}
    report |= {"environment": env, "steps": steps, "tests": tests, "benchmarks": benchmarks}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(report))
    print(f"gpu_check: {'PASSED' if status == 0 else 'FAILED'} in {report['duration_s']:.0f} s; see {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
