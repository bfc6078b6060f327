"""mars.study: from search spaces to a verdict at each optimizer's tuned optimum, in one command.

    python scripts/study.py study=micro          (mars-study study=micro; docs/sweeps.md#studies)

spec.py       the study spec (configs/study/NAME.yaml): its schema, composition and value checks
diff.py       where two nested configs differ, key by key (a study dir's spec, a ladder's sizes)
space.py      a search space: each searched key's distribution -> optuna's; widening a range
configs.py    each arm's training config, composed and checked at the corners of its space
preflight.py  the study dir and storage belong to this spec, run dirs to its trials; the budget
samplers.py   Sobol' (QMC), random and TPE, drawing trial N from (seed, N) alone
storage.py    the optuna storage (SQLite by default, any RDB URL), the ask lock, driver liveness
records.py    the storage's study, rounds and trials read back as records
trials.py     a trial as train.py sees it: run dir, overrides, result (RUN_DIR/outcome.json)
launchers.py  local subprocesses n_jobs at a time (GPU slots of mars.train.launch) or submitit
driver.py     the loop: adopt orphans, ask, launch, tell; rounds; finals; stop on a failure
extend.py     edges after a round (mars.analysis.edges) and auto_extend's wider rounds
finals.py     each arm's top_k rerun with the shared seeds, and its best finalist
budgets.py    budgets and sizes: one wsd trunk per finalist, seed and size, a cooldown branch per budget
report.py     report.py's verdict on the finals plus the study's own sections
figures.py    metric against each searched key; the sensitivity profiles
cli.py        the command line
"""
