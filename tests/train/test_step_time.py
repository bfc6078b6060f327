"""The per-step time split (mars.train.step_time) on the CPU: forward-backward and optimizer step are
perf_counter times of the step's two parts, so they add up to the step's wall time but for what lies
between them (setting the lr, the window's sums, the stop agreement): within 20% per log line here
(a tiny model, where that bookkeeping weighs most), and never more than the step itself."""

from __future__ import annotations

import json

from train_helpers import compose, tiny_overrides

from mars.train.distributed import DistInfo
from mars.train.trainer import Trainer

TOLERANCE = 0.2  # of ms_per_step: what is neither forward-backward nor the optimizer step


def test_the_split_adds_up_to_the_step_time(data_root, tmp_path, one_thread):
    cfg = compose(
        [*tiny_overrides(data_root, max_steps=12, log_interval=4, eval_interval=6), "train.average=ema"]
    )
    Trainer(cfg, tmp_path, DistInfo()).fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/loss" in r]
    assert len(train) == 3
    for r in train:
        split = r["ms_forward_backward"] + r["ms_optimizer"]
        assert 0 < r["ms_forward_backward"] and 0 < r["ms_optimizer"]
        assert (1 - TOLERANCE) * r["ms_per_step"] <= split <= r["ms_per_step"] * (1 + 1e-9), r
        assert abs(r["tokens_per_s"] - 4 * 32 / (r["ms_per_step"] / 1000)) < 1e-6 * r["tokens_per_s"]
    # train_time: the steps' seconds, evaluations left out (the wall clock "time" holds them)
    evals = [r for r in records if "val/loss" in r]
    last = train[-1]
    assert evals[-1]["train_time"] == last["train_time"] < last["time"]
    assert abs(last["train_time"] - sum(4 * r["ms_per_step"] / 1000 for r in train)) < 1e-6
