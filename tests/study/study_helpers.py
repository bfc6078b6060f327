"""Helpers of the study's tests: specs from configs/study/smoke.yaml, and a launcher that runs the fake
trainer (fake_run.py) in this process, behind the launcher interface the driver uses."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import fake_run

from mars.study.driver import Driver
from mars.study.spec import check_spec, compose_spec

REPO = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_run.py")
FAKE_COMMAND = [sys.executable, str(FAKE)]

_smoke: dict = {}


def smoke_spec() -> dict:
    """configs/study/smoke.yaml, composed once per test session."""
    if not _smoke:
        _smoke.update(compose_spec(["study=smoke"]))
    return copy.deepcopy(_smoke)


def set_key(spec: dict, dotted: str, value) -> None:
    node = spec
    *path, last = dotted.split(".")
    for part in path:
        node = node[part]
    node[last] = value


def study_of(directory: Path, **changes):
    """The smoke study in `directory`, with spec keys changed (`sampler__seed=3` sets sampler.seed)."""
    spec = smoke_spec()
    spec["dir"] = str(directory)
    for key, value in changes.items():
        set_key(spec, key.replace("__", "."), value)
    return check_spec(spec)


class FakeHandle:
    def __init__(self, code: int, log: Path):
        self.code, self.log = code, log

    def poll(self) -> int:
        return self.code

    def terminate(self) -> None:
        pass

    def wait(self) -> int:
        return self.code


class FakeLauncher:
    """Runs fake_run.write_run in this process: a trial is done as soon as it starts."""

    def __init__(self, capacity: int = 2):
        self.capacity = capacity
        self.started: list[tuple[Path, bool]] = []

    def start(self, job) -> FakeHandle:
        job.run_dir.mkdir(parents=True, exist_ok=True)
        self.started.append((job.run_dir, job.resume))
        code = fake_run.write_run([*job.command_overrides, f"hydra.run.dir={job.run_dir}"])
        return FakeHandle(code, job.run_dir / "launch.log")


def driver_of(study, launcher=None) -> Driver:
    driver = Driver(study, launcher or FakeLauncher(), say=lambda *_: None, poll_s=0.001)
    driver.prepare(data=False)
    return driver


def run_fake(study, launcher=None) -> Driver:
    driver = driver_of(study, launcher)
    driver.run()
    return driver


def trials_of(driver) -> dict:
    """(arm, phase, index) -> (params, value, status) of every trial in the storage."""
    out = {}
    for arm in driver.study.arms:
        state = driver.arm_state(arm)
        for t in state.search + state.final:
            out[(arm.name, t.phase, t.index)] = (t.params, t.value, t.status)
    return out
