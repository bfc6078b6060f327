"""`python train.py ...` in process: bad input gives one clear line; resume=auto without a checkpoint."""

from __future__ import annotations

import pytest
from train_helpers import assert_one_line, run_cli, tiny_overrides

from mars.train.distributed import DistInfo

pytestmark = pytest.mark.usefixtures("one_thread", "restore_logging")


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["model=gpt2_huge"], ["Could not find 'model/gpt2_huge'", "gpt2_tiny"]),
        (["train.max_steps=many"], ["train.max_steps=many", "could not be converted to Integer"]),
        (["train.batch_size=0"], ["train.batch_size=0 must be >= 1"]),
        (["train.batch_size=3", "train.global_batch_size=8"], ["not a multiple of train.batch_size"]),
        # composition, not a traceback once the run dir exists: an interpolation the harness does not support
        (["logger.wandb.name=${eval:1+1}"], ["Unsupported interpolation type eval", "logger.wandb.name"]),
        (
            ["train.max_steps=4", "schedule.warmup_steps=100"],
            ["schedule.warmup_steps=100 is longer than the run (train.max_steps=4)"],
        ),
        (["data.val_tokens=0"], ["data.val_tokens=0 holds no validation window", "train.eval_steps=0"]),
        (["data.verify=fast"], ["data.verify='fast' is not one of cached, full"]),
        (["launch.gpus_per_job=1"], ["launch.gpus_per_job=1 places the jobs of a sweep", "torchrun"]),
        # two of Hydra's modes at once: Hydra itself raises a ValueError with a traceback
        (["-m", "--cfg", "hydra", "optimizer.lr=1e-3,2e-3"], ["--multirun (-m) and --cfg cannot be given"]),
    ],
)
def test_config_errors_exit_2_with_one_line(monkeypatch, capsys, tmp_path, args, fragments):
    code, _, err = run_cli(monkeypatch, capsys, [*args, f"hydra.run.dir={tmp_path}/run"])
    assert code == 2
    assert_one_line(err, *fragments)
    assert not (tmp_path / "run").exists()  # nothing written before the check


def test_missing_dataset_names_the_prepare_command(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(
        monkeypatch,
        capsys,
        ["data=openwebtext", f"data.root={tmp_path}/data", f"hydra.run.dir={tmp_path}/run"],
    )
    assert code == 1
    assert_one_line(err, "scripts/prepare_data.py", "data=openwebtext")


def test_checkpoint_of_another_model_shape(monkeypatch, capsys, tmp_path, data_root):
    from train_helpers import compose

    from mars.train.trainer import Trainer

    run = tmp_path / "run"
    tr = Trainer(compose(tiny_overrides(data_root)), run, DistInfo())
    tr.save()
    args = [*tiny_overrides(data_root), "model.n_embd=64", "train.resume=auto", f"hydra.run.dir={run}"]
    code, _, err = run_cli(monkeypatch, capsys, args)
    assert code == 1
    assert_one_line(err, "cannot resume", "model.n_embd: 32 -> 64", "fixed for a run")


def test_resume_from_a_path_without_checkpoint(monkeypatch, capsys, tmp_path, data_root):
    args = [*tiny_overrides(data_root), f"train.resume={tmp_path}/nothing", f"hydra.run.dir={tmp_path}/run"]
    code, _, err = run_cli(monkeypatch, capsys, args)
    assert code == 1
    assert_one_line(err, f"train.resume={tmp_path}/nothing: no complete checkpoint there")
    assert not (tmp_path / "run").exists()  # refused before the run dir and its train.log are made


def test_resume_auto_without_checkpoint_starts_fresh_and_says_so(monkeypatch, capsys, tmp_path, data_root):
    run = tmp_path / "run"
    args = [*tiny_overrides(data_root, max_steps=1), "train.resume=auto", f"hydra.run.dir={run}"]
    code, out, err = run_cli(monkeypatch, capsys, args)  # Hydra logs INFO to stdout and RUN_DIR/train.log
    assert code == 0, err
    assert f"train.resume=auto: no checkpoint in {run}/ckpt, starting from scratch" in out
    assert (run / "ckpt" / "step_00000001" / "config.yaml").is_file()
    assert (run / ".hydra" / "config.yaml").is_file()


def test_help_shows_the_usage_and_says_what_the_schema_groups_are(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, ["--help"])
    assert code == 0
    assert out.startswith("python train.py [GROUP=OPTION ...] [KEY=VALUE ...]")
    assert "optimizer: adamw, lion, mars_adamw" in out  # the groups a user picks from
    assert "schema/optimizer holds the key schemas" in out
