"""Where evaluation results go: results.json + table.md per checkpoint, and optional wandb.

results.json is lm-eval's own results dict (the file ``lm_eval --output_path`` writes, minus
samples) with one extra top-level key, "mars": the checkpoint's path, step, tokens seen and
resolved config, the request (tasks, limit, num_fewshot) and the flat scores.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from mars.errors import UserError
from mars.eval.harness import CheckpointEval, flatten_scores, run_dir_of
from mars.eval.tables import markdown_table
from mars.files import write_atomic

RESULTS_FILE = "results.json"
TABLE_FILE = "table.md"


def default_out_dir(ckpt: str | Path, average: bool = False) -> Path:
    """RUN_DIR/eval/step_XXXXXXXX for a checkpoint of a run dir, else STEP_DIR/eval; with `average` (its
    averaged weights), the same name with -average."""
    ckpt = Path(ckpt)
    run_dir = run_dir_of(ckpt)
    suffix = "-average" if average else ""
    return run_dir / "eval" / f"{ckpt.name}{suffix}" if run_dir is not None else ckpt / f"eval{suffix}"


def save(result: CheckpointEval, out_dir: str | Path) -> Path:
    """Write results.json and table.md into ``out_dir``; returns the results.json path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in dataclasses.asdict(result).items() if k != "lm_eval"}
    path = out / RESULTS_FILE
    write_atomic(path, json.dumps({**result.lm_eval, "mars": meta}, indent=2) + "\n")
    (out / TABLE_FILE).write_text(markdown_table([(result.name, result.scores)]))
    return path


def is_results(path: str | Path) -> bool:
    """A results.json this module wrote, or a directory holding one."""
    p = Path(path)
    p = p / RESULTS_FILE if p.is_dir() else p
    if p.suffix != ".json" or not p.is_file():
        return False
    try:
        return "mars" in json.loads(p.read_text())
    except (OSError, ValueError):
        return False


def load(path: str | Path) -> CheckpointEval:
    """Read back a results.json written by :func:`save` (or the directory holding it)."""
    p = Path(path)
    p = p / RESULTS_FILE if p.is_dir() else p
    try:
        data = json.loads(p.read_text())
        meta = data.pop("mars")
        return CheckpointEval(**meta, lm_eval=data)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{p} is not a results.json of python -m eval ({type(e).__name__}: {e})") from e


def reusable(out_dir: str | Path, ckpt: str | Path, request: dict) -> CheckpointEval | None:
    """The result saved in ``out_dir`` when it is for the same checkpoint dir, tasks, limit, shots and
    precision."""
    if not is_results(out_dir):
        return None
    try:
        saved = load(out_dir)
    except UserError:
        return None
    keys = ("tasks", "limit", "num_fewshot")
    same_request = all(saved.request.get(k) == request.get(k) for k in keys)
    # results written before the precision (the weights) were recorded were computed in float32 (of the model)
    same_request &= saved.request.get("dtype", "float32") == request.get("dtype", "float32")
    same_request &= saved.request.get("weights", "model") == request.get("weights", "model")
    return saved if same_request and Path(saved.path).resolve() == Path(ckpt).resolve() else None


def log_wandb(results: Sequence[CheckpointEval], mode: str, project: str, name: str | None = None) -> None:
    """One wandb run (job_type "eval") per checkpoint: summary downstream/<task>/<metric> + table. The
    mode follows the trainer's rule (mars.wandb_mode): WANDB_MODE wins, online without credentials
    logs offline."""
    from mars.wandb_mode import wandb_mode

    mode = wandb_mode(mode)
    if mode == "disabled":
        return
    import wandb

    from mars.eval.tables import columns_for, row_values

    for result in results:
        run = wandb.init(
            project=project,
            name=name if name and len(results) == 1 else result.name,
            mode=mode,
            job_type="eval",
            config={
                "checkpoint": result.path,
                "step": result.step,
                "tokens": result.tokens,
                **result.request,
                "run_config": result.config,
            },
        )
        flat = flatten_scores(result.scores)
        run.summary.update(flat)
        columns = columns_for([(result.name, result.scores)])
        values, avg, _ = row_values(result.scores, columns)
        table = wandb.Table(columns=["model", *[f"{c.header} ({c.metric})" for c in columns], "Avg"])
        table.add_data(result.name, *values, avg)
        run.log({**flat, "downstream/table": table}, step=result.step or 0)
        run.finish()
