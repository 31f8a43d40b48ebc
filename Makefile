# Targets the README and CI call. Everything installs into .venv; system packages come from apt.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch is pinned where it is installed: a range that admits a newer release pulls several GB.
TORCH  := torch==2.14.1 torchvision==0.29.1

.PHONY: setup system-deps test lint quickstart bench clean

setup: system-deps $(STAMP)

system-deps:
	@bash deploy/install-system-deps.sh

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: lint
	$(VENV)/bin/pytest

# The main job on the embedded default: one epoch of a CIFAR-style ResNet on the real Fashion-MNIST, on CPU.
quickstart: setup
	$(PY) -m trainer --config studies/trainer-fashion-mnist.yaml \
		--checkpoint-dir runs/quickstart --result-json runs/quickstart/result.json

bench: setup
	$(PY) bench/throughput.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
