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
