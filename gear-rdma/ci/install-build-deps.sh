#!/usr/bin/env bash
# Installs what gear-rdma's `rdma` feature needs to build (sideway's
# rdma-mummy-sys compiles a small C shim with cmake and generates bindings
# with bindgen, which loads libclang) from PyPI wheels into a project-local
# directory, without root, and prints shell lines that put them in use:
#
#   build_env="$(bash gear-rdma/ci/install-build-deps.sh)" && eval "$build_env"
#   cargo build -p gear-rdma --features rdma
#
# (`eval "$(...)"` in one step also works but hides a failed install.)
#
# A cmake already on PATH and a LIBCLANG_PATH already set are kept. No RDMA
# device or rdma-core is needed to build: the shim loads libibverbs at run
# time. Idempotent: a stamp file records a finished install. Progress goes to
# stderr, the export lines to stdout.
#
# Environment:
#   GEAR_CMAKE_VERSION     cmake wheel version (default 3.31.6)
#   GEAR_LIBCLANG_VERSION  libclang wheel version (default 18.1.1)
#   GEAR_RDMA_DEPS_PREFIX  install directory (default <repo>/.ci/rdma-build-deps)
#   PYTHON                 interpreter with pip (default python3)
set -euo pipefail

cmake_version="${GEAR_CMAKE_VERSION:-3.31.6}"
libclang_version="${GEAR_LIBCLANG_VERSION:-18.1.1}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
prefix="${GEAR_RDMA_DEPS_PREFIX:-$repo/.ci/rdma-build-deps}"
python="${PYTHON:-python3}"
stamp="$prefix/.installed-cmake-$cmake_version-libclang-$libclang_version"

need_cmake=1
if command -v cmake >/dev/null 2>&1; then need_cmake=0; fi
need_libclang=1
if [[ -n "${LIBCLANG_PATH:-}" ]]; then need_libclang=0; fi

if [[ $need_cmake == 0 && $need_libclang == 0 ]]; then
    echo "install-build-deps: cmake is on PATH and LIBCLANG_PATH is set; nothing to install" >&2
    exit 0
fi

if [[ ! -f "$stamp" ]]; then
    if ! "$python" -m pip --version >/dev/null 2>&1; then
        echo "install-build-deps: '$python -m pip' is not available; install pip or set PYTHON" >&2
        exit 1
    fi
    echo "install-build-deps: installing cmake==$cmake_version and libclang==$libclang_version into $prefix" >&2
    mkdir -p "$prefix"
    "$python" -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
        --target "$prefix" "cmake==$cmake_version" "libclang==$libclang_version" >&2
    # Keep the wheels' binaries out of version control.
    printf '*\n' >"$prefix/.gitignore"
    rm -f "$prefix"/.installed-*
    touch "$stamp"
fi

# The cmake wheel's real binary (its bin/cmake entry point is a Python
# script that needs the wheel on PYTHONPATH); the libclang wheel's library.
cmake_bin="$prefix/cmake/data/bin"
libclang_dir="$prefix/clang/native"
if [[ $need_cmake == 1 ]]; then
    if [[ ! -x "$cmake_bin/cmake" ]]; then
        echo "install-build-deps: the cmake wheel did not provide $cmake_bin/cmake" >&2
        exit 1
    fi
    printf 'export PATH=%q:"$PATH"\n' "$cmake_bin"
fi
if [[ $need_libclang == 1 ]]; then
    if ! compgen -G "$libclang_dir/libclang*.so*" >/dev/null; then
        echo "install-build-deps: the libclang wheel did not provide $libclang_dir/libclang.so" >&2
        exit 1
    fi
    printf 'export LIBCLANG_PATH=%q\n' "$libclang_dir"
    # The wheel has libclang but not clang's builtin headers (stddef.h,
    # stdarg.h, ...), which the system headers bindgen parses include; the C
    # compiler's own copies serve (cmake needs that compiler anyway).
    cc_bin="${CC:-cc}"
    builtin_dir="$("$cc_bin" -print-file-name=include 2>/dev/null || true)"
    if [[ -z "$builtin_dir" || ! -f "$builtin_dir/stddef.h" ]]; then
        echo "install-build-deps: '$cc_bin -print-file-name=include' gave no directory with stddef.h; bindgen will miss clang's builtin headers" >&2
        exit 1
    fi
    printf 'export BINDGEN_EXTRA_CLANG_ARGS=%q\n' "${BINDGEN_EXTRA_CLANG_ARGS:+$BINDGEN_EXTRA_CLANG_ARGS }-I$builtin_dir"
fi
