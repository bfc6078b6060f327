"""What a resumed run may change, and applying the new config to restored optimizer state.

The rule (docs/reliability.md):
  * fixed on resume: what defines the run and its saved state: the model's architecture and shape (its
    spec's shape_keys and fixed_keys, mars.model.spec), the optimizer and
    the layout of its state (name, approx, lean, optimize_1d, two_dim_rule), the data (source,
    directory, files, sampling), the global batch size and the seeds (train.seed, train.data_seed).
    A resume that changes any of them is refused with the list of differences;
  * everything else may change and takes effect: the optimizer's hyperparameters (lr, betas, weight
    decay, eps, gamma and its schedule, ...) are the new config's, not the checkpoint's, and so are
    the schedule, max_steps, the intervals and the device settings. The lr and gamma logged in
    metrics.jsonl are read back from the optimizer, so they are always the values it used.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from mars.errors import CheckpointError

FIXED_KEYS = (
    "optimizer.name",
    "optimizer.approx",
    "optimizer.lean",
    "optimizer.optimize_1d",
    "optimizer.two_dim_rule",
    "data.name",
    "data.dir",
    "data.hf_path",
    "data.hf_config",
    "data.hf_split",
    "data.paths",
    "data.format",
    "data.text_field",
    "data.text_sample_by",
    "data.seed",
    "data.sequential",
    "train.global_batch_size",
    "train.seed",
    "train.data_seed",
)  # and the model's: model_fixed_keys
_MISSING = object()


def model_fixed_keys(flat: dict[str, Any]) -> tuple[str, ...]:
    """model.arch and the keys its spec fixes (shape_keys + fixed_keys), for the config `flat` holds."""
    from mars.model.spec import DEFAULT_ARCH, arch

    spec = arch(flat.get("model.arch") or DEFAULT_ARCH)
    return ("model.arch", *(f"model.{k}" for k in (*spec.shape_keys, *spec.fixed_keys)))


def _legacy_model_values(name: Any) -> dict[str, Any]:
    """What a saved run config that lacks a model key of its architecture trained with (mars.model.spec)."""
    from mars.model.spec import arch

    try:
        return dict(arch(name).legacy_values)
    except ValueError:  # an unknown architecture: check_resume_config names it
        return {}


def _flat(cfg: Any) -> dict[str, Any]:
    if not isinstance(cfg, dict):
        cfg = OmegaConf.to_container(OmegaConf.structured(cfg) if not OmegaConf.is_config(cfg) else cfg)
    out: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v

    walk(cfg, "")
    return out


def _effective(flat: dict[str, Any], world_size: int | None) -> dict[str, Any]:
    """Resolve the keys whose null means "derived": data_seed (= seed), global_batch_size."""
    flat = dict(flat)
    if flat.get("train.data_seed", _MISSING) is None:
        flat["train.data_seed"] = flat.get("train.seed")
    if flat.get("train.global_batch_size", _MISSING) is None and world_size is not None:
        flat["train.global_batch_size"] = int(flat["train.batch_size"]) * world_size
    return flat


def fixed_differences(saved: dict, new: Any, saved_world_size: int | None, world_size: int) -> list[str]:
    """`key: saved -> new` for every fixed key that differs (keys an older checkpoint lacks are skipped)."""
    old = _effective(_flat(saved), saved_world_size)
    cur = _effective(_flat(new), world_size)
    old.setdefault("model.arch", "gpt2")  # a run config written before there were two architectures
    for key, value in _legacy_model_values(old["model.arch"]).items():
        old.setdefault(f"model.{key}", value)  # the saved run predates the key: it trained with this value
    diffs = []
    for key in (*model_fixed_keys(cur), *FIXED_KEYS):
        a, b = old.get(key, _MISSING), cur.get(key, _MISSING)
        if a is _MISSING or b is _MISSING:
            continue
        if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
            a, b = list(a or []), list(b or [])
        if a != b:
            diffs.append(f"{key}: {a!r} -> {b!r}")
    return diffs


def check_resume_config(
    step_dir, saved: dict, new: Any, saved_world_size: int | None, world_size: int
) -> None:
    """Refuse to continue `step_dir` under a config that changes what the run is."""
    theirs, ours = (_flat(c).get("model.arch") or "gpt2" for c in (saved, new))
    if theirs != ours:
        raise CheckpointError(
            f"cannot resume {step_dir} with this config: it holds a model.arch={theirs} model, the config "
            f"asks for model.arch={ours}; resume it with a model={theirs}_* preset, or start a new run dir"
        )
    diffs = fixed_differences(saved, new, saved_world_size, world_size)
    if diffs:
        raise CheckpointError(
            f"cannot resume {step_dir} with this config: {'; '.join(diffs)} (these keys are fixed for a "
            "run: model architecture and shape, optimizer and its state layout, data, global batch, "
            "seeds); resume with the checkpoint's values, or start a new run (another hydra.run.dir) "
            "from its weights"
        )


HYPERPARAMETER_SKIP = ("params", "param_names")


def load_optimizer_state(optimizer, state_dict: dict) -> None:
    """optimizer.load_state_dict(state_dict), keeping the hyperparameters the optimizer was built with.

    torch's load_state_dict restores every param-group entry from the checkpoint (lr, betas, weight
    decay, the schedule's initial_lr, ...). Under the resume rule those come from the new config, so
    they are put back after the load; entries that only the old run had (e.g. initial_lr, recorded by
    the lr schedule) are dropped so the schedule scales from the new base values.
    """
    fresh = [{k: v for k, v in g.items() if k not in HYPERPARAMETER_SKIP} for g in optimizer.param_groups]
    optimizer.load_state_dict(state_dict)
    for group, values in zip(optimizer.param_groups, fresh, strict=True):
        for key in [k for k in group if k not in values and k not in HYPERPARAMETER_SKIP]:
            del group[key]
        group.update(values)
