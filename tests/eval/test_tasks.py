"""Task lists: presets, directories, unknown names, and failing fast without the hub."""

import os
import time

import pytest

from mars.errors import UserError
from mars.eval.tasks import (
    LOCAL_TASKS_DIR,
    PAPER_TASKS,
    hub_offline,
    hub_reachable,
    load_tasks,
    resolve_tasks,
    task_manager_for,
)

QUIZ_DIR = LOCAL_TASKS_DIR / "mars_quiz"


def test_presets_comma_lists_and_order():
    spec = resolve_tasks("paper")
    assert spec.names == PAPER_TASKS
    assert str(LOCAL_TASKS_DIR) in spec.include_paths
    assert resolve_tasks("smoke").names == ("mars_quiz",)
    # comma strings and lists mix; duplicates are dropped, order kept
    assert resolve_tasks(["piqa,arc_easy", "piqa", "smoke"]).names == ("piqa", "arc_easy", "mars_quiz")
    with pytest.raises(UserError, match="no tasks given"):
        resolve_tasks(" , ")


def test_task_directory_and_yaml_file(tmp_path):
    spec = resolve_tasks(str(QUIZ_DIR))
    assert spec.names == ("mars_quiz",)
    assert str(QUIZ_DIR.resolve()) in spec.include_paths
    yaml_file = QUIZ_DIR / "mars_quiz.yaml"
    assert resolve_tasks(str(yaml_file)).names == (str(yaml_file.resolve()),)
    empty = tmp_path / "no_tasks"
    empty.mkdir()
    with pytest.raises(UserError, match="defines no lm-eval task"):
        resolve_tasks(str(empty))
    with pytest.raises(UserError, match="does not exist"):
        resolve_tasks("smoke", include=[str(tmp_path / "missing")])


def test_local_tasks_skip_the_builtin_index():
    tm = task_manager_for(resolve_tasks("smoke"))
    assert tm.all_tasks == ["mars_quiz"]  # lm-eval's ~15k built-in tasks were not indexed


def test_local_quiz_loads_offline():
    loaded = load_tasks(resolve_tasks("smoke"))
    assert loaded.names == ["mars_quiz"]
    docs = list(loaded.objects[0].test_docs())
    assert len(docs) == 40
    assert all(len(d["choices"]) == 4 and 0 <= d["answer"] < 4 for d in docs)
    assert sorted({d["answer"] for d in docs}) == [0, 1, 2, 3]  # correct answers spread over positions


def test_unknown_task_is_one_line_with_a_suggestion():
    with pytest.raises(UserError) as err:
        task_manager_for(resolve_tasks(["arc_easy", "hellaswagg"]))
    msg = str(err.value)
    assert "\n" not in msg
    assert "'hellaswagg'" in msg and "did you mean hellaswag" in msg
    assert "arc_easy" not in msg.split("(did you mean")[0]  # only the unknown name is reported
    assert "paper" in msg and "smoke" in msg


def _hub_task_dir(tmp_path):
    """A task whose dataset lives on the hub under a name nobody has cached."""
    d = tmp_path / "hub_tasks"
    d.mkdir()
    (d / "hub_only.yaml").write_text(
        "task: hub_only\n"
        "dataset_path: mars-harness-tests/does-not-exist\n"
        "output_type: multiple_choice\n"
        "test_split: test\n"
        "doc_to_text: '{{q}}'\n"
        "doc_to_choice: '{{c}}'\n"
        "doc_to_target: a\n"
        "metric_list:\n  - metric: acc\n"
    )
    return d


def test_offline_fails_fast_naming_the_tasks(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = resolve_tasks(["mars_quiz", str(_hub_task_dir(tmp_path))])
    start = time.perf_counter()
    with pytest.raises(UserError) as err:
        load_tasks(spec)
    assert time.perf_counter() - start < 60  # datasets' download retries take minutes; any load, seconds
    msg = str(err.value)
    assert "\n" not in msg
    assert "hub_only" in msg and "mars_quiz" not in msg.split("To fix")[0]  # the quiz loaded fine
    assert "unreachable" in msg and "HF_DATASETS_OFFLINE=1" in msg and "precache=true" in msg


def test_hub_probe_never_waits(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused at once
    start = time.perf_counter()
    assert hub_reachable(timeout=1.0) is False
    assert time.perf_counter() - start < 10  # no retries with backoff (a refused port answers at once)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert hub_reachable() is False


def test_hub_offline_restores_settings(monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with hub_offline():
        assert datasets.config.HF_HUB_OFFLINE and huggingface_hub.constants.HF_HUB_OFFLINE
        assert os.environ["HF_DATASETS_OFFLINE"] == "1"
    assert not datasets.config.HF_HUB_OFFLINE and not huggingface_hub.constants.HF_HUB_OFFLINE
    assert "HF_DATASETS_OFFLINE" not in os.environ
