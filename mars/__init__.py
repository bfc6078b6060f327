"""MARS harness: the MARS family of variance-reduced optimizers and a GPT-2 / LLaMA pretraining harness.

Subpackages, one concern each:
    mars.optim   optimizers (MARS, MARS-M, Lion, Muon, Moonlight) and their parameter grouping
    mars.model   the architectures (GPT-2, LLaMA-style; one spec each), FLOPs/MFU, Hugging Face, model files
    mars.data    tokenizer, dataset sources, token shards, batch loaders
    mars.checkpoint  the checkpoint layout: atomic saves, checksums, loading, model files, export
    mars.train   configs, schedules, run dirs, resume, metrics, the DDP / FSDP2 training loop
    mars.eval    zero-shot downstream evaluation through lm-evaluation-harness
    mars.analysis  reports, statistics and figures over run dirs (no torch needed)
    mars.study   equal-budget hyperparameter studies on optuna (scripts/study.py)
    mars.metrics_jsonl  the metrics.jsonl format: written by mars.train, read by mars.analysis
    mars.checks, mars.files, mars.plugins, mars.entry, mars.wandb_mode  what the packages share
"""

__version__ = "0.1.0"
