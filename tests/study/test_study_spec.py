"""Every bad spec value, storage URL or study state stops `scripts/study.py` in one line naming the key and
the fix, before any trial runs (nothing launched, no run dir made)."""

from __future__ import annotations

import pytest
from study_helpers import smoke_spec, study_of

from mars.study.cli import main
from mars.study.errors import StudyError
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
            ["study.storage='nosuchdb://host/x': SQLAlchemy knows no database"],
        ),
        (["train.seed=3"], ["sets train.seed, which the study chooses itself"]),
        (
            ["study.trails=3"],
            ["Could not override 'study.trails'", "its keys: name, dir, storage, base, arms"],
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


def test_no_spec_or_an_unknown_one_is_named(capsys):
    code, err = run_main(capsys, ["model=llama_tiny"])
    assert (
        code == 2
        and "choose a study spec: study=NAME (configs/study/ holds averaging, ladder, micro, smoke)" in err
    )
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
        ("edges.fraction", 0.7, "study.edges.fraction=0.7 must lie in (0, 0.5)"),
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
    with pytest.raises(StudyError) as e:
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
