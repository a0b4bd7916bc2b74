#!/usr/bin/env bash
# Installs NVRTC (the CUDA runtime compiler library, no GPU needed) from the
# PyPI wheel nvidia-cuda-nvrtc into a project-local directory and prints the
# directory holding libnvrtc.so*, for GEAR_NVRTC_DIR or LD_LIBRARY_PATH:
#
#   export GEAR_NVRTC_DIR="$(gear-cuda/ci/install-nvrtc.sh)"
#   GEAR_REQUIRE_NVRTC=1 cargo test -p gear-cuda --test nvrtc_compile
#
# Idempotent: a stamp file records a finished install and later runs only
# print the directory. Progress goes to stderr, the directory to stdout.
#
# Environment:
#   GEAR_NVRTC_VERSION  wheel version (default 13.0.88; cudarc's cuda-13000
#                       bindings load libnvrtc.so.13)
#   GEAR_NVRTC_PREFIX   install directory (default <repo>/.ci/nvrtc)
#   PYTHON              interpreter with pip (default python3)
set -euo pipefail

version="${GEAR_NVRTC_VERSION:-13.0.88}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
prefix="${GEAR_NVRTC_PREFIX:-$repo/.ci/nvrtc}"
python="${PYTHON:-python3}"
major="${version%%.*}"
libdir="$prefix/nvidia/cu$major/lib"
stamp="$prefix/.installed-$version"

if [[ ! -f "$stamp" || ! -e "$libdir/libnvrtc.so.$major" ]]; then
    if ! "$python" -m pip --version >/dev/null 2>&1; then
        echo "install-nvrtc: '$python -m pip' is not available; install pip or set PYTHON" >&2
        exit 1
    fi
    echo "install-nvrtc: installing nvidia-cuda-nvrtc==$version into $prefix" >&2
    mkdir -p "$prefix"
    "$python" -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
        --target "$prefix" "nvidia-cuda-nvrtc==$version" >&2
    if [[ ! -e "$libdir/libnvrtc.so.$major" ]]; then
        echo "install-nvrtc: the wheel did not provide $libdir/libnvrtc.so.$major" >&2
        exit 1
    fi
    # cudarc tries libnvrtc.so first, then libnvrtc.so.<major>; the wheel
    # ships only the versioned name. NVRTC opens its builtins by soname,
    # which GEAR_NVRTC_DIR preloading (or LD_LIBRARY_PATH) makes resolvable.
    ln -sf "libnvrtc.so.$major" "$libdir/libnvrtc.so"
    # Keep the ~200 MB of libraries out of version control.
    printf '*\n' >"$prefix/.gitignore"
    rm -f "$prefix"/.installed-*
    touch "$stamp"
fi
echo "$libdir"
