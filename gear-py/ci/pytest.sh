#!/usr/bin/env bash
# Builds the `gear` Python package into a local virtual environment
# (target/gear-py-venv, from PyPI: maturin, numpy, pytest, pytest-timeout, h5py
# for the HDF5 cross-check against the C library),
# runs the pytest suite, then the CartPole DQN example in its short form.
# torch is not installed (a CPU wheel is ~200 MB): its tests skip with a
# reason; set GEAR_PY_TORCH=1 to install torch (CPU) and run them too.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(cd .. && pwd)/target/gear-py-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
pip=("$venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" "maturin>=1.5,<2" "numpy>=1.22" pytest pytest-timeout h5py
if [ "${GEAR_PY_TORCH:-0}" = 1 ]; then
    "${pip[@]}" torch --index-url https://download.pytorch.org/whl/cpu
fi
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
# A debug build installed in place (editable); `maturin build --release`
# makes the wheel to ship.
maturin develop --quiet
python -m pytest -q tests
# Bounded like the tests: a hang fails CI instead of stalling it.
timeout 300 python examples/cartpole_dqn.py --steps 4000 --check-loss-falls
timeout 120 python examples/r2d2_sequences.py --updates 200
