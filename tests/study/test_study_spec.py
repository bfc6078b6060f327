"""Every bad spec value, storage URL or study state stops `scripts/study.py` in one line naming the key and
the fix, before any trial runs (nothing launched, no run dir made)."""

from __future__ import annotations

from pathlib import Path

import pytest
from study_helpers import smoke_spec, study_of

from mars.errors import UserError
from mars.study.cli import main
from mars.study.spec import check_spec

SEARCH = "study.arms.adamw.search.optimizer.lr"


def run_main(capsys, args) -> tuple[int, str]:
    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        ([f"{SEARCH}.lo=0.2"], ["study.arms.adamw.search.optimizer.lr: lo=0.2 > hi=0.1; swap them"]),
        ([f"{SEARCH}.lo=0"], ["dist=loguniform needs lo > 0 (got lo=0)"]),
        ([f"{SEARCH}.dist=lognormal"], [f"{SEARCH}.dist='lognormal' is not one of loguniform, uniform"]),
        (["study.sampler.name=grid"], ["study.sampler.name='grid' is not one of sobol, random, tpe"]),
        (
            ["+study.arms.adamw.search.optimizer.gamma={dist:uniform,lo:0,hi:0.1}"],
            [
                "study.arms.adamw.search.optimizer.gamma: optimizer=adamw has no key 'gamma'",
                "its keys: lr, betas, eps, weight_decay",
            ],
        ),
        (
            ["study.arms.mars_adamw.search.optimizer.gamma.lo=-0.1"],
            [
                "study.arms.mars_adamw.search.optimizer.gamma: the arm does not compose at the lower bounds",
                "gamma",
            ],
        ),
        (
            ["+study.arms.adamw.search.train.bogus={dist:int,lo:1,hi:4}"],
            ["study.arms.adamw.search.train.bogus: the arm does not compose", "bogus"],
        ),
        (["study.storage=not a url"], ["study.storage='not a url' is not a database URL"]),
        (
            ["study.storage=nosuchdb://host/x"],
            ["study.storage=nosuchdb://host/x: SQLAlchemy knows no database"],
        ),
        (["train.seed=3"], ["sets train.seed, which the study chooses itself"]),
        (
            ["study.trails=3"],
            ["Could not override 'study.trails'", "its keys: name, dir, storage, base, arms"],
        ),
        (
            ["study.edges.fraction=0.1"],  # the outer-tenth rule's key: the rule is bracketing now
            ["Could not override 'study.edges.fraction'", "its keys: tolerance"],
        ),
        (["study.final.top_k=5"], ["study.final.top_k=5 is more than the 4 search trials of arm adamw"]),
        (
            ["study.metric.key=val/los"],
            ["study.metric.key='val/los' is a key no run logs (did you mean val/loss?)"],
        ),
        (["study.baseline=sgd"], ["study.baseline='sgd' is not an arm (adamw, mars_adamw)"]),
        (
            ["study.final.seeds=[1,1]"],
            ["study.final.seeds=[1, 1] must be a non-empty list of distinct seeds"],
        ),
        (["study.launcher.gpus_per_job=64"], ["study.launcher.gpus_per_job=64 but this machine shows"]),
        (
            ["study.metric.key=val/loss_avg"],
            [
                "study.metric.key=val/loss_avg is the averaged weights' loss",
                "study.arms.adamw trains with train.average=off: add train.average=ema",
            ],
        ),  # fmt: skip
    ],
)
def test_a_bad_spec_stops_in_one_line_before_anything_runs(capsys, tmp_path, args, fragments):
    study_dir = tmp_path / "study"
    code, err = run_main(capsys, ["study=smoke", f"study.dir={study_dir}", *args])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    for f in fragments:
        assert f in lines[0], lines[0]
    assert not (study_dir / "search").exists()


SHIPPED = sorted(p.stem for p in (Path(__file__).parents[2] / "configs" / "study").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_spec_composes_and_passes_the_spec_check(name):
    """A schema change must carry the shipped specs with it (ladder_tuned and ladder_mup once kept
    edges.fraction after the edge rule dropped it, and `study=ladder_tuned` stopped at composition)."""
    from mars.study.spec import compose_spec

    study = check_spec(compose_spec([f"study={name}"]))
    assert study.arms and study.baseline in {a.name for a in study.arms}


def test_no_spec_or_an_unknown_one_is_named(capsys):
    code, err = run_main(capsys, ["model=llama_tiny"])
    names = ", ".join(
        sorted(p.stem for p in (Path(__file__).parents[2] / "configs" / "study").glob("*.yaml"))
    )
    assert code == 2 and f"choose a study spec: study=NAME (configs/study/ holds {names})" in err
    code, err = run_main(capsys, ["study=nope"])
    assert code == 2 and "Could not find 'study/nope'" in err and "micro" in err


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        (
            "arms.adamw.search.optimizer.lr",
            {"dist": "choice", "choices": []},
            "choices must be a non-empty list",
        ),
        ("arms.adamw.search.optimizer.lr", {"dist": "int", "lo": 1.5, "hi": 4}, "lo=1.5 must be an integer"),
        (
            "arms.adamw.search.optimizer.lr",
            {"dist": "uniform", "lo": 1, "hi": 1},
            "lo = hi = 1 searches nothing",
        ),
        ("arms.adamw.search.optimizer.lr", {"lo": 1}, "expected a distribution"),
        (
            "arms.adamw.overrides",
            ["optimizer=adamw", "optimizer.lr=1e-3"],
            "which 'optimizer.lr=1e-3' also fixes",
        ),
        ("base", ["hydra.run.dir=/tmp/x"], "each trial's run dir is chosen by the study"),
        ("arms", {}, "study.arms is empty"),
        ("edges.tolerance", -0.1, "study.edges.tolerance=-0.1 must be a number >= 0"),
        ("metric.summary", "mean", "study.metric.summary='mean' is not one of final, best"),
    ],
)
def test_each_value_check_names_its_key(key, value, fragment):
    spec = smoke_spec()
    node = spec
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    node[last] = value
    with pytest.raises(UserError) as e:
        check_spec(spec)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_dry_run_checks_everything_and_prints_the_budget(capsys, tmp_path):
    code = 0
    try:
        main(["study=smoke", f"study.dir={tmp_path / 's'}", "--dry-run"])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr().out
    assert code == 0
    assert "budget: 12 runs, 6,144 training tokens" in out and "dry run: every check passed" in out
    assert not (tmp_path / "s" / "search").exists()
    assert study_of(tmp_path / "t").baseline == "adamw"


@pytest.mark.parametrize(
    ("url", "blocked", "fragment"),
    [
        (
            "postgresql://mars:s3cret@127.0.0.1:1/db",
            "psycopg",
            "driver psycopg is not installed: pip install",
        ),
        ("postgresql://mars:s3cret@127.0.0.1:1/db", None, "cannot reach the database server at 127.0.0.1:1"),
        (
            "postgresql://mars:s3cret@no-such-host.invalid/db",
            None,
            "cannot reach the database server at no-such-host.invalid",
        ),
        (
            "mysql://mars:s3cret@127.0.0.1/db",
            None,
            "driver MySQLdb is not installed: pip install mysqlclient",
        ),
        ("postgresql+psycopg2://mars:s3cret@127.0.0.1/db", None, "pip install psycopg2-binary"),
    ],
)
def test_a_storage_that_cannot_be_opened_is_one_line_without_its_password(
    capsys, tmp_path, monkeypatch, url, blocked, fragment
):
    """No driver, no server, no such host: one line naming the package or the address (a server that
    refuses the password: tests/study/test_postgres.py), the password never shown, nothing written."""
    import sys

    if blocked:
        monkeypatch.setitem(sys.modules, blocked, None)  # as if it were not installed
    study_dir = tmp_path / "s"
    code, err = run_main(
        capsys, ["study=smoke", f"study.dir={study_dir}", f"study.storage={url}", "--dry-run"]
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and fragment in lines[0], err
    assert "s3cret" not in err and "mars:***@" in lines[0]
    assert not study_dir.exists()


def test_a_value_holding_an_equals_sign_is_named_with_its_quoted_form(capsys, tmp_path):
    arg = "study.arms.adamw.overrides=[optimizer=adamw,optimizer.weight_decay=0.05]"
    code, err = run_main(capsys, ["study=smoke", f"study.dir={tmp_path / 's'}", arg, "--dry-run"])
    assert code == 2 and err.count("\n") == 1
    quoted = '\'study.arms.adamw.overrides=["optimizer=adamw","optimizer.weight_decay=0.05"]\''
    assert f"error: {arg}: Hydra's grammar cannot read this value unquoted" in err and quoted in err
    code, err = run_main(
        capsys, ["study=smoke", f"study.dir={tmp_path / 's'}", quoted.strip("'"), "--dry-run"]
    )
    assert code == 0, err  # the quoted form the line gives works
    code, err = run_main(capsys, ["study=smoke", "study.storage=postgresql://u:pw1@h/db?sslmode=require"])
    assert (
        code == 2
        and "pw1" not in err
        and "'study.storage=\"postgresql://u:***@h/db?sslmode=require\"'" in err
    )


def test_an_empty_mapping_merges_nothing_and_is_refused(capsys, tmp_path):
    code, err = run_main(capsys, ["study=smoke", f"study.dir={tmp_path / 's'}", "study.arms={}", "--dry-run"])
    assert code == 2 and "study.arms={} empties nothing" in err and "~study.arms.NAME" in err


def test_a_dry_run_or_a_refused_study_leaves_no_database_behind(capsys, tmp_path):
    study_dir = tmp_path / "s"
    code, _ = run_main(capsys, ["study=smoke", f"study.dir={study_dir}", "--dry-run"])
    assert code == 0 and not (study_dir / "study.db").exists()
    code, err = run_main(capsys, ["study=smoke", f"study.dir={study_dir}", "study.launcher.gpus_per_job=64"])
    assert code == 2 and "gpus_per_job" in err and not (study_dir / "study.db").exists()


@pytest.mark.parametrize("name", ["a,b", "a=b", "é tude"])
def test_a_study_dir_hydra_cannot_read_unquoted_works_and_is_quoted_for_the_trials(tmp_path, name):
    """A study dir with a comma, '=', a space or a non-ASCII letter (train.py takes it quoted): the arms
    compose there, and each trial's hydra.run.dir reaches train.py quoted, as the same path."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from study_helpers import driver_of

    from mars.study.trials import Job, LocalLauncher

    study = study_of(tmp_path / name)
    driver_of(study)  # every check, the arms composed with run dirs under it
    run_dir = study.dir / "search" / "adamw" / "000"
    line = LocalLauncher(study.dir, 1).command_line(Job(run_dir, ["optimizer=adamw"]))
    (override,) = OverridesParser.create().parse_overrides([line[-1]])
    assert override.key_or_group == "hydra.run.dir" and override.value() == str(run_dir)


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        (
            "[false]",
            """read false as a value (False), not a program: quote it, e.g. 'study.launcher.command=["fal""",
        ),
        ("[no-such-program,x]", "'no-such-program' is not a program on PATH"),
    ],
)
def test_a_launcher_command_that_cannot_run_is_refused_before_anything_runs(
    capsys, tmp_path, command, fragment
):
    study_dir = tmp_path / "s"
    code, err = run_main(
        capsys, ["study=smoke", f"study.dir={study_dir}", f"study.launcher.command={command}"]
    )
    assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert not study_dir.exists()


@pytest.mark.parametrize("damage", ["garbage\n", None])
def test_a_finished_trials_damaged_metrics_stop_the_report_in_one_line(capsys, tmp_path, damage):
    from study_helpers import run_fake

    run_fake(study_of(tmp_path / "d"))
    metrics = tmp_path / "d" / "final" / "adamw" / "top1-seed1" / "metrics.jsonl"
    metrics.write_text(damage + metrics.read_text() if damage else "")
    code, err = run_main(capsys, ["study=smoke", f"study.dir={tmp_path / 'd'}", "--report"])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"error: {metrics}"), err
    assert ("line 1 is not a JSON object" if damage else "is empty") in lines[0]


def test_the_budget_counts_the_finals_that_run(tmp_path):
    """An arm with nothing searched reruns its one config with each seed, whatever top_k says."""
    from study_helpers import driver_of

    study = study_of(tmp_path / "s", **{"final.top_k": 2, "arms.mars_adamw.search": {}})
    lines = driver_of(study).budget_lines()
    assert "finals: top 2 x seeds [1, 2]; 8 runs" in lines[0]  # adamw: 4 search trials + 2 configs x 2 seeds
    assert "0 search trials over nothing searched; finals: top 1 x seeds [1, 2]; 2 runs" in lines[1]
    assert lines[-1].startswith("budget: 10 runs")


def test_a_metric_key_a_plugin_registers_is_taken(monkeypatch):
    from mars.study.spec import check_metric_key
    from mars.train import metrics

    monkeypatch.setitem(metrics._REGISTERED, "weights", lambda model, optimizer: {"norm": 1.0})
    check_metric_key("weights/norm")
    check_metric_key("downstream/hellaswag/acc")
    with pytest.raises(UserError, match="'weight/norm' is a key no run logs"):
        check_metric_key("weight/norm")


def test_a_dry_run_checks_the_data_the_trials_will_read(capsys, tmp_path):
    study_dir = tmp_path / "s"
    args = [
        "study=smoke",
        f"study.dir={study_dir}",
        "data=local",
        f"data.root={tmp_path / 'data'}",
        "data.dir=mine",
    ]
    code, err = run_main(capsys, [*args, "--dry-run"])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "holds no prepared dataset" in lines[0], err
    assert "data.paths is empty" in lines[0] and not study_dir.exists() and not (tmp_path / "data").exists()
