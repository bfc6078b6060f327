"""`python -m mars.train [overrides]`: the same command as `python train.py` (used by sweep jobs that
run on GPUs of their own, see mars/train/launch.py)."""

from mars.train.cli import main

main()
