"""The training loop: gradient accumulation, DDP, exact and approximate MARS, checkpoints, metrics.

One optimizer step t (0-based) of the global batch B_t (`BatchLoader.get(t)`):

    lr factor <- schedule(t)
    exact MARS only (optimizer.needs_previous_grads, docs/algorithms.md section 5):
        grad f(x_t, B_{t+1})   accumulated over micro-steps, all-reduced, clipped
        optimizer.stash_previous_grads()       -> g_prev of step t+1 (zeros if not finite)
        zero grads
    grad f(x_t, B_t)           accumulated over micro-steps, all-reduced on the last one only
    clip (global norm); optimizer.step() with found_inf = "the norm is not finite": a non-finite step
    is skipped on the device (mars.optim.found_inf), nothing read back
    train.average: the averaged weights take the new weights in, under the same verdict (mars.train.average)

Nothing is read from the device in a step. The host reads it at read points only: log, evaluation,
checkpoint and downstream steps and the last step, where the loop needs numbers anyway. There
`settle()` reads the gradient norms of the steps since the last read point (one transfer) and runs,
step by step, what the loop decides from them: the divergence alarms (mars.train.health), the
skipped-step counters and their stop rule, the clip count, and the steps' times (mars.train.step_time:
forward-backward and optimizer step, CUDA events read there). The logged loss is summed on the device
and reduced over ranks at log steps. A preemption's stop flag is agreed across ranks every step in
host memory, over a gloo group (mars.train.distributed.host_group), not through the device.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

import mars.checkpoint as ckpt
from mars.checkpoint.lineage import is_hf_dir, lineage, write_lineage
from mars.train import builtin_metrics as builtin_metrics  # registers gamma and the mars/ diagnostics
from mars.train.config import Config, global_batch_size
from mars.train.distributed import DistInfo, all_reduce_sum, barrier, host_group
from mars.train.forks import given, init_weights, source_checkpoint
from mars.train.health import HealthMonitor
from mars.train.metrics import Metrics, MetricsFile, Progress, check_metrics, logged_metrics
from mars.train.outcome import TrainingDivergedError, settings_digest
from mars.train.resume import load_optimizer_state
from mars.train.rundir import resume_command
from mars.train.schedule import LRSchedule

log = logging.getLogger(__name__)


@dataclass
class Counters:
    """Loop position and running totals; saved in every checkpoint."""

    step: int = 0  # completed optimizer steps (skipped ones included)
    elapsed: float = 0.0  # wall-clock seconds over all resumed segments
    train_time: float = 0.0  # seconds in training steps (no evaluation, checkpoint or compilation), ditto
    nonfinite_total: int = 0
    nonfinite_streak: int = 0
    clipped_steps: int = 0
    best_val_loss: float = math.inf


def _to_config(cfg) -> Config:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_object(cfg)
    if isinstance(cfg, Config):
        return cfg
    raise TypeError(f"expected a DictConfig or mars.train.config.Config, got {type(cfg).__name__}")


def _config_node(cfg) -> DictConfig:
    return cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)


def _branch_kind(t, run_dir: Path, resume_from: Path | None) -> str | None:
    """How a run begins from another: "fork" (continuing another run dir's checkpoint: train.fork_from, or
    train.resume=PATH naming another run dir's checkpoint, which makes the same new run), "init"
    (train.init_from's weights, at step 0), or None (from scratch, or resuming its own)."""
    if resume_from is None:
        return "init" if given(t.init_from) else None
    return "fork" if resume_from.resolve().parent.parent != run_dir.resolve() else None


def build_model(model_cfg, device: torch.device, seed: int, shard=None):
    """The model of `model_cfg` (its model.arch's class) on `device`, initialised from a generator seeded
    with `seed`. `shard`, when given, is applied to the model while it is still on the meta device
    (train.parallel=fsdp: mars.train.parallel.fsdp_sharder)."""
    from mars.model.spec import model_config, spec_for

    model_cfg = model_config(model_cfg)
    model = spec_for(model_cfg).model.empty(model_cfg, device, on_meta=shard)
    model.init_weights(generator=torch.Generator(device=device).manual_seed(seed))
    return model


class Trainer:
    """Owns the model, optimizer, loaders, schedule and loop state of one training run.

    Built in five steps, each a method below: data, model (+ its parallel layout), optimizer (+ the lr
    and gamma schedules), restore (the checkpoint `resume_from`, if any), logging. The loop is fit()."""

    def __init__(self, cfg, run_dir: str | Path, dist: DistInfo, resume_from: str | Path | None = None):
        """resume_from: the checkpoint to continue (mars.train.rundir.choose_start): this run dir's own, or
        another run's (train.fork_from: this run is a fork of it). With none, train.init_from (if set)
        gives the initial weights."""
        self.cfg = _to_config(cfg)
        node = _config_node(cfg)
        self.config_yaml = OmegaConf.to_yaml(node, resolve=True)
        self.settings = settings_digest(node)  # recorded with a divergence stop (mars.train.outcome)
        self.run_dir = Path(run_dir)
        self.dist = dist
        self.device = torch.device(dist.device)
        resume_from = None if resume_from is None else Path(resume_from)
        self.branch = _branch_kind(self.cfg.train, self.run_dir, resume_from)  # "fork" | "init" | None

        self._build_data()
        self._build_model()
        self._build_average()
        self._build_optimizer()
        wandb_run_id = self._restore(resume_from)
        check_metrics(self.raw_model, self.optimizer)  # a plugin metric with no number: stop before step 1
        self._start_logging(OmegaConf.to_container(node, resolve=True), resume_from, wandb_run_id)

        self._batch_cache: dict[int, list] = {}
        self._unread: list[tuple[int, torch.Tensor]] = []  # (step, grad norm) since the last read point
        self._stop_signal: int | None = None
        # the stop flag of a preemption, agreed across ranks in host memory (a gloo group): a CPU tensor
        # and a numpy view of it, so that reading it is not a read from any device
        self._stop_tensor = torch.zeros(1, dtype=torch.int32)
        self._stop_flag = self._stop_tensor.numpy()
        self._host_group = host_group() if self.dist.distributed else None
        self.last_val_loss: float | None = None
        self.last_val_loss_avg: float | None = None
        self.progress: Progress | None = None
        self._fit_start: float | None = None
        self._hardware: str | None = None  # said on the first line with seconds of each fit()
        self._elapsed_before = 0.0

    # ------------------------------------------------------------------ construction

    def _build_data(self) -> None:
        """This rank's share of every step's global batch, and the fixed validation windows."""
        from mars.data import BatchLoader, ValLoader, open_dataset

        c, t, dist = self.cfg, self.cfg.train, self.dist
        dataset = open_dataset(c.data, vocab_size=c.model.vocab_size)
        self.global_batch_size = global_batch_size(c, dist.world_size)
        self.tokens_per_step = self.global_batch_size * c.model.block_size
        self.loader = BatchLoader(
            dataset.train,
            block_size=c.model.block_size,
            global_batch_size=self.global_batch_size,
            micro_batch_size=t.batch_size,
            rank=dist.rank,
            world_size=dist.world_size,
            seed=t.seed if t.data_seed is None else t.data_seed,
            sequential=c.data.sequential,
            device=str(self.device),
            dataset=(str(dataset.path), dataset.train_digest),
        )
        self.accum_steps = self.loader.grad_accum_steps
        self.val_loader = None
        if t.eval_steps > 0:
            self.val_loader = ValLoader(
                dataset.val,
                block_size=c.model.block_size,
                micro_batch_size=t.batch_size,
                num_sequences=t.eval_steps * t.batch_size,
                rank=dist.rank,
                world_size=dist.world_size,
                device=str(self.device),
            )

    def _build_model(self) -> None:
        """The model from its spec, laid out by train.parallel (mars.train.parallel): fsdp shards it on the
        meta device; ddp, over several ranks, wraps it in DDP. With compilation each block's forward is
        compiled in place (compile_blocks). raw_model is the module itself, model what training runs."""
        from mars.device import Precision
        from mars.train.parallel import compile_blocks, compiles, device_mesh, fsdp_sharder, replicate

        t = self.cfg.train
        precision = Precision.of(t.dtype, self.device.type)
        precision.apply()  # TF32 for float32 matmuls on CUDA, except with train.dtype=float32
        bf16 = precision.bfloat16
        use_compile = compiles(t.compile, self.device.type)
        self.fsdp = t.parallel == "fsdp"
        self.ddp = self.dist.distributed and not self.fsdp
        # under fsdp, FSDP2's MixedPrecisionPolicy casts the weights to bfloat16 instead of autocast
        self.autocast = nullcontext() if self.fsdp else precision.autocast()

        # built on the meta device, then materialised and initialised from a generator seeded with
        # train.seed: the same weights on every rank, and in any parallel layout
        torch.manual_seed(t.seed)  # dropout and anything else drawn from the global RNG
        shard = None
        if self.fsdp:
            self.mesh = device_mesh(self.dist.world_size, t.fsdp_replicate, self.device.type)
            shard = fsdp_sharder(self.mesh, mixed_precision=bf16)
        self.raw_model = build_model(self.cfg.model, self.device, t.seed, shard)
        if use_compile:
            compile_blocks(self.raw_model)
        self.model = replicate(self.raw_model, self.device) if self.ddp else self.raw_model
        self.params = [p for p in self.raw_model.parameters() if p.requires_grad]
        self.param_names = {id(p): n for n, p in self.raw_model.named_parameters()}
        self._shard, self._compiled = shard, use_compile
        from mars.train.step_time import StepTimes

        self.timer = StepTimes(self.device, compiled=use_compile)

    def _build_average(self) -> None:
        """train.average: a second model from the spec, laid out (fsdp: sharded) and compiled as the model,
        whose parameters hold the averaged weights (mars.train.average); None when off."""
        self.average = None
        if self.cfg.train.average == "off":
            return
        from mars.train.average import WeightAverage
        from mars.train.parallel import compile_blocks

        average_model = build_model(self.cfg.model, self.device, self.cfg.train.seed, self._shard)
        if self._compiled:
            compile_blocks(average_model)
        self.average = WeightAverage(self.cfg.train, self.cfg.schedule, self.raw_model, average_model)

    def _build_optimizer(self) -> None:
        """The optimizer of the config over raw_model (its values were checked with the run's config,
        mars.train.config.validate: not again here), and its lr (and, for MARS, gamma) schedule."""
        from mars.optim import registered

        c, t = self.cfg, self.cfg.train
        # ddp: Newton-Schulz is divided over the ranks (FSDP2's DTensor parameters carry their mesh)
        replicated = torch.distributed.group.WORLD if self.ddp else None
        spec = registered(c.optimizer.name)
        self.optimizer = spec.build(self.raw_model, c.optimizer, process_group=replicated)
        self.exact = bool(getattr(self.optimizer, "needs_previous_grads", False))
        self.schedule = LRSchedule.from_config(c.schedule, c.optimizer.lr, t.max_steps)

    def _restore(self, step_dir: Path | None) -> str | None:
        """The loop's counters, health history and the sums of the current log window, fresh or from the
        checkpoint `step_dir` together with its weights (copied into the parameters in place), optimizer
        state, loader position and RNG. The optimizer's hyperparameters stay those of this run's config
        (mars.train.resume). Returns the checkpoint's wandb run id."""
        t = self.cfg.train
        self.state = Counters()
        self.health = HealthMonitor(t.health_window, t.spike_factor, t.spike_loss)
        self.window = _Window(self.device)
        if step_dir is None:
            if self.branch == "init":
                init_weights(self.raw_model, t.init_from)
                log.info(f"initial weights from train.init_from={t.init_from}")
            if self.average is not None:
                self.average.copy_from_model()
            return None
        ckpt.check_model_shape(step_dir, self.cfg.model)
        ckpt.load_model_state(self.raw_model, step_dir)
        state = ckpt.load_train_state(step_dir)
        self._restore_average(step_dir, state.get("average"), int(state["counters"]["step"]))
        sharded_dir = step_dir / ckpt.SHARDED_DIR if ckpt.checkpoint_format(step_dir) == "sharded" else None
        load_optimizer_state(
            self.optimizer, ckpt.optimizer_state_for(self.optimizer, state["optimizer"], sharded_dir)
        )
        self.loader.load_state_dict(state["loader"])
        ckpt.set_rng_state(state["rng"])
        self.state = Counters(**state["counters"])
        self.health.load_state_dict(state.get("health", {}))
        if "window" in state:  # older checkpoints: the first log line averages the steps since the resume
            self.window.load_state_dict(state["window"], self._micro_batches_per_step(), self.dist.is_main)
        if self.branch == "fork":  # a run of its own: a wandb run of its own too
            how = "" if given(self.cfg.train.fork_from) else " (train.resume names another run dir's)"
            log.info(f"forked from {step_dir} at step {self.state.step}{how}: own lineage.json and wandb run")
            return None
        log.info(f"resumed from {step_dir} at step {self.state.step}")
        return ckpt.read_meta(step_dir).get("wandb_run_id")

    def _restore_average(self, step_dir: Path, saved: dict | None, step: int) -> None:
        """The averaged weights of the checkpoint, continued bit for bit (the rule is this run's config:
        a decay or start changed on resume applies from here). A checkpoint without them (train.average
        was off, or it predates averaging) or with another kind of average starts the average afresh at
        its weights, with a warning unless nothing would have been averaged yet (a tail that begins later)."""
        a = self.average
        if a is None:
            return
        a.copy_from_model()
        if saved is not None and saved.get("kind") == a.kind and ckpt.has_average(step_dir):
            ckpt.load_average(a.tensors(), step_dir)
            a.load_state_dict(saved)
            return
        why = (
            f"it holds a train.average={saved.get('kind')} average, this run asks for {a.kind}"
            if saved is not None and saved.get("kind") not in (None, "off")
            else "it holds no averaged weights (train.average was off, or it predates them)"
        )
        if a.kind == "tail" and a.start >= step:
            log.info(f"train.average=tail begins after step {a.start}: nothing to carry over from {step_dir}")
            return
        log.warning(
            f"{step_dir}: {why}; the train.average={a.kind} average starts afresh at its weights (step "
            f"{step}), so it is not the average an uninterrupted run would have"
        )

    def _start_logging(self, config: dict, resume_from: Path | None, wandb_run_id: str | None) -> None:
        """The main rank's metrics (metrics.jsonl, wandb), cut back to the step resumed from when the
        checkpoint is this run dir's own (its later lines will be logged again)."""
        self.metrics = None
        if not self.dist.is_main:
            return
        if resume_from is not None and resume_from.resolve().parent.parent == self.run_dir.resolve():
            MetricsFile(self.run_dir).truncate_after(self.state.step)
        if self.branch is not None:  # where this run began (a resume of its own checkpoints keeps it)
            source = resume_from if self.branch == "fork" else Path(self.cfg.train.init_from).expanduser()
            if self.branch == "init" and not is_hf_dir(source):
                source = source_checkpoint("train.init_from", str(source))
            write_lineage(self.run_dir, lineage(self.branch, source))
        self.metrics = Metrics(self.run_dir, self.cfg.logger.wandb, config, wandb_run_id=wandb_run_id)

    # ------------------------------------------------------------------ state

    def _micro_batches_per_step(self) -> int:
        return self.accum_steps * self.dist.world_size

    def save(self, preempted: bool = False) -> Path | None:
        """Checkpoint the current step. Replicated (ddp): rank 0 writes the "full" format while the others
        wait. Sharded (fsdp): every rank writes its shards ("sharded" format), rank 0 the rest.
        preempted: saved because the run was stopped by a signal (meta.json says so: mars.train.rundir).
        A checkpoint at a step of train.ckpt_steps is marked "keep": rotation never deletes it."""
        self.settle()  # the counters and health of every step up to this one
        s = self.state
        window = self.window.state_dict(self._micro_batches_per_step())  # every rank: the loss is summed
        sharded = None
        if self.fsdp:
            optimizer_state, optimizer_tensors = ckpt.split_optimizer_state(self.optimizer, self.param_names)
            sharded = {**ckpt.model_templates(self.raw_model), **optimizer_tensors}
        elif self.dist.is_main:
            optimizer_state = self.optimizer.state_dict()
        average = self.average.tensors() if self.average is not None else None
        path = None
        if self.dist.is_main or sharded is not None:
            s.elapsed = self._elapsed()
            train_state = {
                "optimizer": optimizer_state,
                "loader": self.loader.state_dict(),
                "rng": ckpt.rng_state(),
                "schedule": {"step": s.step, "lr_factor": self.schedule(s.step)},
                "counters": asdict(s),
                "health": self.health.state_dict(),
                "window": window,
            }
            if self.average is not None:
                train_state["average"] = self.average.state_dict()
            meta = {
                "tokens": s.step * self.tokens_per_step,
                "wandb_run_id": self.metrics.wandb.run_id if self.metrics else None,
                "val_loss": self.last_val_loss,
                "val_loss_avg": self.last_val_loss_avg,
                "average": self.cfg.train.average,
                "best_val_loss": s.best_val_loss if math.isfinite(s.best_val_loss) else None,
                "world_size": self.dist.world_size,
                "parallel": self.cfg.train.parallel,
                "global_batch_size": self.global_batch_size,
                "block_size": self.cfg.model.block_size,
                "optimizer": self.cfg.optimizer.name,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "preempted": preempted,
                "spike_pending": self.health.spike_pending(),
                "keep": s.step in self.cfg.train.ckpt_steps,
            }
            path = ckpt.save_checkpoint(
                self.run_dir,
                s.step,
                self.raw_model,
                train_state,
                meta,
                self.config_yaml,
                self.cfg.train.keep_last,
                sharded=sharded,
                healthy=self.health.healthy(s.step),
                average=average,
            )
            if path is not None:
                log.info(f"saved checkpoint {path}")
        barrier()
        return path

    # ------------------------------------------------------------------ compute

    def _batches(self, step: int) -> list:
        """This rank's micro-batches of `step`, each loaded once: exact MARS asks for step t + 1 (its
        look-ahead), then t (loaded as step t's look-ahead one step earlier); two entries are kept."""
        batches = self._batch_cache.get(step)
        if batches is None:
            batches = self._batch_cache[step] = self.loader.get(step)
        for old in [k for k in self._batch_cache if k < step - 1]:
            del self._batch_cache[old]
        return batches

    def _forward_backward(self, batches: list) -> torch.Tensor:
        """Accumulate gradients over the micro-batches; returns the sum of their mean losses."""
        n = len(batches)
        scale = 1.0 / n if self.cfg.train.grad_reduction == "mean" else 1.0
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(batches):
            # DDP all-reduces on the last micro-step only; FSDP2 reduce-scatters every micro-step, which
            # keeps the gradients sharded (and accumulates them in place)
            sync = i == n - 1 or not self.ddp
            with nullcontext() if sync else self.model.no_sync():
                with self.autocast:
                    _, loss = self.model(x, y)
                (loss * scale).backward()
            total += loss.detach()
        return total

    def _clip(self) -> torch.Tensor:
        """Clip the global gradient norm (over every rank's shards under FSDP2); returns the norm."""
        from mars.train.grad_norm import clip_grad_norm_  # the same number in every layout

        max_norm = self.cfg.train.grad_clip if self.cfg.train.grad_clip > 0 else math.inf
        return clip_grad_norm_(self.params, max_norm)

    def _zero_grads(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def forward_backward_step(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradients of step `step` (look-ahead first in exact mode), clipped. Returns (loss sum, norm)."""
        if self.exact:
            self._forward_backward(self._batches(step + 1))
            ahead_norm = self._clip()
            # a non-finite look-ahead would poison the next step: the stash drops it (zeros)
            self._unless_finite(ahead_norm, self.optimizer.stash_previous_grads, zero=True)
            self._zero_grads()
        loss_sum = self._forward_backward(self._batches(step))
        return loss_sum, self._clip()

    def _unless_finite(self, norm: torch.Tensor, call, zero: bool = False) -> torch.Tensor | bool:
        """call() (the optimizer's step or stash) with found_inf = "`norm` is not finite": decided on the
        device (mars.optim.found_inf). An optimizer that does not take found_inf (a plugin's, torch's
        unfused ones) costs one read of `norm` instead: a step is then skipped on the host, a stash made
        of zeroed gradients. Returns the verdict, for what else the step gates on it (the averaged
        weights): 1 (taken) or 0 (skipped) as a 0-dim float tensor on the device, or a host bool."""
        from mars.optim import found_inf, skips_on_device

        bad = (~torch.isfinite(norm)).to(torch.float32)
        if skips_on_device(self.optimizer):
            with found_inf(self.optimizer, bad):
                call()
            return 1.0 - bad
        if math.isfinite(float(norm)):
            call()
            return True
        if zero:
            torch._foreach_zero_([p.grad for p in self.params if p.grad is not None])
            call()
        return False

    @torch.no_grad()
    def evaluate(self, model=None) -> float:
        """Mean token loss over the fixed validation windows, all ranks together, of the model (or of
        `model`: the averaged weights' model)."""
        model = self.raw_model if model is None else model
        model.eval()
        totals = torch.zeros(2, device=self.device, dtype=torch.float64)
        for x, y in self.val_loader:
            with self.autocast:
                _, loss = model(x, y)
            totals[0] += loss.double() * y.numel()
            totals[1] += y.numel()
        model.train()
        if self.fsdp:  # no backward follows: put back the sharded weights FSDP2 kept gathered
            from torch.distributed.fsdp import FSDPModule

            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
        all_reduce_sum(totals)
        return (totals[0] / totals[1]).item() if totals[1] > 0 else math.nan

    def _downstream_and_log(self) -> None:
        """Zero-shot scores of the model (mars.eval, on the main rank), logged as downstream/TASK/METRIC,
        and with train.average those of the averaged weights, as downstream_avg/TASK/METRIC."""
        results = self._downstream(self.raw_model, "downstream")
        if self.average is not None:
            results.update(self._downstream(self.average.model, "downstream_avg"))
        if results:
            self._log(results)

    def _downstream(self, of, prefix: str) -> dict:
        from mars.eval.harness import evaluate_model

        d = self.cfg.downstream
        results = {}
        model = self._whole_model_on_main(of) if self.fsdp else of
        if self.dist.is_main:
            model.eval()
            out = evaluate_model(
                model,
                list(d.tasks),
                limit=d.limit,
                batch_size=d.batch_size,
                device=str(self.device),
                num_fewshot=d.num_fewshot,
                tokenizer=self.cfg.data.tokenizer,
                dtype=self.cfg.train.dtype,
            )
            model.train()
            del model
            for task, metrics in out.items():
                for name, value in metrics.items():
                    if isinstance(value, (int, float)):
                        results[f"{prefix}/{task}/{name}"] = value
        barrier()
        return results

    def _whole_model_on_main(self, of):
        """Under fsdp the main rank cannot run the sharded model `of` alone (its forward all-gathers from
        every rank): every rank takes part in gathering the weights, the main rank gets an unsharded
        float32 copy to evaluate (the others get None)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(of, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.dist.is_main:
            return None
        from mars.model.spec import spec_for

        model = spec_for(self.cfg.model).model.empty(self.cfg.model, self.device)
        model.load_state_dict(full)
        return model

    # ------------------------------------------------------------------ loop

    def _on_signal(self, signum, frame) -> None:
        if self._stop_signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without the checkpoint
        self._stop_signal = signum

    @property
    def stop_signal(self) -> int | None:
        """The signal that stopped fit() before train.max_steps (None: it was not stopped)."""
        return self._stop_signal

    def _install_signal_handlers(self) -> dict:
        from mars.train.launch import preemption_signals

        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT, *preemption_signals()):
            try:
                previous[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread
                pass
        return previous

    def _log(self, values: dict) -> dict:
        """One metrics line (main rank): the current step and tokens, then `values`. Returns the line. The
        first line of this segment of the run that carries seconds also says what they were measured on
        ("hardware": a resumed run may continue on another machine; the report names each)."""
        s = self.state.step
        record = {"step": s, "tokens": s * self.tokens_per_step, **values}
        if self._hardware is not None and "train_time" in values:
            record["hardware"], self._hardware = self._hardware, None
        if self.metrics is not None:
            self.metrics.log(record)
        return record

    def _warn(self, alarm: str | None) -> None:
        if alarm and self.progress is not None:
            self.progress.write(f"warning: {alarm}")

    def _check_health(self, alarm: str | None, step: int) -> None:
        """Say the alarm, if any. When an alarm at `step` dates its trouble from an earlier spike, the
        checkpoints saved since that spike are unhealthy too: the main rank (it writes meta.json) marks
        them."""
        self._warn(alarm)
        h = self.health
        began = h.episode_start if h.last_alarm == step else None
        if began is None or began >= step or not self.dist.is_main:
            return
        for p in ckpt.list_checkpoints(self.run_dir / ckpt.CKPT_DIR):
            if began <= ckpt.step_of(p) < step and ckpt.is_healthy(p):
                why = f"the trouble of the alarm at step {step} began at {began}"
                self._update_meta(p, why, healthy=False)

    def _stopped_by_divergence(self) -> None:
        """The run stops because of divergence: none of its unhealthy checkpoints counts as a preemption's
        any more (train.resume=auto continues an unhealthy one only when a signal stopped the run there)."""
        if not self.dist.is_main:
            return
        for p in ckpt.list_checkpoints(self.run_dir / ckpt.CKPT_DIR):
            try:
                meta = ckpt.read_meta(p)
            except ckpt.CheckpointError:
                continue  # resume=auto will not use it either
            if meta.get("preempted") and not meta.get("healthy", True):
                self._update_meta(p, "the run stopped because of divergence after it", preempted=False)

    def _update_meta(self, step_dir: Path, why: str, **changes) -> None:
        """A health verdict into a checkpoint's meta.json; a failure to write it is said, never fatal."""
        what = "marked unhealthy" if changes.get("healthy") is False else "no longer counts as a preemption's"
        try:
            ckpt.update_meta(step_dir, **changes)
        except (ckpt.CheckpointError, OSError) as e:
            self._warn(f"{step_dir} should be {what} ({why}) but its meta.json cannot be rewritten: {e}")
            return
        self._warn(f"{step_dir} {what}: {why}")

    def _every(self, interval: int) -> bool:
        """Whether the current step is a multiple of `interval` (never for interval 0: off)."""
        return interval > 0 and self.state.step % interval == 0

    def _eval_and_log(self) -> None:
        if self.val_loader is None:
            return
        val = self.evaluate()
        self.last_val_loss = val
        if math.isfinite(val):
            self.state.best_val_loss = min(self.state.best_val_loss, val)
        record = {"val/loss": val}
        if self.average is not None:
            record["val/loss_avg"] = self.last_val_loss_avg = self.evaluate(self.average.model)
        self.state.elapsed = self._elapsed()
        self._log({**record, "time": self.state.elapsed, "train_time": self.state.train_time})
        if self.progress is not None:
            avg = f" (averaged weights {record['val/loss_avg']:.4f})" if "val/loss_avg" in record else ""
            self.progress.write(f"step {self.state.step}: val loss {val:.4f}{avg}")

    def train_step(self) -> StepResult:
        """One optimizer step at self.state.step, with nothing read from the device: a step whose gradient
        norm is not finite changes nothing (found_inf); its norm waits for the next read point (settle)."""
        from mars.optim import set_gamma, set_lr_factor
        from mars.optim.mup import base_lr

        s = self.state
        t0 = time.perf_counter()
        set_lr_factor(self.optimizer, self.schedule(s.step))
        opt = self.cfg.optimizer
        if getattr(opt, "gamma_schedule", None) is not None:  # the MARS family
            set_gamma(self.optimizer, opt.gamma_schedule.gamma(s.step, opt.gamma, self.cfg.train.max_steps))
        self.timer.begin()
        loss_sum, norm = self.forward_backward_step(s.step)
        self.timer.middle()
        taken = self._unless_finite(norm, self.optimizer.step)
        if self.average is not None:
            self.average.update(s.step, taken)
        self._zero_grads()
        timed = self.timer.end()
        s.step += 1
        self._unread.append((s.step, norm.detach()))
        self.window.add(loss_sum, norm)
        lr = base_lr(self.optimizer.param_groups[0])  # the schedule's lr (a muP group's over its multiplier)
        stop = self._agree_stop()
        if timed:  # a step that compiled code is left out of the times (mars.train.step_time)
            seconds = time.perf_counter() - t0
            self.window.seconds += seconds
            self.window.timed += 1
            s.train_time += seconds
        return StepResult(loss_sum, norm.detach(), stop, lr)

    def _agree_stop(self) -> bool:
        """Whether this is the last step: a stop signal on any rank, agreed by all of them at the same step
        through host memory (a gloo group; one process: its own flag)."""
        mine = self._stop_signal is not None
        if self._host_group is None:
            return mine
        self._stop_flag[0] = int(mine)
        torch.distributed.all_reduce(self._stop_tensor, group=self._host_group)
        return bool(self._stop_flag[0])

    def settle(self) -> None:
        """A read point: the gradient norms of the steps since the last one, read in one transfer, then
        step by step what the loop decides from them on the host: the divergence alarms (and the
        checkpoints they mark unhealthy), the skipped-step counters, the clip count and the log window's
        norm. A streak of train.max_nonfinite_steps skipped steps anywhere among them stops the run
        (TrainingDivergedError). Called at every log, evaluation, checkpoint and downstream step."""
        if not self._unread:
            return
        t0 = time.perf_counter()
        norms = torch.stack([n.float().reshape(()) for _, n in self._unread]).tolist()  # the one read
        self.window.add_split(*self.timer.collect())  # CUDA: waits for the last step's end event
        wait = time.perf_counter() - t0  # the wait for the device belongs to the steps
        self.window.seconds += wait
        self.state.train_time += wait
        s, t = self.state, self.cfg.train
        diverged = None
        for (step, _), norm in zip(self._unread, norms, strict=True):
            self._check_health(self.health.on_step(step, norm), step)
            if math.isfinite(norm):
                s.nonfinite_streak = 0
                s.clipped_steps += int(t.grad_clip > 0 and norm > t.grad_clip)
                self.window.norm += norm
                self.window.good += 1
            else:
                s.nonfinite_streak += 1
                s.nonfinite_total += 1
                if s.nonfinite_streak >= t.max_nonfinite_steps:
                    diverged = norm
        self._unread = []
        if diverged is not None:
            self._stopped_by_divergence()
            raise TrainingDivergedError(self._divergence_advice(diverged), self.settings)

    def fit(self) -> str:
        """Train to train.max_steps. Returns "completed", or "preempted" after SIGTERM/SIGINT."""
        t, s = self.cfg.train, self.state
        self.progress = Progress(t.max_steps, s.step, enabled=self.dist.is_main and t.progress)
        previous_handlers = self._install_signal_handlers()
        self._fit_start, self._elapsed_before = time.perf_counter(), s.elapsed
        self.raw_model.train()
        status = "completed"
        try:
            from mars.device import hardware

            self._hardware = hardware(str(self.device), self.dist.world_size)
            if s.step == 0:
                self._eval_and_log()
            last_saved = s.step if s.step > 0 else None
            while s.step < t.max_steps:
                out = self.train_step()
                self.progress.advance()
                last = s.step == t.max_steps
                checkpoint = last or out.stop or self._every(t.ckpt_interval) or s.step in t.ckpt_steps
                log, evaluate = last or self._every(t.log_interval), last or self._every(t.eval_interval)
                if log or evaluate or checkpoint or self._every(self.cfg.downstream.interval):
                    self.settle()  # a read point
                if log:
                    self._log_train(self.window, out.lr)
                    self.window = _Window(self.device)
                if evaluate:
                    self._eval_and_log()
                if self._every(self.cfg.downstream.interval):
                    self._downstream_and_log()
                if checkpoint:
                    self.save(preempted=out.stop)
                    last_saved = s.step
                if out.stop:
                    status = "preempted"
                    self.progress.write(self._stopped_message())
                    break
            if status == "completed" and last_saved != s.step:
                self.save()
        finally:
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
            self.progress.close()
            if self.metrics is not None:
                self.metrics.close()
        return status

    def _stopped_message(self) -> str:
        who = signal.Signals(self._stop_signal).name if self._stop_signal else "a signal to another rank"
        return (
            f"stopped by {who} at step {self.state.step}, checkpoint saved; continue with: "
            f"{resume_command(self.run_dir, self.dist.world_size)}"
        )

    def _elapsed(self) -> float:
        if self._fit_start is None:
            return self.state.elapsed
        return self._elapsed_before + time.perf_counter() - self._fit_start

    def _divergence_advice(self, grad_norm: float) -> str:
        """The stop message: what happened, and the newest healthy checkpoint from before the trouble."""
        s = self.state
        began = self.health.episode_start if self.health.episode_start is not None else s.step
        good = [
            p
            for p in ckpt.list_checkpoints(self.run_dir / ckpt.CKPT_DIR)
            if ckpt.is_healthy(p) and ckpt.step_of(p) < began
        ]
        lr = float(self.cfg.optimizer.lr)
        if good:
            command = resume_command(
                self.run_dir, self.dist.world_size, resume=str(good[-1]), optimizer__lr=lr / 2
            )
            where = (
                f"the newest healthy checkpoint from before it is {good[-1]}: continue from it with a lower "
                f"learning rate (a resumed run uses the new lr), e.g. {command}"
            )
        else:
            command = resume_command(
                self.run_dir, self.dist.world_size, resume=None, optimizer__lr=lr / 2, train__overwrite=True
            )
            where = (
                "no checkpoint precedes it: start again with a lower learning rate (train.overwrite=true "
                f"moves this run aside), e.g. {command}"
            )
        return (
            f"stopping at step {s.step}: {s.nonfinite_streak} steps in a row had a non-finite loss or "
            f"gradient norm (last grad norm {grad_norm}); they were skipped and no checkpoint holds them. "
            f"The trouble began at step {began}; {where}"
        )

    def _log_train(self, win: _Window, lr: float) -> None:
        """One training line: loss averaged over the window's steps and the whole global batch."""
        self.settle()
        s = self.state
        loss_total = all_reduce_sum(win.loss.reshape(1)).item()  # every rank reaches log steps together
        s.elapsed = self._elapsed()
        denom = win.good * self.accum_steps * self.dist.world_size
        timed = win.seconds > 0 and win.timed > 0  # not when every step of the window compiled
        tokens_per_s = win.timed * self.tokens_per_step / win.seconds if timed else math.nan
        record = {
            "train/loss": loss_total / denom if denom else math.nan,
            "lr": lr,
            "grad_norm": win.norm / win.good if win.good else math.nan,
            "train/clip_rate": s.clipped_steps / s.step,
            "train/nonfinite_steps": s.nonfinite_total,
            "time": s.elapsed,
            "train_time": s.train_time,
            "ms_per_step": 1000 * win.seconds / win.timed if timed else math.nan,
            "ms_forward_backward": 1000 * win.forward_backward / win.split if win.split else math.nan,
            "ms_optimizer": 1000 * win.optimizer / win.split if win.split else math.nan,
            "tokens_per_s": tokens_per_s,
        }
        # gamma, the mars/ diagnostics (mars.train.builtin_metrics), then a researcher's (register_metric)
        record.update(logged_metrics(self.raw_model, self.optimizer))
        from mars.model.flops import mfu
        from mars.model.spec import spec_for

        fpt = spec_for(self.cfg.model).flops_per_token(self.cfg.model, None)
        utilisation = mfu(tokens_per_s, fpt, self.device, num_devices=self.dist.world_size)
        if utilisation is not None or self.device.type == "cuda":  # CPU: only with $MARS_PEAK_FLOPS
            record["mfu"] = utilisation
        if self.device.type == "cuda":  # the allocator's own count: no device synchronisation
            record["max_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
        self._log(record)
        self.progress.show(record)
        self._check_health(self.health.on_loss(s.step, record["train/loss"]), s.step)


@dataclass
class StepResult:
    loss_sum: torch.Tensor  # this rank's sum of micro-batch mean losses (on the device)
    grad_norm: torch.Tensor  # global gradient norm before clipping (on the device; not finite: skipped)
    stop: bool  # a rank got SIGTERM / SIGINT: every rank stops after this step
    lr: float


class _Window:
    """Sums over the steps since the last training log line (the loss stays on the device; the norms of
    the finite steps and their count are added by Trainer.settle). Saved in every checkpoint, so that
    the first line after a resume averages the same steps as an uninterrupted run's line."""

    def __init__(self, device: torch.device):
        self.loss = torch.zeros((), device=device)
        self.norm, self.good, self.steps, self.seconds = 0.0, 0, 0, 0.0
        # the timed steps (no compilation: mars.train.step_time), their wall time in `seconds`, and the
        # split of the steps read so far: forward-backward and optimizer seconds over `split` steps
        self.timed, self.forward_backward, self.optimizer, self.split = 0, 0.0, 0.0, 0

    def add_split(self, forward_backward: float, optimizer: float, steps: int) -> None:
        self.forward_backward += forward_backward
        self.optimizer += optimizer
        self.split += steps

    def state_dict(self, micro_batches: int) -> dict:
        """On every rank (the loss is summed over them); `micro_batches` per step over all ranks."""
        loss = all_reduce_sum(self.loss.detach().clone()).cpu()
        sums = {"norm": self.norm, "good": self.good, "steps": self.steps, "seconds": self.seconds}
        times = {"timed": self.timed, "forward_backward": self.forward_backward, "optimizer": self.optimizer}
        return {"loss": loss, "micro_batches": micro_batches, **sums, **times, "split": self.split}

    def load_state_dict(self, state: dict, micro_batches: int, main: bool) -> None:
        """The loss summed over every rank goes to the main rank (the log line sums over ranks again); a sum
        over another number of micro-batches per step (another world size or micro batch) is rescaled."""
        loss = state["loss"].to(self.loss.device, self.loss.dtype)
        if int(state["micro_batches"]) != micro_batches:
            loss = loss * (micro_batches / int(state["micro_batches"]))
        self.loss = loss if main else torch.zeros_like(loss)
        self.norm, self.good = float(state["norm"]), int(state["good"])
        self.steps, self.seconds = int(state["steps"]), float(state["seconds"])
        self.timed = int(state.get("timed", self.steps))  # older checkpoints: every step timed, no split
        self.forward_backward, self.optimizer = (
            float(state.get("forward_backward", 0.0)),
            float(state.get("optimizer", 0.0)),
        )
        self.split = int(state.get("split", 0))

    def add(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """A step's loss, on the device (a skipped step's, not finite, adds nothing); its norm is added at
        the next read point (Trainer.settle), its time by train_step()."""
        self.steps += 1
        self.loss += torch.where(torch.isfinite(grad_norm), loss_sum.detach(), 0.0)
