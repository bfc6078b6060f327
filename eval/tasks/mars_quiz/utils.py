"""Data loader for the mars_quiz lm-eval task (referenced from mars_quiz.yaml)."""

from pathlib import Path

DATA_FILE = Path(__file__).resolve().parent / "mars_quiz.jsonl"


def load_quiz(**_task_metadata):
    """The quiz as a DatasetDict with one "test" split, read from the jsonl next to this file.

    lm-eval calls custom_dataset functions with the task's metadata as keyword arguments;
    none of them changes what is loaded.
    """
    import datasets

    return datasets.load_dataset("json", data_files={"test": str(DATA_FILE)})
