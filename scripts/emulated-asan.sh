#!/usr/bin/env bash
# Run a runner command on the emulated CUDA device under the address and
# undefined-behaviour sanitizers: the process starts with the C++ compiler's address
# sanitizer run time preloaded, so the runner builds its emulated kernels under the
# sanitizers and every buffer the CUDA backend allocates has guarded edges. A launch that
# lets a kernel read or write past a buffer (a grid, argument or scratch size off by one)
# stops the run with a report naming the kernel and the line of its source.
#
#   scripts/emulated-asan.sh target/release/runner --device cuda-emulated bench kernels
#
# Needs a C++20 compiler with its sanitizer run time (g++: libasan). The sanitized kernels'
# directory is kept while the command runs (the reports read it) and removed afterwards.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 RUNNER ARGS... (for example: target/release/runner --device cuda-emulated bench kernels)" >&2; exit 2; }
CXX="${CXX:-c++}"
ASAN="$("$CXX" -print-file-name=libasan.so 2>/dev/null)"
case "$ASAN" in
    /*) [ -e "$ASAN" ] || ASAN="" ;;
    *) ASAN="" ;;
esac
[ -n "$ASAN" ] || { echo "$CXX has no address sanitizer run time (libasan.so): install g++ (Debian: libasan8 comes with it)" >&2; exit 2; }
LD_PRELOAD="$ASAN" ASAN_OPTIONS="detect_leaks=0:print_legend=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" "$@" &
pid=$!
trap 'kill "$pid" 2>/dev/null' INT TERM
wait "$pid"
rc=$?
rm -rf "${TMPDIR:-/tmp}"/runner-emulated-cuda-"$pid"-*
exit "$rc"
