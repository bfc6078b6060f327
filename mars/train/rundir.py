"""The run directory before training starts: who owns it, what it holds, and where this run begins.

Rules (checked on rank 0 before any data is read or a process group exists):
  * a run holds its run dir for its lifetime (mars.train.runlock): a second run started in it, a
    `train.resume=auto` of it while it is live, is refused in one line naming the process that holds it;
  * a new run (no train.resume) refuses a run dir that already holds a run (checkpoints or
    metrics.jsonl): resume it, or choose another hydra.run.dir; train.overwrite=true moves the old run
    (its checkpoints, metrics, lineage and outcome.json, with its .hydra/ and train.log) aside into
    RUN_DIR/replaced-<time>/ instead (nothing is deleted, nothing is mixed). Both happen before Hydra
    writes into the run dir (`claim`; for the job dirs of a -m sweep, `claim_sweep`, which first takes
    the lock of every job dir: a live run in one refuses the sweep before anything of any job is moved);
  * train.resume=auto continues the newest usable, healthy checkpoint of the run dir: a newer one that
    fails verification (truncated, corrupt, a checksum mismatch, non-finite weights) or that meta.json
    marks unhealthy (saved within train.health_window steps of a divergence alarm) is moved aside, and
    the log says which one it continues. A preempted run always continues: when the newest usable
    checkpoint is the one saved at a SIGTERM / Ctrl-C (meta.json "preempted"), it is continued even if
    unhealthy, since the signal stopped the run, not its divergence (a divergence stop withdraws that).
    With no checkpoint at all the run starts fresh (a metrics.jsonl of a run that never reached a
    checkpoint is moved aside); with checkpoints but none usable and healthy (every one damaged or
    unhealthy) it refuses, naming each one and why, and nothing is moved;
  * train.resume=PATH continues exactly that checkpoint (no fallback); checkpoints of this run dir
    newer than it are moved aside, so that later saves and resume=auto never mix the two histories;
  * a checkpoint beyond train.max_steps is refused; one at train.max_steps has nothing left to train;
  * in every resume, the config may only change what mars.train.resume allows;
  * train.fork_from starts a new run (the rules of a new run above) from another run's checkpoint, and
    with train.resume=auto a run dir that has checkpoints of its own continues them instead: a requeued
    fork continues itself (mars.train.forks).
Every check comes before anything is moved.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import mars.checkpoint as ckpt
from mars.checkpoint.lineage import LINEAGE_FILE
from mars.checks import get
from mars.entry import hydra_value
from mars.errors import ConfigError
from mars.files import nearest_existing, try_create_dir_in
from mars.train import runlock
from mars.train.forks import NO_PATH, check_fork, check_init, given, source_checkpoint
from mars.train.metrics import METRICS_FILE
from mars.train.outcome import OUTCOME_FILE
from mars.train.resume import check_resume_config

log = logging.getLogger("mars.train")

# what a run leaves in its run dir, moved aside together (train.overwrite=true, a fresh start): an
# outcome.json left behind would speak for the next run (a killed run reading "completed", or a
# divergence refusing the next run's resume=auto)
ARTIFACTS = (ckpt.CKPT_DIR, METRICS_FILE, "wandb", LINEAGE_FILE, OUTCOME_FILE)
HYDRA_FILES = (".hydra", "train.log")  # what Hydra writes into a run dir (job name "train")
NO_RESUME = (None, "", "none", "null")

_notes: list[str] = []  # said before Hydra's logging exists; logged by flush_notes()


def flush_notes() -> None:
    for note in _notes:
        log.info(note)
    _notes.clear()


def check_writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-test-"):
            pass
    except OSError as e:
        raise ConfigError(
            f"run dir {run_dir} is not writable ({e.strerror or e}); choose another hydra.run.dir"
        ) from None


def holds_a_run(run_dir: Path) -> list[str]:
    """What in run_dir belongs to an earlier run (empty when it is fresh)."""
    found = []
    root = run_dir / ckpt.CKPT_DIR
    if root.is_dir() and any(root.iterdir()):
        n = len(ckpt.list_checkpoints(root))
        found.append(f"{ckpt.CKPT_DIR}/ ({n} checkpoint{'s' if n != 1 else ''})")
    metrics = run_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(METRICS_FILE)
    return found


def _move_aside(run_dir: Path, paths: list[Path], why: str) -> str | None:
    dest = ckpt.move_aside(run_dir, paths)
    if dest is None:
        return None
    note = f"{why}: moved {', '.join(p.name for p in paths if not p.exists())} to {dest}"
    log.info(note)
    return note


def _refuse_or_overwrite(run_dir: Path, overwrite: bool) -> bool:
    """True when run_dir holds a run that train.overwrite=true lets this run move aside."""
    earlier = holds_a_run(run_dir)
    if not earlier:
        return False
    if not overwrite:
        raise ConfigError(
            f"run dir {run_dir} already holds a run ({', '.join(earlier)}): continue it with "
            f"train.resume=auto, or choose another hydra.run.dir (train.overwrite=true moves the old run "
            "aside and starts a new one)"
        )
    return True


def claim(cfg, run_dir: Path) -> None:
    """Before Hydra writes into run_dir (rank 0, its lock held): a new run in a run dir that holds one is
    refused, or (train.overwrite=true) the old run is moved aside together with Hydra's files."""
    t = cfg.train
    if t.resume not in NO_RESUME or not _refuse_or_overwrite(run_dir, t.overwrite):
        return
    _move_run_aside(run_dir)


def _move_run_aside(run_dir: Path) -> None:
    dest = ckpt.move_aside(run_dir, [run_dir / a for a in (*ARTIFACTS, *HYDRA_FILES)])
    if dest is not None:
        _notes.append(f"train.overwrite=true: moved the earlier run to {dest}")


def claim_sweep(
    cfgs: list, sweep_dir: Path, job_dirs: list[Path | None], keep: ExitStack | None = None
) -> None:
    """`claim` for a -m sweep (its sweep dir held), before Hydra writes a job dir: `cfgs` and `job_dirs`
    are the jobs' configs and run dirs (None: known only once the job runs). Earlier runs in the sweep
    dir (in a job dir of this sweep, or in a sub dir of an earlier sweep) are refused when a job starts
    fresh, unless a job of this sweep resumes the run; with train.overwrite=true they are moved aside.
    Before anything is moved, the lock of every job dir that exists and of every run to move is taken:
    a live run in any of them refuses the whole sweep, and nothing of any job is moved. `keep`: the
    jobs run in this process, which holds those locks (and the other job dirs') until `keep` closes;
    otherwise they are released here and each job takes its own."""
    sweep_dir = sweep_dir.resolve()
    jobs = {d.resolve(): c for c, d in zip(cfgs, job_dirs, strict=True) if d is not None}  # dir -> config
    resumed = {d for d, c in jobs.items() if c.train.resume not in NO_RESUME}
    earlier = {d.resolve() for d in sweep_dir.iterdir() if d.is_dir() and holds_a_run(d)}
    earlier |= {d for d in jobs if d not in resumed and d.is_dir() and holds_a_run(d)}
    fresh = [c for c in cfgs if c.train.resume in NO_RESUME]
    in_the_way = sorted(earlier - resumed) if fresh else []
    if in_the_way and any(not c.train.overwrite for c in fresh):
        names = ", ".join(f"{_relative(d, sweep_dir)}/" for d in in_the_way[:5])
        raise ConfigError(
            f"hydra.sweep.dir={sweep_dir} already holds runs ({names}{' ...' if len(in_the_way) > 5 else ''}"
            "): continue the sweep with train.resume=auto, or choose another hydra.sweep.dir "
            "(train.overwrite=true moves each old run aside)"
        )
    with ExitStack() as held:
        for run_dir in sorted({*in_the_way, *(d for d in jobs if d.is_dir())}):
            try:
                held.enter_context(runlock.hold(run_dir, "hydra.sweep.subdir"))
            except runlock.RunDirBusyError as e:
                raise runlock.RunDirBusyError(
                    f"hydra.sweep.dir={sweep_dir}: its job dir {_relative(run_dir, sweep_dir)}/ is in use by "
                    f"a live run ({e.holder}); nothing was moved or written: wait for that run to end, or "
                    "choose another hydra.sweep.dir",
                    e.holder,
                ) from None
        if keep is not None:  # the job dirs not made yet too: from now on nobody else can start one
            for run_dir in jobs:
                held.enter_context(runlock.hold(run_dir, "hydra.sweep.subdir"))
        for run_dir in in_the_way:  # every check has passed
            _move_run_aside(run_dir)
        if keep is not None:
            keep.enter_context(held.pop_all())


def _relative(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _fresh_start(run_dir: Path, overwrite: bool) -> None:
    if _refuse_or_overwrite(run_dir, overwrite):
        _move_aside(run_dir, [run_dir / a for a in ARTIFACTS], "train.overwrite=true")


def _usable(step_dir: Path) -> str | None:
    """None when the checkpoint verifies, else the reason it cannot be used."""
    try:
        ckpt.verify_checkpoint(step_dir)
    except ckpt.CheckpointError as e:
        return str(e)
    return None


def _newer_than(run_dir: Path, step_dir: Path) -> list[Path]:
    root = (run_dir / ckpt.CKPT_DIR).resolve()
    if step_dir.resolve().parent != root:
        return []
    return [p for p in ckpt.list_checkpoints(root) if p.name > step_dir.name]


def _auto(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]], list[Path]]:
    """resume=auto's choice: (newest usable healthy checkpoint, or the newest usable one when a signal
    stopped the run there; unusable ones with the reason; unhealthy ones), looking from the newest down.
    Nothing is moved here."""
    chosen, rejected, unhealthy = None, [], []
    for step_dir in reversed(ckpt.list_checkpoints(run_dir / ckpt.CKPT_DIR)):
        try:
            meta = ckpt.read_meta(step_dir)
        except ckpt.CheckpointError as e:
            rejected.append((step_dir, str(e)))
            continue
        preempted_here = bool(meta.get("preempted")) and not unhealthy  # no later unhealthy one
        if not meta.get("healthy", True) and not preempted_here:
            unhealthy.append(step_dir)
            continue
        reason = _usable(step_dir)
        if reason is None:
            chosen = step_dir
            break
        rejected.append((step_dir, reason))
    return chosen, rejected, unhealthy


def choose_start(cfg, run_dir: Path, world_size: int) -> Path | None:
    """The checkpoint this run continues (None: a fresh start), after every check; see the module doc."""
    t = cfg.train
    check_writable(run_dir)
    resume = t.resume
    if resume in NO_RESUME:
        _fresh_start(run_dir, t.overwrite)
        return _fork_point(t)
    here = (run_dir / ckpt.CKPT_DIR).resolve()
    skipped: list[str] = []  # log lines of resume=auto, said once every check has passed
    if resume == "auto":
        _refuse_replaying_a_divergence(cfg, run_dir)
        chosen, rejected, unhealthy = _auto(run_dir)
        if chosen is None and (rejected or unhealthy):
            raise ckpt.CheckpointError(_nothing_to_continue(here, rejected, unhealthy))
        skipped = [f"train.resume=auto: skipping {p}: {reason}" for p, reason in rejected] + [
            f"train.resume=auto: skipping {p}: marked unhealthy in its meta.json (saved within "
            "train.health_window steps of a divergence alarm)"
            for p in unhealthy
        ]
        if chosen is None:
            fork = _fork_point(t)
            how = f"starting the fork from {fork}" if fork else "starting from scratch"
            log.info(
                f"train.resume=auto: no checkpoint in {run_dir / ckpt.CKPT_DIR}, {how} "
                "(to continue an earlier run, also pass hydra.run.dir=THAT_RUN_DIR)"
            )
            _move_aside(run_dir, [run_dir / a for a in ARTIFACTS], how)
            return fork
        aside = sorted([p for p, _ in rejected] + unhealthy)
    else:
        chosen = ckpt.resolve_checkpoint(Path(resume).expanduser())
        if chosen is None:
            raise ConfigError(
                f"train.resume={resume}: no complete checkpoint there; give a run dir, its ckpt/ folder "
                "or a ckpt/step_XXXXXXXX folder (or train.resume=auto)"
            )
        ckpt.verify_checkpoint(chosen)
        aside = _newer_than(run_dir, chosen)
        if chosen.resolve().parent != here:
            _refuse_or_overwrite(run_dir, t.overwrite)  # continuing another run's checkpoint in this run dir
    meta = ckpt.read_meta(chosen)
    check_resume_config(chosen, ckpt.read_run_config(chosen), cfg, meta.get("world_size"), world_size)
    ckpt.check_model_shape(chosen, cfg.model)
    if meta["step"] > t.max_steps:
        raise ckpt.CheckpointError(
            f"train.max_steps={t.max_steps} is below the step of {chosen} ({meta['step']}): the run is "
            f"already past it; raise train.max_steps above {meta['step']} to train on from it, or "
            "evaluate or export it as it is"
        )
    # every check passed: only now is anything moved
    for line in skipped:
        log.warning(line)
    if aside:
        _move_aside(run_dir, aside, f"continuing from {chosen.name}")
    elif chosen.resolve().parent != here:
        _fresh_start(run_dir, t.overwrite)
    if resume == "auto":
        log.info(f"train.resume=auto: continuing from {chosen} (step {meta['step']})")
        if not meta.get("healthy", True):
            log.warning(
                f"{chosen} is marked unhealthy (saved within train.health_window steps of a divergence "
                "alarm), and continued because the run was stopped there by a signal, not by divergence; "
                "the divergence checks go on (to go back to an earlier checkpoint instead: "
                "train.resume=PATH, with a lower optimizer.lr)"
            )
    elif not meta.get("healthy", True):
        log.warning(
            f"{chosen} is marked unhealthy (saved just after a divergence alarm); continuing it as asked"
        )
    return chosen


def _refuse_replaying_a_divergence(cfg, run_dir: Path) -> None:
    """train.resume=auto in a run dir whose last attempt stopped for divergence (outcome.json) under the
    same settings: an exact resume would replay the same steps into the same divergence, and a job
    script that requeues on any failure would loop. Refused as that divergence (exit 1, outcome.json
    "diverged" again, so a study ranks the trial as it did), with the stop's advice."""
    from mars.train.outcome import OUTCOME_FILE, TrainingDivergedError, read_outcome, settings_digest

    last = read_outcome(run_dir)
    if last is None or last["status"] != "diverged" or last.get("settings") is None:
        return
    settings = settings_digest(cfg)
    if last["settings"] != settings:
        return  # something changed (a lower lr, another seed, other health limits): try it
    said = "The stop said: "
    stop = str(last["message"]).split(said)[-1]  # the stop's own line, also after a refusal like this one
    raise TrainingDivergedError(
        f"train.resume=auto: this run stopped for divergence under these same settings "
        f"({run_dir / OUTCOME_FILE}); resumed, it would replay the same steps into it again, so change a "
        f"setting or name a checkpoint with train.resume=PATH. {said}{stop}",
        settings,
    )


def _fork_point(t) -> Path | None:
    """The checkpoint a new run forks from (train.fork_from; checked by mars.train.forks.check_fork
    before the run dir was made), or None."""
    return source_checkpoint("train.fork_from", t.fork_from) if given(t.fork_from) else None


def _nothing_to_continue(here: Path, rejected: list[tuple[Path, str]], unhealthy: list[Path]) -> str:
    """resume=auto's refusal when checkpoints exist but none can be continued: each one and why, and the
    fixes. Starting over is never automatic: it would move the run's checkpoints aside."""
    if not rejected:
        names = ", ".join(p.name for p in unhealthy)
        return (
            f"train.resume=auto: every usable checkpoint in {here} is marked unhealthy (saved within "
            f"train.health_window steps of a divergence alarm, and the run was not stopped there by a "
            f"signal: {names}); continue one anyway with train.resume={unhealthy[0]} (with a lower "
            "optimizer.lr), or start the run again: without train.resume, with train.overwrite=true (which "
            "moves this run aside)"
        )
    found = [reason for _, reason in rejected] + [  # each reason names its file
        f"{p.name}: marked unhealthy (saved within train.health_window steps of a divergence alarm)"
        for p in unhealthy
    ]
    anyway = f"continue an unhealthy one anyway with train.resume={unhealthy[0]}, " if unhealthy else ""
    return (
        f"train.resume=auto: no checkpoint in {here} can be continued ({'; '.join(found)}); put back a good "
        f"copy of one (e.g. from a backup), {anyway}or start the run again: without train.resume, with "
        "train.overwrite=true (which moves this run aside)"
    )


def check_output_dir_writable(path_text: str, key: str) -> None:
    """Before Hydra creates the run dir: a directory can be made where it goes (tried: try_create_dir_in)."""
    literal = path_text.split("${", 1)[0] or "."
    target = Path(literal).expanduser()
    base = nearest_existing(target if target.is_absolute() else Path.cwd() / target)
    try:
        try_create_dir_in(base)
    except NotADirectoryError:
        message = f"{key}={path_text}: {base} is a file, not a directory; choose another {key}"
        raise ConfigError(message) from None
    except OSError as e:
        raise ConfigError(
            f"{key}={path_text}: cannot create directories in {base} ({e.strerror or e}); "
            f"choose another {key}"
        ) from None


# ----------------------------------------------------------------------------- the command that continues


def _override_key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def recorded_overrides(run_dir: Path) -> list[str]:
    """The command-line overrides of the run in run_dir, as Hydra recorded them (.hydra/overrides.yaml)."""
    import yaml

    try:
        data = yaml.safe_load((Path(run_dir) / ".hydra" / "overrides.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return []
    return [str(o) for o in data] if isinstance(data, list) else []


def _launcher(world_size: int) -> list[str]:
    """How this process was started, as the start of a command line (`python train.py`, torchrun ...)."""
    argv0 = sys.argv[0] if sys.argv else ""
    name = os.path.basename(argv0)
    module = name == "__main__.py" and Path(argv0).parent.name == "train"
    if module:
        target = ["-m", "mars.train"]
    elif name.endswith(".py") and name != "__main__.py" and "SUBMITIT_EXECUTOR" not in os.environ:
        target = [argv0]  # (a submitit job runs submitit's own script: then train.py below)
    else:
        target = ["train.py"]
    if world_size > 1:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if local != world_size:  # several nodes: the agent's own rendezvous options, as typed on this node
            from mars.train.distributed import agent_options

            typed = agent_options()
            if typed:
                return ["torchrun", *typed]
        nodes = [f"--nnodes={world_size // local}"] if local != world_size else []
        return ["torchrun", *nodes, f"--nproc_per_node={local}", *target]
    if name == "mars-train":
        return ["mars-train"]
    return ["python", *target]


def resume_command(
    run_dir: str | os.PathLike, world_size: int | None = None, resume: str | None = "auto", **changes
) -> str:
    """The command line that continues the run in run_dir: this run's own overrides (from .hydra/),
    train.resume=`resume` (None: none), `changes` (dotted keys as `optimizer__lr`), hydra.run.dir."""
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    updates = {"train.resume": resume} if resume is not None else {}
    updates.update({k.replace("__", "."): v for k, v in changes.items()})
    updates["hydra.run.dir"] = str(Path(run_dir).absolute())
    drop = {*updates, "train.resume", "train.overwrite"}
    kept = [
        o
        for o in recorded_overrides(Path(run_dir))
        if _override_key(o) not in drop and not _override_key(o).startswith("launch.")
    ]
    args = kept + [f"{k}={hydra_value(v)}" for k, v in updates.items()]
    return " ".join([*_launcher(world_size), *(shlex.quote(a) for a in args)])


def check_source(cfg: Any, run_dir: Path | None, world_size: int) -> None:
    """Before Hydra writes the run dir (rank 0): the source train.fork_from or train.init_from names (or
    train.resume=PATH, when it names another run dir's checkpoint: a fork of it) can start this run, and
    does not lie in the run dir that train.overwrite=true would move aside first. Skipped where
    train.resume=auto will continue the run dir's own checkpoints."""
    t = cfg.train
    resume_path = t.resume not in (*NO_PATH, "auto")
    if not (given(t.fork_from) or given(t.init_from) or resume_path):
        return
    if t.resume == "auto" and run_dir is not None and ckpt.list_checkpoints(Path(run_dir) / ckpt.CKPT_DIR):
        return
    key = next(k for k in ("train.fork_from", "train.init_from", "train.resume") if given(get(cfg, k)))
    source = Path(str(get(cfg, key))).expanduser()
    if key == "train.resume":
        step_dir = ckpt.resolve_checkpoint(source)
        if step_dir is None or run_dir is None or step_dir.resolve().parent.parent == Path(run_dir).resolve():
            return  # this run dir's own checkpoint (mars.train.rundir.choose_start), or none (refused there)
        check_fork(cfg, world_size, key)
        return
    _refuse_own_source(cfg, key, source, run_dir)
    if key == "train.fork_from":
        check_fork(cfg, world_size)
    else:
        check_init(cfg)


def _refuse_own_source(cfg: Any, key: str, source: Path, run_dir: Path | None) -> None:
    """A source inside the run dir whose run train.overwrite=true moves aside before this run starts:
    the run would move its own source away (its parent with it), then fail to find it."""
    if run_dir is None or not cfg.train.overwrite or not holds_a_run(Path(run_dir)):
        return
    if source.resolve().is_relative_to(Path(run_dir).resolve()):
        raise ConfigError(
            f"{key}={source} lies in hydra.run.dir={run_dir}, whose run train.overwrite=true would move "
            "aside before this run starts, its source with it: start this run in another hydra.run.dir "
            "(nothing was moved)"
        )
