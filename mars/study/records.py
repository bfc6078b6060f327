"""What the storage holds about a study, read back as plain records (the driver and the report share them).

optuna studies of a study NAME (mars.study.storage): NAME (user attr "spec"), NAME/ARM/searchR (user
attrs: the round's "space", "sample", "trials", "offset", "notes"), NAME/ARM/final (user attr "plan":
the finals, each {rank, seed, params, source}). Each trial's user attrs: "driver" (while it runs),
"dir", and once finished "result": {"status" (completed | diverged), "message", "tokens", "train_s",
"process_s" (launch to exit, summed over attempts), "overhead_s" (the driver's own time for it),
"attempts"} (TrialRecord.attrs holds both levels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mars.study.extend import Round
from mars.study.space import Dist, choice_value

SEARCH_PREFIX = "search"


def dist_to_dict(d: Dist) -> dict:
    return {
        "key": d.key,
        "kind": d.kind,
        "lo": d.lo,
        "hi": d.hi,
        "choices": list(d.choices),
        "where": d.where,
    }


def dist_from_dict(x: dict) -> Dist:
    return Dist(x["key"], x["kind"], x["lo"], x["hi"], tuple(x["choices"]), x.get("where", ""))


def round_attrs(r: Round) -> dict:
    return {
        "round": r.number,
        "space": [dist_to_dict(d) for d in r.space.values()],
        "sample": [dist_to_dict(d) for d in r.sample.values()],
        "trials": r.trials,
        "offset": r.offset,
        "notes": list(r.notes),
    }


def round_from_attrs(a: dict) -> Round:
    space = {x["key"]: dist_from_dict(x) for x in a["space"]}
    sample = {x["key"]: dist_from_dict(x) for x in a["sample"]}
    return Round(int(a["round"]), space, sample, int(a["trials"]), int(a["offset"]), tuple(a["notes"]))


@dataclass
class TrialRecord:
    arm: str
    phase: str  # search | final
    round: int  # search round (-1 for finals)
    number: int  # the trial's number in its optuna study
    index: int  # search: the arm's trial index (its dir's number); final: the plan's index
    params: dict[str, Any]
    state: str  # optuna's: RUNNING, COMPLETE, FAIL, ...
    value: float | None
    attrs: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        """completed | diverged | running | failed (abandoned before its values were drawn)."""
        if self.state == "COMPLETE":
            return str(self.attrs.get("status", "completed"))
        return "running" if self.state == "RUNNING" else "failed"

    @property
    def dir(self) -> Path | None:
        d = self.attrs.get("dir")
        return Path(d) if d else None

    @property
    def finite(self) -> bool:
        return self.state == "COMPLETE" and self.value is not None and math.isfinite(self.value)


def study_name(name: str, arm: str, phase: str, round_number: int = 0) -> str:
    return f"{name}/{arm}/{SEARCH_PREFIX}{round_number}" if phase == "search" else f"{name}/{arm}/final"


def relocated(path: Path, root: Path) -> Path:
    """A trial's recorded run dir (STUDY/search/ARM[/SCOPE]/NNN or STUDY/final/ARM/NAME) under the study
    dir `root` as it is now."""
    parts = path.parts
    start = max((i for i, part in enumerate(parts) if part in ("search", "final")), default=len(parts) - 3)
    return root.joinpath(*parts[start:])


def records_of(
    optuna_study, arm: str, phase: str, round_number: int = -1, offset: int = 0, root: Path | None = None
) -> list[TrialRecord]:
    """The trials of one optuna study. root: the study dir now; a trial's recorded dirs (written as
    absolute paths) are read under it (relocated), so a study dir that was moved or copied elsewhere
    finds its trials' run dirs."""
    out = []
    for t in optuna_study.get_trials(deepcopy=False):
        if phase == "search":
            params = {k: choice_value(v) for k, v in t.params.items()}
            index = offset + t.number
        else:
            params = dict(t.user_attrs.get("params", {}))
            index = t.number
        value = t.value if t.state.name == "COMPLETE" else None
        attrs = {**t.user_attrs, **t.user_attrs.get("result", {})}  # the driver stores a result in one attr
        for key in ("dir", "trunk_dir"):
            if root is not None and attrs.get(key):
                attrs[key] = str(relocated(Path(attrs[key]), Path(root)))
        out.append(TrialRecord(arm, phase, round_number, t.number, index, params, t.state.name, value, attrs))
    return out
