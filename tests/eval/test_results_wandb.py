"""Evaluation's wandb logging follows the trainer's mode rule: WANDB_MODE wins over wandb.mode."""

from __future__ import annotations

import sys
import types

import pytest

from mars.eval.results import log_wandb


def test_wandb_mode_from_the_environment_wins(monkeypatch):
    modes = []

    def init(**kwargs):
        modes.append(kwargs["mode"])
        raise RuntimeError("stop after init")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    result = types.SimpleNamespace(name="run", path="ckpt", step=1, tokens=2, request={}, config={})

    monkeypatch.setenv("WANDB_MODE", "disabled")
    log_wandb([result], "online", "proj")  # returns before any wandb run starts
    assert modes == []

    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(RuntimeError, match="stop after init"):
        log_wandb([result], "online", "proj")
    assert modes == ["offline"]
