"""The checks a study passes before anything runs, besides the spec's values and the arms' configs
(mars.study.spec, mars.study.configs): is the study dir, and its storage, this spec's, and does every
run dir under it belong to a trial the storage records? And what the study will spend."""

from __future__ import annotations

from pathlib import Path

import yaml

from mars.study.diff import differences
from mars.study.errors import StudyError
from mars.study.spec import Study, identity
from mars.study.storage import shown

SPEC_FILE = "spec.yaml"


def check_spec_file(study: Study) -> None:
    """STUDY_DIR/spec.yaml, if there is one, was written by this spec (operational keys aside)."""
    path = study.dir / SPEC_FILE
    if not path.is_file():
        return
    try:
        old = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise StudyError(f"{path} cannot be read ({e}); restore it, or choose another study.dir") from None
    diff = differences(identity(old), identity(study.spec))
    if diff:
        raise StudyError(
            f"{study.dir} holds a study of another spec ({path}): {'; '.join(diff)}; rerun it with "
            "that spec, or choose another study.dir"
        )


def check_storage_spec(study: Study, storage) -> None:
    """The storage's study of this name, if there is one, was made by this spec (a shared RDB)."""
    import optuna

    if study.name not in optuna.get_all_study_names(storage):
        return
    recorded = optuna.load_study(study_name=study.name, storage=storage).user_attrs.get("spec")
    if recorded is None:
        return
    diff = differences(identity(recorded), identity(study.spec))
    if diff:
        where = f"study.storage={shown(study.storage)} holds study {study.name!r}"
        raise StudyError(
            f"{where} of another spec: {'; '.join(diff)}; rerun it with that spec, or give this one "
            "another study.name or study.storage"
        )


def check_dirs(study: Study, read_trials) -> None:
    """Run dirs under the study dir that the storage does not know, and known finished trials whose
    run dirs are gone: the study would lose or mix them (`read_trials()`: the storage's TrialRecords, read
    after the dirs were listed, so that a trial another driver starts meanwhile is known)."""
    from mars.train.rundir import holds_a_run

    runs = [
        d
        for pattern in ("search/*/*", "search/*/*/*", "final/*/*")  # search/ARM/SCOPE/NNN: study.tune
        for d in sorted(study.dir.glob(pattern))
        if d.is_dir() and holds_a_run(d)
    ]
    known = {t.dir.resolve(): t for t in read_trials() if t.dir is not None}
    unknown = [d for d in runs if d.resolve() not in known]
    if unknown:
        raise StudyError(
            f"{unknown[0]} holds a run that study.storage={shown(study.storage)} does not record (was the "
            "storage replaced?): restore that storage, or move the run away (or choose another study.dir)"
        )
    for path, t in known.items():
        if t.state == "COMPLETE" and not Path(path).is_dir():
            raise StudyError(
                f"the storage records {t.arm} {t.phase} trial {t.index} as finished, but its run dir "
                f"{path} is gone: restore it, or start again in another study.dir"
            )


def finalists(study: Study, arm) -> int:
    """The configs of an arm its finals rerun: top_k of its search, or its one fixed config."""
    return int(study.spec["final"]["top_k"]) if arm.space else 1


def budget_lines(study: Study, configs: dict, finals: bool = True) -> list[str]:
    """What the study will run, per arm and in all: runs and training tokens (`configs`: ArmConfigs);
    finals=False: the search's alone (with budgets and sizes, mars.study.budgets counts the finals)."""
    s = study
    lines = []
    total_runs, total_tokens = 0, 0
    extend = s.spec["auto_extend"]
    for arm in s.arms:
        c = configs[arm.name]
        runs = arm.trials + (finalists(s, arm) * len(s.seeds) if finals else 0)
        total_runs += runs
        total_tokens += runs * c.tokens_per_run
        space = ", ".join(d.describe() for d in arm.space.values()) or "nothing searched"
        lines.append(
            f"{arm.name}{' (baseline)' if arm.name == s.baseline else ''}: optimizer={c.optimizer}, "
            f"{arm.trials} search trials over {space}; finals: top {finalists(s, arm)} x seeds "
            f"{s.seeds}; {runs} {'runs' if finals else 'search runs'} x {c.tokens_per_run:,} tokens = "
            f"{runs * c.tokens_per_run:,} tokens"
        )
    more = (
        f" (+ up to {extend['rounds']} round(s) of {extend['trials']} trials per arm at an edge)"
        if extend["rounds"]
        else ""
    )
    what = "runs" if finals else "search runs"
    lines.append(f"budget: {total_runs} {what}, {total_tokens:,} training tokens{more}")
    return lines
