#!/usr/bin/env bash
# Runs on each worker, in the copied checkout (tpu_scripts/setup.sh sends it there):
#   cd ~/jaxrl-llm && bash tpu_scripts/install_worker.sh
# Makes .venv with a Python the package supports (pyproject.toml: >=3.11,<3.14) and installs
# this tree into it with jax[tpu]; tpu_scripts/launch.sh runs .venv/bin/jaxrl-llm. The TPU VM
# runtimes on Ubuntu 22.04 have Python 3.10 only: then apt adds python3.11 (Ubuntu's universe).
# Stops with one line naming the Python it found when no supported one can be had.
set -euo pipefail

SUPPORTED="3.11 3.12 3.13"
VENV=.venv
APT=(sudo apt-get -q -o DPkg::Lock::Timeout=600)  # a fresh VM's unattended upgrades hold the lock

die() {
  echo "error: $*" >&2
  exit 2
}

# "3.10" for a Python 3.10.12; nothing when $1 is not a Python.
py_version() {
  local out
  out=$("$1" --version 2>&1) || return 0
  if [[ "$out" =~ ^Python\ ([0-9]+\.[0-9]+) ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
  fi
}

supported() {
  local v
  v=$(py_version "$1")
  [[ -n "$v" && " $SUPPORTED " == *" $v "* ]]
}

# The first supported Python on PATH (python3 first), or nothing.
find_python() {
  local py
  for py in python3 python3.13 python3.12 python3.11; do
    if command -v "$py" >/dev/null && supported "$py"; then
      command -v "$py"
      return 0
    fi
  done
}

# What python3 is here, for the error message.
found_python() {
  if command -v python3 >/dev/null; then
    printf '%s (%s)' "$(python3 --version 2>&1)" "$(command -v python3)"
  else
    printf 'no python3'
  fi
}

apt_install() {
  command -v apt-get >/dev/null || return 1
  { "${APT[@]}" update && "${APT[@]}" install -y "$@"; } >>apt.log 2>&1
}

PY=$(find_python)
if [[ -z "$PY" ]]; then
  echo "no Python $SUPPORTED on PATH; installing python3.11 with apt (log: ~/jaxrl-llm/apt.log)"
  apt_install python3.11 python3.11-venv || true
  PY=$(find_python)
fi
[[ -n "$PY" ]] || die "jaxrl-llm needs Python 3.11 to 3.13; this worker has $(found_python) and" \
  "apt could not add python3.11 (~/jaxrl-llm/apt.log): install one, then rerun tpu_scripts/setup.sh"

if ! supported "$VENV/bin/python"; then
  if ! "$PY" -m venv --clear "$VENV" >>venv.log 2>&1; then
    # Ubuntu splits venv's ensurepip into pythonX.Y-venv.
    apt_install "python$(py_version "$PY")-venv" || true
    "$PY" -m venv --clear "$VENV" || die "$PY -m venv $VENV failed (see ~/jaxrl-llm/venv.log)"
  fi
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -e '.[tpu]'
"$VENV/bin/python" -c 'import jax; print(jax.process_index(), jax.device_count())'
