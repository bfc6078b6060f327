"""mars.train: the training harness behind `python train.py` (and the `mars-train` command).

config.py       the structured config schema (Hydra ConfigStore) and its validation
schedule.py     learning-rate schedules (cosine, linear, wsd, constant) as an lr factor
distributed.py  process group setup under torchrun / SLURM, and the few collectives used
resume.py       what a resumed run restores (the checkpoints themselves: mars.checkpoint)
metrics.py      metrics.jsonl, Weights & Biases, the progress bar, register_metric
builtin_metrics.py  gamma and the mars/ diagnostics, registered like a researcher's metrics
trainer.py      the loop: accumulation, DDP, exact/approximate MARS, resume, preemption
cli.py          Hydra entry point: config checks, run dir, then the Trainer
rundir.py       the run dir's rules: a new run, resume=auto / PATH, what is moved aside
forks.py        runs begun from another: forks (fork_from), weights alone (init_from); their checks
runlock.py      one run per run dir: an OS lock held for the run's lifetime
outcome.py      RUN_DIR/outcome.json: how a run ended (completed, preempted, diverged), for launchers
"""
