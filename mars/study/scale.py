"""Budgets and sizes: every token budget of a study's finals from one wsd trunk, for each size; tuning
across sizes (study.tune); and the report's section on both.

With `budgets: [B1, ..., Bn]` (strictly increasing; `budget_unit`: steps or tokens) the finals stage runs,
per arm, finalist, seed and size, ONE wsd run of the largest budget, the trunk, which also saves a
checkpoint at every smaller budget's decay start (train.ckpt_steps), and one cooldown branch per smaller
budget B: train.fork_from=the trunk's checkpoint at decay_start(B), train.max_steps=B. Every step before
decay_start(B) runs at the same lr in a run of B steps as in the trunk (warmup, then the peak), so the
branch is the standalone wsd run of B steps (bit for bit on the CPU: mars.train.forks), for the cost of
its cooldown. The largest budget is the trunk itself. `sizes: {NAME: [overrides]}` repeats all of it per
model size (shape overrides only: model.n_embd=..., model.n_layer=..., or a model preset of the same
family); the search, if any, runs at the base (its train.max_steps) and the first size.

Every trunk and branch is an ordinary run dir, under the finals, named for its size and budget:

    STUDY_DIR/final/ARM/topK-seedS[-SIZE]-bSTEPS

A branch runs once its trunk's checkpoint exists (complete, healthy and settled, or the trunk finished);
a trunk whose run diverged before that step leaves its branches diverged with the reason. Resuming an
interrupted study redoes only what is missing (the driver: orphans continue with train.resume=auto).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mars.analysis.scaling import Analysis, Ladder, SizeInfo, analyse, budget_table, extrapolation_label
from mars.errors import UserError
from mars.train.schedule import decay_start  # the one rule of where wsd's decay starts

UNITS = ("steps", "tokens")
TRUNK, BRANCH = "trunk", "branch"


@dataclass(frozen=True)
class Size:
    name: str  # "" when the spec has no sizes
    overrides: tuple[str, ...]
    budgets: tuple[int, ...]  # in steps, increasing (tokens divided by this size's tokens per step)
    tokens_per_step: int
    forks: tuple[int, ...]  # decay_start of each budget but the largest: the trunk's train.ckpt_steps
    params: int  # non-embedding parameters of the model (of the baseline arm's config)

    @property
    def trunk_steps(self) -> int:
        return self.budgets[-1]

    def fork_of(self, steps: int) -> int:
        return self.forks[self.budgets.index(steps)]

    def trained_steps(self) -> int:
        """Steps the trunk and its branches train: the trunk, plus each branch's cooldown."""
        return self.trunk_steps + sum(b - f for b, f in zip(self.budgets[:-1], self.forks, strict=True))


def check_budget_spec(spec: dict) -> None:
    """The spec's budgets, budget_unit and sizes (before anything is composed): UserError."""
    budgets, unit, sizes = spec["budgets"], spec["budget_unit"], spec["sizes"]
    if unit not in UNITS:
        raise UserError(f"study.budget_unit={unit!r} is not one of {', '.join(UNITS)}")
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in budgets):
        raise UserError(f"study.budgets={budgets}: give whole {unit} >= 1, e.g. study.budgets=[100,200,400]")
    if any(b >= c for b, c in zip(budgets, budgets[1:], strict=False)):
        raise UserError(
            f"study.budgets={budgets} must increase strictly (each budget once, smallest first), e.g. "
            f"{sorted(set(budgets))}"
        )
    for name, overrides in sizes.items():
        where = f"study.sizes.{name}"
        if any(c in str(name) for c in "/\\:-") or not str(name).strip():
            raise UserError(f"{where}: a size's name must be a plain name without - / \\ : (it names dirs)")
        for arg in overrides:
            key = str(arg).lstrip("+~").split("=", 1)[0]
            if "=" not in str(arg) or not (key == "model" or key.startswith("model.")):
                raise UserError(
                    f"{where}: {arg!r} is not a model override; a size may only change the model's shape "
                    "(model.n_embd=..., model.n_layer=..., model=PRESET): put other keys in study.base"
                )


def check_schedule(cfg: Any, where: str) -> None:
    """Budgets need wsd with a decay that follows train.max_steps, a gamma schedule that does not, and an
    averaged-weights tail (or decay) that begins where each budget's decay does."""
    s = cfg.schedule
    if str(s.name) != "wsd":
        raise UserError(
            f"{where}: study.budgets branch cooldowns off one wsd trunk, but schedule={s.name}; add "
            "schedule=wsd to study.base (or drop study.budgets)"
        )
    if s.get("decay_steps") is not None:
        raise UserError(
            f"{where}: schedule.decay_steps={s.decay_steps} fixes where the decay ends, so every budget "
            "would decay alike; drop it (each budget's decay then follows its train.max_steps)"
        )
    gs = cfg.optimizer.get("gamma_schedule")
    if gs is not None and str(gs.name) != "constant" and gs.get("decay_steps") is None:
        raise UserError(
            f"{where}: optimizer.gamma_schedule={gs.name} decays over train.max_steps, so a trunk and a "
            "branch would differ before the fork; use optimizer.gamma_schedule.name=constant or set its "
            "decay_steps"
        )
    t = cfg.train
    if str(t.get("average", "off")) in ("tail", "decay_sqrt") and t.get("average_start") is not None:
        raise UserError(
            f"{where}: train.average={t.average} with train.average_start={t.average_start}: a branch's "
            "average would not be its standalone run's (they begin it at other steps, the trunk before the "
            "fork or after it); drop train.average_start: each budget's then begins at its decay start, "
            "where its branch forks (train.average=ema needs nothing)"
        )


def size_of(name: str, overrides, cfg: Any, spec: dict) -> Size:
    """A size's budgets in steps and fork points, from its composed config: UserError when a budget does
    not fit (tokens not a whole number of steps, no stable phase)."""
    from mars.train.config import global_batch_size

    per_step = global_batch_size(cfg, 1) * int(cfg.model.block_size)
    unit = spec["budget_unit"]
    if not spec["budgets"]:  # sizes alone: one budget, the base's
        return Size(
            name, tuple(overrides), (int(cfg.train.max_steps),), per_step, (), non_embedding_params(cfg)
        )
    steps = []
    for b in spec["budgets"]:
        if unit == "tokens":
            if b % per_step:
                lo = max(1, b // per_step) * per_step
                raise UserError(
                    f"study.budgets: {b} tokens is not a whole number of steps of {per_step} tokens "
                    f"(train.global_batch_size x model.block_size{f' at size {name}' if name else ''}); "
                    f"e.g. {lo} or {lo + per_step}"
                )
            b = b // per_step
        steps.append(int(b))
    warmup = int(cfg.schedule.warmup_steps)
    forks = []
    for b in steps:
        start = decay_start(b, cfg.schedule)
        if b <= warmup or start <= warmup:
            raise UserError(
                f"study.budgets: {b} steps is shorter than warmup plus cooldown (schedule.warmup_steps="
                f"{warmup}, schedule.decay_fraction={cfg.schedule.decay_fraction}): no stable phase to fork "
                f"from; give budgets of at least {warmup + 2} steps or lower schedule.warmup_steps"
            )
        if start >= b:
            raise UserError(
                f"study.budgets: {b} steps leaves no whole step to cool down in (its wsd decay would start "
                f"at step {start}, schedule.decay_fraction={cfg.schedule.decay_fraction}); give a longer one"
            )
        forks.append(start)
    return Size(name, tuple(overrides), tuple(steps), per_step, tuple(forks[:-1]), non_embedding_params(cfg))


def non_embedding_params(cfg: Any) -> int:
    """Parameters of the config's model without its embeddings (built on the meta device: no memory)."""
    import torch
    from omegaconf import OmegaConf

    from mars.model.spec import model_config, spec_for

    model = cfg.model if isinstance(cfg.model, dict) else OmegaConf.to_container(cfg.model, resolve=True)
    mc = model_config(model)
    return int(
        spec_for(mc).model.empty(mc, torch.device("meta"), on_meta=None).num_params(non_embedding=True)
    )


# ----------------------------------------------------------------------------- the finals' plan


def expand_plan(plan: list[dict], sizes: list[Size]) -> list[dict]:
    """The finals of one arm with budgets and sizes: per size (smallest first), its trunks (one per
    finalist and seed), then their branches. Each entry keeps the plain finals' keys (rank, seed, params)."""
    out: list[dict] = []
    for k, size in enumerate(sizes):
        trunks = {}
        for e in plan:
            trunks[(e["rank"], e["seed"])] = len(out)
            out.append(
                {
                    **e,
                    "role": TRUNK,
                    "size": size.name,
                    "steps": size.trunk_steps,
                    "headline": k == 0,
                    "ckpt_steps": list(size.forks),
                }  # fmt: skip
            )
        for e in plan:
            for b in size.budgets[:-1]:
                out.append(
                    {
                        **e,
                        "role": BRANCH,
                        "size": size.name,
                        "steps": b,
                        "headline": False,
                        "trunk": trunks[(e["rank"], e["seed"])],
                        "fork_step": size.fork_of(b),
                    }  # fmt: skip
                )
    return out


def expand_plans(parts: list[tuple[list[dict], Size]]) -> list[dict]:
    """expand_plan for each (plan, size) in turn, each size with its own plan (study.tune: its own
    optimum), the branches' trunk indices into the whole list."""
    out: list[dict] = []
    for plan, size in parts:
        entries = expand_plan(plan, [size])
        for e in entries:
            if "trunk" in e:
                e["trunk"] += len(out)
        out += entries
    first = parts[0][1].name if parts else None
    for e in out:
        e["headline"] = e["role"] == TRUNK and e["size"] == first
    return out


def entry_dir(study_dir: Path, arm: str, entry: dict) -> Path:
    from mars.study.trials import final_dir

    base = final_dir(study_dir, arm, entry["rank"], entry["seed"])
    if "role" not in entry:
        return base
    size = f"-{entry['size']}" if entry["size"] else ""
    return base.with_name(f"{base.name}{size}-b{entry['steps']}")


def fork_point(trunk_dir: Path, step: int) -> Path:
    from mars.checkpoint.layout import CKPT_DIR, step_dirname

    return Path(trunk_dir) / CKPT_DIR / step_dirname(step)


def entry_overrides(entry: dict, sizes: dict[str, Size]) -> list[str]:
    """What a trunk or branch adds to the trial's overrides: its size, length, checkpoints or fork
    (`entry`: a plan entry, or a final trial's attrs, which hold its keys and the trunk's dir)."""
    if "role" not in entry:
        return []
    from mars.entry import hydra_value

    size = sizes[entry["size"]]
    out = [*size.overrides, f"train.max_steps={entry['steps']}"]
    if entry["role"] == TRUNK:
        if entry["ckpt_steps"]:
            out.append(f"train.ckpt_steps=[{','.join(str(s) for s in entry['ckpt_steps'])}]")
    else:
        point = fork_point(Path(entry["trunk_dir"]), entry["fork_step"])
        out.append(f"train.fork_from={hydra_value(str(point))}")
    return out


def branch_ready(trunk_dir: Path, step: int, trunk_finished: bool) -> bool:
    """Whether a branch can fork: its checkpoint is complete, and healthy with no spike pending that could
    still mark it unhealthy (mars.train.health), or its trunk has finished (its verdicts are final)."""
    from mars.checkpoint.layout import is_complete

    point = fork_point(trunk_dir, step)
    if not is_complete(point):
        return False
    if trunk_finished:
        return True
    import json

    try:
        meta = json.loads((point / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(meta.get("healthy", True)) and meta.get("spike_pending") is None


def budget_lines(sizes: list[Size], n_arms: int, runs_per_size: int) -> list[str]:
    """Tokens the trunks and branches train against standalone runs of every budget."""
    lines = []
    total = standalone = 0
    for size in sizes:
        t = size.tokens_per_step
        trained = size.trained_steps() * t * runs_per_size * n_arms
        alone = sum(size.budgets) * t * runs_per_size * n_arms
        total, standalone = total + trained, standalone + alone
        name = f"size {size.name} ({size.params:,} non-embedding params)" if size.name else "finals"
        lines.append(
            f"{name}: budgets {list(size.budgets)} steps = {[b * t for b in size.budgets]} tokens; "
            f"forks at steps {list(size.forks)}; {runs_per_size * n_arms} trunk(s) + "
            f"{runs_per_size * n_arms * (len(size.budgets) - 1)} branch(es) train {trained:,} tokens "
            f"(standalone runs: {alone:,})"
        )
    saved = f"{1 - total / standalone:.0%} less" if standalone else "-"
    lines.append(
        f"budgets: the finals train {total:,} tokens, standalone runs would train {standalone:,} ({saved})"
    )
    return lines


# --------------------------------------------------------------------------------------------------
# Tuning across sizes (`study.tune`): a search at every size, each with its own trial budget, and the
# finals of each size at its own optimum (or at the first size's: a transfer, e.g. under muP).
#
#     tune:
#       trials: {w64: 16, w128: 8, w256: 8}   # search trials per arm at each size named (of study.sizes)
#       finals: own                           # own: each size's finals take its own optimum;
#                                             # first: the first size's (the other searches measure where
#                                             #   each size's optimum lies: does it stay put?)
#       holdout: w256                         # the size the report predicts from the others' optima and
#                                             #   checks (default: the largest searched, when 3 or more are)
#       budgets: false                        # true: search at every budget of study.budgets too, for
#                                             #   h*(N, D) (the finals take the largest budget's optimum)
#
# Each searched (size[, budget]) is a scope: an arm's search there has its own rounds (auto_extend widens
# each scope's range where its best sits at a bound), its own optuna studies (NAME/ARM@SCOPE/searchR) and
# run dirs (STUDY_DIR/search/ARM/SCOPE/NNN). A size not named in tune.trials is not searched: its finals
# take the first size's optimum. Without tune, one scope: the search at the first size (as before).
# The report fits each key's optimum as a power law in model size (and tokens) and checks the prediction
# at the held-out size: the fits in mars.analysis.hyper_scaling, the section of study.md and study.json in
# mars.study.report.tuning_section.


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
    """study.tune's values (before anything is composed): UserError, one line naming the key."""
    tune = spec.get("tune") or {}
    trials = tune.get("trials") or {}
    if tune.get("finals", "own") not in FINALS:
        raise UserError(f"study.tune.finals={tune['finals']!r} is not one of {', '.join(FINALS)}")
    if not trials:
        for key in ("holdout",):
            if tune.get(key) is not None:
                raise UserError(f"study.tune.{key} needs study.tune.trials (the sizes to search at)")
        if tune.get("budgets"):
            raise UserError("study.tune.budgets needs study.tune.trials (the sizes to search at)")
        return
    sizes = list(spec["sizes"])
    if not sizes:
        raise UserError(
            "study.tune.trials searches at sizes, but study.sizes is empty: give the sizes "
            "(e.g. study.sizes={w64: [model.n_embd=64], w128: [model.n_embd=128]})"
        )
    for name, n in trials.items():
        if name not in sizes:
            raise UserError(f"study.tune.trials.{name}: no such size; study.sizes has {', '.join(sizes)}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(
                f"study.tune.trials.{name}={n!r}: each size searched needs at least 1 trial; give it a "
                f"budget (e.g. study.tune.trials.{name}=8) or leave the size out (it then takes the first "
                "size's optimum)"
            )
    if sizes[0] not in trials:
        raise UserError(
            f"study.tune.trials does not search the first size {sizes[0]} (the headline, and what the "
            f"sizes not searched take): add study.tune.trials.{sizes[0]}=N"
        )
    holdout = tune.get("holdout")
    if holdout is not None:
        if holdout not in trials:
            raise UserError(
                f"study.tune.holdout={holdout!r} is not a searched size ({', '.join(trials)}): its optimum "
                "must be measured to check the prediction"
            )
        if len(trials) < 3:
            raise UserError(
                f"study.tune.holdout={holdout}: the fit needs 2 other searched sizes, study.tune.trials has "
                f"{len(trials) - 1}; search at more sizes or drop the holdout"
            )
    if tune.get("budgets") and len(spec["budgets"]) < 1:
        raise UserError("study.tune.budgets=true searches at every budget, but study.budgets is empty")
    if tune.get("finals", "own") == "own" and spec["final"]["top_k"] != 1:
        raise UserError(
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
    """The scopes of an arm that searches (`sizes`: mars.study.scale.Size of every size, in order)."""
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


# --------------------------------------------------------------------------------------------------
# The study report's section on budgets and sizes (study.md "Budgets and sizes", study.json "ladder", and
# loss_vs_tokens.png, speedup_vs_tokens.png, speedup_vs_size.png, performance_profile.png): the budget
# table, the fits and the speedups of mars.analysis.scaling on the finals of each arm's best finalist, the
# speedups per second (times the ratio of throughputs), and the performance profile over every budget and
# size (mars.analysis.profile).


UNRESOLVED = 100.0  # an interval wider than this factor is marked "unresolved"


def ladder_of(driver, arms, key: str | None = None) -> Ladder:
    """The best finalist's finals of every arm (`arms`: the report's ArmReports), by size and budget: the
    study's metric as recorded, or (`key`) another key's final value, read from each run dir."""
    cells: dict[tuple[str, str, int], dict[int, float]] = {}
    for rep in arms:
        if rep.best_rank is None:
            continue
        for t in rep.final:
            if int(t.attrs.get("rank", 0)) != rep.best_rank or t.state != "COMPLETE" or "role" not in t.attrs:
                continue
            value = t.value if t.value is not None else math.nan
            if key is not None:
                value = _final(t.dir, key)
            cells.setdefault((rep.name, str(t.attrs["size"]), int(t.attrs["steps"])), {})[
                int(t.attrs["seed"])
            ] = value
    sizes = [SizeInfo(z.name, z.tokens_per_step, z.params) for z in driver.sizes]
    return Ladder(cells, sizes, [a.name for a in driver.study.arms], driver.study.baseline)


def _final(run_dir, key: str) -> float:
    from mars.analysis.runs import load_run

    return load_run(Path(run_dir)).final(key) if run_dir else math.nan


def throughputs(arms) -> dict[tuple[str, str], float]:
    """(arm, size) -> tokens per training second, the mean over the best finalist's trunks (their
    metrics' train_time; mars.analysis.time_to_target.throughput); absent where none was logged."""
    from mars.analysis.runs import load_run
    from mars.analysis.time_to_target import throughput

    rates: dict[tuple[str, str], list[float]] = {}
    for rep in arms:
        for t in rep.final:
            if rep.best_rank is None or int(t.attrs.get("rank", 0)) != rep.best_rank:
                continue
            if t.attrs.get("role") != "trunk" or t.state != "COMPLETE" or not t.dir:
                continue
            rate = throughput(load_run(Path(t.dir)))
            if rate is not None:
                rates.setdefault((rep.name, str(t.attrs["size"])), []).append(rate)
    return {k: sum(v) / len(v) for k, v in rates.items()}


def profile_costs(ladder: Ladder, rates: dict[tuple[str, str], float]) -> dict[str, dict]:
    """{"tokens" | "seconds": {cell: {arm: cost}}} of the performance profile (mars.analysis.profile):
    a cell is a size and budget, its target the baseline's median final value there."""
    import numpy as np

    from mars.analysis.profile import tokens_to_reach

    costs: dict[str, dict] = {"tokens": {}, "seconds": {}}
    for z in ladder.sizes:
        curves = {
            arm: sorted(
                (d, float(np.median(list(v.values())))) for d, v in ladder.finals(arm, z).items() if v
            )
            for arm in ladder.arms
        }
        for d, target in curves.get(ladder.baseline, []):
            cell = f"{z.name or '-'} / {d:,.0f} tokens"
            for arm, curve in curves.items():
                tokens = tokens_to_reach(curve, target)
                costs["tokens"].setdefault(cell, {})[arm] = tokens
                if (arm, z.name) in rates:
                    costs["seconds"].setdefault(cell, {})[arm] = tokens / rates[(arm, z.name)]
    costs["seconds"] = {c: v for c, v in costs["seconds"].items() if len(v) == len(costs["tokens"][c])}
    return costs


def _iv(iv) -> str:
    """An interval; one spanning more than a factor 100 is marked unresolved (the fit could be anything)."""
    if isinstance(iv, str):
        return f"(no interval: {iv})"
    wide = "unresolved: " if not iv.low > 0 or iv.high / iv.low > UNRESOLVED else ""
    return f"({wide}{iv.low:.3g} to {iv.high:.3g})"


def _fit_cell(f, ivals=None) -> list[str]:
    if isinstance(f, str):
        return [f"no fit: {f}", "", ""]
    ivals = ivals or {}
    return [
        f"{f.c:.4g} {_iv(ivals['E'])}" if "E" in ivals else f"{f.c:.4g}",
        f"{f.a:.4g} {_iv(ivals['A'])}" if "A" in ivals else f"{f.a:.4g}",
        f"{f.b:.4g} {_iv(ivals['alpha'])}" if "alpha" in ivals else f"{f.b:.4g}",
    ]


def ladder_section(
    driver, arms, out: Path, table, key: str | None = None
) -> tuple[list[str], list[Path], dict]:
    """study.md's lines, the figures written, and study.json's "ladder" (of another logged `key` than the
    study's metric when given: mars.study.averaged)."""
    from mars.analysis.metric import metric_of
    from mars.analysis.scaling_plots import scaling_figures

    s = driver.study
    title = driver.metric.title if key is None else metric_of(key).title
    ladder = ladder_of(driver, arms, key)
    an = analyse(ladder)
    rates = throughputs(arms)
    per_step = {z.name: z.tokens_per_step for z in ladder.sizes}
    rows = budget_table(ladder.cells, per_step, s.baseline, [z.name for z in ladder.sizes])
    L = ["", "## Budgets and sizes", ""]
    L.append(
        "Every budget of each arm's best config, per size and seed: one wsd trunk of the largest budget and "
        f"a cooldown branch forked at each smaller budget's decay start (mars.study.scale). Budgets in "
        f"{s.spec['budget_unit']}: {s.spec['budgets'] or '(the base)'}."
    )
    runs = s.spec["final"]["top_k"] * len(s.seeds)
    L += [""] + [f"- {line}" for line in budget_lines(driver.sizes, len(s.arms), runs)]
    spent = _wall(arms)
    if spent:
        L.append(
            f"- wall time of the trunks {spent[0]:.0f} s and of the branches {spent[1]:.0f} s (launch to "
            "exit, summed)"
        )
    L += ["", "### Budget table", ""]
    L.append(
        f"Final {title}, mean ± std over seeds (n); the paired difference to **{s.baseline}** "
        "at the same size and budget with its 95% interval; p uncorrected / Holm over the whole table."
    )
    body = []
    for r in rows:
        c = r.comparison
        if c is None:
            diff, p = "baseline", "-"
        elif isinstance(c, str):
            diff, p = f"n/a ({c})", "-"
        else:
            diff = f"{c.difference:+.4f} ({c.ci[0]:+.4f} to {c.ci[1]:+.4f})"
            p = f"{c.p:.3g} / {r.p_holm:.3g}"
        std = f" ± {r.std:.4f}" if r.std is not None else ""
        body.append(
            [r.size or "-", f"{r.steps} / {r.tokens:,.0f}", r.arm, f"{r.mean:.4f}{std} (n={r.n})", diff, p]
        )
    L += [
        "",
        table(
            ["size", "budget (steps / tokens)", "arm", "final", f"vs {s.baseline} (95% CI)", "p / p Holm"],
            body,
        ),
    ]
    L += ["", "### Loss against tokens: L(D) = E + A D^-alpha", ""]
    L.append(
        "Fitted to the seed means at each budget (mars.analysis.scaling; 95% intervals: the paired jackknife "
        "over seeds, every fit redone per left-out seed). "
        + (
            "With 3 budgets the curve has as many points as parameters and passes through them: the "
            "intervals then hold only the seeds' spread."
            if len(ladder.budgets) <= 3
            else f"{len(ladder.budgets)} budgets leave {len(ladder.budgets) - 3} point(s) to spare. An E at "
            "its bound 0 with an interval spanning orders of magnitude means the losses do not yet bend to "
            "a floor in this range: E and the extrapolation are not determined."
        )
    )
    body = [[z.name or "-", arm, *_fit_cell(an.loss_fits[(arm, z.name)], an.loss_intervals[(arm, z.name)])]
            for z in ladder.sizes for arm in ladder.arms]  # fmt: skip
    L += ["", table(["size", "arm", "E", "A", "alpha"], body)]
    L += ["", "### Effective-data speedup", ""]
    L.append(
        f"The tokens {s.baseline}'s fitted curve needs to reach the arm's fitted loss at D, over D (>1: the "
        "arm needs less data); at each budget, and beyond the largest as an extrapolation of both fits, "
        "labelled with its factor. Per second: that speedup times the arm's throughput over "
        f"{s.baseline}'s at the same size (tokens per training second of the trunks, evaluations and "
        f"compilation left out; {_hardware(arms)})."
    )
    body = []
    for (arm, size), pts in an.speedups.items():
        curve = an.speedup_curves.get((arm, size), [])
        ratio = (
            rates[(arm, size)] / rates[(s.baseline, size)]
            if (arm, size) in rates and (s.baseline, size) in rates
            else None
        )
        for p in [*pts, *(curve[-1:] if curve else [])]:
            val = f"{p.value:.3f} {_iv(p.interval)}" if p.value is not None else f"none: {p.why}"
            per_s = "-" if p.value is None or ratio is None else f"{p.value * ratio:.3f}"
            body.append(
                [
                    size or "-",
                    arm,
                    f"{p.d:,.0f}",
                    val,
                    per_s,
                    extrapolation_label(p.extrapolation) or "measured",
                ]
            )
    L += [
        "",
        table(["size", "arm", "D (tokens)", "speedup per token (95% CI)", "per second", "range"], body)
        if body
        else "- no arm besides the baseline",
    ]
    costs = profile_costs(ladder, rates)
    profile_lines, profile_figs, profile_json = _profile(costs, out, s, title, table)
    L += profile_lines
    if len(ladder.sizes) > 1:
        L += ["", "### Loss against model size: L(N) = E + A N^-alpha (N: non-embedding parameters)", ""]
        body = [[arm, str(steps), *_fit_cell(f)] for (arm, steps), f in an.size_fits.items()]
        L += [table(["arm", "budget (steps)", "E", "A", "alpha"], body)]
    figs = scaling_figures(out, ladder, an) + profile_figs
    js = _json(ladder, an, rows)
    js["throughput"] = [{"arm": a, "size": z, "tokens_per_s": v} for (a, z), v in rates.items()]
    js["performance_profile"] = profile_json
    return L, figs, js


def _hardware(arms) -> str:
    """The hardware the finals' seconds were measured on, in words."""
    from mars.analysis.runs import load_run

    seen = {
        h
        for rep in arms
        for t in rep.final
        if t.dir and Path(t.dir).is_dir()
        for h in load_run(Path(t.dir)).hardware
    }
    if not seen:
        return "no run names its hardware"
    return "measured on " + "; ".join(sorted(seen))


def _profile(costs: dict, out: Path, s, title: str, table) -> tuple[list[str], list[Path], dict]:
    """The performance profile's lines, figure and JSON (mars.analysis.profile)."""
    from mars.analysis.profile import TAUS, profile, profile_figure, ratios

    curves = {what: ratios(c) for what, c in costs.items() if c}
    if not curves.get("tokens") or len(curves["tokens"]) < 2:
        return [], [], {}
    L = ["", "### Performance profile", ""]
    L.append(
        f"Over the {len(costs['tokens'])} cells (size x budget): each cell's target is **{s.baseline}**'s "
        f"median final {title} there; an arm's cost is the tokens (or training seconds) its median final "
        "value over the budgets takes to reach it (linear in tokens between budgets; at the smallest budget "
        "already: that budget's tokens, an upper bound; beyond the largest: never). rho(tau) is the share "
        "of cells where the arm's cost is within a factor tau of the best arm's (AlgoPerf's performance "
        "profile; `performance_profile.png`)."
    )
    body = [
        [what, arm, *(f"{profile(r, tau):.2f}" for tau in TAUS)]
        for what, by_arm in curves.items()
        for arm, r in by_arm.items()
    ]
    L += ["", table(["cost", "arm", *(f"rho({tau:g})" for tau in TAUS)], body)]
    figs = profile_figure(out / "performance_profile.png", curves, f"performance profile: {s.name}")
    js = {
        what: {
            "cells": {
                cell: {a: (c if c != math.inf else None) for a, c in by_arm.items()}
                for cell, by_arm in costs[what].items()
            },
            "rho": {arm: {f"{tau:g}": profile(r, tau) for tau in TAUS} for arm, r in by_arm_ratios.items()},
        }
        for what, by_arm_ratios in curves.items()
    }
    return L, figs, js


def _wall(arms) -> tuple[float, float] | None:
    trunk = sum(
        float(t.attrs.get("process_s", 0.0)) for r in arms for t in r.final if t.attrs.get("role") == "trunk"
    )
    branch = sum(
        float(t.attrs.get("process_s", 0.0)) for r in arms for t in r.final if t.attrs.get("role") == "branch"
    )
    return (trunk, branch) if trunk or branch else None


def _json(ladder: Ladder, an: Analysis, rows) -> dict:
    def fit(f):
        return (
            {"reason": f} if isinstance(f, str) else {"E": f.c, "A": f.a, "alpha": f.b, "points": f.n_points}
        )

    def iv(x):
        return {"reason": x} if isinstance(x, str) else {"low": x.low, "high": x.high, "method": x.method}

    def point(arm, size, p):
        return {"arm": arm, "size": size, "tokens": p.d, "speedup": p.value, "why": p.why,
                "interval": iv(p.interval), "extrapolation": p.extrapolation}  # fmt: skip

    return {
        "sizes": [
            {"name": z.name, "tokens_per_step": z.tokens_per_step, "params": z.params} for z in ladder.sizes
        ],
        "table": [
            {
                "arm": r.arm,
                "size": r.size,
                "steps": r.steps,
                "tokens": r.tokens,
                "mean": r.mean,
                "std": r.std,
                "n": r.n,
                "p_holm": r.p_holm,
                "difference": None
                if r.comparison is None or isinstance(r.comparison, str)
                else r.comparison.difference,
            }
            for r in rows
        ],  # fmt: skip
        "loss_fits": [
            {
                "arm": a,
                "size": z,
                **fit(f),
                "intervals": {k: iv(v) for k, v in an.loss_intervals[(a, z)].items()},
            }
            for (a, z), f in an.loss_fits.items()
        ],  # fmt: skip
        "size_fits": [{"arm": a, "steps": st, **fit(f)} for (a, st), f in an.size_fits.items()],
        "speedups": [point(a, z, p) for (a, z), pts in an.speedups.items() for p in pts],
        "speedup_curves": [point(a, z, p) for (a, z), pts in an.speedup_curves.items() for p in pts],
    }
