"""``python -m eval ckpt=RUN_DIR tasks=paper``: score checkpoints and print the paper's table.

    python -m eval ckpt=RUN_DIR                                  # latest checkpoint, paper tasks
    python -m eval ckpt=RUN_DIR/ckpt/step_00001000 tasks=smoke   # offline smoke test
    python -m eval ckpt=RUN_DIR average=true                     # the averaged weights (train.average)
    python -m eval compare=[RUN_A,RUN_B] tasks=[hellaswag,arc_easy] limit=200
    python -m eval precache=true tasks=paper                     # download the datasets only

Each checkpoint's results go to ``out`` (default RUN_DIR/eval/step_XXXXXXXX, -average for its averaged
weights): results.json and
table.md. A checkpoint whose output dir already holds results for the same tasks, limit and
num_fewshot is not evaluated again (force=true re-evaluates). Errors print one line and exit 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, ListConfig, OmegaConf

from mars import device as devices
from mars.checks import above, choice, reported_as
from mars.errors import UserError
from mars.eval import results as results_io
from mars.eval.config import WANDB_MODES, register_configs
from mars.eval.harness import CheckpointEval, evaluate_checkpoint, precision_name, prepare_tasks, request_of
from mars.eval.tables import console_table, markdown_table
from mars.eval.tasks import resolve_tasks

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def _plain(value):
    return OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value


def _check(cfg) -> None:
    with reported_as(UserError):
        choice("wandb.mode", cfg.wandb.mode, WANDB_MODES)
        if cfg.num_fewshot < 0 or cfg.batch_size < 1:
            got = f"{cfg.num_fewshot}, {cfg.batch_size}"
            raise UserError(f"need num_fewshot >= 0, batch_size >= 1; got {got}")
        if cfg.limit is not None:
            above("limit", cfg.limit, 0, " (documents per task, or a fraction of them when < 1)")
        devices.check("device", str(cfg.device))  # train.py's check: a device this machine has
        choice("dtype", cfg.dtype, ("auto", "float32", "bfloat16"), " (auto: bfloat16 on CUDA, else float32)")


def run(cfg) -> list[CheckpointEval]:
    """Evaluate (or reload) every entry of ckpt + compare, print and save the table."""
    from mars.checkpoint import find_checkpoint, has_average
    from mars.checkpoint.load import no_average

    _check(cfg)
    spec = resolve_tasks(_plain(cfg.tasks), _plain(cfg.include))
    if cfg.precache:
        loaded = prepare_tasks(spec, cfg.num_fewshot)
        print(f"cached the datasets of {len(loaded.names)} task(s): {', '.join(loaded.names)}")
        return []
    entries = ([cfg.ckpt] if cfg.ckpt else []) + [str(c) for c in cfg.compare]
    if not entries:
        raise UserError("nothing to evaluate: pass ckpt=RUN_DIR_OR_CKPT (or compare=[RUN_A,RUN_B])")
    device = devices.resolve(str(cfg.device))
    precision = precision_name(cfg.dtype, device)
    request = request_of(spec, cfg.limit, cfg.num_fewshot, cfg.batch_size, precision, cfg.average)
    single = len(entries) == 1
    # Plan first, so that a missing checkpoint, an unknown task or missing data fails before any
    # model is loaded. Each entry is (saved result | None, checkpoint dir, output dir).
    plans = []
    for entry in entries:
        if results_io.is_results(entry):
            plans.append((results_io.load(entry), None, Path(entry)))
            continue
        ckpt = find_checkpoint(entry)
        if cfg.average and not has_average(ckpt):
            raise UserError(
                f"average=true: {no_average(ckpt)}; drop average=true to score the model's own weights"
            )
        out_dir = Path(cfg.out) if cfg.out and single else results_io.default_out_dir(ckpt, cfg.average)
        saved = None if cfg.force else results_io.reusable(out_dir, ckpt, request)
        plans.append((saved, ckpt, out_dir))
    if any(saved is None for saved, _, _ in plans):
        prepare_tasks(spec, cfg.num_fewshot)
    evals: list[CheckpointEval] = []
    for saved, ckpt, out_dir in plans:
        if saved is not None:
            where = out_dir / results_io.RESULTS_FILE if out_dir.is_dir() else out_dir
            print(f"reusing {where} ({saved.name}; force=true re-evaluates)")
            evals.append(saved)
            continue
        result = evaluate_checkpoint(
            ckpt,
            spec,
            limit=cfg.limit,
            batch_size=cfg.batch_size,
            device=device,
            num_fewshot=cfg.num_fewshot,
            name=cfg.name if single and cfg.ckpt else None,
            dtype=cfg.dtype,
            average=cfg.average,
        )
        print(f"wrote {results_io.save(result, out_dir)}")
        evals.append(result)
    rows = [(r.name, r.scores) for r in evals]
    print()
    print(console_table(rows))
    print(markdown_table(rows))
    if cfg.out and not single:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(markdown_table(rows))
        keys = ("name", "path", "step", "tokens", "scores")
        summary = [{k: getattr(r, k) for k in keys} for r in evals]
        (out / "compare.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {out / 'compare.md'}")
    results_io.log_wandb(evals, cfg.wandb.mode, cfg.wandb.project, cfg.wandb.name)
    return evals


register_configs()


@hydra.main(version_base=None, config_path=str(CONFIG_DIR), config_name="eval")
def _hydra_main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except UserError as e:  # the user's to fix: one line, no traceback
        from mars.entry import EXIT_USAGE, fail

        fail(str(e), EXIT_USAGE)


def main() -> None:
    """`python -m eval`: the command line is composed and checked first (mars.entry), so that an unknown
    key or a bad value is one line and exit status 2, as for every command of the harness."""
    from mars.entry import EXIT_USAGE, check_hydra_command, fail

    try:
        check_hydra_command(CONFIG_DIR, "eval", sys.argv[1:], check=_check)
    except UserError as e:
        fail(str(e), EXIT_USAGE)
    _hydra_main()


if __name__ == "__main__":
    main()
