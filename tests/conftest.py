"""Keep every test deterministic and offline."""

import logging
import os
import random
import signal

# Set before anything imports datasets / huggingface_hub / wandb.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The optimizers' compiled kernels cost seconds per process to compile or load; tests/optim (whose
# conftest puts the default back) checks them, everything else (and its subprocesses) runs the
# multi-tensor path, which they are tested equal to.
os.environ.setdefault("MARS_OPTIM_FUSED", "0")
# Under pytest-xdist (make test: -n auto) each worker takes one core: the tiny models gain nothing from
# a second thread, and the workers would fight over it.
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(THREADS)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """The tests of one slow file share an xdist worker (make test: --dist loadgroup), so that the file's
    module-scoped multi-process fixture runs once; the other tests go to whichever worker is free."""
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def restore_logging():
    """Hydra configures the root logger (a handler on the test's captured stdout or stderr): undo it after
    every test. Left in place, the next test in the same worker logs into that closed capture ("Logging
    error ... I/O operation on closed file" on its stderr), which fails a one-line-error assertion
    depending on which tests xdist happened to run before it in that worker."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
# A suite started as a background job (nohup, `&` in a script, some CI runners) inherits SIGINT ignored,
# and so would every process a test starts: Ctrl-C tests would see nothing. They assume a terminal's.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
_SESSION_HANDLERS = {s: signal.getsignal(s) for s in _SIGNALS}  # as the worker started


@pytest.fixture(autouse=True)
def restore_signal_handlers():
    """Every test starts with the handlers of the signals a run or a launcher handles (SIGINT, SIGTERM,
    SIGUSR1/2) as the worker started: code a test or a module's fixture runs in this process may install
    its own (the trainer's graceful stop, a launcher's requeue), and one left behind turns a later test's
    Ctrl-C into a stop request instead of a KeyboardInterrupt, depending on which tests xdist ran before
    it in that worker."""
    for s, handler in _SESSION_HANDLERS.items():
        if handler is not None and signal.getsignal(s) is not handler:
            signal.signal(s, handler)
    yield


@pytest.fixture
def make_model():
    """GPT factory (tests/model, tests/checkpoint); every parameter (biases and LayerNorms included)
    randomised, so a mapping that drops or mixes up any tensor shows up in the outputs."""
    from mars.model.gpt import GPT, GPTConfig

    def make(**overrides):
        cfg = GPTConfig(**{"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 128,
                           **overrides})  # fmt: skip
        model = GPT(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias") or "ln_" in name:
                    p.add_(torch.randn_like(p) * 0.1)
        return model.eval()

    return make
