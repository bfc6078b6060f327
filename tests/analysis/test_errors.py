"""Bad input to scripts/report.py: one line on stderr naming the problem, exit status 2, nothing written."""

from __future__ import annotations

import pytest
from analysis_helpers import config, power_law, two_group_sweep, write_run

from mars.analysis.cli import report_main
from mars.analysis.report import build_report


def one_error_line(capsys, argv) -> str:
    assert report_main([str(a) for a in argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return two_group_sweep(tmp_path_factory.mktemp("errors") / "sweep")


def test_a_dir_without_run_dirs(tmp_path, capsys):
    (tmp_path / "empty" / "notes").mkdir(parents=True)
    line = one_error_line(capsys, [tmp_path / "empty"])
    empty = tmp_path / "empty"
    assert (
        line
        == f"error: no run dirs under {empty} (a run dir holds .hydra/config.yaml, as train.py writes it)"
    )
    line = one_error_line(capsys, [tmp_path / "missing"])
    assert line == f"error: {tmp_path / 'missing'} is not a directory (give a sweep dir or a run dir)"


def test_a_plugin_that_cannot_be_imported(sweep, tmp_path, capsys, monkeypatch):
    import mars.plugins as plugins

    monkeypatch.setattr(plugins, "_done", False)
    monkeypatch.setattr(plugins, "_entry_points", lambda: [])
    monkeypatch.setenv("MARS_PLUGINS", "no_such_plugin_module")
    line = one_error_line(capsys, [sweep, "--out", tmp_path / "out"])
    assert line.startswith("error: MARS_PLUGINS=no_such_plugin_module: cannot import plugin")
    assert not (tmp_path / "out").exists()


def test_runs_without_metrics_or_without_val_loss_are_named(tmp_path, capsys):
    write_run(tmp_path / "0", config(), [], power_law)
    write_run(tmp_path / "1", config(), [], power_law, metrics=False)
    write_run(tmp_path / "2", config(), [], None)  # train lines only
    line = one_error_line(capsys, [tmp_path])
    assert line.startswith("error: 2 run(s) without validation loss: ")
    assert f"{tmp_path / '1'} (no metrics.jsonl), {tmp_path / '2'} (no val/loss line)" in line
    assert f"{tmp_path / '0'} " not in line and not (tmp_path / "report.md").exists()


def test_runs_of_different_length_from_separate_sweeps_are_refused(tmp_path, capsys):
    a, b = tmp_path / "A", tmp_path / "B"
    for job in range(3):
        write_run(a / str(job), config(**{"train.seed": job}), [f"train.seed={job}"], power_law)
    for job in range(2):
        cfg = config(**{"train.max_steps": 300, "train.seed": job})
        write_run(b / str(job), cfg, ["train.max_steps=300", f"train.seed={job}"], power_law)
    line = one_error_line(capsys, [a, b])
    assert line == (
        f"error: runs differ in train.max_steps (200 in 3 runs under {a}, 300 in 2 runs under {b}): "
        "report them separately (or sweep train.max_steps in one multirun to compare them)"
    )
    # the same runs put side by side in one dir are still not a sweep of that key: they are named
    c = tmp_path / "C"
    write_run(c / "0", config(), [], power_law)
    write_run(c / "1", config(**{"model.n_layer": 6}), [], power_law)
    line = one_error_line(capsys, [c])
    assert line.startswith(
        f"error: runs differ in model.n_layer (4 in 1 run ({c / '0'}), 6 in 1 run ({c / '1'}))"
    )


def test_baseline_that_matches_no_group_lists_the_values(sweep, capsys):
    line = one_error_line(capsys, [sweep, "--baseline", "optimizer.name=lion"])
    assert (
        line
        == "error: --baseline optimizer.name=lion matches no group (optimizer.name takes adamw, mars_adamw)"
    )
    line = one_error_line(capsys, [sweep, "--baseline", "optimizer.nme=adamw"])
    assert line.startswith("error: --baseline key optimizer.nme is in no run's config or overrides")
    assert not (sweep / "report.md").exists()


def test_baseline_that_matches_several_groups_asks_for_another_key(tmp_path, capsys):
    for job, (lr, gamma) in enumerate(((0.003, 0.0), (0.003, 0.025), (0.006, 0.0))):
        cfg = config(**{"optimizer.lr": lr, "optimizer.gamma": gamma})
        write_run(tmp_path / str(job), cfg, [f"optimizer.lr={lr}", f"optimizer.gamma={gamma}"], power_law)
    line = one_error_line(capsys, [tmp_path, "--baseline", "optimizer.lr=3e-3"])
    assert line == (
        "error: --baseline optimizer.lr=3e-3 matches 2 groups (gamma=0.0, lr=0.003; gamma=0.025, lr=0.003): "
        "add another --baseline KEY=VALUE, e.g. --baseline optimizer.gamma=0.0 (optimizer.gamma takes 0.0, "
        "0.025 among them), or --best to take the best of them"
    )
    narrowed = build_report([tmp_path], baseline=["optimizer.lr=3e-3", "optimizer.gamma=0.025"])
    assert narrowed.groups[narrowed.baseline].label == "gamma=0.025, lr=0.003"


@pytest.mark.parametrize("spec", ["adamw", "=adamw", "optimizer name=adamw"])
def test_unparsable_baseline(sweep, capsys, spec):
    line = one_error_line(capsys, [sweep, "--baseline", spec])
    assert line == f"error: --baseline {spec!r} is not KEY=VALUE (e.g. --baseline optimizer.name=adamw)"


def test_best_takes_the_matching_group_with_the_lowest_mean_final_loss(tmp_path):
    """--best: the tuned baseline, e.g. the best lr of an AdamW sweep (known offsets per lr)."""
    for job, (lr, offset) in enumerate(((0.001, 0.3), (0.002, 0.0), (0.004, 0.1))):
        cfg = config(**{"optimizer.lr": lr, "optimizer.name": "adamw"})
        write_run(tmp_path / str(job), cfg, [f"optimizer.lr={lr}"], power_law, offset=offset)
    report = build_report([tmp_path], baseline=["optimizer.name=adamw"], best=True)
    assert report.groups[report.baseline].label == "lr=0.002"
    with pytest.raises(Exception, match="matches 3 groups"):
        build_report([tmp_path], baseline=["optimizer.name=adamw"])


def test_a_target_that_is_not_a_finite_number_is_one_line_with_the_fix(sweep, capsys):
    for bad in ("nan", "inf"):
        line = one_error_line(capsys, [sweep, "--target", bad])
        assert f"--target {bad} is not a finite number" in line and "e.g. --target 3.28" in line
