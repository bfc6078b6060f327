"""The driver on the fake trainer (fake_run.py, in this process): budgets, determinism, divergence,
failures and resuming, two drivers on one storage, auto_extend, and the report against report.py."""

from __future__ import annotations

import json
import math
import threading

import fake_run
import pytest
from scipy.stats import qmc
from study_helpers import FakeLauncher, driver_of, run_fake, smoke_spec, study_of, trials_of

from mars.errors import UserError


def test_equal_budgets_and_the_same_seed_draws_the_same_trials(tmp_path):
    a = run_fake(study_of(tmp_path / "a"))
    b = run_fake(study_of(tmp_path / "b"))
    ta, tb = trials_of(a), trials_of(b)
    assert ta == tb  # the same params and values, trial by trial (another seed draws others: next test)
    for arm in ("adamw", "mars_adamw"):
        search = [k for k in ta if k[0] == arm and k[1] == "search"]
        finals = [k for k in ta if k[0] == arm and k[1] == "final"]
        assert len(search) == 4 and len(finals) == 2  # trials per arm; top 1 x 2 seeds
    assert all(status == "completed" for _, _, status in ta.values())


def test_sobol_trial_n_is_point_n_of_the_scrambled_sequence(tmp_path):
    driver = run_fake(study_of(tmp_path / "s", sampler__seed=3))
    state = driver.arm_state(driver.study.arm("mars_adamw"))
    points = qmc.Sobol(2, scramble=True, seed=3).random(4)  # keys in the spec's order: lr, gamma
    for t in state.search:
        u = points[t.number]
        assert t.params["optimizer.lr"] == pytest.approx(1e-4 * 1000 ** u[0], rel=1e-9)
        assert t.params["optimizer.gamma"] == pytest.approx(0.1 * u[1], rel=1e-9)


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_an_interrupted_study_draws_what_an_uninterrupted_one_does(tmp_path, monkeypatch, sampler):
    whole = trials_of(run_fake(study_of(tmp_path / "whole", sampler__name=sampler)))
    study = study_of(tmp_path / "parts", sampler__name=sampler)
    monkeypatch.setenv("FAKE_FAIL", "search/mars_adamw/002")  # stops the study half-way
    with pytest.raises(UserError):
        run_fake(study)
    monkeypatch.delenv("FAKE_FAIL")
    launcher = FakeLauncher()
    resumed = run_fake(study, launcher)  # a new driver, as after a restart
    assert trials_of(resumed) == whole
    reran = {(d.parent.name, d.name): resume for d, resume in launcher.started}
    assert reran[("mars_adamw", "002")] is True  # the failed trial reran in its own dir
    assert ("adamw", "000") not in reran  # a finished trial never runs again


def test_a_trial_left_half_asked_by_a_killed_driver_is_completed_by_the_next(tmp_path):
    from mars.study.search import study_name

    whole = trials_of(run_fake(study_of(tmp_path / "whole")))
    study = study_of(tmp_path / "cut")
    killed = driver_of(study)
    rnd = killed.arm_state(study.arm("mars_adamw"), create=True).rounds[0]
    killed._optuna_study(study_name(study.name, "mars_adamw", "search", 0), rnd).ask()  # no values, no owner
    assert trials_of(run_fake(study)) == whole


def test_a_diverged_trial_counts_ranks_worst_and_is_reported(tmp_path):
    study = study_of(tmp_path / "d", **{"arms.adamw.search.optimizer.lr.hi": 1.0})
    driver = run_fake(study)
    search = driver.arm_state(study.arm("adamw")).search
    diverged = [t for t in search if t.status == "diverged"]
    assert diverged and len(search) == 4  # in the budget
    assert all(t.value == math.inf for t in diverged)
    from mars.study.report import write_study_report

    write_study_report(driver)
    text = (study.dir / "report" / "study.md").read_text()
    assert f"adamw search {diverged[0].dir}: diverged: stopping at step 3" in text
    data = json.loads((study.dir / "report" / "study.json").read_text())
    assert sum(t["status"] == "diverged" for t in data["arms"]["adamw"]["search"]) == len(diverged)
    finalist = data["arms"]["adamw"]["finals"][0]["params"]["optimizer.lr"]
    assert finalist <= fake_run.DIVERGE_LR  # never a diverged config


def test_a_failed_trial_stops_the_study_in_one_line_and_stays_to_rerun(tmp_path, monkeypatch):
    study = study_of(tmp_path / "f")
    monkeypatch.setenv("FAKE_FAIL", "search/adamw/001")
    driver = driver_of(study)
    with pytest.raises(UserError) as e:
        driver.run()
    line = str(e.value)
    assert "\n" not in line
    assert "trial adamw search 001" in line and "search/adamw/001/launch.log" in line
    assert "rerun the same command" in line
    state = driver.arm_state(study.arm("adamw"))
    assert [t.status for t in state.search if t.index == 1] == ["running"]


def test_an_adopted_trial_waits_until_its_old_process_let_go_of_the_run_dir(tmp_path, monkeypatch):
    import time

    from mars.train import runlock

    study = study_of(tmp_path / "w")
    monkeypatch.setenv("FAKE_FAIL", "search/adamw/000")
    with pytest.raises(UserError):
        run_fake(study)
    monkeypatch.delenv("FAKE_FAIL")
    run_dir, released, holding = study.dir / "search" / "adamw" / "000", [], threading.Event()

    def old_process():  # still saving its checkpoint when the study is rerun
        with runlock.hold(run_dir):
            holding.set()
            time.sleep(0.5)  # (how long it saves, not a synchronisation)
            released.append(time.time())  # taken before it lets go: the driver may start in the same instant

    holder = threading.Thread(target=old_process)
    holder.start()
    assert holding.wait(timeout=60)
    launcher = FakeLauncher()
    starts = {}
    real_start = launcher.start
    launcher.start = lambda job: starts.setdefault(job.run_dir, time.time()) and real_start(job)
    run_fake(study, launcher)
    holder.join()
    assert starts[run_dir] >= released[0]


def test_two_drivers_on_one_storage_never_run_a_trial_twice(tmp_path):
    study = study_of(tmp_path / "two", trials=6)
    launchers = [FakeLauncher(capacity=1), FakeLauncher(capacity=1)]
    drivers = [driver_of(study, la) for la in launchers]
    errors = []

    def go(d):
        try:
            d.run()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=go, args=(d,)) for d in drivers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    started = [d for la in launchers for d, _ in la.started]
    # Every trial once and the whole budget spent. Which driver ran how many is up to the scheduler
    # (under load one thread may run them all before the other gets the storage): not asserted.
    assert len(started) == len(set(started)) == 2 * (6 + 2)


@pytest.mark.parametrize(("opt_lr", "fires"), [(3e-5, True), (2e-3, False)])
def test_auto_extend_widens_where_the_optimum_lies_outside(tmp_path, monkeypatch, opt_lr, fires):
    monkeypatch.setenv("FAKE_OPT_LR", str(opt_lr))
    monkeypatch.setattr(fake_run, "DIVERGE_LR", 10.0)
    study = study_of(
        tmp_path / "e",
        trials=8,
        base=[*smoke_spec()["base"], "schedule.min_lr=1e-7"],  # else lr may not go below 3e-5
        **{
            "auto_extend.rounds": 2,
            "arms.adamw.search.optimizer.lr": {"dist": "loguniform", "lo": 1e-4, "hi": 1e-1},
        },
    )
    driver = run_fake(study)
    rounds = driver.arm_state(study.arm("adamw")).rounds
    if not fires:
        assert len(rounds) == 1
        return
    assert len(rounds) == 3  # both extension rounds spent
    lr = [r.space["optimizer.lr"] for r in rounds]
    assert [d.lo for d in lr] == pytest.approx([1e-4, 5e-5, 2.5e-5])
    assert [d.hi for d in lr] == pytest.approx([0.1] * 3)
    assert rounds[1].sample["optimizer.lr"].hi == pytest.approx(1e-4)  # only the new octave is drawn
    search = driver.arm_state(study.arm("adamw")).search
    assert [sum(t.round == r for t in search) for r in range(3)] == [8, 4, 4]


def test_a_bound_the_config_refuses_to_pass_is_reported_not_widened(tmp_path, monkeypatch):
    from mars.study.report import collect

    monkeypatch.setenv("FAKE_OPT_GAMMA", "-0.05")  # the objective wants a negative gamma
    gamma_only = {"optimizer": {"gamma": {"dist": "uniform", "lo": 0.0, "hi": 0.1}}}
    study = study_of(
        tmp_path / "g",
        **{"auto_extend.rounds": 1, "arms.mars_adamw.search": gamma_only},
        **{"arms.mars_adamw.overrides": ["optimizer=mars_adamw", "optimizer.lr=3e-3"]},
    )
    driver = run_fake(study)
    rep = next(r for r in collect(driver) if r.name == "mars_adamw")
    assert len(rep.rounds) == 1  # nothing to widen into
    assert [(e.key, e.bound) for e, _ in rep.limits] == [("optimizer.gamma", "lower")]
    assert "optimizer.gamma" in rep.limits[0][1]  # the train config's own line says why
    assert rep.where().startswith("at a bound the train config will not pass: optimizer.gamma lower 0")


def test_the_study_report_is_report_py_on_the_same_run_dirs(tmp_path, capsys):
    from mars.analysis.cli import report_main
    from mars.study.report import collect, verdict_command, write_study_report

    driver = run_fake(study_of(tmp_path / "r"))
    write_study_report(driver)
    dirs, pairs, command = verdict_command(driver, collect(driver))
    assert command.startswith("python scripts/report.py ")
    out = tmp_path / "by_hand"
    args = [
        *map(str, dirs),
        *(a for p in pairs for a in ("--baseline", p)),
        "--metric",
        "val/loss",
        "--out",
        str(out),
    ]
    assert report_main(args) == 0
    ours = json.loads((driver.study.dir / "report" / "report.json").read_text())
    theirs = json.loads((out / "report.json").read_text())
    assert ours == theirs
    assert (out / "report.md").read_text() == (driver.study.dir / "report" / "report.md").read_text()
    assert ours["baseline"]["label"].startswith("AdamW")


def test_a_study_dir_of_another_spec_is_refused_with_the_differences(tmp_path):
    run_fake(study_of(tmp_path / "x"))
    with pytest.raises(UserError) as e:
        driver_of(study_of(tmp_path / "x", trials=5, **{"final.seeds": [1, 2, 3]}))
    line = str(e.value)
    assert "holds a study of another spec" in line and "\n" not in line
    assert "study.trials: 4 then, 5 now" in line and "study.final.seeds: [1, 2] then, [1, 2, 3] now" in line
    with pytest.raises(UserError, match=r"study.base: -train.max_steps=4 \+train.max_steps=8 now"):
        driver_of(
            study_of(
                tmp_path / "x",
                base=[*smoke_spec()["base"][:6], "train.max_steps=8"] + smoke_spec()["base"][7:],
            )
        )
    driver_of(study_of(tmp_path / "x", **{"launcher.n_jobs": 1}))  # how it runs may change


def test_run_dirs_the_storage_does_not_know_are_refused(tmp_path):
    study = study_of(tmp_path / "y")
    run_fake(study)
    (study.dir / "study.db").rename(tmp_path / "moved.db")
    with pytest.raises(
        UserError, match=r"search/adamw/000 holds a run that study.storage=.* does not record"
    ):
        driver_of(study)


def _table_row(driver, arm: str, key: str) -> list[str]:
    """The study report's sensitivity row of an arm's key (the table alone: no figures drawn)."""
    from mars.study.report import _sensitivity_table, collect

    table = _sensitivity_table(collect(driver), driver.metric, driver.study.spec["edges"]["tolerance"])
    return next(line for line in table.splitlines() if line.startswith(f"| {arm} | {key} |")).split(" | ")


@pytest.mark.parametrize("trials", [1, 2, 4])
def test_a_loss_falling_over_the_whole_range_is_an_edge_however_few_trials(tmp_path, monkeypatch, trials):
    """study=smoke's case: AdamW's loss falls with lr over its whole range, its best is the highest lr
    tried: not at the optimum, in the verdict and in the sensitivity table alike."""
    from mars.study.report import collect

    monkeypatch.setenv("FAKE_OPT_LR", "10")  # beyond the range: the loss falls monotonically with lr
    monkeypatch.setattr(fake_run, "DIVERGE_LR", 100.0)
    driver = run_fake(study_of(tmp_path / "m", trials=trials))
    rep = next(r for r in collect(driver) if r.name == "adamw")
    highest = max(t.params["optimizer.lr"] for t in rep.search)
    assert [(e.key, e.bound, e.best) for e in rep.edges if e.bound == "upper"] == [
        ("optimizer.lr", "upper", highest)
    ]
    assert rep.where().startswith("not at the optimum") and not rep.at_optimum
    assert _table_row(driver, "adamw", "optimizer.lr")[5] == "none: an edge"  # as the verdict says


def test_an_interior_optimum_is_bracketed_and_at_the_optimum(tmp_path):
    from mars.study.report import collect

    driver = run_fake(study_of(tmp_path / "i", trials=8))  # the fake's optimum lr 3e-3 lies inside
    rep = next(r for r in collect(driver) if r.name == "adamw")
    assert rep.edges == [] and rep.limits == [] and rep.where() == "yes"
    row = _table_row(driver, "adamw", "optimizer.lr")
    assert "(+" in row[4] and "(+" in row[5]  # a worse trial below and above the best


def test_drivers_know_each_other_through_the_storage_alone(tmp_path):
    """Liveness and the ask lock live in the storage (mars.study.storage): a driver on another machine is
    alive while its heartbeat is fresh; one of this machine whose process is gone is dead at once; the ask
    lock of a dead driver passes to the next one that asks."""
    import datetime

    from sqlalchemy import func, insert, select, update

    from mars.study.storage import DRIVER_ROWS, LOCK_ROWS, STALE_S, DriverLock, open_storage

    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    me = DriverLock()
    me.acquire(storage, "s")
    try:
        with storage.engine.begin() as c:
            now = c.execute(select(func.now())).scalar()
            if isinstance(now, str):
                now = datetime.datetime.fromisoformat(now)
            rows = [("far-1-a", "another-machine", 1, now), ("here-1-b", me.host, 2**22 + 7, now)]
            for driver, host, pid, beat in rows:
                c.execute(insert(DRIVER_ROWS).values(study="s", driver=driver, host=host, pid=pid, beat=beat))
        assert me.alive("far-1-a") and not me.alive("here-1-b")  # no such pid on this machine
        assert not me.alive("never-registered") and not me.alive(None)
        old = now - datetime.timedelta(seconds=2 * STALE_S)
        with storage.engine.begin() as c:
            c.execute(update(DRIVER_ROWS).where(DRIVER_ROWS.c.driver == "far-1-a").values(beat=old))
            c.execute(update(LOCK_ROWS).where(LOCK_ROWS.c.study == "s").values(holder="far-1-a"))
        assert not me.alive("far-1-a")  # its heartbeat stopped: gone
        with me.ask():  # the dead driver's lock is taken over
            with storage.engine.connect() as c:
                assert c.execute(select(LOCK_ROWS.c.holder)).scalar() == me.id
    finally:
        me.release()
    with storage.engine.connect() as c:  # a driver that stops leaves no row and no lock
        assert c.execute(select(LOCK_ROWS.c.holder)).scalar() is None
        assert me.id not in {r.driver for r in c.execute(select(DRIVER_ROWS.c.driver))}


def test_a_study_dir_moved_elsewhere_is_still_its_study(tmp_path):
    """The storage records trials' run dirs as absolute paths; a study dir moved (or copied) elsewhere
    reads them under its new place: every check passes, the trials and finals are found there."""
    from mars.study.report import collect, verdict_command

    before = trials_of(run_fake(study_of(tmp_path / "here")))
    (tmp_path / "here").rename(tmp_path / "there")
    driver = driver_of(study_of(tmp_path / "there"))  # refused before: "holds a run that ... does not record"
    assert trials_of(driver) == before and driver.done()
    dirs, _, _ = verdict_command(driver, collect(driver))
    assert dirs and all(str(d).startswith(str(tmp_path / "there")) and d.is_dir() for d in dirs)
