#!/usr/bin/env bash
# Installs every Debian package gradcomm needs (docs/architecture.md, README), idempotently.
# Safe to re-run: packages already present are skipped without touching apt's lists.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config git
  # CPU transport, baselines measured in the same run
  libucx-dev ucx-utils libopenmpi-dev openmpi-bin libgloo-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev python3-pytest
  # CLI, output, auth, compression of data files
  libcli11-dev nlohmann-json3-dev libfmt-dev libssl-dev zlib1g-dev
  # trainer
  libopenblas-dev dataset-fashion-mnist
  # Python bindings and PyTorch integration
  python3 python3-dev pybind11-dev python3-pybind11 python3-numpy python3-torch python3-matplotlib
  libtorch-dev  # the torch C++ extension module (_gradcomm_torch)
  # pip packaging (pyproject.toml, setup.py; scripts/check-pip-install.sh): pip, venv,
  # and the setuptools/wheel that `pip install --no-build-isolation .` builds with
  python3-pip python3-venv python3-setuptools python3-wheel
  # fuzzing and sanitizers (clang + libFuzzer runtime), network emulation
  clang libclang-rt-14-dev iproute2 procps
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${#missing[@]} packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
