"""The stand-ins fail where torch fails on a GPU machine (and pass where it passes): each rule checked in a
process of its own with the stand-ins installed (they change torch for the life of the process)."""

from __future__ import annotations

import json
import subprocess
import sys

from standin_helpers import STANDIN, env

CHECKS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
import standin_cuda

torch_message = None
try:  # torch's own rule, before the stand-ins replace anything
    torch._utils._get_device_index(torch.device("cuda"))
except ValueError as e:
    torch_message = str(e)
m = standin_cuda.install(devices=2)
out = {}

def outcome(name, fn):
    try:
        value = fn()
        out[name] = ["ok", None if value is None else str(value)]
    except Exception as e:
        out[name] = [type(e).__name__, str(e).splitlines()[0]]

outcome("set_device(cuda)", lambda: torch.cuda.set_device(torch.device("cuda")))
outcome("set_device(cuda:1)", lambda: torch.cuda.set_device(torch.device("cuda:1")))
outcome("current_device", torch.cuda.current_device)
outcome("set_device(5)", lambda: torch.cuda.set_device(5))
outcome("empty(cuda:3)", lambda: torch.empty(2, device="cuda:3"))
outcome("empty(cuda)", lambda: torch.empty(2, device="cuda").shape)
x = torch.ones(3).to("cuda:0", non_blocking=True)
outcome("pin a cuda tensor", lambda: x.pin_memory())
outcome("pin a cpu tensor", lambda: torch.ones(3).pin_memory().shape)
outcome("pin a moved-back tensor", lambda: x.cpu().pin_memory().shape)
outcome("pin a tensor moved by .to(cpu)", lambda: x.to("cpu").pin_memory().shape)
outcome("pin a cuda tensor cast by .to(dtype)", lambda: x.to(torch.float64).pin_memory())
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
outcome("elapsed before record", lambda: start.elapsed_time(end))
start.record(); end.record()
outcome("elapsed before sync", lambda: start.elapsed_time(end))
torch.cuda.synchronize()
outcome("elapsed after sync", lambda: start.elapsed_time(end) >= 0)
untimed = torch.cuda.Event()
untimed.record()
outcome("elapsed untimed", lambda: untimed.elapsed_time(end))
outcome("rng states for 3 of 2 gpus", lambda: torch.cuda.set_rng_state_all([torch.cuda.get_rng_state()] * 3))
outcome("rng states round trip", lambda: torch.cuda.set_rng_state_all(torch.cuda.get_rng_state_all()))
outcome("synchronize(cuda)", lambda: torch.cuda.synchronize("cuda"))
outcome("synchronize(cuda:2)", lambda: torch.cuda.synchronize("cuda:2"))
outcome("max_memory_allocated(cuda)", lambda: torch.cuda.max_memory_allocated(torch.device("cuda")))
outcome("device name", lambda: torch.cuda.get_device_name(0))
outcome("generator", lambda: torch.Generator(device="cuda:1").manual_seed(1).initial_seed())
outcome("generator(cuda:4)", lambda: torch.Generator(device="cuda:4"))
import torch.distributed as dist
nccl = dict(device_id=torch.device("cuda"), rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
outcome("nccl device_id without index", lambda: dist.init_process_group("nccl", **nccl))
print(json.dumps({"torch": torch_message, "out": out}))
"""


def test_each_stand_in_fails_where_torch_fails(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", CHECKS, str(STANDIN.parent)],
        env=env(2, tmp_path / "log.json"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    out = result["out"]
    # a device without its index: torch's own rule and message
    assert out["set_device(cuda)"] == ["ValueError", result["torch"]]
    assert out["set_device(cuda:1)"] == ["ok", None] and out["current_device"] == ["ok", "1"]
    for bad in ("set_device(5)", "empty(cuda:3)", "synchronize(cuda:2)", "generator(cuda:4)"):
        assert out[bad][0] == "RuntimeError" and "invalid device ordinal" in out[bad][1], (bad, out[bad])
    assert out["empty(cuda)"] == ["ok", "torch.Size([2])"]  # the current device
    assert (
        out["pin a cuda tensor"][0] == "RuntimeError"
        and "only dense CPU tensors" in out["pin a cuda tensor"][1]
    )
    assert out["pin a cpu tensor"][0] == out["pin a moved-back tensor"][0] == "ok"
    assert out["pin a tensor moved by .to(cpu)"][0] == "ok"
    assert out["pin a cuda tensor cast by .to(dtype)"][0] == "RuntimeError"
    assert out["elapsed before record"][0] == "RuntimeError"
    assert out["elapsed before sync"][0] == "RuntimeError" and "not ready" in out["elapsed before sync"][1]
    assert out["elapsed after sync"] == ["ok", "True"]
    assert out["elapsed untimed"][0] == "RuntimeError" and "enable_timing" in out["elapsed untimed"][1]
    assert out["rng states for 3 of 2 gpus"][0] == "RuntimeError"
    assert out["rng states round trip"] == ["ok", None]
    assert out["synchronize(cuda)"] == ["ok", None] and out["max_memory_allocated(cuda)"] == ["ok", "0"]
    assert out["device name"] == ["ok", "NVIDIA H200 (stand-in)"]
    assert out["generator"] == ["ok", "1"]
    # torch.distributed's own message (init_process_group's device_id check)
    assert out["nccl device_id without index"] == ["ValueError", "Please use a device_id with index."]
