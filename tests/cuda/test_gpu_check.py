"""scripts/gpu_check.py without a GPU (not marked cuda: this runs everywhere): without CUDA one line,
exit 1 and a report of steps not run; the dry run's report end to end, every step of the plan; a step
past its timeout (pytest interrupted: the tests it finished, their properties and failures are kept,
the rest counted as not run, its process group killed); the plan's caps fit its budget."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gc = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gc  # (dataclasses look their module up)
spec.loader.exec_module(gc)


def script_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "GPU_CHECK_DATA_ROOT")}
    return env | {"PYTHONPATH": str(REPO)} | extra


def test_the_plan_fits_one_gpu_call_riskiest_first():
    caps = [step.cap for step in gc.STEPS.values()]
    assert sum(caps) == gc.BUDGET_S <= 600 - gc.GRACE_S  # one 10-minute call of a lent machine
    assert list(gc.STEPS)[:3] == ["train-readme", "train-fsdp", "memory-1.5b"]
    assert all(step.cuda for step in gc.STEPS.values())


def test_without_cuda_it_says_so_in_one_line_and_fails(tmp_path):
    out = tmp_path / "report"
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(out)],
        env=script_env(CUDA_VISIBLE_DEVICES=""),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr  # a CPU build of torch must not pass for a GPU check
    assert r.stdout.startswith("gpu_check: no CUDA device visible (torch ") and r.stdout.count("\n") == 1
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["ok"] is False and report["exit_status"] == 1 and report["finished"] is True
    assert [s["status"] for s in report["steps"]] == ["not run"] * len(gc.STEPS)
    assert all(s["summary"] == "not run: no CUDA device visible" for s in report["steps"])
    assert "| train-readme | not run |" in (out / "gpu_check.md").read_text()


@pytest.mark.extended  # make test-all
def test_dry_run_writes_the_json_and_markdown_report(tmp_path):
    out = tmp_path / "report"
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run"],
        cwd=tmp_path,
        env=script_env(OUT=str(out)),  # $OUT when no folder is given
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["dry_run"] is True and report["ok"] is True and report["exit_status"] == 0
    assert 0 < report["duration_s"] <= took and report["budget_s"] == gc.BUDGET_S
    env = report["environment"]
    assert env["torch"] and env["cuda_available"] is False and env["gpus"] == []

    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == list(gc.STEPS)  # the dry run covers every step
    assert {n: s["status"] for n, s in steps.items()} == {
        "train-readme": "passed",
        "train-fsdp": "passed",
        "memory-1.5b": "passed",
        "cuda-optim": "skipped",
        "bench-optim": "passed",
        "bench-train": "passed",
        "cuda-train": "skipped",
        "cuda-parallel": "skipped",
    }, {n: (s["summary"], s.get("output_tail")) for n, s in steps.items()}
    for s in steps.values():
        assert s["returncode"] == 0 and 0 < s["seconds"] <= s["timeout_s"] and (out / s["log"]).is_file()
        assert s["command"].startswith(sys.executable) and s["what"] == gc.STEPS[s["name"]].what
    assert (
        steps["train-readme"]["summary"].endswith("; resumed") and " && " in steps["train-readme"]["command"]
    )
    (readme,) = report["benchmarks"]["train-readme"]
    assert readme["step"] == 3 and readme["val/loss"] > 0 and readme["tokens_per_s"] > 0
    by_step = {name: [t for t in report["tests"] if t["step"] == name] for name in steps}
    for name in ("cuda-optim", "cuda-train", "cuda-parallel"):
        assert steps[name]["tests"] == {"skipped": len(by_step[name])} and by_step[name]
        assert "needs a CUDA device" in steps[name]["summary"]
        assert all(t["outcome"] == "skipped" and t["file"].startswith("tests/cuda/") for t in by_step[name])
    assert len(by_step["cuda-optim"]) > 40  # every optimizer case
    assert [r["name"] for r in report["benchmarks"]["bench-optim"]] == ["adamw_fused", "mars_adamw_foreach"]
    assert [r["name"] for r in report["benchmarks"]["bench-train"]] == ["adamw", "mars_adamw_approx"]
    names = [r["name"] for r in report["benchmarks"]["memory-1.5b"]]
    assert names == ["adamw", "mars_adamw_approx", "mars_adamw_exact"]
    for row in report["benchmarks"]["bench-optim"] + report["benchmarks"]["bench-train"]:
        assert row["ms_per_step"] > 0 and row["ratio_to_baseline"] > 0

    md = (out / "gpu_check.md").read_text()
    assert md.startswith("# GPU check: PASSED") and "DRY RUN" in md
    for line in (
        "## Environment",
        "## Steps",
        "## bench-optim: `scripts/bench_optim.py`",
        "| mars_adamw_approx |",
    ):
        assert line in md, line
    assert "| cuda-optim | skipped |" in md and "| bench-train | passed |" in md and "## memory-1.5b:" in md
    for name in steps:  # every step's time is printed
        assert any(line.split()[:2] == [name, steps[name]["status"]] for line in r.stdout.splitlines()), name


FAKE_TESTS = """
import os, subprocess, sys, time
import pytest

@pytest.mark.cuda
def test_measures(record_property):
    record_property("err", 1.5e-07)
    record_property("form", "moonlight")

@pytest.mark.cuda
def test_fails():
    assert 0.2 < 0.05, "too far off"

@pytest.mark.cuda
def test_skips():
    pytest.skip("needs 2 GPUs")

@pytest.mark.cuda
def test_hangs():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(os.environ["GRANDCHILD_PID"], "w").write(str(child.pid))
    time.sleep(600)

@pytest.mark.cuda
def test_after_the_hang():
    pass

def test_deselected():
    pass
"""


def test_a_step_past_its_timeout_keeps_what_pytest_finished(tmp_path, monkeypatch):
    # the grace a step gets to write its XML after SIGINT: long, so that however slowly a loaded machine
    # runs pytest's shutdown, the step ends by itself within it (what is checked), never by the kill
    monkeypatch.setattr(gc, "GRACE_S", 300.0)
    (tmp_path / "test_fake.py").write_text(FAKE_TESTS)
    logs, pid_file = tmp_path / "logs", tmp_path / "grandchild.pid"

    class HangsFirst(subprocess.Popen):
        """The step's timeout counts only once its pytest is inside test_hangs: on a loaded machine, 8 s
        can end before Python has started pytest at all, and a SIGINT there is lost in its start-up."""

        def wait(self, timeout=None):
            if timeout is not None and timeout < gc.GRACE_S:  # the step's own timeout, not the grace
                start, deadline = time.monotonic(), time.monotonic() + 300
                while not pid_file.exists() and time.monotonic() < deadline and self.poll() is None:
                    time.sleep(0.05)
                timeout = max(timeout - (time.monotonic() - start), 0.1)
            return super().wait(timeout=timeout)

    monkeypatch.setattr(gc.subprocess, "Popen", HangsFirst)
    logs.mkdir()
    cmd = [sys.executable, *shlex.split(gc.PYTEST.format(out=logs / "fake")), str(tmp_path / "test_fake.py")]
    env = script_env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", GRANDCHILD_PID=str(pid_file))
    r = gc.run("fake", cmd, timeout_s=8, logs=logs, env=env)
    assert r["status"] == "timeout" and r["timeout_s"] == 8 and 8 <= r["seconds"] < 8 + gc.GRACE_S
    tests, rows = gc.finish(r, tmp_path, dry=False)
    assert rows == [] and r["status"] == "timeout"
    assert r["tests"] == {"passed": 1, "failed": 1, "skipped": 1, "not run": 2}, r["summary"]
    assert r["summary"] == "1 passed, 1 failed, 1 skipped, 2 not run (needs 2 GPUs: 1)"
    outcomes = {t["name"]: (t["outcome"], t["properties"]) for t in tests}
    assert outcomes == {
        "test_measures": ("passed", {"err": 1.5e-07, "form": "moonlight"}),
        "test_fails": ("failed", {}),
        "test_skips": ("skipped", {}),
    }
    assert "too far off" in next(t["message"] for t in tests if t["name"] == "test_fails")
    assert "KeyboardInterrupt" in r["output_tail"]
    grandchild = int(pid_file.read_text())  # killed with the step's process group
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's grandchild {grandchild} outlived its timeout")

    report = {"ok": False, "started": "t", "duration_s": 9.0, "budget_s": 8.0, "dry_run": False}
    md = gc.markdown(report | {"environment": {}, "steps": [r], "tests": tests, "benchmarks": {}})
    assert md.startswith("# GPU check: FAILED")
    assert "| fake | timeout |" in md and "## fake timeout: the end of logs/fake.log" in md
    assert (
        "| case | outcome | seconds | err | form |" in md
        and "| passed |" in md
        and "| 1.5e-07 | moonlight |" in md
    )
    assert "## failed: test_fails" in md and "too far off" in md
