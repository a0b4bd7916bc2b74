#!/usr/bin/env bash
# The Python benchmark in one command: builds the `gear` binary and the
# Python package in release mode (the package into its own venv,
# target/gear-py-bench-venv, so the test venv keeps its debug build), then
# runs bench.py (arguments are passed on: --rounds N, --json).
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$(pwd)"
venv="$root/target/gear-py-bench-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import maturin, numpy" 2>/dev/null; then
    "$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2" "numpy>=1.22"
fi
cargo build -q --release -p gear-cli --bin gear
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" GEAR_BIN="$root/target/release/gear"
(cd gear-py && maturin develop --quiet --release)
exec python gear-py/bench/bench.py "$@"
