"""Tuning across sizes (study.tune, mars.study.scale) on the fake trainer, whose optimal lr is a known
power law of the width: each size's search finds it within the search's resolution, the report's fitted
h*(N) has the known exponent in its interval, and the rule fitted without the held-out size predicts
that size's optimum inside its interval; h*(N, D) with tune.budgets; every bad tune spec is one line
before anything runs."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from study_helpers import run_fake, smoke_spec, study_of

from mars.errors import UserError
from mars.study.spec import check_spec

WIDTHS = (32, 64, 128, 256)
SIZES = {f"w{w}": [f"model.n_embd={w}"] for w in WIDTHS}


def tuned_study(directory, base=(), **changes):
    """The smoke spec's adamw arm (lr searched over 1e-4..1e-1), searched at every size, one final seed
    (`base` added to its base)."""
    spec = smoke_spec()
    spec["dir"] = str(directory)
    spec["base"] = [*spec["base"], *base]
    spec["arms"] = {"adamw": spec["arms"]["adamw"]}
    spec["sizes"] = SIZES
    spec["final"]["seeds"] = [1]
    spec["tune"]["trials"] = {z: 8 for z in SIZES}
    spec["tune"]["holdout"] = "w256"
    for key, value in changes.items():
        node = spec
        *path, last = key.split("__")
        for part in path:
            node = node[part]
        node[last] = value
    return check_spec(spec)


def test_each_size_finds_the_known_law_and_the_held_out_size_is_predicted(tmp_path, monkeypatch):
    import fake_run

    from mars.study.report import write_study_report

    monkeypatch.setenv("FAKE_LR_WIDTH_EXPONENT", "1.0")  # the optimal lr: 3e-3 * (width / 32)^-1
    driver = run_fake(tuned_study(tmp_path / "st"))
    write_study_report(driver)
    tuning = json.loads((tmp_path / "st" / "report" / "study.json").read_text())["tuning"]
    optima = {o["scope"]: o for o in tuning["optima"]}
    assert list(optima) == list(SIZES) and tuning["holdout"] == "w256"
    for w in WIDTHS:  # within the search's resolution: between the best trial's neighbours
        o = optima[f"w{w}"]
        miss = abs(math.log(o["params"]["optimizer.lr"] / fake_run.optimal_lr(w)))
        assert miss <= math.sqrt(12) * o["resolution"]["optimizer.lr"], (w, o)
    # N is the non-embedding parameter count (about 12 width^2 here), so the known exponent in N is
    # the slope of log lr*(width) on log N over these sizes (about -0.5)
    n = np.log([optima[f"w{w}"]["x"][0] for w in WIDTHS])
    known = float(np.polyfit(n, np.log([fake_run.optimal_lr(w) for w in WIDTHS]), 1)[0])
    (rule,) = tuning["rules"]
    lo, hi = rule["fit"]["intervals"]["N"]
    assert lo < known < hi and rule["fit"]["moves"] == {"N": True}
    assert rule["fit"]["exponents"]["N"] == pytest.approx(known, abs=0.1)
    (held,) = tuning["holdout_check"]
    assert held["scope"] == "w256" and held["fit"]["points"] == 3
    assert held["inside"] and held["interval"][0] <= held["searched"] <= held["interval"][1]
    assert held["interval"][0] < fake_run.optimal_lr(256) < held["interval"][1]
    md = (tmp_path / "st" / "report" / "study.md").read_text()
    assert "## Tuning across sizes" in md and "### Prediction at the held-out size" in md
    assert "| adamw | optimizer.lr | h*(N) = " in md and "| yes: with N |" in md
    assert "| adamw | optimizer.lr | w256 |" in md and md.count("| inside |") == 1


def test_with_budgets_the_optimum_is_fitted_in_size_and_tokens(tmp_path, monkeypatch):
    """tune.budgets: a search at every (size, budget); the fake optimum moves with both."""
    import fake_run

    from mars.study.report import write_study_report

    monkeypatch.setenv("FAKE_LR_WIDTH_EXPONENT", "1.0")
    monkeypatch.setenv("FAKE_LR_STEPS_EXPONENT", "0.5")
    spec = dict(sizes={"w32": SIZES["w32"], "w64": SIZES["w64"]}, budgets=[8, 16], tune__budgets=True,
                tune__trials={"w32": 6, "w64": 6}, tune__holdout=None)  # fmt: skip
    driver = run_fake(tuned_study(tmp_path / "st", ["schedule=wsd", "train.max_steps=16"], **spec))
    write_study_report(driver)
    tuning = json.loads((tmp_path / "st" / "report" / "study.json").read_text())["tuning"]
    assert [o["scope"] for o in tuning["optima"]] == ["w32-b8", "w32-b16", "w64-b8", "w64-b16"]
    for o in tuning["optima"]:
        truth = fake_run.optimal_lr(32 if o["size"] == "w32" else 64, o["steps"])
        assert (
            abs(math.log(o["params"]["optimizer.lr"] / truth))
            <= math.sqrt(12) * o["resolution"]["optimizer.lr"]
        )
    (rule,) = tuning["rules"]
    assert rule["note"] is None and set(rule["fit"]["exponents"]) == {"N", "D"}
    assert rule["fit"]["formula"].startswith("h*(N, D) = ") and rule["fit"]["df"] == 1
    md = (tmp_path / "st" / "report" / "study.md").read_text()
    assert "Over every searched size and budget:" in md
    assert "- none: study.tune.holdout is unset and fewer than 3 sizes are searched" in md


def test_with_one_budget_the_report_says_only_h_of_n_is_fitted():
    from mars.study.report import _rule

    def at(size, n):
        return (SimpleNamespace(size=size), (n, 1e6), 1e-3 * (n / 1e4) ** -0.5, 0.1)

    rule, used, note = _rule([at("a", 1e4), at("b", 4e4), at("c", 1.6e5)], with_d=True)
    assert note.startswith("only h*(N) is fitted, at each size's largest budget (h*(N, D): the points do not")
    assert rule.names == ("N",) and rule.exponent() == pytest.approx(-0.5) and len(used) == 3


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tune__trials": {"s": 0}}, "study.tune.trials.s=0: each size searched needs at least 1 trial"),
        ({"tune__trials": {"s": True}}, "study.tune.trials.s=True: each size searched needs at least 1"),
        ({"tune__trials": {"s": 4, "xl": 4}}, "study.tune.trials.xl: no such size; study.sizes has s, m"),
        ({"tune__trials": {"m": 4}}, "study.tune.trials does not search the first size s"),
        ({"tune__finals": "best"}, "study.tune.finals='best' is not one of own, first"),
        ({"tune__holdout": "m", "tune__trials": {}}, "study.tune.holdout needs study.tune.trials"),
        ({"tune__budgets": True, "tune__trials": {}}, "study.tune.budgets needs study.tune.trials"),
        ({"tune__holdout": "xl"}, "study.tune.holdout='xl' is not a searched size (s, m)"),
        ({"tune__holdout": "m"}, "study.tune.holdout=m: the fit needs 2 other searched sizes"),
        ({"tune__budgets": True}, "study.tune.budgets=true searches at every budget, but study.budgets is"),
        ({"final__top_k": 2}, "study.final.top_k=2 with study.tune: each size's finals rerun its own"),
        ({"sizes": {}}, "study.tune.trials searches at sizes, but study.sizes is empty"),
    ],
)
def test_a_bad_tune_spec_is_one_line_before_anything_runs(tmp_path, changes, message):
    two = {"sizes": {"s": ["model.n_embd=32"], "m": ["model.n_embd=64"]}, "tune__trials": {"s": 4, "m": 4}}
    with pytest.raises(UserError) as e:
        study_of(tmp_path / "st", **{**two, **changes})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert not (tmp_path / "st").exists()
