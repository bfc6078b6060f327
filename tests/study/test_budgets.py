"""Budgets and sizes in a study (mars.study.scale) on the fake trainer: one trunk per arm, seed and size
with a cooldown branch per smaller budget, forked at the decay start; resuming redoes only what is
missing; every bad budget or size is one line before anything runs."""

from __future__ import annotations

import json

import pytest
from study_helpers import FakeLauncher, driver_of, run_fake

from mars.errors import UserError

BASE = ["schedule=wsd", "train.max_steps=32"]
SIZES = {"s": ["model.n_embd=32"], "m": ["model.n_embd=64"]}


def ladder_study(directory, base=BASE, **changes):
    """The smoke spec with budgets 8/16/32 steps, sizes s and m, 2 seeds, and `base` added to its base."""
    from study_helpers import set_key, smoke_spec

    from mars.study.spec import check_spec

    spec = smoke_spec()
    spec["dir"] = str(directory)
    spec["base"] = [*spec["base"], *base]
    changes = {"budgets": [8, 16, 32], "sizes": SIZES, "final__seeds": [1, 2], **changes}
    for key, value in changes.items():
        set_key(spec, key.replace("__", "."), value)
    return check_spec(spec)


def overrides_of(run_dir) -> dict:
    import yaml

    items = yaml.safe_load((run_dir / ".hydra/overrides.yaml").read_text())
    return dict(i.split("=", 1) for i in items)


def test_one_trunk_per_arm_seed_and_size_and_a_branch_per_smaller_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SPEEDUP", "1.5")
    launcher = FakeLauncher()
    driver = run_fake(ladder_study(tmp_path / "st"), launcher)
    assert [(z.name, z.budgets, z.forks) for z in driver.sizes] == [
        ("s", (8, 16, 32), (7, 13)),
        ("m", (8, 16, 32), (7, 13)),
    ]
    finals = sorted(d.name for d, _ in launcher.started if d.parent.parent.name == "final")
    assert len(finals) == 2 * 2 * 2 * 3  # arms x seeds x sizes x budgets: each one run, nothing twice
    final = tmp_path / "st" / "final" / "adamw"
    trunk, branch = final / "top1-seed2-m-b32", final / "top1-seed2-m-b8"
    assert overrides_of(trunk)["train.max_steps"] == "32"
    assert overrides_of(trunk)["train.ckpt_steps"] == "[7,13]"  # every smaller budget's decay start
    assert "train.fork_from" not in overrides_of(trunk)
    assert overrides_of(branch)["train.max_steps"] == "8" and overrides_of(branch)["model.n_embd"] == "64"
    assert overrides_of(branch)["train.fork_from"].strip("'") == str(trunk / "ckpt" / "step_00000007")
    assert json.loads((branch / "lineage.json").read_text())["step"] == 7
    # the search ran at the first size, at the base's budget
    assert overrides_of(tmp_path / "st" / "search" / "adamw" / "000")["model.n_embd"] == "32"


def test_the_dry_run_prints_tokens_trained_against_standalone_runs(tmp_path):
    driver = driver_of(ladder_study(tmp_path / "st"))
    lines = driver.budget_lines()
    # 4 x 32 = 128 tokens a step; a trunk of 32 steps + cooldowns 8-7 and 16-13 = 36 steps against 56,
    # x 2 seeds x 2 arms x 2 sizes
    assert "budgets: the finals train 36,864 tokens, standalone runs would train 57,344 (36% less)" in lines
    assert any(line.startswith("size s (") and "forks at steps [7, 13]" in line for line in lines)


def test_a_resumed_study_runs_only_what_is_missing(tmp_path, monkeypatch):
    study = ladder_study(tmp_path / "st")
    monkeypatch.setenv("FAKE_FAIL", "seed2-m-b16")  # a branch fails: the study stops there
    with pytest.raises(UserError, match="seed2-m-b16"):
        run_fake(study)
    monkeypatch.delenv("FAKE_FAIL")
    launcher = FakeLauncher()
    run_fake(study, launcher)
    again = [(d.name, resume) for d, resume in launcher.started]
    assert ("top1-seed2-m-b16", True) in again  # the failed branch, in its own dir, forking again
    assert not any(name.startswith("top1-seed1") for name, _ in again)  # seed 1 was done: not again
    assert all(not name.isdigit() for name, _ in again)  # no search trial reran


def test_a_branch_whose_trunk_left_no_fork_point_is_recorded_unrun(tmp_path, monkeypatch):
    import fake_run

    original = fake_run.write_run

    def no_checkpoints(args):  # the trunk "diverges" before its decay starts: no ckpt_steps saved
        return original([a for a in args if not a.startswith("train.ckpt_steps=")])

    monkeypatch.setattr(fake_run, "write_run", no_checkpoints)
    driver = run_fake(ladder_study(tmp_path / "st", sizes={"s": ["model.n_embd=32"]}, final__seeds=[1, 2]))
    state = driver.arm_state(driver.study.arm("adamw"))
    branches = [t for t in state.final if t.attrs.get("role") == "branch"]
    assert len(branches) == 4 and all(t.status == "diverged" for t in branches)
    assert "left no checkpoint at step 7 to fork from" in branches[0].attrs["message"]


@pytest.mark.parametrize(
    ("changes", "base", "message"),
    [
        ({"budgets": [16, 8]}, BASE, "study.budgets=[16, 8] must increase strictly"),
        ({"budget_unit": "epochs"}, BASE, "study.budget_unit='epochs' is not one of steps, tokens"),
        ({"budgets": [8, 32]}, ["train.max_steps=32"], "but schedule=cosine; add schedule=wsd"),
        ({"budgets": [4, 32]}, BASE, "4 steps leaves no whole step to cool down in"),
        ({"budgets": [1, 32]}, BASE, "1 steps is shorter than warmup plus cooldown"),
        (
            {"budgets": [1000, 4096], "budget_unit": "tokens"},
            BASE,
            "1000 tokens is not a whole number of steps",
        ),
        (
            {"sizes": {"s": ["train.batch_size=4"]}},
            BASE,
            "study.sizes.s: 'train.batch_size=4' is not a model",
        ),
        ({"sizes": {"s": [], "l": ["model=llama_tiny"]}}, BASE, "a ladder of sizes keeps one family"),
        ({"budgets": [8, 32]}, [*BASE, "schedule.decay_steps=30"], "schedule.decay_steps=30 fixes where"),
    ],
)
def test_bad_budgets_and_sizes_are_one_line_before_anything_runs(tmp_path, changes, base, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(")) as e:
        driver_of(ladder_study(tmp_path / "st", base, **changes))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "st").exists() or not any((tmp_path / "st").iterdir())


def test_the_report_recovers_a_known_speedup_at_every_budget_and_size(tmp_path, monkeypatch):
    """Both arms at their fake optimum with nothing searched (the finals only); the fake law gives every
    arm but adamw exactly 1.5x the data: the fits find 1.5 at each budget, and beyond them, labelled."""
    from mars.study.report import write_study_report

    monkeypatch.setenv("FAKE_SPEEDUP", "1.5")
    fixed = {
        "arms": {
            "adamw": {"overrides": ["optimizer=adamw", "optimizer.lr=0.003"], "search": {}, "trials": None},
            "mars_adamw": {
                "overrides": ["optimizer=mars_adamw", "optimizer.lr=0.003", "optimizer.gamma=0.04"],
                "search": {},
                "trials": None,
            },
        }
    }
    launcher = FakeLauncher()
    driver = run_fake(ladder_study(tmp_path / "st", **fixed), launcher)
    assert not any(d.parent.parent.name == "search" for d, _ in launcher.started)  # nothing to search
    written = write_study_report(driver)
    md = (tmp_path / "st" / "report" / "study.md").read_text()
    ladder = json.loads((tmp_path / "st" / "report" / "study.json").read_text())["ladder"]
    measured = ladder["speedups"]  # sizes x budgets, the interval on the truth (the noise is paired)
    assert [p["tokens"] for p in measured] == [1024, 2048, 4096] * 2
    assert all(p["speedup"] == pytest.approx(1.5, rel=1e-4) for p in measured)
    assert all(p["interval"]["low"] <= 1.5 + 1e-6 and p["interval"]["high"] >= 1.5 - 1e-6 for p in measured)
    last = [p for p in ladder["speedup_curves"] if p["extrapolation"] > 3.99]
    assert last and all(p["speedup"] == pytest.approx(1.5, rel=1e-3) for p in last)
    assert "x4 beyond the largest budget" in md and "### Budget table" in md
    # 2 sizes: no L(N) fit, said in one line per arm and budget
    assert "no fit: needs at least 3 points with parameters > 0, adamw at 32 steps has 2" in md
    assert {p.name for p in written} >= {"loss_vs_tokens.png", "speedup_vs_tokens.png", "speedup_vs_size.png"}
    # the verdict (report.py) compares the trunks at the first size, the largest budget
    assert "top1-seed1-s-b32" in md and "report.md" in {p.name for p in written}


def test_the_report_judges_the_averaged_weights_and_gives_speedups_per_second_and_a_profile(
    tmp_path, monkeypatch
):
    """The fake law's 1.5x data speedup, at twice adamw's seconds per token: 0.75x per second. With
    train.average the runs log val/loss_avg (adamw's 0.02 below its val/loss, mars_adamw's 0.01 above):
    the report judges both, averaging's paired effect per arm, size and budget, and writes report.py's
    report of the averaged value; the performance profile puts mars_adamw best in tokens, adamw in seconds."""
    from fake_run import FAKE_HARDWARE

    from mars.study.report import write_study_report

    monkeypatch.setenv("FAKE_SPEEDUP", "1.5")
    monkeypatch.setenv("FAKE_SLOWDOWN", "2")
    fixed = {
        "arms": {
            "adamw": {"overrides": ["optimizer=adamw", "optimizer.lr=0.003"], "search": {}, "trials": None},
            "mars_adamw": {
                "overrides": ["optimizer=mars_adamw", "optimizer.lr=0.003", "optimizer.gamma=0.04"],
                "search": {},
                "trials": None,
            },
        }
    }
    study = ladder_study(tmp_path / "st", [*BASE, "train.average=ema"], **fixed)
    written = {
        p.relative_to(tmp_path / "st" / "report").as_posix() for p in write_study_report(run_fake(study))
    }
    report = tmp_path / "st" / "report"
    md, js = (report / "study.md").read_text(), json.loads((report / "study.json").read_text())
    ladder = js["ladder"]
    assert {(t["arm"], t["tokens_per_s"]) for t in ladder["throughput"]} == {
        ("adamw", 1000.0),
        ("mars_adamw", 500.0),
    }
    assert "| s | mars_adamw | 1,024 | 1.500 (1.5 to 1.5) | 0.750 | measured |" in md
    assert f"measured on {FAKE_HARDWARE}" in md
    rho = ladder["performance_profile"]
    assert rho["tokens"]["rho"]["mars_adamw"]["1"] == 1.0 and rho["tokens"]["rho"]["adamw"]["1"] < 1.0
    assert rho["seconds"]["rho"]["adamw"]["1"] == 1.0 and rho["seconds"]["rho"]["mars_adamw"]["1"] < 1.0
    assert "performance_profile.png" in written and "### Performance profile" in md
    # averaged weights: the same runs judged on val/loss_avg
    averaged = js["averaged"]
    assert averaged["key"] == "val/loss_avg" and "## Averaged weights" in md
    effect = {a["arm"]: a["difference"] for a in averaged["arms"]}
    assert effect == {"adamw": pytest.approx(-0.02), "mars_adamw": pytest.approx(0.01)}
    assert all(
        c["difference"] == pytest.approx(-0.02 if c["arm"] == "adamw" else 0.01) for c in averaged["cells"]
    )
    assert len(averaged["cells"]) == 2 * 2 * 3  # arms x sizes x budgets
    assert {"averaged/report.md", "averaged/performance_profile.png"} <= written
    assert "weights (train.average=ema) and logged its val/loss_avg" in md and "#### Budget table" in md


@pytest.mark.slow
@pytest.mark.extended  # make test-all
def test_a_budgets_study_of_the_real_train_py_branches_equal_standalone_runs(tmp_path, data_root):
    """One arm, nothing searched, budgets 6 and 8 steps: a trunk and a branch through train.py; the
    branch's final val loss is that of a standalone wsd run of 6 steps, bit for bit."""
    import subprocess
    import sys

    from study_helpers import REPO

    from mars.analysis.runs import load_run

    study_dir = tmp_path / "st"
    arms = ["study.arms.adamw.search={}", "~study.arms.mars_adamw"]
    args = [*arms, "study.budgets=[6,8]", "study.final.seeds=[1]", "schedule=wsd", f"data.root={data_root}"]
    env = {"PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    command = [
        sys.executable,
        str(REPO / "scripts" / "study.py"),
        "study=smoke",
        f"study.dir={study_dir}",
        *args,
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "the finals train 1,152 tokens, standalone runs would train 1,792 (36% less)" in proc.stdout
    branch = study_dir / "final" / "adamw" / "top1-seed1-b6"
    assert json.loads((branch / "lineage.json").read_text())["step"] == 5
    overrides = overrides_of(branch)
    alone = tmp_path / "alone"
    standalone = [
        f"{k}={v}" for k, v in overrides.items() if k not in ("train.fork_from", "logger.wandb.name")
    ]
    run = subprocess.run(
        [sys.executable, "-m", "mars.train", *standalone, f"hydra.run.dir={alone}"],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert load_run(branch).final("val/loss") == load_run(alone).final("val/loss")
    study = json.loads((study_dir / "report" / "study.json").read_text())
    assert [r["steps"] for r in study["ladder"]["table"]] == [6, 8]
