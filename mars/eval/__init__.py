"""mars.eval: zero-shot downstream evaluation through lm-evaluation-harness.

    from mars.eval import evaluate_model
    scores = evaluate_model(model, ["hellaswag"], limit=500)   # {"hellaswag": {"acc": .., "acc_norm": ..}}

Modules: harness (evaluate_model, evaluate_checkpoint), tasks (presets, task resolution,
offline checks), tables (the paper's table), results (output files, wandb), cli (python -m eval).
lm-eval itself is imported only when an evaluation runs.
"""

from mars.errors import UserError
from mars.eval.harness import CheckpointEval, evaluate_checkpoint, evaluate_model, flatten_scores
from mars.eval.tasks import PAPER_TASKS, TASK_PRESETS

PRESETS = TASK_PRESETS  # the name TASK_PRESETS had before the GPT-2 presets got theirs (GPT_PRESETS)

__all__ = [
    "PAPER_TASKS",
    "TASK_PRESETS",
    "CheckpointEval",
    "UserError",
    "evaluate_checkpoint",
    "evaluate_model",
    "flatten_scores",
]
