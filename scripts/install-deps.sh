#!/usr/bin/env bash
# Installs the Debian packages c10d needs. Idempotent: does nothing (quietly) when every
# package is already present, and runs `apt-get update` only when something is missing.
# Python packages (numpy, pytest, PyTorch, mpi4py, ...) come from PyPI into the project venv
# instead (Makefile, requirements/). Set C10D_WITH_FUZZ=1 for clang and its libFuzzer runtime.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libgloo-dev libuv1-dev libdlpack-dev libcpp-httplib-dev nlohmann-json3-dev
  libopenmpi-dev openmpi-bin
  python3 python3-dev python3-venv
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  clang-format
  debootstrap  # the bare root file system the portable wheel is tried in (make test)
  chromium     # the flight recorder's timeline page is checked in a real browser (make test)
)
if [[ "${C10D_WITH_FUZZ:-0}" == "1" ]]; then
  packages+=(clang libclang-rt-14-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Update the package lists only when they are absent or an install fails for lack of them.
if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
