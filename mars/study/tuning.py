"""Tuning across sizes (`study.tune`): a search at every size, each with its own trial budget, and the
finals of each size at its own optimum (or at the first size's: a transfer, e.g. under muP).

    tune:
      trials: {w64: 16, w128: 8, w256: 8}   # search trials per arm at each size named (of study.sizes)
      finals: own                           # own: each size's finals take its own optimum;
                                            # first: the first size's (the other searches measure where
                                            #   each size's optimum lies: does it stay put?)
      holdout: w256                         # the size the report predicts from the others' optima and
                                            #   checks (default: the largest searched, when 3 or more are)
      budgets: false                        # true: search at every budget of study.budgets too, for
                                            #   h*(N, D) (the finals take the largest budget's optimum)

Each searched (size[, budget]) is a scope: an arm's search there has its own rounds (auto_extend widens
each scope's range where its best sits at a bound), its own optuna studies (NAME/ARM@SCOPE/searchR) and
run dirs (STUDY_DIR/search/ARM/SCOPE/NNN). A size not named in tune.trials is not searched: its finals
take the first size's optimum. Without tune, one scope: the search at the first size (as before).
The report fits each key's optimum as a power law in model size (and tokens) and checks the prediction
at the held-out size: the fits in mars.analysis.hyper_scaling, the section of study.md and study.json in
mars.study.report.tuning_section.
"""

from __future__ import annotations

from dataclasses import dataclass

from mars.study.errors import StudyError

FINALS = ("own", "first")


@dataclass(frozen=True)
class Scope:
    """Where an arm searches: a size (and a budget in steps, or None: the base's train.max_steps)."""

    name: str  # "" (the single search of a study without tune), "w128", or "w128-b200"
    size: str  # the size's name ("" without sizes)
    steps: int | None
    trials: int | None  # the first round's budget; None: the arm's own (study.trials / the arm's trials)
    overrides: tuple[str, ...]  # what the scope adds to a search trial's overrides

    def key(self, arm: str) -> str:
        """The arm's name in the scope's optuna study names."""
        return arm if not self.name else f"{arm}@{self.name}"


def tuned(spec: dict) -> bool:
    return bool(spec.get("tune", {}).get("trials"))


def check_tune_spec(spec: dict) -> None:
    """study.tune's values (before anything is composed): StudyError, one line naming the key."""
    tune = spec.get("tune") or {}
    trials = tune.get("trials") or {}
    if tune.get("finals", "own") not in FINALS:
        raise StudyError(f"study.tune.finals={tune['finals']!r} is not one of {', '.join(FINALS)}")
    if not trials:
        for key in ("holdout",):
            if tune.get(key) is not None:
                raise StudyError(f"study.tune.{key} needs study.tune.trials (the sizes to search at)")
        if tune.get("budgets"):
            raise StudyError("study.tune.budgets needs study.tune.trials (the sizes to search at)")
        return
    sizes = list(spec["sizes"])
    if not sizes:
        raise StudyError(
            "study.tune.trials searches at sizes, but study.sizes is empty: give the sizes "
            "(e.g. study.sizes={w64: [model.n_embd=64], w128: [model.n_embd=128]})"
        )
    for name, n in trials.items():
        if name not in sizes:
            raise StudyError(f"study.tune.trials.{name}: no such size; study.sizes has {', '.join(sizes)}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise StudyError(
                f"study.tune.trials.{name}={n!r}: each size searched needs at least 1 trial; give it a "
                f"budget (e.g. study.tune.trials.{name}=8) or leave the size out (it then takes the first "
                "size's optimum)"
            )
    if sizes[0] not in trials:
        raise StudyError(
            f"study.tune.trials does not search the first size {sizes[0]} (the headline, and what the "
            f"sizes not searched take): add study.tune.trials.{sizes[0]}=N"
        )
    holdout = tune.get("holdout")
    if holdout is not None:
        if holdout not in trials:
            raise StudyError(
                f"study.tune.holdout={holdout!r} is not a searched size ({', '.join(trials)}): its optimum "
                "must be measured to check the prediction"
            )
        if len(trials) < 3:
            raise StudyError(
                f"study.tune.holdout={holdout}: the fit needs 2 other searched sizes, study.tune.trials has "
                f"{len(trials) - 1}; search at more sizes or drop the holdout"
            )
    if tune.get("budgets") and len(spec["budgets"]) < 1:
        raise StudyError("study.tune.budgets=true searches at every budget, but study.budgets is empty")
    if tune.get("finals", "own") == "own" and spec["final"]["top_k"] != 1:
        raise StudyError(
            f"study.final.top_k={spec['final']['top_k']} with study.tune: each size's finals rerun its own "
            "best config, so set study.final.top_k=1"
        )


def holdout_of(spec: dict) -> str | None:
    """The held-out size: tune.holdout, else the largest searched (the last in study.sizes) when 3 or more
    sizes are searched, else None."""
    tune = spec.get("tune") or {}
    if tune.get("holdout") is not None:
        return str(tune["holdout"])
    searched = [z for z in spec["sizes"] if z in (tune.get("trials") or {})]
    return searched[-1] if len(searched) >= 3 else None


def scopes_of(spec: dict, sizes: list) -> list[Scope]:
    """The scopes of an arm that searches (`sizes`: mars.study.budgets.Size of every size, in order)."""
    first = tuple(sizes[0].overrides) if sizes else ()
    if not tuned(spec):
        return [Scope("", sizes[0].name if sizes else "", None, None, first)]
    trials = spec["tune"]["trials"]
    out = []
    for z in sizes:
        if z.name not in trials:
            continue
        if spec["tune"].get("budgets"):
            for steps in z.budgets:
                extra = (*z.overrides, f"train.max_steps={steps}")
                out.append(Scope(f"{z.name}-b{steps}", z.name, steps, int(trials[z.name]), extra))
        else:
            out.append(Scope(z.name, z.name, None, int(trials[z.name]), tuple(z.overrides)))
    return out


def finals_scope(spec: dict, scopes: list[Scope], size: str) -> Scope:
    """The scope whose optimum the finals at `size` take: its own (the largest budget's with
    tune.budgets) under tune.finals=own, else the first size's."""
    first = [s for s in scopes if s.size == scopes[0].size]
    own = [s for s in scopes if s.size == size]
    if not tuned(spec) or spec["tune"].get("finals", "own") == "first" or not own:
        return first[-1]
    return own[-1]
