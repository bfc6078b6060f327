# The two commands of the README's quick start. Each installs what it needs first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_VERSION ?= 2.13.0

.PHONY: install train test test-all test-fast lint gpu-check

# CPU torch where no CUDA driver is present: a pinned version resolves to the CPU wheel here,
# an unpinned `torch` would pull the multi-GB CUDA build.
# The postgres extra (psycopg) and, where apt-get can install it, the PostgreSQL server: the slow suite
# starts one to run a study's drivers against it (tests/study/test_postgres.py; skipped without it).
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q "torch==$(TORCH_VERSION)"
	@$(PIP) install -q -e ".[dev,postgres]"
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
		|| [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null \
		|| apt-get install -y -qq postgresql >/dev/null 2>&1 \
		|| (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq postgresql >/dev/null 2>&1) \
		|| echo "note: apt-get could not install postgresql; tests/study/test_postgres.py will be skipped"

train: install
	$(PYTHON) train.py $(ARGS)

# One run of both suites on every core (pytest-xdist, --dist loadgroup): the tests of a slow file, and of a
# module marked xdist_group, share one worker (tests/conftest.py), so that its multi-process fixture runs
# once; the fast tests fill the other worker meanwhile.
test: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m pytest -q -m "not extended" -n auto --dist loadgroup

# test plus the extended tier (-m extended: the heaviest end-to-end tests, about 6 more minutes on 2 cores),
# left out of CI to keep it under 10 minutes: studies of the real train.py (smoke, budgets, submitit), fsdp
# SIGKILL/resharding, two nodes, the plugin end to end, the GPU check's full dry run, the parallel launcher
# and a 2x2 sweep, submitit, LLaMA's SIGKILL resume, fsdp budget branches, a killed study driver's resume,
# 4-rank optimizers, train-then-evaluate.
test-all: test
	$(PYTHON) -m pytest -q -m extended -n auto --dist loadgroup

test-fast: install
	$(PYTHON) -m pytest -q -m "not slow" -n auto --dist loadgroup

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

# On a CUDA machine: the CUDA tests and the benchmarks in 8 minutes, one report in gpu_check/ (or $OUT);
# docs/gpu_check.md. Installs nothing; ARGS=--dry-run runs it on the CPU with tiny sizes (make test-all does).
gpu-check:
	$(PYTHON) scripts/gpu_check.py $(ARGS)
