#!/usr/bin/env bash
# The GPU check (python -m bench gpu) on a GPU machine that reaches no package index: a bare node
# whose python3 already holds torch, torchvision, numpy, PyYAML, TensorBoard, nvidia-ml-py and
# cloudpickle, but not the rest of what this service imports.
#
#   bash bench/gpu_machine.sh fetch   # here, with PyPI: those packages as wheels, into .whl/ (git-ignored)
#   bash bench/gpu_machine.sh run     # there, in the repository's root with .whl/ beside it
#
# `run` installs the wheels into /tmp/hpo-site (nothing of the machine's own Python changes), runs
# the check, and copies bench/results/gpu.json, gpu.txt and docs/benchmarks.md into $OUT when the
# machine's runner collects files from there. PY_VERSION (default 3.12) is the machine's Python.
set -euo pipefail
cd "$(dirname "$0")/.."

# The versions the test suite runs with (pyproject.toml's ranges admit them).
PACKAGES=(
    optuna==5.0.0 alembic==1.20.1 mako==1.4.3 colorlog==6.12.0
    submitit==1.5.4
    sqlalchemy==2.1.9 greenlet==3.5.6
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
    typing-extensions==4.16.0
)

case "${1:-}" in
fetch)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    pip=(python3 -m pip)
    [ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)
    "${pip[@]}" download --quiet --no-deps --only-binary=:all: --dest .whl \
        --python-version "${PY_VERSION:-3.12}" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        "${PACKAGES[@]}"
    echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1), in .whl/: carry it to the GPU machine"
    ;;
run)
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/hpo-site .whl/*.whl
    export PYTHONPATH="/tmp/hpo-site:$PWD" PYTHONUNBUFFERED=1
    status=0
    python3 -m bench gpu || status=$?
    if [ -n "${OUT:-}" ]; then
        cp bench/results/gpu.json bench/results/gpu.txt docs/benchmarks.md "$OUT"/ 2>/dev/null || true
    fi
    exit "$status"
    ;;
*)
    echo "usage: bash bench/gpu_machine.sh fetch|run" >&2
    exit 2
    ;;
esac
