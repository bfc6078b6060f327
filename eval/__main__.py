"""python -m eval ckpt=RUN_DIR tasks=paper  (Hydra overrides; schema in mars/eval/config.py)."""

from mars.eval.cli import main

if __name__ == "__main__":
    main()
