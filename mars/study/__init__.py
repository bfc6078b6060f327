"""mars.study: from search spaces to a verdict at each optimizer's tuned optimum, in one command.

    python scripts/study.py study=micro          (mars-study study=micro; docs/sweeps.md#studies)

spec.py       the spec (configs/study/NAME.yaml): schema, composition, value checks; each arm's training
              config checked at the corners of its space; the study dir, storage and run dirs (preflight)
search.py     a search space and its samplers (Sobol', random, TPE; trial N from (seed, N) alone); the
              edge rule and auto_extend's wider rounds; the finals (top_k rerun with shared seeds); the
              storage's studies, rounds and trials read back as records
storage.py    the optuna storage (SQLite, any RDB URL) and how several drivers share it: the ask lock,
              driver liveness (the multi-driver machinery, nothing else)
trials.py     a trial as train.py sees it (run dir, overrides, RUN_DIR/outcome.json) and its launchers
              (local subprocesses n_jobs at a time, or submitit)
driver.py     the ask/tell loop: adopt orphans, ask, launch, tell; rounds; finals; stop on a failure
scale.py      budgets and sizes (one wsd trunk, a cooldown branch per budget), tuning across sizes, and
              the report's section on them
report.py     report.py's verdict on the finals plus the study's own sections and figures
averaged.py   the report's section on averaged weights (train.average)
cli.py        the command line
"""
