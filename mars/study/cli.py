"""`python scripts/study.py study=NAME [study.KEY=VALUE ...] [TRAINING OVERRIDES ...]` / `mars-study ...`.

    python scripts/study.py study=micro                          run the study (or resume it), then its report
    python scripts/study.py study=micro model=llama_tiny study.dir=studies/micro_llama
    python scripts/study.py study=micro --dry-run                every check and the budget; runs nothing
    python scripts/study.py study=micro --report                 rewrite the report from what is stored

Exit status: 0 done; 2 a bad spec, found before anything runs; 1 a storage, study dir or trial problem
(the line names it and the fix; rerunning the same command resumes); 130 interrupted (Ctrl-C,
SIGTERM: the running trials saved a checkpoint; rerunning continues them).
"""

from __future__ import annotations

import sys
import time

from mars.entry import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, fail

USAGE = __doc__.split("\n\n")[1]
FLAGS = ("--dry-run", "--report")


def _say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def main(argv: list[str] | None = None) -> None:
    from mars.errors import UserError
    from mars.study.driver import Driver, Interrupted
    from mars.study.report import write_study_report
    from mars.study.spec import check_spec, compose_spec

    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return
    flags = [a for a in args if a.startswith("--")]
    unknown = [a for a in flags if a not in FLAGS]
    if unknown:
        fail(
            f"unknown option {unknown[0]} (options: {', '.join(FLAGS)}; the rest are Hydra overrides)",
            EXIT_USAGE,
        )
    overrides = [a for a in args if not a.startswith("--")]
    try:
        study = check_spec(compose_spec(overrides))
        driver = Driver(study, say=_say)
        dry = "--dry-run" in flags
        driver.prepare(data=not dry and "--report" not in flags, check_data=dry)
    except UserError as e:
        fail(str(e), EXIT_USAGE)
    for line in driver.budget_lines():
        _say(line)
    if "--dry-run" in flags:
        _say(f"dry run: every check passed; the study would run in {study.dir}")
        return
    try:
        if "--report" not in flags:
            t0 = time.perf_counter()
            driver.run()
            _say(f"study done in {time.perf_counter() - t0:.0f} s")
        if not driver.done():
            fail(
                f"{study.dir}: the study is not finished; run it (without --report) to finish it", EXIT_FAILED
            )
        written = write_study_report(driver)
    except Interrupted as e:
        fail(str(e), EXIT_INTERRUPTED)
    except UserError as e:  # also a trial's files the report cannot read
        fail(str(e), EXIT_FAILED)
    _say("wrote " + ", ".join(str(p) for p in written if p.suffix in (".md", ".json")))
