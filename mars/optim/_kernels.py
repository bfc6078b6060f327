"""Run an update rule of mars.optim.rules over a bucket of tensors: compiled, or with multi-tensor ops.

`update(rule, tensors, into, ...)` runs the rule and stores its results; `norms(rule, tensors, ...)`
returns its per-tensor reductions as an (n, k) table. Both choose, per tensor:

- compiled (fused=True, or fused=None where a compiler is available: on CUDA always, on the CPU for
  buckets of CPU_COMPILE_MIN_NUMEL entries and more): the rule compiled by torch.compile
  (Inductor: C++/OpenMP on CPU, Triton on CUDA) on first use, one call for up to GROUP tensors of a
  bucket, one fused loop per tensor that reads each input once and writes each output once. Tensors
  are flattened and their sizes are dynamic, so one compilation serves every shape; the
  hyperparameters travel as a small table on the tensors' device, so a changing lr, gamma, step
  count or clip scale never recompiles and nothing is read back to the host. Arithmetic runs in float64 for
  float64 tensors and in float32 otherwise (bf16/fp16 upcast on load, rounded once on store).
- multi-tensor (fused=False, MARS_OPTIM_FUSED=0 with fused=None, no compiler, tensors under
  FUSED_MIN_NUMEL entries, non-contiguous ones, and everything inside an outer torch.compile of a
  training step, which fuses these ops itself): the rule runs on `TensorList`s of the whole bucket
  (on the CPU strip by strip, see STRIP), each operation one torch._foreach_* op (one launch on
  CUDA, a C++ loop on CPU), in the same compute dtype; the results are then copied into place.

If compilation fails (no C++ compiler, no Triton), the package switches to the multi-tensor path
(`available()` turns False) with one warning. No path reads a value back to the host.

A `gate` (a 0-dim bool tensor on the device: the step is to be taken) makes `update` keep the old
values where it is false, on the device, NaN-safe: inside the compiled kernel a `where` per output,
on the multi-tensor path one `torch.where` per tensor (torch has no multi-tensor select). This is how
an optimizer skips a step whose gradients are not finite without reading anything back (found_inf).
"""

from __future__ import annotations

import os
import types
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

Lists = Sequence[list[Tensor] | None]

# MARS_OPTIM_FUSED=0 makes the multi-tensor path the default (fused=None): for short runs where
# compiling or loading the kernels (seconds per process) costs more than they save. fused=True still
# compiles.
DEFAULT_ENV = "MARS_OPTIM_FUSED"
# Smaller tensors (LayerNorm weights, biases) take the multi-tensor path: in a compiled call each
# tensor costs guards and a parallel region of its own, more than the memory passes it saves (ATen's
# own parallel grain size is the same 32768).
FUSED_MIN_NUMEL = 32768
# On the CPU, fused=None compiles a bucket's kernels only when it holds at least this many entries in
# such tensors. Compiling a rule costs seconds in every new process (about 6 s for MARS-AdamW's two
# kernels on the 2-core development machine, the FX graph cache warm), and the compiled update saves
# about 5 ns per entry and step over the multi-tensor path (docs/benchmarks.md): at 8M entries (GPT-2
# tiny's matrices) that pays for itself within about 150 steps; a micro model (0.3M) never would.
CPU_COMPILE_MIN_NUMEL = 8 * 2**20
# Inductor decides at compile time, from the first call's sizes, whether a CPU kernel runs its loop in
# parallel, and the FX graph cache then reuses that decision for every size: a kernel first compiled
# for a small tensor would update a 38M-entry embedding on one thread. dynamic_threads always emits
# the parallel loop and lets OpenMP size the team at run time.
_INDUCTOR_OPTIONS = {"cpp.dynamic_threads": True}


# ---- the multi-tensor path


def _raw(other):
    return other.tensors if isinstance(other, TensorList) else other


class TensorList:
    """Same-device, same-dtype tensors whose arithmetic is torch._foreach_* ops: a rule's tensor
    argument on the multi-tensor path. The other operand of an operation: a TensorList (entry by
    entry; its entries may be 0-dim per-tensor values) or a number."""

    __slots__ = ("tensors",)

    def __init__(self, tensors: list[Tensor]) -> None:
        self.tensors = tensors

    def __add__(self, other):
        return TensorList(torch._foreach_add(self.tensors, _raw(other)))

    __radd__ = __add__

    def __sub__(self, other):
        return TensorList(torch._foreach_sub(self.tensors, _raw(other)))

    def __rsub__(self, other):
        return TensorList(torch._foreach_add(torch._foreach_neg(self.tensors), _raw(other)))

    def __mul__(self, other):
        if type(other) in (int, float) and other == 1:  # e.g. the clip scale of an unclipped tensor
            return self
        return TensorList(torch._foreach_mul(self.tensors, _raw(other)))

    __rmul__ = __mul__

    def __truediv__(self, other):
        return TensorList(torch._foreach_div(self.tensors, _raw(other)))

    def __rtruediv__(self, other):
        return TensorList(torch._foreach_mul(torch._foreach_reciprocal(self.tensors), _raw(other)))

    def __neg__(self):
        return TensorList(torch._foreach_neg(self.tensors))

    def sqrt(self):
        return TensorList(torch._foreach_sqrt(self.tensors))

    def sign(self):
        return TensorList(torch._foreach_sign(self.tensors))

    def maximum(self, other):
        return TensorList(torch._foreach_maximum(self.tensors, _raw(other)))

    def norm(self):
        """Per-tensor 2-norms, as a TensorList of 0-dim tensors."""
        return TensorList(list(torch._foreach_norm(self.tensors)))


def _wide_list(tensors: list[Tensor]) -> TensorList:
    if tensors and tensors[0].dtype in (torch.bfloat16, torch.float16):
        return TensorList([t.float() for t in tensors])
    return TensorList(tensors)


def _multi_tensor(rule, tensors: Lists, hyper: dict, options: dict):
    args = [None if lst is None else _wide_list(lst) for lst in tensors]
    n = len(next(a for a in args if a is not None).tensors)

    # A 0-dim tensor hyperparameter (inside torch.compile) becomes a TensorList of it, n times: Dynamo
    # traces a TensorList operation with a TensorList operand, not one with a tensor operand.
    def value(v):
        if isinstance(v, list):
            return TensorList(v)
        return TensorList([v] * n) if isinstance(v, Tensor) else v

    return rule(*args, **{k: value(v) for k, v in hyper.items()}, **options)


# On the CPU the multi-tensor path runs a rule strip by strip: entries [j STRIP, (j + 1) STRIP) of
# every contiguous tensor at once. Each operation then works on data in cache instead of making a pass
# over memory (and a fresh allocation, whose pages fault in, for each intermediate result): on the
# GPT-2 embedding a MARS-AdamW update takes a third of the time it takes on whole tensors.
STRIP = 1 << 16


def _strips(tensors: Lists, into: Lists, hyper: dict):
    """The bucket in strips: (tensors, into, hyper, owners) each, owners[r] the index of the bucket
    tensor whose piece the r-th entry is. One strip of everything off the CPU or inside torch.compile."""
    lists = [lst for lst in [*tensors, *into] if lst is not None]
    first = lists[0]
    n = len(first)
    pieces = [
        -(-t.numel() // STRIP) if t.numel() > STRIP and all(lst[i].is_contiguous() for lst in lists) else 1
        for i, t in enumerate(first)
    ]
    if first[0].device.type != "cpu" or torch.compiler.is_compiling() or max(pieces) == 1:
        yield tensors, into, hyper, list(range(n))
        return
    flat = {id(lst): [t.view(-1) if k > 1 else t for t, k in zip(lst, pieces, strict=True)] for lst in lists}
    for j in range(max(pieces)):
        owners = [i for i, k in enumerate(pieces) if k > j]

        def cut(lst, j=j, owners=owners):
            views = flat[id(lst)]
            return [views[i][j * STRIP : (j + 1) * STRIP] if pieces[i] > 1 else views[i] for i in owners]

        yield (
            [None if lst is None else cut(lst) for lst in tensors],
            [cut(lst) for lst in into],
            {k: [v[i] for i in owners] if isinstance(v, list) else v for k, v in hyper.items()},
            owners,
        )


# ---- the compiled path

_disabled_reason: str | None = None


def available(device: torch.device) -> bool:
    """Whether compiled kernels can be used for tensors on `device`."""
    return _disabled_reason is None and _toolchain(device.type)


def _toolchain(device_type: str) -> bool:
    from mars.device import compiler_missing

    return compiler_missing(device_type) is None


def _disable(err: BaseException) -> None:
    global _disabled_reason
    if _disabled_reason is None:
        _disabled_reason = f"{type(err).__name__}: {err}"
        warnings.warn(
            "mars.optim: torch.compile of the fused optimizer kernels failed "
            f"({_disabled_reason.splitlines()[0][:300]}); using the multi-tensor implementation instead "
            "(same results, slower). Pass fused=False to silence this.",
            RuntimeWarning,
            stacklevel=4,
        )


def _store(dst: list[Tensor], values: list[Tensor], gate: Tensor | None, otherwise: str = "old") -> None:
    """dst <- values (cast to dst's dtype); with a gate, only where it is true: elsewhere dst keeps its
    old values (otherwise="old") or becomes zeros ("zero")."""
    if gate is None:
        torch._foreach_copy_(dst, values)
        return
    gate = gate.to(dst[0].device, non_blocking=True)
    kept = dst if otherwise == "old" else [d.new_zeros(()) for d in dst]
    torch._foreach_copy_(dst, [torch.where(gate, v, k) for v, k in zip(values, kept, strict=True)])


class _Kernel:
    """A rule's per-tensor body, compiled on first use; run eagerly if compilation fails (every kernel,
    when the toolchain is broken; this one alone, when it would recompile past torch.compile's limit)."""

    def __init__(self, name: str, fn: Callable) -> None:
        self.name = name
        self.fn = fn
        self._compiled = None
        self._eager = False

    def __call__(self, *args):
        if _disabled_reason is not None or self._eager:
            return self.fn(*args)
        try:
            if self._compiled is None:
                self._compiled = torch.compile(
                    self.fn, dynamic=True, fullgraph=True, options=_INDUCTOR_OPTIONS
                )
            return self._compiled(*args)
        except torch._dynamo.exc.FailOnRecompileLimitHit as err:
            self._eager = True
            warnings.warn(
                f"mars.optim: the compiled {self.name} kernel met torch.compile's recompile limit ({err}); "
                "it runs eagerly from now on (same results, slower)",
                RuntimeWarning,
                stacklevel=4,
            )
            return self.fn(*args)
        except Exception as err:  # noqa: BLE001 - a broken toolchain must not stop training
            result = self.fn(*args)  # an error of the rule itself is raised here, as it is
            _disable(err)
            return result


_KERNELS: dict[tuple, _Kernel] = {}


def _wide(t: Tensor) -> Tensor:
    """t in its compute dtype (a no-op for float32 and float64; decided when the kernel is traced)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _kernel(
    rule, arg_slots: tuple, out_slots: tuple | None, names: tuple, options: dict, n: int, like: tuple
) -> _Kernel:
    """The compiled kernel of `rule` over n tensors, for one layout of its arguments: flat[s][i] is
    the i-th tensor's entry of distinct list s, flat[arg_slots[j]] its j-th tensor argument, its
    results go to flat[out_slots[k]] (out_slots None: they are returned, one row per tensor); the
    hyperparameters are hp[i] (`names`); with a gate, results are stored where it is true.

    `like` (device type, dtypes of the lists, gated) is part of the key: each kernel's code object sees
    one kind of input, so torch.compile's per-code-object recompile limit is never reached by a model
    that mixes dtypes or devices, and sizes never recompile (dynamic)."""
    key = (rule, arg_slots, out_slots, names, tuple(sorted(options.items())), n, like)
    kernel = _KERNELS.get(key)
    if kernel is None:

        def body(flat, hp, gate):
            rows = []
            for i, values in enumerate(hp.unbind(0)):
                args = [None if s is None else _wide(flat[s][i]) for s in arg_slots]
                results = rule(*args, **dict(zip(names, values.unbind(0), strict=True)), **options)
                if out_slots is None:
                    rows.append(torch.stack(results))
                else:
                    for s, r in zip(out_slots, results, strict=True):
                        flat[s][i].copy_(r if gate is None else torch.where(gate, r, flat[s][i]))
            return torch.stack(rows) if out_slots is None else None

        # a code object of its own per kernel: Dynamo caches compilations (and counts recompiles) per
        # code object, and profiles then name the rule
        name = f"{rule.__name__}_kernel"
        code = body.__code__.replace(co_name=name, co_qualname=name)
        fn = types.FunctionType(code, body.__globals__, name, None, body.__closure__)
        kernel = _KERNELS[key] = _Kernel(rule.__name__, fn)
    return kernel


def _hyper_table(hyper: dict, idx: list[int], like: Tensor) -> Tensor:
    """The hyperparameters of tensors idx, one row each, in `like`'s compute dtype, on its device."""
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    numbers = [0.0 if isinstance(v, (list, Tensor)) else float(v) for v in hyper.values()]
    row = torch.tensor(numbers, dtype=dtype)
    if like.device.type != "cpu":
        row = row.pin_memory().to(like.device, non_blocking=True)
    table = row.expand(len(idx), len(numbers)).clone()
    for j, v in enumerate(hyper.values()):
        if isinstance(v, (list, Tensor)):
            table[:, j] = torch.stack([v[i] for i in idx]) if isinstance(v, list) else v
    return table


# One compiled call updates up to GROUP tensors of a bucket: one guard check and one C++ call for all
# of them (on a 2-core CPU ~15% off a MARS-Lion update of GPT-2's matrices), with the compilation
# (~0.5 s a tensor) bounded and shared by buckets of any size.
GROUP = 16


def _groups(idx: list[int]) -> list[list[int]]:
    return [idx[i : i + GROUP] for i in range(0, len(idx), GROUP)]


# ---- running a rule


def compiled_indices(fused: bool | None, tensors: Lists) -> list[int]:
    """Which tensors of a bucket take the compiled path (the others: multi-tensor)."""
    if fused is False or torch.compiler.is_compiling():
        return []
    if fused is None and os.environ.get(DEFAULT_ENV, "auto") == "0":
        return []
    lists = [lst for lst in tensors if lst is not None]
    device = lists[0][0].device
    if not available(device):
        return []
    big = [
        i
        for i, t in enumerate(lists[0])
        if t.numel() >= FUSED_MIN_NUMEL and all(lst[i].is_contiguous() for lst in lists)
    ]
    small_bucket = sum(lists[0][i].numel() for i in big) < CPU_COMPILE_MIN_NUMEL
    if fused is None and device.type == "cpu" and small_bucket:
        return []  # compiling would cost more than it saves
    return big


def _subset(values, idx: list[int]):
    return [values[i] for i in idx] if isinstance(values, list) else values


def _split(fused, tensors: Lists, into: Lists, hyper: dict):
    """(indices of the compiled tensors, the multi-tensor part as (tensors, into, hyper) or None)."""
    big = compiled_indices(fused, [*tensors, *into])
    n = len(next(lst for lst in tensors if lst is not None))
    if not big:
        return big, (tensors, into, hyper)
    if len(big) == n:
        return big, None
    small = sorted(set(range(n)) - set(big))
    return big, (
        [None if lst is None else _subset(lst, small) for lst in tensors],
        [_subset(lst, small) for lst in into],
        {k: _subset(v, small) for k, v in hyper.items()},
    )


def _layout(tensors: Lists, into: Lists) -> tuple[list[list[Tensor]], tuple, tuple]:
    """The distinct lists (a list of the same tensors in both `tensors` and `into` once: a compiled
    kernel must not take one tensor as two inputs), and where each argument and result is among them."""
    unique: list[list[Tensor]] = []

    def slot(lst) -> int:
        for s, u in enumerate(unique):
            if u is lst or (u[0] is lst[0] and all(a is b for a, b in zip(u, lst, strict=True))):
                return s
        unique.append(lst)
        return len(unique) - 1

    arg_slots = tuple(None if lst is None else slot(lst) for lst in tensors)
    out_slots = tuple(slot(lst) for lst in into)
    return unique, arg_slots, out_slots


def _flat(t: Tensor) -> Tensor:
    return t.detach().view(-1)


def _like(unique: list[list[Tensor]], gated: bool) -> tuple:
    return (unique[0][0].device.type, tuple(lst[0].dtype for lst in unique), gated)


def update(
    rule, tensors: Lists, into: Lists, *, fused: bool | None, options=None, gate=None, **hyper
) -> None:
    """Run the update `rule` over a bucket and store its results in place.

    tensors: the rule's tensor arguments, one list per argument (entry i of each list belongs to the
    bucket's i-th tensor; None: the rule gets None); into: where each of its results goes, in order
    (lists, some of them maybe from `tensors`); hyper: its hyperparameters (numbers, 0-dim tensors,
    or per-tensor lists of 0-dim tensors); options: its static keyword arguments (functions, flags),
    which select the compiled kernel; gate: a 0-dim bool tensor, the results are stored only where
    it is true (the old values stay otherwise)."""
    options = options or {}
    big, rest = _split(fused, tensors, into, hyper)
    if rest is not None:
        for small_tensors, small_into, small_hyper, _ in _strips(*rest):
            results = _multi_tensor(rule, small_tensors, small_hyper, options)
            for dst, r in zip(small_into, results, strict=True):
                _store(dst, r.tensors, gate)
    if big:
        unique, arg_slots, out_slots = _layout(tensors, into)
        if gate is not None:
            gate = gate.to(unique[0][0].device, non_blocking=True)
        for group in _groups(big):
            kernel = _kernel(
                rule, arg_slots, out_slots, tuple(hyper), options, len(group), _like(unique, gate is not None)
            )
            kernel(
                [[_flat(lst[i]) for i in group] for lst in unique],
                _hyper_table(hyper, group, unique[0][0]),
                gate,
            )


def norms(rule, tensors: Lists, *, fused: bool | None, options=None, **hyper) -> Tensor:
    """Run a reduction `rule` (it returns per-tensor sums, 0-dim) over a bucket: an (n, k) table in
    the compute dtype, row i for the bucket's i-th tensor. Arguments as for `update`."""
    options = options or {}
    big, rest = _split(fused, tensors, [], hyper)
    n = len(next(lst for lst in tensors if lst is not None))
    rows: list[Tensor | None] = [None] * n
    if rest is not None:
        table = None
        for small_tensors, _, small_hyper, owners in _strips(*rest):
            results = _multi_tensor(rule, small_tensors, small_hyper, options)
            part = torch.stack([torch.stack(r.tensors) for r in results], dim=1)
            if table is None:  # the first strip has a piece of every tensor, in order
                table = part
            else:  # the sums over each tensor's strips
                table = table.index_add(0, torch.tensor(owners, device=part.device), part)
        if not big:
            return table
        small = sorted(set(range(n)) - set(big))
        for i, row in zip(small, table.unbind(0), strict=True):
            rows[i] = row
    unique, arg_slots, _ = _layout(tensors, [])
    for group in _groups(big):
        kernel = _kernel(rule, arg_slots, None, tuple(hyper), options, len(group), _like(unique, False))
        table = kernel(
            [[_flat(lst[i]) for i in group] for lst in unique], _hyper_table(hyper, group, unique[0][0]), None
        )
        for i, row in zip(group, table.unbind(0), strict=True):
            rows[i] = row
    return torch.stack(rows)


# ---- the fused= argument


def check_fused_flag(owner: str, fused: bool | None, device: torch.device | None) -> None:
    """fused=True is a request the optimizer must be able to honour: fail at construction if it cannot."""
    if fused not in (None, True, False):
        raise ValueError(f"{owner}: invalid fused={fused!r}: must be None (auto), True or False")
    if fused and device is not None and not available(device):
        raise ValueError(
            f"{owner}: fused=True needs torch.compile with a C++ compiler (CPU) or Triton (CUDA) for "
            f"{device.type} tensors; pass fused=None (auto) or fused=False"
        )


def first_device(params) -> torch.device | None:
    for group in params:
        for p in group["params"]:
            return p.device
    return None
