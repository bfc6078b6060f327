"""The driver: from a checked spec to trials, rounds, finals and the report, resumable at any point.

    driver = Driver(check_spec(compose_spec(args)))
    driver.prepare()   # every check; nothing runs, nothing is written
    driver.run()       # the trials, n_jobs at a time, then the report

prepare() refuses, each in one line naming the key or file and the fix: every bad spec value
(mars.study.spec), an arm whose config does not compose at the corners of its space
(mars.study.spec), a storage it cannot open, a study dir or storage made by another spec (the
differences named), run dirs the storage does not know or known trials whose run dirs are gone.

run() loops: while a launcher slot is free, the next job is chosen under the study's ask lock (a row
of the storage: mars.study.storage), arms in turn so that they progress alike:

1. an orphaned trial (RUNNING, its driver dead) is adopted and rerun in its own dir with
   train.resume=auto;
2. else a new trial of the arm's current round is asked, while the round's budget lasts;
3. a round whose trials have all finished goes through the edge check (mars.study.search): a wider
   round, or the arm's finals: its top_k configs, each with every seed of study.final.seeds.

A finished trial is read from its run dir (mars.study.trials.read_result): completed or diverged
(ranked worst) is told to optuna; any other failure stops the study in one line naming the trial and
its log, after the other running trials were stopped with a checkpoint (SIGTERM); the trial stays
RUNNING, so the next run of the same command reruns it. Ctrl-C or SIGTERM stops the same way. When
every arm's finals are done, the report is written (mars.study.report).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from mars.errors import UserError
from mars.study import scale
from mars.study.scale import Scope, finals_scope, scopes_of, tuned
from mars.study.search import (
    Round,
    TrialRecord,
    distributions,
    draw,
    edges_of,
    make_sampler,
    points_of,
    records_of,
    round_attrs,
    round_from_attrs,
    study_name,
    widen,
)
from mars.study.spec import (
    SPEC_FILE,
    Arm,
    ArmConfig,
    Study,
    check_arm,
    check_dirs,
    check_metric_key,
    check_sizes,
    check_spec_file,
    check_storage_spec,
    prepare_data,
    public_spec,
    study_dir_ok,
    valid,
)
from mars.study.storage import DriverLock, open_storage
from mars.study.trials import LAUNCH_LOG, Job, Result, final_dir, read_result, search_dir, trial_overrides

MAX_ATTEMPTS = 3  # a trial preempted (SIGTERM from outside) is continued this many times
POLL_S = 0.2


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: the running trials were stopped with a checkpoint; rerun to continue."""


@dataclass
class ArmState:
    """Where an arm stands, as the storage says: its rounds and search trials in each scope (the sizes it
    searches at: mars.study.scale), its finals."""

    searches: dict[str, tuple[list[Round], list[TrialRecord]]]  # scope name -> (rounds, trials)
    final: list[TrialRecord]
    plan: list[dict] | None  # the finals' plan, once the search is over

    @property
    def rounds(self) -> list[Round]:
        """The first scope's rounds (the only scope without study.tune)."""
        return next(iter(self.searches.values()))[0] if self.searches else []

    @property
    def search(self) -> list[TrialRecord]:
        """The first scope's search trials."""
        return next(iter(self.searches.values()))[1] if self.searches else []

    @property
    def all_search(self) -> list[TrialRecord]:
        return [t for _, trials in self.searches.values() for t in trials]


class Driver:
    def __init__(self, study: Study, launcher=None, say=print, poll_s: float = POLL_S):
        self.study, self.launcher, self.say, self.poll_s = study, launcher, say, poll_s
        self.metric = None
        self.configs: dict[str, ArmConfig] = {}
        self.sizes: list[scale.Size] = []  # budgets and sizes of the finals (mars.study.scale); [] without
        self.storage = None
        self.lock = DriverLock()
        self._studies: dict[str, object] = {}
        self._valid: dict[tuple, str | None] = {}
        self.stopping = False
        self._started: dict[str, int] = {}
        self._names: set[str] = set()
        self._ids: dict[tuple[str, int], int] = {}

    # ------------------------------------------------------------------ checks (nothing runs)

    def prepare(self, data: bool = True, check_data: bool = False) -> None:
        """Every check (nothing runs); data: prepare each arm's dataset, check_data (a dry run): only check
        that it is prepared or can be, writing nothing."""
        from mars.analysis.metric import metric_of
        from mars.errors import UserError
        from mars.study.trials import make_launcher

        s = self.study
        study_dir_ok(s.dir)
        try:
            self.metric = metric_of(s.spec["metric"]["key"], s.spec["metric"]["direction"])
        except UserError as e:
            raise UserError(f"study.metric: {e}") from None
        self.configs = {arm.name: check_arm(s, arm) for arm in s.arms}  # (loads the plugins' metrics)
        check_metric_key(s.spec["metric"]["key"])
        self.sizes = self._check_sizes()
        check_spec_file(s)
        self.storage = open_storage(s.storage, create=False)  # a new SQLite file is made by run() alone
        check_storage_spec(s, self.storage)
        check_dirs(
            s,
            lambda: [t for arm in s.arms for st in [self.arm_state(arm)] for t in st.all_search + st.final],
        )
        if self.launcher is None:
            self.launcher = make_launcher(s)
        if data or check_data:
            prepare_data(list(self.configs.values()), write=data)

    def scopes(self, arm: Arm) -> list[Scope]:
        """Where `arm` searches (mars.study.scale): every size of study.tune.trials, or the first size."""
        if not arm.space:
            return scopes_of({**self.study.spec, "tune": {}}, self.sizes)
        return scopes_of(self.study.spec, self.sizes)

    def _scope(self, arm: Arm, name: str) -> Scope:
        return next(z for z in self.scopes(arm) if z.name == name)

    def _check_sizes(self) -> list[scale.Size]:
        """Every arm's sizes, which must agree (the same budgets in steps and fork points: the arms pair)."""
        s = self.study
        by_arm = {arm.name: check_sizes(s, arm) for arm in s.arms}
        ref = by_arm[s.baseline]
        for name, sizes in by_arm.items():
            mine = [(z.budgets, z.forks, z.tokens_per_step) for z in sizes]
            if mine != [(z.budgets, z.forks, z.tokens_per_step) for z in ref]:
                raise UserError(
                    f"study.arms.{name}: its budgets in steps, forks or tokens per step ({mine}) differ from "
                    f"the baseline {s.baseline}'s: set the schedule and batch in study.base, not in an arm"
                )
        return ref

    @property
    def size_of(self) -> dict[str, scale.Size]:
        return {z.name: z for z in self.sizes}

    def budget_lines(self) -> list[str]:
        from mars.study.spec import budget_lines, finalists

        lines = budget_lines(self.study, self.configs, finals=not self.sizes)
        if self.sizes:  # every arm's finalists and seeds, at every size
            runs = sum(finalists(self.study, arm) for arm in self.study.arms) * len(self.study.seeds)
            lines += scale.budget_lines(self.sizes, 1, runs)
        if tuned(self.study.spec):
            for arm in self.study.arms:
                scopes = [z for z in self.scopes(arm) if z.name]
                if scopes:
                    each = ", ".join(f"{z.name}: {z.trials}" for z in scopes)
                    lines.append(
                        f"{arm.name}: with study.tune the search runs at each size instead, trials {each} = "
                        f"{sum(z.trials for z in scopes)} runs (the line above counts study.trials)"
                    )
        return lines

    # ------------------------------------------------------------------ the storage's view

    def _optuna_study(self, name: str, round_: Round | None = None, attrs: dict | None = None):
        """The optuna study `name` (created with `attrs` when missing), cached."""
        import optuna

        if name in self._studies:
            return self._studies[name]
        direction = "maximize" if self.metric.higher_is_better else "minimize"
        sampler = None
        if round_ is not None:
            sp = self.study.spec["sampler"]
            sampler = make_sampler(
                sp["name"],
                int(sp["seed"]) + round_.number,
                distributions(round_.sample),
                sp["startup_trials"],
            )
        st = optuna.create_study(
            storage=self.storage, study_name=name, direction=direction, sampler=sampler, load_if_exists=True
        )
        for k, v in (attrs or {}).items():
            if k not in st.user_attrs:
                st.set_user_attr(k, v)
        self._studies[name] = st
        return st

    def _exists(self, name: str) -> bool:
        """Whether the storage holds optuna study `name` (a study, once made, is never removed)."""
        import optuna

        if name in self._studies or name in self._names:
            return True
        self._names = set(optuna.get_all_study_names(self.storage))
        return name in self._names

    def arm_state(self, arm: Arm, create: bool = False) -> ArmState:
        """The arm's rounds and search trials in each scope, its finals and plan. create=True (under the ask
        lock only) makes round 0 of each scope and completes a round whose driver died while making it."""
        searches = {z.name: self._scope_state(arm, z, create) for z in self.scopes(arm)}
        final: list[TrialRecord] = []
        plan = None
        fname = study_name(self.study.name, arm.name, "final")
        if self._exists(fname):
            st = self._optuna_study(fname)
            plan = st.user_attrs.get("plan")
            final = records_of(st, arm.name, "final", root=self.study.dir)
        return ArmState(searches, final, plan)

    def _first_round(self, arm: Arm, scope: Scope) -> Round:
        trials = arm.trials if scope.trials is None else scope.trials
        return Round(0, dict(arm.space), dict(arm.space), trials, 0)

    def _scope_state(self, arm: Arm, scope: Scope, create: bool) -> tuple[list[Round], list[TrialRecord]]:
        import optuna

        rounds: list[Round] = []
        search: list[TrialRecord] = []
        while True:
            r = len(rounds)
            sname = study_name(self.study.name, scope.key(arm.name), "search", r)
            if not self._exists(sname):
                if r == 0 and create:
                    first = self._first_round(arm, scope)
                    self._optuna_study(sname, first, round_attrs(first))
                    continue
                break
            raw = self._studies.get(sname) or optuna.load_study(study_name=sname, storage=self.storage)
            if "space" not in raw.user_attrs:  # its driver died between creating it and describing it
                if not create:
                    break
                rnd = self._first_round(arm, scope) if r == 0 else None
                if rnd is None:
                    rnd = self._next_round(arm, scope, rounds, search, quiet=True)
                for k, v in round_attrs(rnd).items():
                    raw.set_user_attr(k, v)
            rnd = round_from_attrs(raw.user_attrs)
            st = self._optuna_study(sname, rnd)
            rounds.append(rnd)
            search += _in_scope(
                records_of(st, arm.name, "search", rnd.number, rnd.offset, self.study.dir), scope
            )
        return rounds, search

    def _set_attrs(self, st, number: int, attrs: dict) -> None:
        """User attrs of trial `number` of optuna study `st` (through the storage: the trial may be
        another driver's, or this one's from before it was resumed)."""
        key = (st.study_name, number)
        if key not in self._ids:
            study_id = self.storage.get_study_id_from_name(st.study_name)
            self._ids[key] = self.storage.get_trial_id_from_study_id_trial_number(study_id, number)
        for k, v in attrs.items():
            self.storage.set_trial_user_attr(self._ids[key], k, v)

    # ------------------------------------------------------------------ choosing the next job

    def _arm_order(self) -> list[Arm]:
        """Arms with the fewest trials started first, so that they progress alike."""
        started = {}
        for arm in self.study.arms:
            st = self._started.get(arm.name, 0)
            started[arm.name] = st
        return sorted(self.study.arms, key=lambda a: started[a.name])

    def next_job(self) -> Job | None:
        with self.lock.ask():
            for arm in self._arm_order():
                job = self._next_for_arm(arm)
                if job is not None:
                    self._started[arm.name] = self._started.get(arm.name, 0) + 1
                    return job
        return None

    def _next_for_arm(self, arm: Arm) -> Job | None:
        state = self.arm_state(arm, create=True)
        for t in state.all_search + state.final:  # 1. orphans
            if t.state == "RUNNING" and not self.lock.alive(t.attrs.get("driver")):
                return self._adopt(arm, state, t)
        if state.plan is None:
            waiting = False
            for scope in self.scopes(arm):
                rounds, search = state.searches[scope.name]
                current = rounds[-1]
                in_round = [t for t in search if t.round == current.number and t.state != "FAIL"]
                if len(in_round) < current.trials:  # 2. a new search trial
                    return self._ask_search(arm, scope, current)
                if any(t.state == "RUNNING" for t in search):
                    waiting = True  # the round is still running (here or in another driver)
                    continue
                nxt = self._next_round(arm, scope, rounds, search)  # 3. the round is done: widen it?
                if nxt is not None:
                    self._optuna_study(
                        study_name(self.study.name, scope.key(arm.name), "search", nxt.number),
                        nxt,
                        round_attrs(nxt),
                    )
                    return self._ask_search(arm, scope, nxt)
            if waiting:
                return None
            state.plan = self._plan_finals(arm, state)  # every scope's search is done: plan the finals
        while len(state.final) < len(state.plan):
            entry = state.plan[len(state.final)]
            if entry.get("role") == scale.BRANCH:
                ready = self._branch_ready(arm, state, entry)
                if ready is False:
                    return None  # its trunk has not saved the fork point yet
                if isinstance(ready, str):  # its trunk diverged before it: the branch ranks worst, unrun
                    self._tell_unrun(arm, state.plan, len(state.final), ready)
                    state = self.arm_state(arm)
                    continue
            return self._ask_final(arm, state.plan, len(state.final))
        return None

    def _branch_ready(self, arm: Arm, state: ArmState, entry: dict) -> bool | str:
        """True when the branch can fork, False while its trunk has not reached the fork point, or why it
        never will (its trunk finished without that checkpoint)."""
        trunk = state.final[entry["trunk"]]
        finished = trunk.state == "COMPLETE"
        if scale.branch_ready(trunk.dir, entry["fork_step"], finished):
            return True
        if not finished:
            return False
        return (
            f"its trunk {trunk.dir} ({trunk.status}) left no checkpoint at step {entry['fork_step']} to fork "
            "from"
        )

    def _tell_unrun(self, arm: Arm, plan: list[dict], i: int, why: str) -> None:
        st = self._optuna_study(study_name(self.study.name, arm.name, "final"))
        number = st.ask().number
        t = self._fill_final(arm, st, plan, number)
        result = {"status": "diverged", "message": why, "tokens": 0.0, "train_s": 0.0, "process_s": 0.0}
        self._set_attrs(st, number, {"result": {**result, "attempts": 0}})
        st.tell(number, -math.inf if self.metric.higher_is_better else math.inf)
        self.say(f"{arm.name} final {t.dir.name}: not run: {why}")

    def _adopt(self, arm: Arm, state: ArmState, t: TrialRecord) -> Job:
        """Take over an orphaned trial: finish what its driver wrote of it (a driver killed while asking
        leaves a trial without all its values or attrs) and rerun it in its own dir."""
        if t.phase == "search":
            scope = self._scope(arm, t.attrs["scope"])
            rnd = state.searches[scope.name][0][t.round]
            name = study_name(self.study.name, scope.key(arm.name), "search", rnd.number)
            st = self._optuna_study(name, rnd)
            t = self._fill_search(arm, scope, st, rnd, t.number)
        else:
            st = self._optuna_study(study_name(self.study.name, arm.name, "final"))
            t = self._fill_final(arm, st, state.plan, t.number)
        job = self._job(arm, t, st, fresh=False)
        self.say(f"{job.label}: its driver stopped; rerunning it in its own dir with train.resume=auto")
        return job

    def _ask_search(self, arm: Arm, scope: Scope, rnd: Round) -> Job:
        st = self._optuna_study(study_name(self.study.name, scope.key(arm.name), "search", rnd.number), rnd)
        trial = st.ask()
        return self._job(arm, self._fill_search(arm, scope, st, rnd, trial.number, trial), st, fresh=True)

    def _fill_search(self, arm: Arm, scope: Scope, st, rnd: Round, number: int, trial=None) -> TrialRecord:
        """Trial `number`'s values (drawn by the round's sampler, which the trial's number decides; any
        already stored stay), its run dir and this driver as its owner."""
        import optuna

        if trial is None:  # an orphan: its values may be missing if its driver died while asking
            study_id = self.storage.get_study_id_from_name(st.study_name)
            trial = optuna.Trial(st, self.storage.get_trial_id_from_study_id_trial_number(study_id, number))
        draw(trial, rnd.sample)
        run_dir = search_dir(self.study.dir, arm.name, rnd.offset + number, scope.name)
        self._set_attrs(st, number, {"driver": self.lock.id, "dir": str(run_dir)})
        return _in_scope([records_of_one(st, number, arm.name, rnd, self.study.dir)], scope)[0]

    def _ask_final(self, arm: Arm, plan: list[dict], i: int) -> Job:
        st = self._optuna_study(study_name(self.study.name, arm.name, "final"))
        number = st.ask().number
        if number != i:  # the plan's entries are taken in order under the ask lock
            raise UserError(
                f"{arm.name}: final trial {number} was asked for plan entry {i}: the storage is "
                "inconsistent (was it changed by hand?)"
            )
        return self._job(arm, self._fill_final(arm, st, plan, number), st, fresh=True)

    def _fill_final(self, arm: Arm, st, plan: list[dict], number: int) -> TrialRecord:
        """Final trial `number` is the plan's entry `number`: its values, rank, seed, run dir, owner."""
        entry = plan[number]
        run_dir = scale.entry_dir(self.study.dir, arm.name, entry)
        attrs = {"params": entry["params"], "rank": entry["rank"], "seed": entry["seed"], "dir": str(run_dir)}
        for key in ("role", "size", "steps", "headline", "ckpt_steps", "fork_step"):
            if key in entry:
                attrs[key] = entry[key]
        if "trunk" in entry:
            attrs["trunk_dir"] = str(scale.entry_dir(self.study.dir, arm.name, plan[entry["trunk"]]))
        self._set_attrs(st, number, {"driver": self.lock.id, **attrs})
        return [r for r in records_of(st, arm.name, "final", root=self.study.dir) if r.number == number][0]

    def _job(self, arm: Arm, t: TrialRecord, st, fresh: bool) -> Job:
        """The job of trial t: a fresh trial in a new run dir, or (fresh=False) an interrupted one
        continued in its own with train.resume=auto."""
        from mars.train.rundir import holds_a_run

        s = self.study
        extra: list[str] = []
        if t.phase == "search":
            scope = self._scope(arm, t.attrs["scope"])
            run_dir, seed = search_dir(s.dir, arm.name, t.index, scope.name), int(s.spec["search_seed"])
            tag = f"search/{arm.name}/{f'{scope.name}/' if scope.name else ''}{t.index:03d}"
            extra = list(scope.overrides)  # its size (and budget); without study.tune, the first size
        else:
            rank, seed = int(t.attrs["rank"]), int(t.attrs["seed"])
            run_dir = Path(t.attrs["dir"]) if "role" in t.attrs else final_dir(s.dir, arm.name, rank, seed)
            tag = f"final/{arm.name}/{run_dir.name}"
            extra = scale.entry_overrides(t.attrs, self.size_of)
        if fresh and holds_a_run(run_dir):
            raise UserError(
                f"{run_dir} already holds a run that is not this trial's: move it away (a trial's run dir is "
                "never overwritten)"
            )
        overrides = [*trial_overrides(s, arm, t.params, seed, tag), *extra]
        label = f"{arm.name} {t.phase} {run_dir.name}"
        return Job(run_dir, overrides, resume=not fresh, label=label, trial=t, study=st)

    def _next_round(
        self, arm: Arm, scope: Scope, rounds: list[Round], search: list[TrialRecord], quiet: bool = False
    ) -> Round | None:
        ext = self.study.spec["auto_extend"]
        current = rounds[-1]
        if current.number >= ext["rounds"]:
            return None
        edges = self.edges(arm, ArmState({scope.name: (rounds, search)}, [], None), scope)
        if not edges:
            return None
        nxt, _ = widen(current, edges, int(ext["trials"]), lambda k, v: self.refuses(arm, k, v))
        if nxt is not None and not quiet:
            for note in nxt.notes:
                self.say(f"edge: {note} ({ext['trials']} more trials)")
        return nxt

    def edges(self, arm: Arm, state: ArmState, scope: Scope | None = None):
        """The edges of an arm's search in one scope (default: the first)."""
        rounds, search = state.searches[scope.name] if scope is not None else (state.rounds, state.search)
        where = arm.name if scope is None or not scope.name else f"{arm.name} at {scope.name}"
        return edges_of(
            rounds[-1].space,
            points_of(search),
            self.metric.higher_is_better,
            self.study.spec["edges"]["tolerance"],
            where,
        )

    def refuses(self, arm: Arm, key: str, value) -> str | None:
        k = (arm.name, key, value)
        if k not in self._valid:
            self._valid[k] = valid(self.study, arm, key, value)
        return self._valid[k]

    def _plan_finals(self, arm: Arm, state: ArmState) -> list[dict]:
        from mars.study.search import plan_finals

        spec = self.study.spec

        def plan_of(search):
            return plan_finals(search, spec["final"]["top_k"], self.study.seeds, self.metric.higher_is_better)

        if arm.space:
            plan = plan_of(state.search)
        else:  # nothing searched: the arm's fixed config, with every seed
            plan = [{"rank": 1, "seed": int(seed), "params": {}, "source": None, "search_value": None}
                    for seed in self.study.seeds]  # fmt: skip
        if self.sizes and arm.space and tuned(spec):  # each size's finals at its scope's optimum
            scopes = self.scopes(arm)
            own = {z.name: state.searches[finals_scope(spec, scopes, z.name).name][1] for z in self.sizes}
            plan = scale.expand_plans([(plan_of(own[z.name]), z) for z in self.sizes])
        elif self.sizes:
            plan = scale.expand_plan(plan, self.sizes)
        self._optuna_study(study_name(self.study.name, arm.name, "final"), attrs={"plan": plan})
        if not plan:
            self.say(f"{arm.name}: every search trial diverged; the arm has no finalist")
        return plan

    # ------------------------------------------------------------------ running

    def run(self) -> None:
        import optuna

        s = self.study
        s.dir.mkdir(parents=True, exist_ok=True)
        if isinstance(self.storage, optuna.storages.InMemoryStorage):  # prepare() made no file: now
            self.storage = open_storage(s.storage)
            self._studies, self._names, self._ids = {}, set(), {}
        self.lock.acquire(self.storage, s.name)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
        try:
            with self.lock.ask():  # the first of several drivers writes the spec
                spec_file = s.dir / SPEC_FILE
                if not spec_file.is_file():
                    from mars.files import write_atomic

                    write_atomic(spec_file, yaml.safe_dump(public_spec(s.spec), sort_keys=False))
                meta = optuna.create_study(storage=self.storage, study_name=s.name, load_if_exists=True)
                if "spec" not in meta.user_attrs:
                    meta.set_user_attr("spec", public_spec(s.spec))
            self._loop()
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            self.lock.release()

    def _loop(self) -> None:
        running: list[tuple[Job, object]] = []
        try:
            while True:
                while len(running) < self.launcher.capacity:
                    t0 = time.perf_counter()
                    job = self.next_job()
                    if job is None:
                        break
                    running.append((job, self._start(job, t0)))
                if not running:
                    if self.done():
                        return
                    time.sleep(max(self.poll_s, 1.0))  # other drivers run what is left
                    continue
                finished = []
                while not finished:
                    finished = [(j, h, c) for j, h in running if (c := h.poll()) is not None]
                    if not finished:
                        time.sleep(self.poll_s)
                for job, handle, code in finished:
                    running.remove((job, handle))
                    again = self._finish(job, handle, code, running)
                    if again is not None:
                        running.append((job, again))
        except (KeyboardInterrupt, Interrupted):
            self.stopping = True
            n = _stop(running)
            raise Interrupted(
                f"interrupted: {n} running trial(s) stopped with a checkpoint; rerun the same command to "
                "continue the study (they continue where they stopped)"
            ) from None

    def _start(self, job: Job, t0: float):
        from mars.train.runlock import busy

        if job.resume and busy(job.run_dir):  # the process of its dead driver still saves
            self.say(f"{job.label}: waiting for the process that ran it to stop (it is saving a checkpoint)")
            while busy(job.run_dir):
                time.sleep(max(self.poll_s, 0.5))
        job.attempts += 1
        job.started = time.time()
        handle = self.launcher.start(job)
        job.overhead_s += time.perf_counter() - t0
        job.extra["launched"] = time.perf_counter()
        self.say(f"{job.label}: started{' (resuming)' if job.resume else ''} -> {job.run_dir}")
        return handle

    def _finish(self, job: Job, handle, code: int, running: list):
        t0 = time.perf_counter()
        process_s = t0 - job.extra["launched"]
        job.extra["process_s"] = job.extra.get("process_s", 0.0) + process_s
        result = read_result(job.run_dir, self.metric, self.study.spec["metric"]["summary"], job.started)
        if result == "preempted" and not self.stopping and job.attempts < MAX_ATTEMPTS:
            job.resume = True
            self.say(f"{job.label}: preempted; continuing it")
            return self._start(job, t0)
        if not isinstance(result, Result):
            n = _stop(running)
            log = getattr(handle, "log", job.run_dir / LAUNCH_LOG)
            line = _last_error(Path(log))
            stopped = f"; {n} other running trial(s) stopped with a checkpoint" if n else ""
            raise UserError(
                f"trial {job.label} ({job.run_dir}) failed with exit status {code}: {result}"
                f"{f' [{line}]' if line else ''}; its log: {log}{stopped}. Fix the cause and rerun the same "
                "command: the study resumes, rerunning this trial in its own dir"
            )
        st, number = job.study, job.trial.number
        if job.trial.attrs.get("role") == scale.BRANCH:  # the tokens it trained: its trunk's are not its own
            per_step = self.size_of[job.trial.attrs["size"]].tokens_per_step
            result.tokens = max(0.0, result.tokens - int(job.trial.attrs["fork_step"]) * per_step)
        result_attrs = {
            "status": result.status,
            "message": result.message,
            "tokens": result.tokens,
            "train_s": result.train_s,
            "process_s": job.extra["process_s"],
            "attempts": job.attempts,
        }
        result_attrs["overhead_s"] = job.overhead_s + time.perf_counter() - t0  # its tell (next) not counted
        self._set_attrs(st, number, {"result": result_attrs})
        st.tell(number, result.value)
        shown = ", ".join(f"{k}={_short(v)}" for k, v in job.trial.params.items())
        what = f"{self.metric.key} {result.value:.4f}" if result.status == "completed" else "diverged"
        self.say(f"{job.label}: {what} ({shown}) in {process_s:.0f} s")
        return None

    def done(self) -> bool:
        for arm in self.study.arms:
            state = self.arm_state(arm)
            if state.plan is None or len(state.final) < len(state.plan):
                return False
            if any(t.state == "RUNNING" for t in state.final + state.all_search):
                return False
        return True


def _in_scope(records: list[TrialRecord], scope: Scope) -> list[TrialRecord]:
    """Search records marked with their scope's name (attrs["scope"])."""
    for t in records:
        t.attrs["scope"] = scope.name
    return records


def records_of_one(st, number: int, arm: str, rnd: Round, root: Path) -> TrialRecord:
    return [r for r in records_of(st, arm, "search", rnd.number, rnd.offset, root) if r.number == number][0]


def _stop(running: list) -> int:
    """SIGTERM every running trial (each saves a checkpoint) and wait for them; how many there were."""
    for _, handle in running:
        handle.terminate()
    for _, handle in running:
        handle.wait()
    return len(running)


def _raise_interrupt(signum, frame):
    raise Interrupted("SIGTERM")


def _last_error(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1][:300]


def _short(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else str(v)
