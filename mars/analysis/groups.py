"""Grouping runs into settings (seeds pooled), checking they may be compared, choosing the baseline.

Grouping rule: two runs belong to one group when their resolved configs agree on every setting,
i.e. on everything except the seeds (train.seed, train.data_seed), bookkeeping keys (where the
run lives, how it is logged) and optimizer keys their optimizer does not read
(mars.analysis.settings). Runs that differ in anything else are never averaged together.

Comparability rule: runs must agree on train.max_steps, train.global_batch_size, the data
(data.name, data.dir, data.hf_path, data.hf_config, data.paths) and the model shape
(model.n_layer, n_head, n_embd, block_size, vocab_size), unless a sweep varied the key on purpose:
some sweep (the runs of one Hydra multirun dir; for other runs, the dir given on the command
line) holds runs whose overrides give that key (or its config group: model=, data=,
experiment=) different values. Two separate runs with different max_steps are two experiments,
not a comparison; `-m train.max_steps=200,400` is a sweep over training length.
"""

from __future__ import annotations

import copy
import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from mars.analysis.labels import Column, Item, cell, format_value, item_of, number_text
from mars.analysis.metric import Metric
from mars.analysis.runs import Run
from mars.analysis.settings import canonical, comparability_keys, with_defaults
from mars.errors import UserError


@dataclass
class Group:
    """Runs of one setting (their seeds differ), in natural order of their dirs."""

    settings: dict[str, Any]
    overrides: dict[str, str]  # the first run's overrides and config-group choices, seeds removed
    runs: list[Run]

    @property
    def item(self) -> Item:
        return Item(self.settings, self.overrides)


# ----------------------------------------------------------------------------- runs trained on


def extended(run: Run) -> bool:
    """Whether the run was continued with a new train.max_steps (train.resume and train.max_steps among
    its overrides: how docs/training.md trains a finished run on) rather than launched with it. A fork
    (train.fork_from: a budget branch, which may carry train.resume=auto to requeue) is a run of its
    own length, never an extension of its parent's."""
    if run.flat.get("train.fork_from") not in (None, "", "none", "null"):
        return False
    return "train.max_steps" in run.overrides and "train.resume" in run.overrides


def _same_setting(run: Run, runs: Sequence[Run]) -> list[Run]:
    """The runs that agree with `run` on every setting but train.max_steps (seeds aside)."""

    def key(r: Run) -> str:
        return canonical({k: v for k, v in item_of(r).settings.items() if k != "train.max_steps"})

    mine = key(run)
    return [r for r in runs if key(r) == mine]


def _launched(sweep: Sequence[Run]) -> list[Run]:
    """The runs of a sweep that run the sweep's own train.max_steps (they give it no override)."""
    return [r for r in sweep if "train.max_steps" not in r.overrides]


def sweep_length(run: Run, sweep: Sequence[Run]) -> int | None:
    """The train.max_steps an extended run was launched with: that of the runs of its sweep that set none
    of their own, preferring those of its own setting; None where they do not agree on one shorter than
    the run's."""
    for pool in (_same_setting(run, _launched(sweep)), _launched(sweep)):
        lengths = {r.flat.get("train.max_steps") for r in pool}
        if len(lengths) == 1:
            (length,) = lengths
            longer = isinstance(length, int) and length < (run.flat.get("train.max_steps") or 0)
            return length if longer else None
    return None


def cut_at(run: Run, steps: int) -> Run:
    """The run as it stood at `steps`: later lines dropped, train.max_steps `steps`, the overrides that
    extended it gone."""
    metrics = {k: [p for p in points if not p.step > steps] for k, points in run.metrics.items()}
    metrics = {k: points for k, points in metrics.items() if points}
    config = copy.deepcopy(run.config)
    config.setdefault("train", {})["max_steps"] = steps
    kept = [p for points in metrics.values() for p in points]
    return replace(
        run,
        config=config,
        overrides={k: v for k, v in run.overrides.items() if k not in ("train.max_steps", "train.resume")},
        metrics=metrics,
        last_step=min(run.last_step, steps),
        last_tokens=max((p.tokens for p in kept), default=0.0),
    )


def at_sweep_length(runs: Sequence[Run]) -> tuple[list[Run], list[str]]:
    """Runs of a sweep continued beyond their siblings' train.max_steps (extended), cut back to it, with a
    note per run: they are compared on the training their siblings also did, where the sweep's setting
    is defined, and group with those siblings. Up to that step the run was one of them, as long as it was
    continued from the end of its first training: one continued earlier followed the longer lr schedule
    before it, which the note says (its lr, logged on every training line, differs from its siblings')."""
    by_sweep: dict[Path | None, list[Run]] = defaultdict(list)
    for run in runs:
        by_sweep[run.sweep].append(run)
    out, notes = [], []
    for run in runs:
        length = sweep_length(run, by_sweep[run.sweep]) if extended(run) else None
        if length is None:
            out.append(run)
            continue
        cut = cut_at(run, length)
        out.append(cut)
        note = (
            f"{run.path} was trained on to train.max_steps={run.flat.get('train.max_steps')}; compared at "
            f"step {length}, its sweep's length (report it alone for the longer run)"
        )
        siblings = _same_setting(run, _launched(by_sweep[run.sweep]))
        if siblings and _lr_differs(cut, siblings[0]):
            note += f"; its lr differs from its siblings' before step {length}: continued before it got there"
        notes.append(note)
    return out, notes


def _lr_differs(run: Run, sibling: Run) -> bool:
    theirs = {p.step: p.value for p in sibling.metrics.get("lr", ())}
    return any(
        p.step in theirs and not math.isclose(p.value, theirs[p.step], rel_tol=1e-6)
        for p in run.metrics.get("lr", ())
    )


# ----------------------------------------------------------------------------- groups


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Runs pooled by settings, in order of first appearance."""
    groups: dict[str, Group] = {}
    for run in runs:
        item = item_of(run)
        key = canonical(item.settings)
        if key not in groups:
            groups[key] = Group(settings=item.settings, overrides=item.overrides, runs=[])
        groups[key].runs.append(run)
    return list(groups.values())


def value_key(value: str | None) -> tuple:
    """Sort values numerically where they are numbers, "-" (None) last."""
    if value is None:
        return (2, 0.0, "")
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def sort_groups(groups: list[Group], columns: Sequence[Column]) -> list[Group]:
    return sorted(groups, key=lambda g: tuple(value_key(cell(c, g.item)) for c in columns))


# ----------------------------------------------------------------------------- comparability


def swept_keys(runs: Sequence[Run]) -> set[str]:
    """Override keys (and config groups) that some sweep gave different values among its own runs."""
    by_sweep: dict[Path, list[dict[str, str]]] = defaultdict(list)
    for run in runs:  # numbers as labels show them: 3e-3 and 0.003 are one value
        by_sweep[run.sweep].append({k: number_text(v) for k, v in {**run.choices, **run.overrides}.items()})
    swept: set[str] = set()
    for views in by_sweep.values():
        for key in {k for v in views for k in v}:
            if len({v.get(key) for v in views}) > 1:
                swept.add(key)
    return swept


def _is_swept(key: str, swept: set[str]) -> bool:
    return key in swept or key.split(".", 1)[0] in swept or "experiment" in swept


def _where(runs: Sequence[Run]) -> str:
    sweeps = sorted({str(r.sweep) for r in runs})
    return ", ".join(sweeps[:3]) + (", ..." if len(sweeps) > 3 else "")


def _list_runs(runs: Sequence[Run]) -> str:
    names = [str(r.path) for r in runs]
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def check_comparable(runs: Sequence[Run]) -> None:
    """Refuse runs that differ in training length, batch, data or model shape without a sweep saying so."""
    swept = swept_keys(runs)
    flats = [with_defaults(run.flat) for run in runs]
    for key in comparability_keys():
        by_value: dict[str, list[Run]] = defaultdict(list)
        shown: dict[int, Any] = {}
        for run, flat in zip(runs, flats, strict=True):
            by_value[canonical(flat.get(key))].append(run)
            shown[id(run)] = flat.get(key)
        if len(by_value) < 2 or _is_swept(key, swept):
            continue
        ordered = sorted(by_value.values(), key=len, reverse=True)
        places = [_where(rs) for rs in ordered]
        same_place = len(set(places)) < len(places)
        parts = [
            f"{format_value(shown[id(rs[0])])} in {len(rs)} run{'s' if len(rs) > 1 else ''} "
            + (f"({_list_runs(rs)})" if same_place else f"under {place}")
            for rs, place in zip(ordered, places, strict=True)
        ]
        raise UserError(
            f"runs differ in {key} ({', '.join(parts)}): report them separately "
            f"(or sweep {key} in one multirun to compare them)"
        )


# ----------------------------------------------------------------------------- baseline


def parse_baseline(specs: Sequence[str]) -> list[tuple[str, str]]:
    pairs = []
    for spec in specs:
        key, sep, value = spec.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w.]*", key):
            raise UserError(f"--baseline {spec!r} is not KEY=VALUE (e.g. --baseline optimizer.name=adamw)")
        pairs.append((key, value.strip()))
    return pairs


def _equal(config_value: Any, text: str) -> bool:
    """A config value against what the user typed: 3e-3 == 0.003, True == true, [0.9,0.95] == [0.9, 0.95]."""
    if isinstance(config_value, bool):
        return text.lower() == str(config_value).lower()
    if isinstance(config_value, (int, float)):
        try:
            return math.isclose(float(config_value), float(text), rel_tol=1e-9, abs_tol=0.0)
        except ValueError:
            return False
    if config_value is None:
        return text.lower() in ("null", "none", "~")
    if isinstance(config_value, list):
        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError:
            return False
        return (
            isinstance(parsed, list)
            and len(parsed) == len(config_value)
            and all(_equal(v, str(p)) for v, p in zip(config_value, parsed, strict=True))
        )
    return str(config_value) == text


def _value_of(group: Group, key: str) -> tuple[bool, Any]:
    """(has it, value): a config setting, else an override / config-group choice."""
    if key in group.settings:
        return True, group.settings[key]
    if key in group.overrides:
        return True, group.overrides[key]
    return False, None


def _values(groups: Sequence[Group], key: str) -> list[str]:
    """The values a key takes among the groups, sorted numerically where they are numbers."""
    values = set()
    for g in groups:
        has, value = _value_of(g, key)
        if has:
            values.add(format_value(value))
    return sorted(values, key=value_key)


def _matches(group: Group, key: str, text: str) -> bool:
    has, value = _value_of(group, key)
    return has and _equal(value, text)


def select_baseline(
    groups: Sequence[Group],
    specs: Sequence[str],
    columns: Sequence[Column],
    labels: Sequence[str],
    best: bool = False,
    metric: Metric | None = None,
) -> tuple[int, str]:
    """The baseline group's index and a line saying how it was chosen.

    Without --baseline it is the first group in sorted order: not the best one, which would make
    every other group look worse by construction. With `best` (--best), a --baseline that matches
    several groups (e.g. optimizer.name=adamw over an lr sweep) picks the one with the best mean
    final value of the metric (default: the lowest mean final val loss) among them: the tuned
    baseline.
    """
    metric = metric or Metric("val/loss")
    if not specs:
        how = "the first group in sorted order; choose one with --baseline KEY=VALUE"
        return 0, f"{labels[0] or 'all runs'} ({how})"
    pairs = parse_baseline(specs)
    for key, _ in pairs:
        if not any(_value_of(g, key)[0] for g in groups):
            raise UserError(
                f"--baseline key {key} is in no run's config or overrides "
                f"(keys that differ between the groups: {', '.join(c.key for c in columns) or 'none'})"
            )
    matched = [i for i, g in enumerate(groups) if all(_matches(g, k, v) for k, v in pairs)]
    given = " ".join(f"{k}={v}" for k, v in pairs)
    if not matched:
        available = "; ".join(f"{k} takes {', '.join(_values(groups, k))}" for k, _ in pairs)
        raise UserError(f"--baseline {given} matches no group ({available})")
    if len(matched) > 1 and best:
        sign = -1.0 if metric.higher_is_better else 1.0
        score = [
            sign * sum(r.final(metric.key) for r in groups[i].runs) / len(groups[i].runs) for i in matched
        ]
        chosen = matched[min(range(len(matched)), key=lambda j: score[j])]
        extreme = "highest" if metric.higher_is_better else "lowest"
        return chosen, (
            f"{labels[chosen] or 'all runs'} (--baseline {given} --best: the {extreme} mean final "
            f"{metric.title} of the {len(matched)} matching groups)"
        )
    if len(matched) > 1:
        hint = ""
        for c in columns:
            key = {"optimizer": "optimizer.name", "size": "model.n_layer"}.get(c.kind, c.key)
            values = _values([groups[i] for i in matched], key)
            if len(values) > 1:
                hint = f", e.g. --baseline {key}={values[0]} ({key} takes {', '.join(values)} among them)"
                break
        raise UserError(
            f"--baseline {given} matches {len(matched)} groups ({'; '.join(labels[i] for i in matched)}): "
            f"add another --baseline KEY=VALUE{hint}, or --best to take the best of them"
        )
    return matched[0], f"{labels[matched[0]] or 'all runs'} (--baseline {given})"


def duplicate_seeds(group: Group) -> list[str]:
    """Warnings for runs of a group that share all their seeds: the same run twice, not two seeds."""
    seeds = Counter(seeds_of(r) for r in group.runs)
    return [f"{n} runs with train.seed={s[0]}, data seed {s[1]}" for s, n in seeds.items() if n > 1]


def seeds_of(run: Run) -> tuple[Any, Any]:
    """(train.seed, the data-order seed): train.data_seed, which is train.seed when null or absent."""
    seed = run.flat.get("train.seed")
    data_seed = run.flat.get("train.data_seed")
    return seed, seed if data_seed is None else data_seed


def pairing(group: Sequence[Run], baseline: Sequence[Run]) -> tuple[list[int], str]:
    """How to pair a group's runs with the baseline's by seeds: the group's run indices in the order
    of the baseline's runs, or ([], why not). Runs are paired when both sides ran exactly the same
    seeds (train.seed and data seed), each once: the same initialisation and batch order, so most
    seed-to-seed noise is shared and cancels in the per-seed differences."""
    mine, theirs = [canonical(seeds_of(r)) for r in group], [canonical(seeds_of(r)) for r in baseline]
    if len(set(mine)) < len(mine) or len(set(theirs)) < len(theirs):
        return [], "a seed occurs twice on one side"
    if set(mine) != set(theirs):
        return [], "the seeds differ"
    return [mine.index(s) for s in theirs], ""
