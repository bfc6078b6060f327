"""The device a process computes on, in one place: the check of a device setting (one line naming the key,
what this machine has, and the fix), its resolution to one device with an index (`cuda:N`, as
torch.cuda.set_device, nccl's device_id and DDP's device_ids need), what train.dtype means there
(autocast and TF32), and whether torch.compile can build code for it. Training, evaluation, the
optimizers' kernels and the benchmarks all take these from here.

Standard library and torch only (torch is imported when a function is called).
"""

from __future__ import annotations

import functools
import os
import shutil
from contextlib import nullcontext
from dataclasses import dataclass

FORMS = "auto, cpu, cuda, cuda:N"


def _launched() -> bool:
    """Under torchrun (or SLURM turned into its variables): one process per GPU, cuda:LOCAL_RANK."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def machine() -> str:
    """What this machine offers, in words: "cpu and 2 CUDA devices (cuda:0-cuda:1, NVIDIA H200)"."""
    import torch

    if torch.version.cuda is None and not torch.cuda.is_available():
        return f"cpu only (torch {torch.__version__} is a CPU build)"
    if not torch.cuda.is_available():
        cuda = torch.version.cuda
        return f"cpu only (torch {torch.__version__} has CUDA {cuda}, but no CUDA device is visible)"
    n = torch.cuda.device_count()
    which = "cuda:0" if n == 1 else f"cuda:0-cuda:{n - 1}"
    return f"cpu and {n} CUDA device{'s' if n > 1 else ''} ({which}, {torch.cuda.get_device_name(0)})"


def hardware(device: str, processes: int = 1) -> str:
    """What a run's seconds are measured on, in words: "8 x NVIDIA H200", or on the CPU "1 process x 2
    threads of AMD EPYC 7B13 (2 cores)" (torch's threads per process, the machine's cores)."""
    import torch

    if device.startswith("cuda"):
        return f"{processes} x {torch.cuda.get_device_name(torch.device(device))}"
    name = _cpu_name()
    threads = torch.get_num_threads()
    return (
        f"{processes} process{'es' if processes > 1 else ''} x {threads} thread{'s' if threads > 1 else ''} "
        f"of {name} ({os.cpu_count()} cores)"
    )


def _cpu_name() -> str:
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "an unknown CPU"


def check(key: str, value: str) -> None:
    """ValueError (one line) unless `value` names a device this process can use: auto, cpu, cuda, or
    cuda:N of a visible GPU; under torchrun, `cuda`/`auto` with a GPU for this rank's LOCAL_RANK."""
    if value in ("auto", "cpu"):
        return _check_rank_gpu(key) if value == "auto" else None
    if not (value == "cuda" or (value.startswith("cuda:") and value[5:].isdigit())):
        raise ValueError(
            f"{key}={value!r} is not a device this harness computes on ({FORMS}); this machine has "
            f"{machine()}: use {key}=auto"
        )
    import torch

    if not torch.cuda.is_available():
        fix = "install a CUDA build of torch" if torch.version.cuda is None else "check CUDA_VISIBLE_DEVICES"
        raise ValueError(f"{key}={value}: this machine has {machine()}; use {key}=cpu (or auto), or {fix}")
    n = torch.cuda.device_count()
    if ":" in value:
        index = int(value[5:])
        if index >= n:
            fix = f"{key}=cuda:{n - 1} or lower (or {key}=cuda)"
            raise ValueError(f"{key}={value}: this machine has {machine()}; use {fix}")
        if _launched():
            raise ValueError(
                f"{key}={value} under torchrun would put every rank on that one GPU; use {key}=cuda (or "
                "auto): each rank takes cuda:LOCAL_RANK"
            )
    _check_rank_gpu(key)


def _check_rank_gpu(key: str) -> None:
    """Under torchrun on a GPU machine: a GPU for every process of this node (checked alike on each, from
    LOCAL_WORLD_SIZE, so that rank 0 reports it; LOCAL_RANK where the launcher does not set it)."""
    import torch

    if not (_launched() and torch.cuda.is_available()):
        return
    n = torch.cuda.device_count()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", int(os.environ.get("LOCAL_RANK", "0")) + 1))
    if per_node > n:
        raise ValueError(
            f"{key}: {per_node} processes on this node (LOCAL_WORLD_SIZE), but this machine has {machine()}; "
            f"start at most {n} per node (torchrun --nproc_per_node={n}), or set {key}=cpu"
        )


def resolve(value: str) -> str:
    """One device with an index: auto -> cuda when a GPU is visible, else cpu; cuda -> cuda:LOCAL_RANK
    under torchrun, else cuda:0 (the first visible GPU: CUDA_VISIBLE_DEVICES picks it)."""
    import torch

    if value == "auto":
        value = "cuda" if torch.cuda.is_available() else "cpu"
    if value == "cuda":
        value = f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) if _launched() else 0}"
    return value


@dataclass(frozen=True)
class Precision:
    """What a dtype setting (auto | float32 | bfloat16) means on a device: bfloat16 autocast or none,
    and whether float32 matmuls may use TF32 (CUDA; with `float32`, they may not: float32 means float32)."""

    device_type: str
    bfloat16: bool

    @classmethod
    def of(cls, dtype: str, device_type: str) -> Precision:
        bf16 = dtype == "bfloat16" or (dtype == "auto" and device_type == "cuda")
        return cls(device_type, bf16)

    @property
    def name(self) -> str:
        return "bfloat16" if self.bfloat16 else "float32"

    def autocast(self):
        """The context the forward passes run in (bfloat16 autocast, or none)."""
        import torch

        return torch.autocast(self.device_type, dtype=torch.bfloat16) if self.bfloat16 else nullcontext()

    def apply(self) -> None:
        """Set CUDA's matmul precision for this setting (process-wide; nothing to set on the CPU)."""
        import torch

        if self.device_type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.bfloat16
            torch.backends.cudnn.allow_tf32 = self.bfloat16


@functools.cache
def compiler_missing(device_type: str) -> str | None:
    """Why torch.compile (Inductor) cannot build code for `device_type` on this machine, in words; None
    when it can: the CPU needs a C++ compiler, CUDA needs Triton."""
    import torch

    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    if device_type == "cpu":
        found = any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++"))
        return None if found else "no C++ compiler (g++, c++ or clang++) is on PATH"
    if device_type == "cuda":
        try:
            from torch.utils._triton import has_triton
        except ImportError:
            return "this torch has no Triton support"
        missing = "Triton is not installed or cannot drive this GPU (pip install triton)"
        return None if has_triton() else missing
    return f"the harness does not compile for {device_type}"
