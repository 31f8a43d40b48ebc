# Targets the README and CI call. Everything installs into .venv; system packages come from apt.
VENV   ?= .venv
# Where PYTHONDONTWRITEBYTECODE is set, each of the suite's thousands of Python processes (trials,
# hpo commands, pytest's workers) would compile hpo/, trainer/ and pytest's rewritten tests again.
unexport PYTHONDONTWRITEBYTECODE
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# A scheduler the service does not know, installed for the tests only (tests/plugins/fifo_executor):
# it reaches the service through the hpo.executors entry points, as another scheduler's package would.
PLUGIN := tests/plugins/fifo_executor
PLUGIN_STAMP := $(VENV)/.installed-plugin
# torch is pinned where it is installed: a range that admits a newer release pulls several GB.
TORCH  := torch==2.14.1 torchvision==0.29.1

.PHONY: setup system-deps cluster cluster-down test test-fast lint quickstart train bench bench-quick gpu-check clean

setup: system-deps $(STAMP)

system-deps:
	@bash deploy/install-system-deps.sh

# uv installs what pip would (the same versions from PyPI) in a tenth of the time: it downloads in
# parallel and links from its cache rather than unpacking torch's 6 GB of CUDA wheels again. It
# compiles the bytecode as pip does: with PYTHONDONTWRITEBYTECODE set, no import would write it.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet uv
	$(VENV)/bin/uv pip install --python $(PY) --quiet --compile-bytecode $(TORCH) -e '.[test]'
	@touch $(STAMP)

$(PLUGIN_STAMP): $(STAMP) $(PLUGIN)/pyproject.toml
	$(VENV)/bin/uv pip install --python $(PY) --quiet --compile-bytecode -e $(PLUGIN)
	@touch $(PLUGIN_STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The real two-node Slurm (with sacct) and PostgreSQL that the tests run against.
cluster:
	bash deploy/local-cluster/up.sh

cluster-down:
	bash deploy/local-cluster/down.sh

# Four pytest workers on the 2 cores: much of a test of the service waits on Slurm, a database or
# a trial's sleep (with three, the cores idled a tenth of the run), and other workers run meanwhile.
# The tests that start a local Ray run one after the other on one worker (an xdist group); those of
# the fault cluster (deploy/local-cluster/faults.sh), whose daemons they stop, on another. Prints
# the 20 slowest files and the run's time. The lint runs beside the tests (its output printed at
# the end, its failure failing the target): mypy is single-threaded, and before the tests it held
# one core for most of a minute while the other idled.
test: setup $(PLUGIN_STAMP) cluster
	@mkdir -p test-artifacts; \
	$(MAKE) --no-print-directory lint > test-artifacts/lint.log 2>&1 & linting=$$!; \
	$(VENV)/bin/pytest -n 4 --dist loadgroup; tests=$$?; \
	wait $$linting; linted=$$?; \
	echo "lint (ruff, mypy) beside the tests: exit $$linted"; cat test-artifacts/lint.log; \
	exit $$(( tests != 0 ? tests : linted ))

# The layer below the cluster: the tests marked `fast` (pure functions, the schema, reference sbatch
# files, recorded Slurm output, the docs, the import graph); under a minute, no cluster needed.
test-fast: setup $(PLUGIN_STAMP)
	$(VENV)/bin/pytest -n 2 -m fast

# The main job on the embedded default: a 10-trial study of a narrow ResNet on the real
# Fashion-MNIST, trials as local processes, the study in runs/quickstart/; ends with the best trial.
# Run again, it resumes the study (and only prints the best trial once the budget is spent).
quickstart: setup
	$(VENV)/bin/hpo launch studies/quickstart.yaml
	$(VENV)/bin/hpo best studies/quickstart.yaml

# One training run of the trainer alone: one epoch of a CIFAR-style ResNet on Fashion-MNIST, on CPU.
train: setup
	$(PY) -m trainer --config studies/trainer-fashion-mnist.yaml \
		--checkpoint-dir runs/train --result-json runs/train/result.json

# On a GPU node: every GPU path in under ten minutes, one line per check, bench/results/gpu.json
# (on a machine without a GPU it says so and exits 0).
gpu-check: setup
	$(PY) -m bench gpu

# Every benchmark, side by side, into bench/results/ and docs/benchmarks.md (about 60 minutes;
# `make bench-quick` about 10).
bench: setup cluster
	$(PY) -m bench all

bench-quick: setup cluster
	$(PY) -m bench all --quick

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
