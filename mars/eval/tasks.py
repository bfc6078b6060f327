"""Which lm-eval tasks to run: presets, local task directories, name checks, offline loading.

A task list is a preset name (``paper``, ``smoke``), an lm-eval task / group / tag name
(``arc_easy``, ``mmlu``), a path to a task YAML file, or a directory of task YAMLs (all the
groups and stand-alone tasks it defines), given as a list or one comma-separated string.
The project's own tasks in ``eval/tasks/`` are always on lm-eval's search path.

Standard tasks download their data from the Hugging Face hub. When the hub cannot be reached
(no network, or HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set) tasks are loaded with the hub
forced offline, so they either come from the local cache at once or fail at once with a
:class:`UserError` naming them; nothing waits on a network timeout.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from mars.errors import UserError

PAPER_TASKS = (
    "arc_easy",
    "arc_challenge",
    "boolq",
    "hellaswag",
    "openbookqa",
    "piqa",
    "winogrande",
    "mmlu",
    "sciq",
)
TASK_PRESETS: dict[str, tuple[str, ...]] = {
    "paper": PAPER_TASKS,  # the MARS paper's zero-shot table (docs/algorithms.md section 6)
    "smoke": ("mars_quiz",),  # offline: the project's own 40-question quiz
}
# eval/tasks/ at the repository root: the project's local tasks (mars_quiz).
LOCAL_TASKS_DIR = Path(__file__).resolve().parents[2] / "eval" / "tasks"

HUB_CHECK_TIMEOUT_S = 2.0
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class TaskSpec:
    """A resolved task list: names (or YAML paths) for lm-eval plus the directories to index."""

    names: tuple[str, ...]
    include_paths: tuple[str, ...]


def resolve_tasks(tasks: str | Sequence[str] | TaskSpec, include: Sequence = ()) -> TaskSpec:
    """Expand presets, comma lists and task directories into a :class:`TaskSpec` (no lm-eval yet)."""
    if isinstance(tasks, TaskSpec):
        return tasks
    items = [tasks] if isinstance(tasks, str) else list(tasks)
    words = [w.strip() for item in items for w in str(item).split(",") if w.strip()]
    if not words:
        raise UserError("no tasks given: pass tasks=paper, tasks=smoke or tasks=[NAME,...]")
    include_paths = [str(LOCAL_TASKS_DIR)] if LOCAL_TASKS_DIR.is_dir() else []
    for extra in include:
        path = Path(extra).expanduser()
        if not path.is_dir():
            raise UserError(f"task directory {path} does not exist (from include=)")
        include_paths.append(str(path.resolve()))
    names: list[str] = []
    for word in words:
        path = Path(word).expanduser()
        if word in TASK_PRESETS:
            names.extend(TASK_PRESETS[word])
        elif path.is_dir():
            include_paths.append(str(path.resolve()))
            defined = top_level_tasks(path)
            if not defined:
                raise UserError(f"task directory {path} defines no lm-eval task or group YAML")
            names.extend(defined)
        elif path.suffix in (".yaml", ".yml") and path.is_file():
            names.append(str(path.resolve()))
        else:
            names.append(word)
    return TaskSpec(tuple(dict.fromkeys(names)), tuple(dict.fromkeys(include_paths)))


def top_level_tasks(directory: str | os.PathLike) -> list[str]:
    """Groups and stand-alone tasks (not members of one of its groups) defined by a directory."""
    tm = task_manager((str(Path(directory).resolve()),), include_defaults=False)
    members = set()
    for group in tm.all_groups:
        children = (tm.task_index[group].cfg or {}).get("task") or []
        members.update(c for c in children if isinstance(c, str))
    return list(tm.all_groups) + [t for t in tm.all_subtasks if t not in members]


@functools.lru_cache(maxsize=8)
def task_manager(include_paths: tuple[str, ...], include_defaults: bool = True):
    """A cached lm-eval TaskManager (indexing lm-eval's own ~15k task YAMLs takes seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(include_paths) or None, include_defaults=include_defaults)


def task_manager_for(spec: TaskSpec):
    """The cheapest TaskManager that knows every name of ``spec``; raises UserError otherwise.

    Names found in the local directories alone skip indexing lm-eval's built-in tasks.
    """
    local = task_manager(spec.include_paths, include_defaults=False)
    if all(_known(local, name) for name in spec.names):
        return local
    full = task_manager(spec.include_paths, include_defaults=True)
    unknown = [name for name in spec.names if not _known(full, name)]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, full.all_tasks + list(TASK_PRESETS), n=3, cutoff=0.75)
            hints.append(f"'{name}'" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise UserError(
            f"unknown task {', '.join(hints)}: use a preset ({', '.join(TASK_PRESETS)}), an lm-eval task, "
            "group or tag name (list them with: python -m lm_eval ls tasks), a task YAML file, "
            "or a directory of task YAMLs"
        )
    return full


def _known(tm, name: str) -> bool:
    return name in tm.task_index or Path(name).is_file()


# ----------------------------------------------------------------------------- hub / offline


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def hub_reachable(timeout: float = HUB_CHECK_TIMEOUT_S) -> bool:
    """Whether the Hugging Face hub (HF_ENDPOINT) accepts a TCP connection within ``timeout``.

    False at once when HF_HUB_OFFLINE, HF_DATASETS_OFFLINE or TRANSFORMERS_OFFLINE is set. The
    probe (DNS lookup included) runs in a daemon thread, so a stalled resolver cannot block us.
    """
    if any(_env_true(v) for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    if not url.hostname:
        return False
    port = url.port or (80 if url.scheme == "http" else 443)
    ok = threading.Event()

    def probe():
        with contextlib.suppress(OSError), socket.create_connection((url.hostname, port), timeout=timeout):
            ok.set()

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return ok.is_set()


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Force datasets / huggingface_hub offline (cache only) inside the block, then restore."""
    import datasets.config
    import huggingface_hub.constants as hub_constants

    saved_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    config = datasets.config
    saved = (config.HF_HUB_OFFLINE, config.HF_DATASETS_OFFLINE, hub_constants.HF_HUB_OFFLINE)
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, datasets.config.HF_DATASETS_OFFLINE = saved[0], saved[1]
        hub_constants.HF_HUB_OFFLINE = saved[2]
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def precache_hint(names: Sequence[str]) -> str:
    tasks = ",".join(Path(n).stem if n.endswith((".yaml", ".yml")) else n for n in names)
    return (
        f"pre-cache them once on a machine with internet (python -m eval precache=true tasks=[{tasks}], "
        "which fills ~/.cache/huggingface or $HF_HOME), copy that cache here and run with "
        "HF_DATASETS_OFFLINE=1; or try tasks=smoke, which needs no download"
    )


@dataclass
class LoadedTasks:
    """lm-eval Task / Group objects for one TaskSpec, in request order, plus their manager."""

    spec: TaskSpec
    objects: list  # top-level lm_eval Task / Group objects, handed to simple_evaluate as is
    names: list[str]  # their names: the keys of the score dict
    manager: object


def load_tasks(spec: TaskSpec) -> LoadedTasks:
    """Build lm-eval's task objects (this loads their datasets), failing fast when offline."""
    tm = task_manager_for(spec)
    online = hub_reachable()
    objects: list = []
    failed: dict[str, str] = {}
    with contextlib.nullcontext() if online else hub_offline():
        for name in spec.names:
            try:
                loaded = tm.load([name])
            except Exception as e:  # datasets raises ConnectionError, FileNotFoundError, ...
                failed[name] = f"{type(e).__name__}: {e}".splitlines()[0]
                continue
            objects.extend(_top_level(loaded))
    if failed:
        first = next(iter(failed))
        detail = f"{first}: {failed[first]}" + ("; likewise the others" if len(failed) > 1 else "")
        cause = (
            "the Hugging Face hub is unreachable (offline) and their datasets are not in the local cache"
            if not online
            else "their datasets failed to load"
        )
        raise UserError(
            f"cannot load task(s) {', '.join(failed)}: {cause} ({detail}). "
            f"To fix: {precache_hint(list(failed))}"
        )
    names = [getattr(obj, "name", None) or obj.task_name for obj in objects]
    return LoadedTasks(spec, objects, list(dict.fromkeys(names)), tm)


def _top_level(loaded: dict) -> list:
    """The objects lm-eval's load() was asked for: groups not inside another group, free tasks."""
    groups, group_map = loaded.get("groups") or {}, loaded.get("group_map") or {}
    children = {c for kids in group_map.values() for c in kids}
    top_groups = [g for name, g in groups.items() if name not in children]
    in_group = {t.task_name for g in groups.values() for t in g.get_all_tasks()}
    return top_groups + [t for name, t in loaded["tasks"].items() if name not in in_group]
