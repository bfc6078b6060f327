"""A research report over Hydra sweeps: every setting with its seeds pooled, compared to a baseline.

    python train.py -m optimizer.lr=1e-3,3e-3 optimizer.gamma=0,0.025 train.seed=1,2,3
    python scripts/report.py multirun/2025-01-01/12-00-00
    python scripts/report.py multirun/A multirun/B --baseline optimizer.name=adamw --out report/

Finds every run dir (a dir holding .hydra/config.yaml) under the dirs given, pools the runs that
differ only in their seeds into groups, and writes report.md, report.json, report_curves.png/.pdf
and, when exactly two keys vary between groups, report_heatmap.png/.pdf into the first dir (or
--out); both tables are printed too. Everything is about one metric of metrics.jsonl, --metric KEY
(default val/loss; any logged key, e.g. train/loss or downstream/hellaswag/acc), better lower or
higher by its name (mars/analysis/metric.py; --direction lower|higher overrides).

The group table, per group: seeds, final and best value (mean ± sample std), tokens to the
target value per run (interpolated between evaluations; runs that never reach it are counted as
such), the speedup in tokens against the baseline (from the seed-mean curves), an effective-data
speedup from L(D) = a D^-b + c fitted to the baseline's mean curve (metrics where lower is better),
and 95% intervals of both speedups (jackknife over seeds). The comparison table, per group against
the baseline: the paired t-test of the per-seed differences where the group ran the baseline's
seeds, Welch's test otherwise (--unpaired: always), the difference with its 95% interval, p, p
corrected by Holm over all groups compared with the baseline, the verdict (better / worse at
corrected p < 0.05, else not resolved), the smallest difference these seeds detect with 80% power
and the seeds the observed difference would need. docs/research.md explains how to read them.

Grouping: runs are one group when their resolved configs agree on everything except the seeds
(train.seed, train.data_seed), bookkeeping keys (data.root, data.num_workers, data.verify,
train.resume, train.progress, train.device, train.log_interval, train.ckpt_interval,
train.keep_last, logger.*, downstream.*, hydra) and optimizer keys the run's optimizer does not
read (e.g. gamma or lr_1d for AdamW). Groups are labelled by the overrides that differ between
them, sorted by those values.

Refusals: runs must agree on train.max_steps, train.global_batch_size, the data (data.name,
data.dir, data.hf_path, data.hf_config, data.paths) and the model shape (model.n_layer, n_head,
n_embd, block_size, vocab_size), unless a sweep varied that key on purpose: the runs of one Hydra
sweep dir (the dir holding multirun.yaml; for other runs, the dir given on the command line) have
different values of it (or of its config group: model=, data=, experiment=) in their overrides.
Otherwise the report stops with one line, e.g. "error: runs differ in train.max_steps (300 in 6
runs under A, 200 in 3 runs under B): report them separately". It also stops (exit status 2, one
line on stderr) for a dir without run dirs, runs without metrics.jsonl or without a line of the metric
(named), a --metric no run logged (the logged keys are listed), and a --baseline that is not
KEY=VALUE or that matches no group or several.

Baseline: --baseline KEY=VALUE picks the group whose config (or overrides) has that value; repeat
it to narrow several matches down, or add --best to take the matching group with the best mean
final value, e.g. the lowest val loss (the tuned baseline: --baseline optimizer.name=adamw --best
over an lr sweep).
Without --baseline it is the first group in sorted order (said in the output), never the best group.
"""

from __future__ import annotations

import sys

from mars.analysis.cli import report_main


def main(argv: list[str] | None = None) -> int:
    return report_main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
