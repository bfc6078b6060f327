import json
import logging
import math

import pytest
import torch

from mars import metrics_jsonl
from mars.train import metrics
from mars.train.metrics import MetricsFile, read_metrics, wandb_mode


def test_metrics_file_writes_one_object_per_line(tmp_path):
    f = MetricsFile(tmp_path)
    f.write({"step": 1, "tokens": 8, "train/loss": torch.tensor(2.5), "lr": 1e-3})
    f.write({"step": 1, "tokens": 8, "val/loss": float("nan")})
    f.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"step": 1, "tokens": 8, "train/loss": 2.5, "lr": 1e-3}
    assert json.loads(lines[1])["val/loss"] == "nan"  # strict JSON: no NaN literal
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 1]


def test_truncate_after_drops_lines_past_the_resumed_step_and_a_torn_tail(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(json.dumps({"step": s, "tokens": s}) + "\n" for s in range(1, 6)) + '{"step": 6, "tok'
    )
    MetricsFile(tmp_path).truncate_after(3)
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    f = MetricsFile(tmp_path)
    f.write({"step": 4, "tokens": 4})
    f.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4]


def test_a_damaged_line_in_the_middle_is_named_never_dropped_silently(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    good = [json.dumps({"step": s, "tokens": s}) for s in range(1, 6)]
    path.write_bytes("\n".join([good[0], '{"step": 2, "tok\x00\x00', *good[2:], '{"step": 6, "tok']).encode())
    with pytest.raises(metrics_jsonl.CorruptLineError) as e:
        read_metrics(path)
    assert str(e.value).startswith(f'{path} line 2 is not a JSON object (\'{{"step": 2, "tok\\x00\\x00\')')
    assert f"repair or delete that line (e.g. sed -i 2d {path})" in str(e.value)

    with caplog.at_level(logging.WARNING):
        MetricsFile(tmp_path).truncate_after(3)  # a resume from step 3: the damaged line is kept, said
    assert f"{path} line 2 is not a JSON object" in caplog.text and "kept as it is" in caplog.text
    assert path.read_bytes().decode().splitlines() == [good[0], '{"step": 2, "tok\x00\x00', good[2]]

    path.write_bytes(b"\n".join([good[0].encode(), good[3].encode(), b"\xff\xfe", good[4].encode(), b""]))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        MetricsFile(tmp_path).truncate_after(1)  # among the lines redone: dropped with them, said
    assert f"{path} line 3 is not a JSON object" in caplog.text
    assert "dropped with the lines after step 1, which this run logs again" in caplog.text
    assert [r["step"] for r in read_metrics(path)] == [1]

    path.write_bytes(b"\n".join([good[0].encode(), b"\xff\xfe", good[1].encode(), b""]))
    MetricsFile(tmp_path).truncate_after(3)  # bytes that are not UTF-8 are kept as they were
    assert path.read_bytes().splitlines()[1] == b"\xff\xfe"


def test_wandb_mode_env_wins_and_online_without_key_goes_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode("online") == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    assert wandb_mode("online") == "offline"
    assert wandb_mode("disabled") == "disabled"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("online") == "online"


def test_disabled_wandb_logger_is_a_no_op(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    from mars.train.config import WandbConfig

    logger = metrics.WandbLogger(WandbConfig(), ".", {"a": 1})
    assert logger.run is None and logger.run_id is None
    logger.log({"step": 1, "x": math.pi})  # a no-op
    logger.finish()


def test_registered_metrics_are_read_as_floats_and_named(monkeypatch):
    monkeypatch.setattr(metrics, "_REGISTERED", {})
    model = torch.nn.Linear(3, 2)
    metrics.register_metric("weights/norm", lambda m, o: torch.linalg.vector_norm(m.weight))
    metrics.register_metric(
        "opt", lambda m, o: {"groups": len(o.param_groups), "lr": o.param_groups[0]["lr"]}
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    values = metrics.logged_metrics(model, opt)
    assert list(values) == ["weights/norm", "opt/groups", "opt/lr"]
    assert values["weights/norm"] == pytest.approx(float(model.weight.detach().norm()))
    assert values["opt/groups"] == 1.0 and values["opt/lr"] == 0.5
    assert all(type(v) is float for v in values.values())
    with pytest.raises(ValueError, match="is not a metrics.jsonl key"):
        metrics.register_metric("/bad", lambda m, o: 0.0)


# ----------------------------------------------------------------------------- registered metrics


@pytest.fixture
def registered(monkeypatch):
    """An empty metric registry (restored afterwards): what the test registers."""
    monkeypatch.setattr(metrics, "_REGISTERED", {})
    return metrics._REGISTERED


def linear_and_sgd():
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.Adam(model.parameters())


@pytest.mark.parametrize(
    "value, shown",
    [
        ("not a number", "returned 'not a number' (str)"),
        (None, "returned None (NoneType)"),
        (True, "returned True (bool)"),
        (torch.ones(3), "returned a Tensor of shape (3,)"),
        ({"ok": 1.0, "bad": [1, 2]}, "metric 'probe/bad' (register_metric('probe', "),
    ],
)
def test_a_metric_that_returns_no_number_is_one_line_naming_it(registered, value, shown):
    from mars.errors import ConfigError

    metrics.register_metric("probe", lambda m, o: value)
    for check in (metrics.check_metrics, metrics.logged_metrics):  # before the first step, and at a log line
        with pytest.raises(ConfigError) as info:
            check(*linear_and_sgd())
        message = str(info.value)
        assert shown in message and "test_metrics" in message and "\n" not in message
        assert "must return a number, a one-element tensor, or a dict of them" in message


def test_metric_keys_may_not_collide_and_a_failing_metric_is_named(registered):
    from mars.errors import ConfigError

    metrics.register_metric("train", lambda m, o: {"loss": 0.0})  # would write train/loss
    with pytest.raises(ConfigError, match=r"metric 'train/loss' .* writes 'train/loss', which the trainer"):
        metrics.check_metrics(*linear_and_sgd())
    registered.clear()
    metrics.register_metric("a/b", lambda m, o: 1.0)
    metrics.register_metric("a", lambda m, o: {"b": 2.0})
    with pytest.raises(ConfigError, match=r"writes 'a/b', which another registered metric writes too"):
        metrics.check_metrics(*linear_and_sgd())
    registered.clear()
    # the optimizer holds no state before the first step: left to the first log line, which names it
    metrics.register_metric("adam/m", lambda m, o: o.state[m.weight]["exp_avg"].norm())
    model, opt = linear_and_sgd()
    metrics.check_metrics(model, opt)
    with pytest.raises(
        ConfigError, match=r"^metric 'adam/m' \(register_metric\('adam/m', .*\)\) failed: KeyError"
    ):
        metrics.logged_metrics(model, opt)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert metrics.logged_metrics(model, opt)["adam/m"] > 0


def test_a_metric_with_no_number_stops_the_run_before_training(registered, data_root, tmp_path, one_thread):
    from train_helpers import compose, tiny_overrides

    from mars.errors import ConfigError
    from mars.train.distributed import DistInfo
    from mars.train.trainer import Trainer

    metrics.register_metric("weights/first", lambda model, optimizer: next(model.parameters()).flatten()[:2])
    with pytest.raises(ConfigError, match=r"metric 'weights/first' .* returned a Tensor of shape \(2,\)"):
        Trainer(compose(tiny_overrides(data_root)), tmp_path, DistInfo())
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "ckpt").exists()


def test_the_trainer_writes_exactly_the_keys_it_declares(
    registered, data_root, tmp_path, one_thread, monkeypatch
):
    """TRAINER_KEYS (what register_metric refuses) is every key of the trainer's lines: a training run with
    every optional key on (a gamma schedule, diagnostics, MFU, evaluation) writes all of them and no
    other but the registered metric's (Metrics.log refuses an undeclared one)."""
    from train_helpers import compose, tiny_overrides

    from mars.optim._correction import DIAGNOSTIC_KEYS
    from mars.train.distributed import DistInfo
    from mars.train.trainer import Trainer

    monkeypatch.setenv("MARS_PEAK_FLOPS", "1e12")
    metrics.register_metric("weights", lambda model, optimizer: {"rms": 1.0})
    extra = ["optimizer.diagnostics=true", "optimizer.gamma_schedule.name=linear"]
    extra.append("train.average=ema")  # val/loss_avg
    cfg = compose([*tiny_overrides(data_root, max_steps=2, eval_interval=2), *extra])
    Trainer(cfg, tmp_path, DistInfo()).fit()
    keys = {k for line in read_metrics(tmp_path) for k in line}
    # max_memory_gb is a GPU's (tests/gpu_standin checks it on stand-in GPUs)
    assert keys == {*metrics.TRAINER_KEYS, *DIAGNOSTIC_KEYS, "weights/rms"} - {"max_memory_gb"}
    # a training line: the trainer's core record, the built-in metrics, a researcher's, then MFU
    core = ["step", "tokens", "train/loss", "lr", "grad_norm", "train/clip_rate", "train/nonfinite_steps"]
    times = ["time", "train_time", "ms_per_step", "ms_forward_backward", "ms_optimizer", "tokens_per_s"]
    order = [*core, *times, "gamma", *DIAGNOSTIC_KEYS, "weights/rms", "mfu"]
    assert [list(line) for line in read_metrics(tmp_path) if "train/loss" in line] == [order, order]
    # the first line with seconds names the hardware they are measured on: the evaluation at step 0
    assert [line.get("hardware", "").endswith("cores)") for line in read_metrics(tmp_path)] == [
        True,
        False,
        False,
        False,
    ]
    assert all(metrics.is_trainer_key(k) for k in DIAGNOSTIC_KEYS)
    with pytest.raises(RuntimeError, match=r"'new/key' is neither in mars.train.metrics.TRAINER_KEYS"):
        metrics._check_keys({"step": 1, "weights/rms": 1.0, "new/key": 2.0})
