"""scripts/gpu_check.sh without a GPU (not marked cuda: this runs everywhere).

The no-CUDA path (one line, exit 0, nothing written), the dry run (every part on the CPU with tiny
sizes: the report's JSON schema and markdown), and the orchestration in process: timeouts kill a
part's whole process group, failures keep their output tail, missing modules skip only the parts
that need them, a spent budget skips the rest, and all of it sets the exit status.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gc = load_gpu_check()


def script_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "GPU_CHECK_DRY_RUN", "GPU_CHECK_FACTS")}
    env["PYTHON"] = sys.executable
    env.update(extra)
    return env


def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path):
    out = tmp_path / "report"
    r = subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        env=script_env(CUDA_VISIBLE_DEVICES=""),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith("gpu_check: no CUDA device visible (torch ")
    assert "CUDA build: " in lines[0] and lines[0].endswith("; nothing to check")
    assert not out.exists()


PART_KEYS = {"name", "status", "seconds", "summary", "details", "started_s", "timeout_s", "returncode"}
PART_KEYS |= {"command", "log", "output_tail"}


def test_dry_run_writes_the_json_and_markdown_report(tmp_path):
    out = tmp_path / "report"
    t0 = time.monotonic()
    r = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"],
        cwd=tmp_path,
        env=script_env(OUT=str(out)),  # $OUT when no directory is given
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    report = json.loads((out / "gpu_check.json").read_text())

    assert {"started", "duration_s", "environment", "parts", "bench_optim", "bench_train"} <= set(report)
    assert report["dry_run"] is True and report["ok"] is True and report["exit_status"] == 0
    assert 0 < report["duration_s"] <= took + 1
    env = report["environment"]
    for key in ("python", "torch", "torch_cuda", "cuda_available", "device_count", "gpus", "imports"):
        assert key in env, key
    assert env["cuda_available"] is False and env["gpus"] == [] and env["missing_modules"] == []
    assert set(env["fused"]) >= {"device", "available", "compiled", "disabled_reason"}

    parts = {p["name"]: p for p in report["parts"]}
    assert list(parts) == gc.PART_NAMES
    for p in parts.values():
        assert set(p) >= PART_KEYS, p["name"]
        assert p["status"] in ("passed", "failed", "skipped", "timeout")
        assert isinstance(p["seconds"], (int, float)) and isinstance(p["summary"], str)
    statuses = {name: p["status"] for name, p in parts.items()}
    assert statuses == {
        "environment": "passed",
        "imports": "passed",
        "data": "passed",
        "cuda-optim": "skipped",
        "cuda-train": "skipped",
        "cuda-parallel": "skipped",
        "bench-optim": "passed",
        "bench-train": "passed",
    }, {n: (p["status"], p["summary"], p["output_tail"][-1500:]) for n, p in parts.items()}
    for name in ("cuda-optim", "cuda-train", "cuda-parallel"):
        tests = parts[name]["details"]["tests"]
        assert tests["skipped"] == tests["total"] > 0 and "needs a CUDA device" in parts[name]["summary"]
        assert (out / parts[name]["log"]).is_file()

    assert {r["name"] for r in report["bench_optim"]} == {"adamw_fused", "mars_adamw_foreach"}
    for row in report["bench_optim"]:
        assert row["ms_per_step"] > 0 and "ratio_to_adamw" in row and "state_bytes_per_param" in row
    assert [r["name"] for r in report["bench_train"]] == ["adamw", "mars_adamw_approx"]
    for row in report["bench_train"]:
        assert row["tokens_per_s"] > 0 and "ratio_to_baseline" in row

    md = (out / "gpu_check.md").read_text()
    assert md.startswith("# GPU check: PASSED")
    for heading in ("## Environment", "## Parts", "## Optimizer step", "## Training step"):
        assert heading in md
    assert "| cuda-optim | skipped |" in md and "| bench-train | passed |" in md
    assert "| mars_adamw_foreach |" in md and "| mars_adamw_approx |" in md
    for name in gc.PART_NAMES:  # every part's time is printed
        assert any(line.strip().startswith(name) and " s " in line for line in r.stdout.splitlines()), name


# ---- the orchestration, in process


def make_ctx(tmp_path, **kw):
    now = time.monotonic()
    ctx = gc.Context(
        out=tmp_path,
        logs=tmp_path / "logs",
        dry_run=True,
        data_root=tmp_path / "data",
        python=sys.executable,
        budget_s=kw.pop("budget_s", 120.0),
        t0=now,
        deadline=now + kw.pop("deadline_in", 120.0),
        jobs=3,
        timeouts=kw.pop("timeouts", {}),
        injected=kw.pop("injected", {}),
    )
    ctx.logs.mkdir(parents=True, exist_ok=True)
    ok = {"ok": True, "missing": [], "errors": []}
    ctx.env = {"imports": {g: dict(ok) for g in gc.IMPORT_GROUPS}, "torch": "x", "cuda_available": False}
    ctx.env["imports"].update(kw.pop("imports", {}))
    assert not kw, kw
    return ctx


def part(name):
    return next(p for p in gc.PARTS if p.name == name)


def test_a_hang_times_out_a_failure_keeps_its_tail_and_the_exit_status_says_so(tmp_path):
    ctx = make_ctx(
        tmp_path,
        injected={"cuda-train": "hang", "cuda-parallel": "fail"},
        timeouts={"cuda-train": 1.5},
    )
    t0 = time.monotonic()
    gc.run_phase([part("cuda-train"), part("cuda-parallel")], ctx, later=[])
    assert time.monotonic() - t0 < 30
    hang, fail = ctx.results["cuda-train"], ctx.results["cuda-parallel"]
    assert hang["status"] == "timeout" and hang["returncode"] is None and hang["timeout_s"] == 1.5
    assert "injected hang" in hang["output_tail"] and "killed after the 2 s timeout" in hang["output_tail"]
    assert 1.5 <= hang["seconds"] < 15
    assert fail["status"] == "failed" and fail["returncode"] == 3
    assert "injected failure" in fail["output_tail"]

    ctx.results["environment"] = gc._result(part("environment"), "passed", "env")
    report = gc.build_report(ctx, "2025-01-01T00:00:00+00:00", gc.PART_NAMES, ["--dry-run"])
    assert report["ok"] is False and report["exit_status"] == 1
    json.dumps(report)  # serialisable
    md = gc.render_markdown(report)
    assert md.startswith("# GPU check: FAILED")
    assert "| cuda-train | **TIMEOUT** |" in md and "| cuda-parallel | **FAILED** |" in md
    assert "injected failure" in md and "Output tail" in md


def test_a_timeout_kills_the_whole_process_group(tmp_path):
    ctx = make_ctx(tmp_path)
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    run = gc.run_command(ctx, "hang", [sys.executable, "-c", code], timeout_s=2.0)
    assert run["timed_out"] and run["returncode"] is None
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        try:  # reap it if it happens to be ours
            os.waitpid(grandchild, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {grandchild} still running after the timeout")


def test_missing_modules_skip_only_the_parts_that_need_them(tmp_path):
    missing = {"ok": False, "missing": ["hydra", "antlr4"], "errors": []}
    ctx = make_ctx(tmp_path, imports={"train": missing})
    selected = [p for p in gc.PARTS if p.kind not in ("probe", "imports")]
    imp = gc.imports_result(ctx, selected)
    assert imp["status"] == "failed"
    assert "hydra (hydra-core), antlr4 (antlr4-python3-runtime)" in imp["summary"]
    assert "pip install hydra-core antlr4-python3-runtime" in imp["summary"]
    assert "cuda-train" in imp["summary"] and "cuda-optim" not in imp["summary"].split("needed by")[1]
    assert ctx.env["missing_modules"] == ["hydra", "antlr4"]
    for name in ("data", "cuda-train", "cuda-parallel", "bench-train"):
        assert gc.blocked_reason(part(name), ctx) == "not run: needs hydra, antlr4 (not installed)"
    for name in ("cuda-optim", "bench-optim"):
        assert gc.blocked_reason(part(name), ctx) is None

    ctx.results["imports"] = imp
    ctx.results["data"] = gc._result(part("data"), "skipped", gc.blocked_reason(part("data"), ctx))
    report = gc.build_report(ctx, "t", gc.PART_NAMES, [])
    assert report["exit_status"] == 1
    assert "Missing modules (hydra, antlr4): install them with `pip install hydra-core" in gc.render_markdown(
        report
    )


def test_a_failed_dependency_and_a_spent_budget_skip_parts(tmp_path):
    ctx = make_ctx(tmp_path, budget_s=30.0, deadline_in=5.0)
    ctx.results["data"] = gc._result(part("data"), "failed", "boom")
    assert gc.blocked_reason(part("cuda-train"), ctx) == "not run: needs part data, which failed"
    gc.run_phase([part("cuda-optim"), part("bench-optim")], ctx, later=[part("bench-train")])
    for name in ("cuda-optim", "bench-optim"):
        assert ctx.results[name]["status"] == "skipped"
        assert ctx.results[name]["summary"] == "not run: the 30 s budget is spent"
    report = gc.build_report(ctx, "t", gc.PART_NAMES, [])
    assert report["exit_status"] == 1


def test_pytest_results_are_read_from_junit(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.dry_run = False
    (ctx.logs / "cuda-optim.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="3">'
        '<testcase classname="t" name="test_a" time="1.0"/>'
        '<testcase classname="t" name="test_b[x]" time="0.5">'
        '<failure message="AssertionError: 0.2 &lt; 0.05">trace</failure></testcase>'
        '<testcase classname="t" name="test_c" time="0"><skipped message="needs 2 GPUs"/></testcase>'
        "</testsuite></testsuites>"
    )
    (ctx.logs / "cuda-optim.facts.jsonl").write_text('{"section": "s", "test": "test_a", "err": 1e-07}\n')
    run = {"timed_out": False, "returncode": 1, "timeout_s": 10.0}
    status, summary, details = gc.finish_pytest(part("cuda-optim"), run, ctx)
    assert status == "failed" and summary == "1 passed, 1 failed, 1 skipped; first: test_b[x]"
    assert details["tests"] == {"passed": 1, "failed": 1, "skipped": 1, "errors": 0, "total": 3}
    assert details["failures"][0]["message"] == "AssertionError: 0.2 < 0.05"
    assert details["skipped_reasons"] == {"needs 2 GPUs": 1}
    assert details["facts"] == [{"section": "s", "test": "test_a", "err": 1e-07}]


def test_a_killed_bench_train_keeps_the_rows_it_printed(tmp_path):
    ctx = make_ctx(tmp_path)
    log = ctx.logs / "bench-train.log"
    log.write_text(
        "$ python scripts/bench_train.py ...\n  adamw: 41.5 ms/step\n  mars_adamw_approx: 43.0 ms/step\n"
    )
    run = {"timed_out": True, "returncode": None, "timeout_s": 200.0, "log_path": log}
    status, summary, details = gc.finish_bench(part("bench-train"), run, ctx)
    assert status == "timeout" and summary == "killed after 200 s; 2 partial row(s) from its output"
    assert ctx.results["_bench"]["bench_train"] == [
        {"name": "adamw", "ms_per_step": 41.5, "partial": True},
        {"name": "mars_adamw_approx", "ms_per_step": 43.0, "partial": True},
    ]
