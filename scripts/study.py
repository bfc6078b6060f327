#!/usr/bin/env python
"""The study: search spaces per optimizer -> trials -> finals -> a verdict at each one's tuned optimum.

    python scripts/study.py study=micro [study.KEY=VALUE ...] [TRAINING OVERRIDES ...] [--dry-run | --report]

mars/study/cli.py holds the command; docs/sweeps.md#studies explains it.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mars.study.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
