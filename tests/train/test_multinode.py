"""Two nodes on one machine (CPU, gloo): two torchrun agents started with the options of
docs/training.md (--nnodes=2, a c10d rendezvous, HOST = 127.0.0.1), each in a working dir of its own
as on two hosts. Marked slow.

The shared fixture launches the 2-node run once (one rank per node, so that the machine's 2 cores
run it) with a fault plugin (MARS_PLUGINS) that kills the agent of rank 1 with SIGKILL at the log of
step 3, the newest checkpoint being step 2; then it runs, on both nodes, the command the surviving
rank printed, as written. The tests read what the two launches left: the run against the same run in
one process, who wrote what, the one line, the resume. The HSDP test launches the documented fsdp
command once more with 2 ranks per node (train.fsdp_replicate=2: one replica per node, sharded over
the node's 2 ranks).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_e2e import TRAIN, assert_same_training, in_process, losses, norm_tolerance
from train_helpers import PYTHON, REPO, subprocess_env, tiny_overrides

from mars.checkpoint import latest_checkpoint, read_meta

pytestmark = [pytest.mark.slow, pytest.mark.extended]  # make test-all

DIST_TIMEOUT_MIN = 0.5  # train.dist_timeout_min of these runs: a lost rank must be noticed well within it

KILL_MY_AGENT = """
import os, signal, time
from mars.train.metrics import register_metric

_calls = 0


def _kill_my_agent(model, optimizer):  # on every rank: once before step 1 (the check), then at every log step
    global _calls
    _calls += 1
    if _calls == 1 + 3 and os.environ["RANK"] == "1":  # at the log of step 3
        os.kill(os.getppid(), signal.SIGKILL)  # this rank's torchrun agent
        time.sleep(120)  # the rank must die with its agent, not train on
    return 0.0


register_metric("fault/kill_my_agent", _kill_my_agent)
"""


def documented_command(start: str) -> list[str]:
    """The command of docs/training.md whose first line begins with `start` (continuations joined)."""
    text = (REPO / "docs" / "training.md").read_text(encoding="utf-8").replace("\\\n", " ")
    line = next(s for s in text.splitlines() if s.strip().startswith(start))
    return shlex.split(line)


def on_this_machine(command: list[str], port: int, nproc: int, overrides: list[str], run_dir: Path | None):
    """A documented torchrun command for two "nodes" on this machine: HOST = 127.0.0.1 on a free port,
    `nproc` ranks per node, a tiny run (`overrides`) in place of the experiment, `run_dir` in place of the
    shared dir (None: none given, rank 0 chooses)."""
    assert command[0] == "torchrun" and "train.py" in command, command
    split = command.index("train.py")
    options = [
        o.replace("HOST:29500", f"127.0.0.1:{port}") if o.startswith("--rdzv_endpoint=") else o
        for o in command[1:split]
    ]
    assert f"--rdzv_endpoint=127.0.0.1:{port}" in options and "--nnodes=2" in options, command
    options = [f"--nproc_per_node={nproc}" if o.startswith("--nproc_per_node=") else o for o in options]
    kept = [o for o in command[split + 1 :] if not o.startswith(("experiment=", "hydra.run.dir="))]
    where = [] if run_dir is None else [f"hydra.run.dir={run_dir}"]
    return [PYTHON, "-m", "torch.distributed.run", *options, TRAIN, *kept, *overrides, *where]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    """One agent's end: its working dir, exit status, when it ended (monotonic) and what it printed."""

    cwd: Path
    returncode: int
    ended: float
    out: str
    err: str


def run_nodes(
    command: list[str], cwds: list[Path], logs: Path, env: dict, timeout: float = 240
) -> list[Node]:
    """The same command in each working dir at once (one agent per "node"), until every agent ends."""
    logs.mkdir(parents=True, exist_ok=True)
    files = [(logs / f"{c.name}.out", logs / f"{c.name}.err") for c in cwds]
    procs = []
    for cwd, (out, err) in zip(cwds, files, strict=True):
        cwd.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as o, open(err, "w") as e:
            procs.append(subprocess.Popen(command, cwd=cwd, env=env, stdout=o, stderr=e))
    ended: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(ended) < len(procs):
            assert time.monotonic() < deadline, f"the agents did not end in {timeout} s; logs in {logs}"
            for i, p in enumerate(procs):
                if i not in ended and p.poll() is not None:
                    ended[i] = time.monotonic()
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [
        Node(cwd, p.returncode, ended[i], out.read_text(), err.read_text())
        for i, (cwd, p, (out, err)) in enumerate(zip(cwds, procs, files, strict=True))
    ]


def error_lines(node: Node) -> list[str]:
    return [s for s in (node.out + node.err).splitlines() if s.startswith("error: ")]


def records(run_dir: Path) -> list[dict]:
    return [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]


@dataclass
class TwoNodes:
    overrides: list[str]
    cwds: list[Path]
    killed: list[Node]  # the first launch: rank 1's agent killed after step 3
    before: list[dict]  # metrics.jsonl as the first launch left it
    run_dir: Path
    resume_line: str
    resumed: list[Node]  # the printed command, run as written on both nodes
    one: Path  # the same run in one process


@pytest.fixture(scope="module")
def two_nodes(data_root, tmp_path_factory) -> TwoNodes:
    root = tmp_path_factory.mktemp("two_nodes")
    overrides = tiny_overrides(
        data_root, batch_size=1, global_batch_size=4, eval_steps=4, ckpt_interval=2,
        dist_timeout_min=DIST_TIMEOUT_MIN,
    )  # fmt: skip
    plugins = root / "plugins"
    plugins.mkdir()
    (plugins / "kill_my_agent.py").write_text(KILL_MY_AGENT)
    env = subprocess_env()
    faulty = {
        **env,
        "MARS_PLUGINS": "kill_my_agent",
        "PYTHONPATH": f"{plugins}{os.pathsep}{env['PYTHONPATH']}",
    }
    cwds = [root / "node0", root / "node1"]
    # no hydra.run.dir: rank 0 chooses outputs/DATE/TIME in its own working dir, and every rank uses it
    first = on_this_machine(
        documented_command("torchrun --nnodes=2 --nproc_per_node=8 --rdzv_id=owt-small-mars"),
        free_port(), 1, overrides, None,
    )  # fmt: skip
    killed = run_nodes(first, cwds, root / "logs_first", faulty)
    found = [d for c in cwds for d in c.glob("outputs/*/*")]
    assert len(found) == 1, (found, [n.err[-3000:] for n in killed])
    run_dir = found[0]
    before = records(run_dir)
    lines = [s for n in killed for s in error_lines(n)]
    assert len(lines) == 1 and "continue with: " in lines[0], [n.err[-3000:] for n in killed]
    command = shlex.split(lines[0].split("continue with: ", 1)[1])
    assert command[0] == "torchrun", lines[0]
    resumed = run_nodes(
        [PYTHON, "-m", "torch.distributed.run", *command[1:]], cwds, root / "logs_resume", env
    )
    one = in_process(overrides, root / "one_process")
    return TwoNodes(overrides, cwds, killed, before, run_dir, lines[0], resumed, one)


def test_two_nodes_train_as_one_process(two_nodes):
    """Before the kill (steps 1-3) and after the resume (1-4): loss and grad_norm per step, val loss and
    final weights equal one process's (the tolerances of test_e2e: float32 rounding of another order)."""
    one = losses(two_nodes.one)
    before = {r["step"]: r for r in two_nodes.before if "train/loss" in r}
    assert sorted(before) == [1, 2, 3]
    for step, r in before.items():
        assert abs(r["train/loss"] - one[step]) < 1e-4, (step, r["train/loss"], one[step])
    norms = losses(two_nodes.one, "grad_norm")
    for step, r in before.items():
        assert abs(r["grad_norm"] - norms[step]) <= norm_tolerance(step) * norms[step], (step, r["grad_norm"])
    got = losses(two_nodes.run_dir)
    assert sorted(got) == [1, 2, 3, 4]
    for step, loss in got.items():
        assert abs(loss - one[step]) < 1e-4, (step, loss, one[step])
    for step, val in losses(two_nodes.one, "val/loss").items():
        assert abs(losses(two_nodes.run_dir, "val/loss")[step] - val) < 1e-4, step
    assert_same_training(two_nodes.run_dir, two_nodes.one, label="2 nodes")


def test_rank_0_alone_writes_and_holds_the_run_dir(two_nodes):
    """One writer: the node of rank 0 holds the run dir; the other node's agent and rank wrote nothing of
    their own (no outputs/, no .hydra/, no train.log, no outcome.json), and there is one lock, in the run
    dir."""
    writer = next(c for c in two_nodes.cwds if two_nodes.run_dir.is_relative_to(c))
    other = next(c for c in two_nodes.cwds if c != writer)
    assert list(other.iterdir()) == []
    assert [p.name for p in writer.iterdir()] == ["outputs"]
    assert sorted(p.name for p in two_nodes.run_dir.iterdir()) == [
        ".hydra", ".run.lock", "ckpt", "metrics.jsonl", "outcome.json", "train.log",
    ]  # fmt: skip
    root = writer.parent
    assert [p for p in root.rglob(".run.lock")] == [two_nodes.run_dir / ".run.lock"]
    assert [p for p in root.rglob(".hydra")] == [two_nodes.run_dir / ".hydra"]
    log = (two_nodes.run_dir / "train.log").read_text()
    assert log.count(f"run dir: {two_nodes.run_dir}  (world size 2") == 2  # both launches, one dir


def test_killing_one_agent_stops_the_other_ranks_with_one_line(two_nodes):
    """The killed agent's rank dies with it (it would sleep 120 s otherwise); the other node's rank
    notices at its next collective, well within train.dist_timeout_min, and says so in one line naming
    the newest checkpoint and the command that continues the run; no traceback of a rank."""
    killed = next(n for n in two_nodes.killed if n.returncode == -signal.SIGKILL)
    survivor = next(n for n in two_nodes.killed if n is not killed)
    assert survivor.returncode == 1, survivor.err[-3000:]
    assert survivor.ended - killed.ended < DIST_TIMEOUT_MIN * 60, (killed.ended, survivor.ended)
    assert error_lines(killed) == [] and len(error_lines(survivor)) == 1, survivor.err[-3000:]
    line = error_lines(survivor)[0]
    assert line.startswith("error: rank 0 lost contact with another rank after step 3 ("), line
    assert "its newest checkpoint is step_00000002: continue with: torchrun --nnodes=2" in line, line
    lost = line.split(" (", 1)[1].split("): ", 1)[0]  # gloo's words, e.g. "Connection closed by peer ..."
    assert "Error executing job" not in survivor.err and lost not in survivor.err.replace(line, "")
    # (the rank's exception is in its one line only; the rest of stderr is the agent's own report)
    assert latest_checkpoint(two_nodes.run_dir / "ckpt").name == "step_00000004"  # (after the resume)


def test_the_printed_command_resumes_the_run_exactly(two_nodes):
    """The command of the one line, run as written on both nodes, continues from step 2: step 3 is
    computed again to the same bits, each step is logged once, and the run ends at train.max_steps."""
    command = two_nodes.resume_line.split("continue with: ", 1)[1]
    port = command.split("--rdzv_endpoint=127.0.0.1:", 1)[1].split()[0]
    assert command.startswith(
        f"torchrun --nnodes=2 --nproc_per_node=1 --rdzv_id=owt-small-mars --rdzv_backend=c10d "
        f"--rdzv_endpoint=127.0.0.1:{port} {TRAIN} "
    ), command  # the agent's own options: the rendezvous included
    assert command.endswith(f"train.resume=auto hydra.run.dir={two_nodes.run_dir}"), command
    assert [n.returncode for n in two_nodes.resumed] == [0, 0], [n.err[-3000:] for n in two_nodes.resumed]
    after = records(two_nodes.run_dir)
    steps = [r["step"] for r in after if "train/loss" in r]
    assert steps == [1, 2, 3, 4]
    before = {r["step"]: r for r in two_nodes.before if "train/loss" in r}
    again = {r["step"]: r for r in after if "train/loss" in r}
    for step in (1, 2, 3):
        assert again[step]["train/loss"] == before[step]["train/loss"], step
        assert again[step]["grad_norm"] == before[step]["grad_norm"], step
    assert "continuing from" in (two_nodes.run_dir / "train.log").read_text()
    meta = read_meta(latest_checkpoint(two_nodes.run_dir / "ckpt"))
    assert meta["step"] == 4 and meta["world_size"] == 2


def test_hsdp_one_replica_per_node_equals_one_process(two_nodes, tmp_path):
    """The documented multi-node fsdp command (train.fsdp_replicate=2), 2 ranks per node: each node
    holds one replica sharded over its 2 ranks; the run equals one process's."""
    run_dir = tmp_path / "shared" / "xl"
    command = on_this_machine(
        documented_command("torchrun --nnodes=2 --nproc_per_node=8 --rdzv_id=xl"),
        free_port(), 2, two_nodes.overrides, run_dir,
    )  # fmt: skip
    assert "train.parallel=fsdp" in command and "train.fsdp_replicate=2" in command
    nodes = run_nodes(command, [tmp_path / "node0", tmp_path / "node1"], tmp_path / "logs", subprocess_env())
    assert [n.returncode for n in nodes] == [0, 0], [n.err[-3000:] for n in nodes]
    one, got = losses(two_nodes.one), losses(run_dir)
    assert sorted(got) == [1, 2, 3, 4]
    for step, loss in got.items():
        assert abs(loss - one[step]) < 1e-4, (step, loss, one[step])
    assert_same_training(run_dir, two_nodes.one, label="hsdp 2x2")
    step_dir = latest_checkpoint(run_dir / "ckpt")
    meta = read_meta(step_dir)
    assert meta["format"] == "sharded" and meta["world_size"] == 4
    assert sorted(p.name for p in (step_dir / "sharded").glob("*.distcp")) == [
        f"__{r}_0.distcp" for r in range(4)
    ]
