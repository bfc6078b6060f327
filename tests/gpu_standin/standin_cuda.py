"""A CUDA machine on the CPU, for the harness's CUDA branches: torch.cuda's entry points replaced by
stand-ins that apply torch's own argument rules and record each call, and CUDA memory served by the CPU.

    python tests/gpu_standin/standin_cuda.py train.py ARGS...
    python tests/gpu_standin/standin_cuda.py -m eval ckpt=RUN device=cuda
    MARS_STANDIN_DEVICES=2 torchrun --nproc_per_node=2 tests/gpu_standin/standin_cuda.py train.py ARGS...

`install(devices)` makes `torch.cuda.is_available()` true with `devices` GPUs ("NVIDIA H200
(stand-in)"), then runs the command's real entry point (runpy), so that everything the harness decides
from "there is a GPU" runs: the device string, set_device, the nccl process group (a gloo one
underneath, after nccl's checks), DDP's device_ids, FSDP2's device mesh, autocast, pinned host memory,
events, memory statistics, the RNG states of checkpoints. A tensor asked for on cuda:N is made on the
CPU and remembered as a CUDA tensor where it was made (factories, `.to`, `.cuda`).

Each stand-in fails where torch fails on a real GPU machine, with torch's own message where torch gives
one (tests/gpu_standin/test_standin_rules.py pins them against torch's functions):
  * a device without an index where torch needs one (`set_device`, `init_process_group(device_id=)`,
    DDP's device_ids), an index past the last GPU anywhere;
  * pinning a CUDA tensor (only dense CPU tensors can be pinned);
  * `Event.elapsed_time` before both events were recorded and the end one completed (a synchronize);
  * `set_rng_state_all` with more states than GPUs, non-byte states;
  * a nccl group whose rank has not set its own device, or two ranks of one machine on one GPU;
  * bfloat16 autocast is allowed (an H200 has it), as is every torch.cuda query the harness makes.
What the CPU cannot do is left as it is: a Triton kernel (`has_triton()` is false, so the harness's own
fallbacks run), torch.compile of CUDA code, real asynchrony. A tensor computed from CUDA tensors is not
known as one (only where tensors are made), so the pinning rule covers tensors moved or made there.

The record ($MARS_STANDIN_LOG, with ".RANK" appended under a launcher) is a JSON list of
{"call": NAME, ...} written at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

NAME = "NVIDIA H200 (stand-in)"
TOTAL_MEMORY = 143_771_090_944  # bytes, as an H200 reports


class Machine:
    """The stand-in machine: its GPUs, the current device, the calls made, the CUDA tensors made."""

    def __init__(self, devices: int):
        self.devices = devices
        self.current: int | None = None  # set by set_device; torch's default is 0
        self.calls: list[dict] = []
        self.cuda_tensors = WeakIdKeyDictionary()
        self.pending_events: list[Event] = []
        self.autocasts: set[tuple] = set()

    def record(self, call: str, **details: Any) -> None:
        self.calls.append({"call": call, **{k: _plain(v) for k, v in details.items()}})

    def index(self, device: Any, optional: bool) -> int:
        """torch's reading of a CUDA device argument (torch._utils._get_device_index), range-checked."""
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device) and device.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        index = torch._utils._get_device_index(device, optional=optional, allow_cpu=False)
        if index < 0:  # optional and no index: the current device
            index = self.current_device()
        self.check_ordinal(index)
        return index

    def check_ordinal(self, index: int) -> None:
        if not 0 <= index < self.devices:
            raise RuntimeError(
                "CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously reported "
                f"(device {index} of a machine with {self.devices} GPU(s))"
            )

    def current_device(self) -> int:
        return 0 if self.current is None else self.current

    def host(self, device: Any) -> tuple[Any, bool]:
        """(where a tensor asked for on `device` is made, whether it counts as a CUDA tensor)."""
        if isinstance(device, int) and not isinstance(device, bool):  # an index means a CUDA device here
            self.check_ordinal(device)
            return "cpu", True
        if isinstance(device, (str, torch.device)):
            d = torch.device(device)
            if d.type == "cuda":
                self.check_ordinal(self.current_device() if d.index is None else d.index)
                return "cpu", True
        return device, False

    def is_cuda(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t in self.cuda_tensors

    def mark(self, out: Any) -> Any:
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.cuda_tensors[t] = True
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


MACHINE: Machine | None = None


def machine() -> Machine:
    if MACHINE is None:
        raise RuntimeError("the CUDA stand-ins are not installed")
    return MACHINE


# ----------------------------------------------------------------------------- CUDA memory on the CPU


class CudaOnCpu(TorchFunctionMode):
    """Tensors asked for on cuda:N are made on the CPU (after the ordinal check) and remembered; copies
    back to the host are new tensors; pinning a CUDA tensor fails as it does on a GPU machine."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        m = machine()
        args, kwargs = list(args), dict(kwargs or {})
        device = None  # the device argument, when the call has one
        if "device" in kwargs:
            device, kwargs["device"] = kwargs["device"], m.host(kwargs["device"])[0]
        if func is torch.Tensor.cuda:
            device = args.pop(1) if len(args) > 1 else kwargs.pop("device", None)
            kwargs.pop("non_blocking", None)
            device = torch.device("cuda", m.index(m.current_device() if device is None else device, True))
            args.append("cpu")
        elif func is torch.Tensor.cpu:
            device = "cpu"
        elif func is torch.Tensor.to and len(args) > 1:
            index = isinstance(args[1], int) and not isinstance(args[1], bool)
            if isinstance(args[1], (str, torch.device)) or index:
                device, args[1] = args[1], m.host(args[1])[0]
            elif isinstance(args[1], torch.Tensor):  # .to(other): other's device
                device = "cuda" if m.is_cuda(args[1]) else "cpu"
        elif func is torch.Tensor.pin_memory:
            if m.is_cuda(args[0]):
                raise RuntimeError(
                    f"cannot pin '{args[0].dtype}' CUDA tensor: only dense CPU tensors can be pinned"
                )
            m.record("pin_memory", shape=list(args[0].shape))
            return args[0]  # pinned: the stand-in's host memory is all alike
        elif func is torch.Tensor.is_pinned:
            return not m.is_cuda(args[0])
        out = func(*args, **kwargs)
        if device is None:  # .to(dtype) and everything else: CUDA where the input was (for .to)
            return m.mark(out) if func is torch.Tensor.to and m.is_cuda(args[0]) else out
        if m.host(device)[1]:
            return m.mark(out)
        if func in (torch.Tensor.to, torch.Tensor.cpu) and m.is_cuda(args[0]) and out is args[0]:
            return out.clone()  # a copy in host memory, as from a GPU
        return out


# ----------------------------------------------------------------------------- torch.cuda


class DeviceProperties:
    def __init__(self, index: int):
        self.name, self.total_memory, self.major, self.minor = NAME, TOTAL_MEMORY, 9, 0
        self.multi_processor_count, self.index = 132, index


class Event:
    """torch.cuda.Event: elapsed_time needs both events recorded and the end one completed."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self.time: float | None = None
        self.done = False
        machine().record("Event", enable_timing=enable_timing)

    def record(self, stream=None) -> None:
        self.time, self.done = time.perf_counter(), False
        machine().pending_events.append(self)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        if self.time is not None:
            self.done = True

    def wait(self, stream=None) -> None:
        pass

    def elapsed_time(self, end: Event) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.time is None or end.time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not end.done:
            raise RuntimeError("CUDA error: device not ready (the end event has not completed: synchronize)")
        return 1000.0 * (end.time - self.time)


class Stream:
    def __init__(self, device=None, priority: int = 0):
        self.device = torch.device("cuda", machine().index(device, optional=True))

    def synchronize(self) -> None:
        synchronize()

    def wait_stream(self, other) -> None:
        pass

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event


def is_available() -> bool:
    return True


def device_count() -> int:
    return machine().devices


def current_device() -> int:
    return machine().current_device()


def set_device(device) -> None:
    m = machine()
    index = torch._utils._get_device_index(device)  # torch's rule: a torch.device needs its index
    if index >= 0:
        m.check_ordinal(index)
        m.current = index
    m.record("set_device", device=device, index=index)


def synchronize(device=None) -> None:
    m = machine()
    index = m.index(device, optional=True) if device is not None else m.current_device()
    for event in m.pending_events:
        event.done = event.time is not None
    m.pending_events.clear()
    m.record("synchronize", index=index)


def get_device_properties(device=None) -> DeviceProperties:
    return DeviceProperties(machine().index(device, optional=True))


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_device_capability(device=None) -> tuple[int, int]:
    p = get_device_properties(device)
    return p.major, p.minor


def _memory(name: str):
    def stat(device=None) -> int:
        machine().index(device, optional=True)
        return 0

    stat.__name__ = name
    return stat


def reset_peak_memory_stats(device=None) -> None:
    machine().index(device, optional=True)


def mem_get_info(device=None) -> tuple[int, int]:
    machine().index(device, optional=True)
    return TOTAL_MEMORY, TOTAL_MEMORY


_RNG = torch.ByteTensor(16).zero_()


def get_rng_state(device="cuda") -> torch.Tensor:
    machine().index(device, optional=True)
    return _RNG.clone()


def set_rng_state(new_state: torch.Tensor, device="cuda") -> None:
    machine().index(device, optional=True)
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError(f"expected a torch.ByteTensor, but got {type(new_state).__name__}")


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(machine().devices)]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


class _DeviceContext:
    """torch.cuda.device(d): a context manager class (torch checks isinstance against it)."""

    def __init__(self, device):
        m = machine()
        self.idx = (
            -1 if device is None or (isinstance(device, int) and device < 0) else m.index(device, False)
        )
        self.prev = None

    def __enter__(self):
        m = machine()
        self.prev, m.current = m.current, (m.current if self.idx < 0 else self.idx)

    def __exit__(self, *exc):
        machine().current = self.prev
        return False


@contextlib.contextmanager
def _stream(stream):
    """torch.cuda.stream(s): work queued inside goes to `s`; here everything runs in order anyway."""
    if stream is not None and not isinstance(stream, Stream):
        raise TypeError(f"expected a torch.cuda.Stream, got {type(stream).__name__}")
    yield


TORCH_CUDA = {
    "is_available": is_available,
    "device_count": device_count,
    "current_device": current_device,
    "set_device": set_device,
    "synchronize": synchronize,
    "get_device_properties": get_device_properties,
    "get_device_name": get_device_name,
    "get_device_capability": get_device_capability,
    "is_bf16_supported": lambda including_emulation=True: True,
    "is_initialized": lambda: True,
    "init": lambda: None,
    "empty_cache": lambda: None,
    "memory_allocated": _memory("memory_allocated"),
    "max_memory_allocated": _memory("max_memory_allocated"),
    "memory_reserved": _memory("memory_reserved"),
    "max_memory_reserved": _memory("max_memory_reserved"),
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "mem_get_info": mem_get_info,
    "get_rng_state": get_rng_state,
    "set_rng_state": set_rng_state,
    "get_rng_state_all": get_rng_state_all,
    "set_rng_state_all": set_rng_state_all,
    "manual_seed": lambda seed: None,
    "manual_seed_all": lambda seed: None,
    "Event": Event,
    "Stream": Stream,
    "current_stream": lambda device=None: Stream(device),
    "device": _DeviceContext,
    "stream": _stream,
}


# ----------------------------------------------------------------------------- torch.distributed


def _process_groups() -> None:
    """nccl's checks, then a gloo group: init_process_group, DDP, FSDP2's device mesh."""
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh
    import torch.nn.parallel as parallel

    real_init, real_mesh, real_ddp = (
        dist.init_process_group,
        device_mesh.init_device_mesh,
        parallel.DistributedDataParallel,
    )

    def init_process_group(backend=None, *args, device_id=None, **kwargs):
        m = machine()
        if isinstance(device_id, int):
            device_id = torch.device("cuda", device_id)
        if device_id is not None and device_id.type == "cuda":
            if device_id.index is None:
                raise ValueError("Please use a device_id with index.")
            m.check_ordinal(device_id.index)
        nccl = backend == "nccl" or (backend is None and device_id is not None and device_id.type == "cuda")
        if nccl:
            if m.current is None and device_id is None:
                raise RuntimeError(
                    "nccl: this rank has not chosen its GPU (torch.cuda.set_device or device_id)"
                )
            backend, device_id = "gloo", None
        m.record(
            "init_process_group",
            backend="nccl" if nccl else backend,
            device=m.current,
            rank=os.environ.get("RANK"),
        )
        real_init(backend, *args, device_id=device_id, **kwargs)
        if nccl:
            _one_gpu_per_rank(m)

    def init_device_mesh(device_type, mesh_shape, *args, **kwargs):
        m = machine()
        if device_type == "cuda":
            if m.current is None:
                raise RuntimeError(
                    "a cuda device mesh needs this rank's GPU set first (torch.cuda.set_device)"
                )
            device_type = "cpu"
            m.record("init_device_mesh", device_type="cuda", shape=list(mesh_shape), device=m.current)
        return real_mesh(device_type, mesh_shape, *args, **kwargs)

    class DistributedDataParallel(real_ddp):
        def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
            m = machine()
            on_cuda = any(m.is_cuda(p) for p in module.parameters()) or device_ids is not None
            if on_cuda:
                if device_ids is None or len(device_ids) != 1:
                    raise ValueError(
                        "DistributedDataParallel device_ids and output_device arguments only work with "
                        f"single-device GPU modules, but got device_ids {device_ids}"
                    )
                index = m.index(device_ids[0], optional=True)  # torch: None means the current device
                if index != m.current_device():
                    raise RuntimeError(
                        f"DDP on cuda:{index} while this rank's device is cuda:{m.current_device()}"
                    )
                m.record("DistributedDataParallel", device_ids=list(device_ids))
            super().__init__(module, None, None, *args, **kwargs)

    dist.init_process_group = init_process_group
    device_mesh.init_device_mesh = init_device_mesh
    parallel.DistributedDataParallel = DistributedDataParallel
    torch.nn.parallel.distributed.DistributedDataParallel = DistributedDataParallel


def _one_gpu_per_rank(m: Machine) -> None:
    """Two ranks of one machine on one GPU hang or fail in nccl: refused here."""
    import torch.distributed as dist

    here = [(os.uname().nodename, m.current_device())]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, here)
    seen = [tuple(x[0]) for x in every]
    if len(set(seen)) != len(seen):
        raise RuntimeError(f"nccl: several ranks of one machine use the same GPU: {seen}")


# ----------------------------------------------------------------------------- install


class _Autocast(torch.autocast):
    """torch.autocast, recording each kind of CUDA autocast entered (device type and dtype) once."""

    def __enter__(self):
        m = machine()
        key = (self.device, str(self.fast_dtype))
        if self.device == "cuda" and key not in m.autocasts:
            m.autocasts.add(key)
            m.record("autocast", device_type=self.device, dtype=str(self.fast_dtype))
        return super().__enter__()


class _Generator(torch._C.Generator):
    def __new__(cls, device: Any = "cpu"):
        host, _ = machine().host(device)
        return torch._C.Generator(device=host)


def install(devices: int = 1, log: str | None = None) -> Machine:
    """Make this process a machine with `devices` stand-in GPUs (see the module's docstring)."""
    global MACHINE
    if MACHINE is not None:
        return MACHINE
    MACHINE = Machine(devices)
    for name, fn in TORCH_CUDA.items():
        setattr(torch.cuda, name, fn)
    torch.version.cuda = "12.8"
    import torch.utils._triton as triton

    triton.has_triton = lambda: False  # no Triton for a GPU here: the harness's fallbacks run
    torch.Generator = _Generator
    torch.autocast = _Autocast
    _process_groups()
    CudaOnCpu().__enter__()  # for the life of the process
    if log:
        rank = os.environ.get("RANK")
        path = Path(log if rank is None or os.environ.get("WORLD_SIZE", "1") == "1" else f"{log}.{rank}")
        atexit.register(lambda: _write(path))
    return MACHINE


def _write(path: Path) -> None:
    """The record, ending with the process's last CUDA settings."""
    m = machine()
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    m.record("exit", matmul_tf32=tf32[0], cudnn_tf32=tf32[1], current_device=m.current)
    path.write_text(json.dumps(m.calls, indent=1))


def main(argv: list[str]) -> None:
    """Install the stand-ins ($MARS_STANDIN_DEVICES GPUs, default 1; the record to $MARS_STANDIN_LOG), then
    run the entry point `argv` (a script and its arguments, or -m MODULE ...)."""
    install(int(os.environ.get("MARS_STANDIN_DEVICES", "1")), os.environ.get("MARS_STANDIN_LOG"))
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":  # run the layer as the module standin_cuda, not as __main__ (dynamo looks it up)
    import standin_cuda

    standin_cuda.main(sys.argv[1:])
