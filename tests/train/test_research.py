"""The research workflow in the trainer: strict optimizer keys (also in sweeps), gamma schedules logged
as used and resumed exactly, MARS diagnostics in metrics.jsonl."""

from __future__ import annotations

import json

import pytest
from train_helpers import compose, tiny_overrides

from mars.checkpoint import latest_checkpoint
from mars.errors import ConfigError
from mars.train.cli import precheck
from mars.train.distributed import DistInfo
from mars.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEDULE = [
    "optimizer.gamma=0.04",
    "optimizer.gamma_schedule.name=linear",
    "optimizer.gamma_schedule.warmup_steps=4",
    "optimizer.gamma_schedule.start=0.0",
    "optimizer.gamma_schedule.end=0.01",
    "optimizer.gamma_schedule.decay_steps=8",
    "schedule=constant",
]
# gamma used at update t (0-based): warmup 0 -> 0.04 over 4 updates, linear to 0.01 at update 8, then 0.01
EXPECTED = [0.0, 0.01, 0.02, 0.03, 0.04, 0.0325, 0.025, 0.0175, 0.01, 0.01]


def records(run_dir, key):
    lines = [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in lines if key in r}


def trainer(data_root, run_dir, extra, resume_from=None, **train):
    return Trainer(compose([*tiny_overrides(data_root, **train), *extra]), run_dir, DistInfo(), resume_from)


def test_gamma_follows_its_schedule_and_the_log_says_what_was_used(data_root, tmp_path):
    tr = trainer(data_root, tmp_path, SCHEDULE, max_steps=10)
    used = []
    for _ in range(10):
        tr.train_step()
        used.append(tr.optimizer.param_groups[0]["gamma"])
    assert used == pytest.approx(EXPECTED)

    run = tmp_path / "fit"
    trainer(data_root, run, SCHEDULE, max_steps=10).fit()
    logged = records(run, "gamma")  # the line of step s reports the gamma of update s - 1
    assert [logged[s] for s in range(1, 11)] == pytest.approx(EXPECTED)


def test_resume_mid_schedule_is_exact(data_root, tmp_path):
    straight = tmp_path / "straight"
    trainer(data_root, straight, SCHEDULE, max_steps=10).fit()
    first = trainer(data_root, tmp_path / "half", SCHEDULE, max_steps=5)
    first.fit()
    resumed = trainer(
        data_root,
        tmp_path / "half",
        SCHEDULE,
        max_steps=10,
        resume_from=latest_checkpoint(tmp_path / "half/ckpt"),
    )
    resumed.fit()
    assert records(tmp_path / "half", "train/loss") == records(straight, "train/loss")  # bit-identical
    assert records(tmp_path / "half", "gamma") == records(straight, "gamma")


def test_diagnostics_are_logged_at_log_steps_only_when_on(data_root, tmp_path):
    on = tmp_path / "on"
    trainer(data_root, on, ["optimizer.diagnostics=true"], max_steps=4, log_interval=2).fit()
    lines = [json.loads(s) for s in (on / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if "train/loss" in r]
    assert [r["step"] for r in train] == [2, 4]
    for r in train:
        assert 0 <= r["mars/clip_fraction"] <= 1 and r["mars/c_norm_max"] >= r["mars/c_norm_mean"] > 0
        assert -1 <= r["mars/grad_cos"] <= 1 and r["mars/correction_ratio"] >= 0
    off = tmp_path / "off"
    trainer(data_root, off, [], max_steps=4, log_interval=2).fit()
    assert not any(
        k.startswith("mars/")
        for r in off.joinpath("metrics.jsonl").read_text().splitlines()
        for k in json.loads(r)
    )
    assert records(on, "train/loss") == records(off, "train/loss")  # same training either way
    adamw = tmp_path / "adamw"
    trainer(data_root, adamw, ["optimizer=adamw"], max_steps=2).fit()
    assert records(adamw, "gamma") == {}  # no gamma for an optimizer without one


@pytest.mark.parametrize(
    "argv, fragments",
    [
        (
            ["optimizer=muon", "optimizer.gamma=0.05"],
            ["optimizer.gamma: optimizer=muon has no key 'gamma'", "its keys: lr,"],
        ),
        (
            ["optimizer=adamw", "optimizer.lr_1d=1e-3"],
            ["optimizer.lr_1d: optimizer=adamw has no key 'lr_1d'"],
        ),
        (
            ["-m", "optimizer=mars_adamw,muon", "optimizer.gamma=0.01,0.05"],
            ["optimizer=muon has no key 'gamma'", "(sweep job optimizer=muon optimizer.gamma=0.01)"],
        ),
        (["optimizer.gamma=-0.1"], ["optimizer.gamma=-0.1 must be a finite number >= 0"]),
        (
            [
                "optimizer.gamma_schedule.name=cosine",
                "optimizer.gamma_schedule.warmup_steps=200",
                "train.max_steps=100",
            ],
            ["gamma_schedule ends before it starts", "train.max_steps=100"],
        ),
        (["optimizer.betas=[0.9,1.0]"], ["optimizer.betas=[0.9, 1.0] must be a pair"]),
        (["model.dropout=1.5"], ["model.dropout=1.5 must lie in [0, 1)"]),
    ],
)
def test_foreign_keys_and_bad_values_fail_before_any_job(argv, fragments):
    with pytest.raises(ConfigError) as e:
        precheck(argv)
    text = str(e.value)
    assert len(text.splitlines()) == 1
    for fragment in fragments:
        assert fragment in text, text
