"""mars.checks: the config value checks of train, data, eval and the model specs, one line each."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

from mars.checks import (
    above,
    at_least,
    choice,
    finite_non_negative,
    fraction,
    fraction_pair,
    get,
    multiple_of,
    reported_as,
)


@pytest.mark.parametrize(
    "check, message",
    [
        (lambda: at_least("train.max_steps", 0, 1), "train.max_steps=0 must be >= 1"),
        (lambda: at_least("train.max_steps", None, 1), "train.max_steps=None must be >= 1"),
        (lambda: at_least("train.max_steps", True, 1), "train.max_steps=True must be >= 1"),
        (
            lambda: at_least("data.token_budget", 0, 1, " (or null)"),
            "data.token_budget=0 must be >= 1 (or null)",
        ),
        (lambda: above("model.norm_eps", 0.0), "model.norm_eps=0.0 must be > 0"),
        (lambda: above("limit", "all", 0), "limit='all' must be > 0"),
        (lambda: above("model.rope_theta", math.inf), "model.rope_theta=inf must be a finite number > 0"),
        (lambda: above("model.norm_eps", math.nan), "model.norm_eps=nan must be a finite number > 0"),
        (
            lambda: finite_non_negative("optimizer.lr", math.inf),
            "optimizer.lr=inf must be a finite number >= 0",
        ),
        (lambda: fraction("model.dropout", 1.0), "model.dropout=1.0 must lie in [0, 1)"),
        (lambda: fraction("model.dropout", math.nan), "model.dropout=nan must lie in [0, 1)"),
        (
            lambda: fraction("schedule.decay_fraction", 1.5, closed=True),
            "schedule.decay_fraction=1.5 must lie in [0, 1]",
        ),
        (
            lambda: fraction_pair("optimizer.betas", [0.9, 1.0]),
            "optimizer.betas=[0.9, 1.0] must be a pair [beta1, beta2] of numbers in [0, 1)",
        ),
        (
            lambda: fraction_pair("optimizer.betas", [0.9]),
            "optimizer.betas=[0.9] must be a pair [beta1, beta2] of numbers in [0, 1)",
        ),
        (
            lambda: choice("data.verify", "fast", ("cached", "full")),
            "data.verify='fast' is not one of cached, full",
        ),
        (
            lambda: multiple_of("model.n_embd", 66, "model.n_head", 4),
            "model.n_embd=66 must be a multiple of model.n_head=4",
        ),
    ],
)
def test_each_check_raises_one_line_naming_the_key_and_value(check, message):
    with pytest.raises(ValueError) as e:
        check()
    assert str(e.value) == message


def test_values_that_satisfy_the_rule_pass():
    at_least("k", 1, 1)
    at_least("k", 0.5, 0.0)
    above("k", 1e-9)
    finite_non_negative("k", 0)
    fraction("k", 0.0)
    fraction("k", 1.0, closed=True)
    choice("k", "full", ("cached", "full"))
    multiple_of("k", 768, "n", 12)


@dataclass
class _Train:
    max_steps: int = 3


def test_get_reads_dotted_keys_of_dataclasses_dicts_and_omegaconf_nodes():
    for cfg in ({"train": {"max_steps": 3}}, {"train": _Train()}, OmegaConf.structured({"train": _Train()})):
        assert get(cfg, "train.max_steps") == 3


class _MyError(RuntimeError):
    pass


def test_reported_as_turns_a_check_into_the_callers_error_class():
    with pytest.raises(_MyError, match="^batch_size=0 must be >= 1$"):
        with reported_as(_MyError):
            at_least("batch_size", 0, 1)
    with pytest.raises(KeyError):  # only ValueErrors are reported as the caller's class
        with reported_as(_MyError):
            raise KeyError("x")
