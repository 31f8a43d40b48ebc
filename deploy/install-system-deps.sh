#!/usr/bin/env bash
# System packages the project needs on a Debian machine: a venv-capable Python and the real
# Fashion-MNIST files (Debian's dataset-fashion-mnist, under /usr/share/datasets/fashion-mnist),
# and Chromium for the dashboard's browser test.
set -euo pipefail

needed=()
dpkg -s dataset-fashion-mnist >/dev/null 2>&1 || needed+=(dataset-fashion-mnist)
python3 -m venv --help >/dev/null 2>&1 || needed+=(python3-venv)
python3 -m pip --version >/dev/null 2>&1 || needed+=(python3-pip)
# The browser test opens optuna-dashboard in a real headless Chromium.
command -v chromium >/dev/null 2>&1 || needed+=(chromium)

if ((${#needed[@]})); then
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    echo "installing Debian packages: ${needed[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${needed[@]}" >/dev/null
fi
