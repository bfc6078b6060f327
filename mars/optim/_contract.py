"""What every optimizer of this package owes torch.optim.Optimizer's users beyond step().

torch.optim.Optimizer keeps only `defaults`, `state` and `param_groups` when an optimizer is copied
or pickled, and its load_state_dict() takes whatever param groups and buffers it is given. The
optimizers here also depend on constructor options kept as attributes (MARS's is_approx, MARS-M's
lean, fused, ...) and on group entries that decide what each state buffer means (MARS's mars_type,
optimize_1d, two_dim_rule; the matrix optimizers' use_muon). `TorchContract` therefore

- keeps every attribute through copy.deepcopy and pickle (torch's step and state-dict hooks are
  dropped, as torch drops them);
- checks every param group's values (the constructor's defaults filled in) with the optimizer's
  `value_checks` (mars.optim.config) and every parameter's dtype (real floating point only), and
  takes back a group that fails, so a failed add_param_group leaves the optimizer as it was;
- records the class and those options in state_dict() under RECORD_KEY, and has load_state_dict()
  refuse, in one line naming both sides, a state dict written by another optimizer or with other
  options. A state dict without the record (written before it existed, or rebuilt by a tool that
  keeps only "state" and "param_groups") is checked from its contents: the group entries it has,
  the buffers it holds. Older state dicts kept the step count as a Python int: it is converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

from ._step import as_step_counter
from .config import check_keywords

RECORD_KEY = "mars_optim"
# Entries torch.optim's own optimizers put in every param group and ours never do.
TORCH_GROUP_FLAGS = ("foreach", "fused", "capturable", "maximize")
_TORCH_RUNTIME = ("_zero_grad_profile_name",)  # rebuilt by Optimizer.__setstate__


class TorchContract:
    """Mixin before torch.optim.Optimizer in the bases of MARS, MARSM, Lion, Muon and Moonlight.

    A subclass sets `owner` (its name in refusals), `value_checks` (and `group_names`, the param-group
    keys of keywords a group keeps under another name), `instance_options` (attributes that decide
    what the state buffers mean) and `role_keys` (param-group entries that do), defines
    `_buffer_names(p, group)` (the state entries it may keep for p) and may define
    `_infer_options(entries)` and `_split_param_group(group)`.
    """

    owner: str
    value_checks: tuple = ()
    group_names: Mapping[str, str] = MappingProxyType({})
    instance_options: tuple[str, ...] = ()
    role_keys: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict, options: dict | None = None) -> None:
        """defaults: the param-group defaults; options: the constructor's other values that its checks
        relate to a group's (MARS-M's lean), checked with every group."""
        # The group entries a state dict of this optimizer always has: the constructor's defaults
        # (torch later adds "differentiable" to self.defaults when it loads or unpickles) and the roles.
        self._group_keys = frozenset(defaults) | frozenset(self.role_keys)
        self._options = dict(options or {})
        super().__init__(params, defaults)  # each group, defaults filled in, checked by add_param_group

    def _check_values(self, values: dict) -> None:
        check_keywords(self.owner, self.value_checks, {**self._options, **values}, self.group_names)

    @property
    def _name(self) -> str:
        return type(self).__name__

    # ---- copy.deepcopy and pickle

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        for key, value in self.__dict__.items():
            if key not in state and not key.startswith("_optimizer_") and key not in _TORCH_RUNTIME:
                state[key] = value
        return state

    def __repr__(self) -> str:
        options = {name: getattr(self, name) for name in (*self.instance_options, "fused")}
        head = f"{self._name} ("
        lines = "".join(f"\n    {name}: {value}" for name, value in options.items())
        return super().__repr__().replace(head, f"{head}\nOptions{lines}", 1)

    # ---- param groups

    def add_param_group(self, param_group: dict) -> None:
        first = len(self.param_groups)
        try:
            for group in self._split_param_group(param_group):
                super().add_param_group(group)
                added = self.param_groups[-1]
                for p in added["params"]:
                    _real_floating(self._name, p)
                self._check_values(added)
        except BaseException:
            del self.param_groups[first:]
            raise

    def _split_param_group(self, param_group: dict) -> list[dict]:
        return [param_group]

    # ---- state dicts

    def _record(self) -> dict:
        return {"class": self._name, **{name: getattr(self, name) for name in self.instance_options}}

    def _describe(self, record: dict | None = None) -> str:
        record = self._record() if record is None else record
        options = ", ".join(f"{k}={v!r}" for k, v in record.items() if k != "class")
        return f"{record.get('class')}({options})" if options else str(record.get("class"))

    def state_dict(self) -> dict:
        """torch's state dict ("state", "param_groups", with "param_names" for named parameters) plus
        RECORD_KEY: {"class": ..., and the options that decide what the buffers mean}."""
        # prepended for this call only: the user's post-hooks see the record, deepcopy sees no hook
        handle = self.register_state_dict_post_hook(_add_record, prepend=True)
        try:
            return super().state_dict()
        finally:
            handle.remove()

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict, refusing (ValueError, one line naming both sides) a state dict
        saved by another optimizer class or with other role-determining options."""
        # appended for this call only: the check runs on the dict the user's pre-hooks produced
        check = self.register_load_state_dict_pre_hook(_check_loadable)
        convert = self.register_load_state_dict_post_hook(_step_counts_as_tensors, prepend=True)
        try:
            super().load_state_dict(state_dict)
        finally:
            check.remove()
            convert.remove()

    def _buffer_names(self, p: torch.Tensor, group: dict) -> set[str]:
        raise NotImplementedError

    def _infer_options(self, entries: list[tuple[torch.Tensor, dict, dict]]) -> dict[str, tuple[object, str]]:
        """From (parameter, group, saved buffers) of a state dict without the record: the options
        its buffers reveal, as {name: (value, evidence)}."""
        return {}


def _real_floating(owner: str, p: torch.Tensor) -> None:
    """The updates are real arithmetic (norms, signs, square roots, Newton-Schulz): refuse other dtypes
    at construction instead of stepping them wrongly."""
    if p.is_floating_point():
        return
    if p.is_complex():
        fix = (
            "keep the real and imaginary parts as a real parameter instead (store torch.view_as_real(z) "
            "as the nn.Parameter and use torch.view_as_complex(param) in forward)"
        )
    else:
        fix = "only floating-point tensors can be optimized: leave it out of the optimizer (e.g. a buffer)"
    raise ValueError(
        f"{owner} does not support a parameter of shape {tuple(p.shape)} and dtype {p.dtype}: it "
        f"updates real floating-point tensors (float32, float64, bfloat16, float16); {fix}"
    )


def _add_record(optimizer: TorchContract, state_dict: dict) -> None:
    state_dict[RECORD_KEY] = optimizer._record()


def _step_counts_as_tensors(optimizer: TorchContract) -> None:
    for state in optimizer.state.values():
        if isinstance(state, dict) and "step" in state:
            state["step"] = as_step_counter(state["step"])


def _fail(optimizer: TorchContract, problem: str, fix: str) -> None:
    raise ValueError(f"{optimizer._name}.load_state_dict: {problem}; {fix}")


def _quoted(keys) -> str:
    return ", ".join(repr(k) for k in sorted(keys))


def _check_loadable(optimizer: TorchContract, state_dict: dict) -> None:
    """Refuse a state dict written by another optimizer or with other role-determining options."""
    groups, saved_groups = optimizer.param_groups, state_dict.get("param_groups")
    if not isinstance(saved_groups, list) or not all(isinstance(g, dict) for g in saved_groups):
        return  # not a state dict at all: torch's load_state_dict says so
    ours = optimizer._describe()
    record = state_dict.get(RECORD_KEY)
    if record is not None:
        if record.get("class") != optimizer._name:
            _fail(
                optimizer,
                f"the state dict was saved by {optimizer._describe(record)}, this optimizer is {ours}",
                f"load it into a {record.get('class')} built the same way, or start {optimizer._name} afresh",
            )
        for name in optimizer.instance_options:
            if name in record and record[name] != getattr(optimizer, name):
                _fail(
                    optimizer,
                    f"the state dict was saved by {optimizer._describe(record)}, this optimizer is {ours}",
                    f"its buffers mean something else here: build {optimizer._name} with "
                    f"{name}={record[name]!r} to resume it",
                )
    else:
        for i, saved in enumerate(saved_groups):
            missing = optimizer._group_keys - set(saved)
            foreign = set(TORCH_GROUP_FLAGS) & set(saved)
            if missing or foreign:
                what = f"lacks {_quoted(missing)}" if missing else f"carries {_quoted(foreign)}"
                _fail(
                    optimizer,
                    f"param group {i} of the state dict {what}, so it was not saved by {ours} "
                    f"(its entries: {_quoted(k for k in saved if k not in ('params', 'param_names'))})",
                    "load it into the optimizer that saved it",
                )
    if len(saved_groups) != len(groups) or any(
        len(g["params"]) != len(s.get("params", ())) for g, s in zip(groups, saved_groups, strict=True)
    ):
        return  # torch's own checks name these mismatches
    for i, (group, saved) in enumerate(zip(groups, saved_groups, strict=True)):
        for key in optimizer.role_keys:
            if saved.get(key) != group[key]:
                _fail(
                    optimizer,
                    f"param group {i} was saved with {key}={saved.get(key)!r}, this optimizer has "
                    f"{key}={group[key]!r}",
                    f"the state buffers differ between them: build {optimizer._name} with "
                    f"{key}={saved.get(key)!r} for that group to resume it",
                )
    owner = {}  # saved parameter id -> (this optimizer's parameter, its group, the group's index)
    for i, (group, saved) in enumerate(zip(groups, saved_groups, strict=True)):
        for saved_id, p in zip(saved["params"], group["params"], strict=True):
            owner[saved_id] = (p, group, i)
    located = [  # (parameter, group, group index, saved buffers)
        (*owner[k], buffers)
        for k, buffers in state_dict.get("state", {}).items()
        if k in owner and isinstance(buffers, dict)
    ]
    if record is None:
        entries = [(p, group, buffers) for p, group, _, buffers in located]
        for name, (value, evidence) in optimizer._infer_options(entries).items():
            if value != getattr(optimizer, name):
                _fail(
                    optimizer,
                    f"the state dict holds {evidence}, so it was saved with {name}={value!r}; this "
                    f"optimizer is {ours}",
                    f"build {optimizer._name} with {name}={value!r} to resume it",
                )
    for p, group, i, buffers in located:
        unknown = set(buffers) - optimizer._buffer_names(p, group)
        if unknown:
            _fail(
                optimizer,
                f"the state dict holds {_quoted(unknown)} for a parameter of shape {tuple(p.shape)} "
                f"(param group {i}), which {ours} does not keep there: it was saved by another optimizer "
                "or with other options",
                "load it into the optimizer that saved it",
            )


def named_tensor(entry) -> torch.Tensor:
    """The tensor of a params entry: a tensor, or a (name, tensor) pair from named_parameters()."""
    return entry[1] if isinstance(entry, tuple) else entry
