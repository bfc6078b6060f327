"""The run directory before training starts: what it holds, and where this run begins.

Rules (checked on rank 0 before any data is read or a process group exists):
  * a new run (no train.resume) refuses a run dir that already holds a run (checkpoints or
    metrics.jsonl): resume it, or choose another hydra.run.dir; train.overwrite=true moves the old
    run aside into RUN_DIR/replaced-<time>/ instead (nothing is deleted, nothing is mixed);
  * train.resume=auto continues the newest usable checkpoint of the run dir; a newest checkpoint that
    fails verification (truncated, corrupt, non-finite weights) is moved aside and the next older one
    is used, and the log says so; with no checkpoint at all the run starts fresh (a metrics.jsonl of
    a run that never reached a checkpoint is moved aside);
  * train.resume=PATH continues exactly that checkpoint (no fallback); checkpoints of this run dir
    newer than it are moved aside, so that later saves and resume=auto never mix the two histories;
  * in every resume, the config may only change what mars.train.resume allows.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import mars.checkpoint as ckpt
from mars.train.config import ConfigError
from mars.train.metrics import METRICS_FILE
from mars.train.resume import check_resume_config

log = logging.getLogger("mars.train")

ARTIFACTS = (ckpt.CKPT_DIR, METRICS_FILE, "wandb")


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


def _move_aside(run_dir: Path, paths: list[Path], why: str) -> None:
    dest = ckpt.move_aside(run_dir, paths)
    if dest is not None:
        log.info(f"{why}: moved {', '.join(p.name for p in paths if not p.exists())} to {dest}")


def _fresh_start(run_dir: Path, overwrite: bool) -> None:
    earlier = holds_a_run(run_dir)
    if not earlier:
        return
    if not overwrite:
        raise ConfigError(
            f"run dir {run_dir} already holds a run ({', '.join(earlier)}): continue it with "
            f"train.resume=auto, or choose another hydra.run.dir (train.overwrite=true moves the old run "
            "aside and starts a new one)"
        )
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


def choose_start(cfg, run_dir: Path, world_size: int) -> Path | None:
    """The checkpoint this run continues (None: a fresh start), after every check; see the module doc."""
    t = cfg.train
    check_writable(run_dir)
    resume = t.resume
    if resume in (None, "", "none", "null"):
        _fresh_start(run_dir, t.overwrite)
        return None
    if resume == "auto":
        found = ckpt.list_checkpoints(run_dir / ckpt.CKPT_DIR)
        chosen, rejected = None, []
        for step_dir in reversed(found):
            reason = _usable(step_dir)
            if reason is None:
                chosen = step_dir
                break
            rejected.append((step_dir, reason))
        for step_dir, reason in rejected:
            log.warning(f"train.resume=auto: skipping {step_dir}: {reason}")
        if rejected:
            _move_aside(run_dir, [p for p, _ in rejected], "unusable checkpoints")
        if chosen is None:
            note = "no usable checkpoint" if rejected else "no checkpoint"
            log.info(
                f"train.resume=auto: {note} in {run_dir / ckpt.CKPT_DIR}, starting from scratch "
                "(to continue an earlier run, also pass hydra.run.dir=THAT_RUN_DIR)"
            )
            _move_aside(run_dir, [run_dir / a for a in ARTIFACTS], "starting from scratch")
            return None
        if rejected:
            log.warning(f"train.resume=auto: continuing from {chosen} instead")
    else:
        chosen = ckpt.resolve_checkpoint(Path(resume).expanduser())
        if chosen is None:
            raise ConfigError(
                f"train.resume={resume}: no complete checkpoint there; give a run dir, its ckpt/ folder "
                "or a ckpt/step_XXXXXXXX folder (or train.resume=auto)"
            )
        ckpt.verify_checkpoint(chosen)
        newer = _newer_than(run_dir, chosen)
        if newer:
            _move_aside(run_dir, newer, f"resuming from {chosen.name}")
        elif chosen.resolve().parent != (run_dir / ckpt.CKPT_DIR).resolve():
            _fresh_start(run_dir, t.overwrite)  # continuing another run's checkpoint in this run dir
    meta = ckpt.read_meta(chosen)
    check_resume_config(chosen, ckpt.read_run_config(chosen), cfg, meta.get("world_size"), world_size)
    ckpt.check_model_shape(chosen, cfg.model)
    return chosen


def nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output_dir_writable(path_text: str, key: str) -> None:
    """Before Hydra creates the run dir: a directory can be made where it goes (tried, then removed,
    since permission bits say nothing for root or a read-only mount)."""
    literal = path_text.split("${", 1)[0] or "."
    target = Path(literal).expanduser()
    base = nearest_existing(target if target.is_absolute() else Path.cwd() / target)
    if not base.is_dir():
        raise ConfigError(f"{key}={path_text}: {base} is a file, not a directory; choose another {key}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mars-write-test-", dir=base))
    except OSError as e:
        raise ConfigError(
            f"{key}={path_text}: cannot create directories in {base} ({e.strerror or e}); "
            f"choose another {key}"
        ) from None
