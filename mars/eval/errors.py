"""Errors of the evaluation harness: each message is one line a user can act on."""

from __future__ import annotations


class EvalError(RuntimeError):
    """Base class of the evaluation errors."""


class UnknownTaskError(EvalError):
    """A task name that is neither a preset, an lm-eval task/group/tag, nor a task YAML path."""


class TasksUnavailableError(EvalError):
    """Tasks whose datasets can be neither downloaded (hub unreachable) nor read from the cache."""
