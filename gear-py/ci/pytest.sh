#!/usr/bin/env bash
# Builds the `gear` Python package into a local virtual environment
# (target/gear-py-venv, from PyPI: maturin, numpy, pytest, pytest-timeout,
# h5py for the HDF5 cross-check against the C library, torch and jax[cpu]
# so the torch, DLPack and JAX tests run), builds the `gear` binary the
# cluster tests start as shard servers, runs the pytest suite, then the
# examples in their short forms.
#
# torch comes from the ordinary package index (the default wheel, with its
# CUDA libraries, ~5 GB; it runs on the CPU). A venv that already has
# torch and jax is reused as it is: a second run installs nothing.
#
# Disk is what a fresh install runs out of (CI once reached this step with
# 3.3 GB free), so the install keeps its peak near the venv's final size:
# pip resolves torch and jax[cpu] from the index's metadata alone, then
# installs what it resolved one wheel per call, with no cache, so no more
# than one downloaded wheel sits beside the venv at a time. torch's triton
# (~1 GB, used only to compile models, which no test does) is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(cd .. && pwd)"
venv="$root/target/gear-py-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
# pip's cache is off: it would hold a second copy of torch's ~3 GB of
# wheels beside the venv, and a full disk is the likeliest way a fresh
# install fails. An install that fails (a registry hiccup, a full disk) is
# tried three times, each failure followed by the disk's free space so the
# log says which it was.
pip_install() {
    local attempt
    for attempt in 1 2 3; do
        if "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir --progress-bar off "$@"; then
            return 0
        fi
        echo "pytest.sh: pip install $* failed (attempt $attempt of 3); free space under target/:" >&2
        df -h "$root/target" >&2 || true
        [ "$attempt" -lt 3 ] && sleep $((attempt * 20))
    done
    return 1
}
if ! "$venv/bin/python" -c "import maturin, numpy, pytest, pytest_timeout, h5py" 2>/dev/null; then
    pip_install "maturin>=1.5,<2" "numpy>=1.22" pytest pytest-timeout h5py
fi
# Installs the requirements' resolution one wheel per pip call (above).
pip_install_one_at_a_time() {
    local report="$venv/torch-jax-resolution.json" requirement
    pip_install --dry-run --report "$report" "$@"
    "$venv/bin/python" -c '
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    print(item["metadata"]["name"] + "==" + item["metadata"]["version"])
' "$report" | while read -r requirement; do
        case "$requirement" in
            triton==*) continue ;;
        esac
        pip_install --no-deps "$requirement"
    done
    rm -f "$report"
}
if ! "$venv/bin/python" -c "import torch, jax" 2>/dev/null; then
    echo "pytest.sh: installing torch and jax[cpu] (~5 GB) into $venv; free space: $(df -h --output=avail "$root/target" | tail -1)"
    pip_install_one_at_a_time torch "jax[cpu]"
fi
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
# torch, JAX and the cluster's shard servers must be there: their tests
# fail instead of skipping.
export GEAR_REQUIRE_TORCH=1
# The shard servers. The test profile is what `cargo test --workspace`
# (earlier in .ci/run) built, so this reuses its artifacts.
cargo build -q --profile test -p gear-cli --bin gear
export GEAR_BIN="$root/target/debug/gear"
# A debug build installed in place (editable); `maturin build --release`
# makes the wheel to ship.
maturin develop --quiet
python -m pytest -q tests
# Bounded like the tests: a hang fails CI instead of stalling it.
timeout 300 python examples/cartpole_dqn.py --steps 4000 --check-loss-falls
timeout 120 python examples/r2d2_sequences.py --updates 200
timeout 300 python examples/cluster_dqn.py --steps 4000 --check-loss-falls
