"""Budgets and sizes: every token budget of a study's finals from one wsd trunk, for each size.

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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mars.study.errors import StudyError
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
    """The spec's budgets, budget_unit and sizes (before anything is composed): StudyError."""
    budgets, unit, sizes = spec["budgets"], spec["budget_unit"], spec["sizes"]
    if unit not in UNITS:
        raise StudyError(f"study.budget_unit={unit!r} is not one of {', '.join(UNITS)}")
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in budgets):
        raise StudyError(f"study.budgets={budgets}: give whole {unit} >= 1, e.g. study.budgets=[100,200,400]")
    if any(b >= c for b, c in zip(budgets, budgets[1:], strict=False)):
        raise StudyError(
            f"study.budgets={budgets} must increase strictly (each budget once, smallest first), e.g. "
            f"{sorted(set(budgets))}"
        )
    for name, overrides in sizes.items():
        where = f"study.sizes.{name}"
        if any(c in str(name) for c in "/\\:-") or not str(name).strip():
            raise StudyError(f"{where}: a size's name must be a plain name without - / \\ : (it names dirs)")
        for arg in overrides:
            key = str(arg).lstrip("+~").split("=", 1)[0]
            if "=" not in str(arg) or not (key == "model" or key.startswith("model.")):
                raise StudyError(
                    f"{where}: {arg!r} is not a model override; a size may only change the model's shape "
                    "(model.n_embd=..., model.n_layer=..., model=PRESET): put other keys in study.base"
                )


def check_size_configs(study, cfgs: dict[str, Any]) -> None:
    """The composed config of each size (of one arm): everything but the model equal, one family."""
    from omegaconf import OmegaConf

    names = list(cfgs)
    first = cfgs[names[0]]
    ref = {k: v for k, v in OmegaConf.to_container(first, resolve=True).items() if k != "model"}
    for name in names[1:]:
        cfg = cfgs[name]
        if str(cfg.model.arch) != str(first.model.arch):
            raise StudyError(
                f"study.sizes.{name} is model.arch={cfg.model.arch}, study.sizes.{names[0]} "
                f"{first.model.arch}: a ladder of sizes keeps one family (give shape overrides only)"
            )
        other = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "model"}
        if other != ref:
            from mars.study.diff import differences

            diff = differences(ref, other, "")
            raise StudyError(
                f"study.sizes.{name} changes more than the model's shape ({'; '.join(diff)[:200]}): a size "
                "may only change model keys"
            )


def check_schedule(cfg: Any, where: str) -> None:
    """Budgets need wsd with a decay that follows train.max_steps, a gamma schedule that does not, and an
    averaged-weights tail (or decay) that begins where each budget's decay does."""
    s = cfg.schedule
    if str(s.name) != "wsd":
        raise StudyError(
            f"{where}: study.budgets branch cooldowns off one wsd trunk, but schedule={s.name}; add "
            "schedule=wsd to study.base (or drop study.budgets)"
        )
    if s.get("decay_steps") is not None:
        raise StudyError(
            f"{where}: schedule.decay_steps={s.decay_steps} fixes where the decay ends, so every budget "
            "would decay alike; drop it (each budget's decay then follows its train.max_steps)"
        )
    gs = cfg.optimizer.get("gamma_schedule")
    if gs is not None and str(gs.name) != "constant" and gs.get("decay_steps") is None:
        raise StudyError(
            f"{where}: optimizer.gamma_schedule={gs.name} decays over train.max_steps, so a trunk and a "
            "branch would differ before the fork; use optimizer.gamma_schedule.name=constant or set its "
            "decay_steps"
        )
    t = cfg.train
    if str(t.get("average", "off")) in ("tail", "decay_sqrt") and t.get("average_start") is not None:
        raise StudyError(
            f"{where}: train.average={t.average} with train.average_start={t.average_start}: a branch's "
            "average would not be its standalone run's (they begin it at other steps, the trunk before the "
            "fork or after it); drop train.average_start: each budget's then begins at its decay start, "
            "where its branch forks (train.average=ema needs nothing)"
        )


def size_of(name: str, overrides, cfg: Any, spec: dict) -> Size:
    """A size's budgets in steps and fork points, from its composed config: StudyError when a budget does
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
                raise StudyError(
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
            raise StudyError(
                f"study.budgets: {b} steps is shorter than warmup plus cooldown (schedule.warmup_steps="
                f"{warmup}, schedule.decay_fraction={cfg.schedule.decay_fraction}): no stable phase to fork "
                f"from; give budgets of at least {warmup + 2} steps or lower schedule.warmup_steps"
            )
        if start >= b:
            raise StudyError(
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
