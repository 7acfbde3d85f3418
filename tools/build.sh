#!/usr/bin/env bash
# Configures (once) and builds parity in ./build (or $1).  Extra arguments
# after the directory go to `meson setup`.
#
# It builds what the main job runs: the `parity` binary (about half of the
# whole build's time on 2 cores).  PARITY_BUILD_TARGETS names other ninja
# targets ("all": everything, the tests and tools/bench included); the test
# command (tools/test.sh) needs nothing here, since `meson test` builds the
# tests itself before it runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
if [ -f "$dir/build.ninja" ]; then
  [ $# -gt 0 ] && meson configure "$dir" "$@" >/dev/null
  meson setup --reconfigure "$dir" >/dev/null
else
  meson setup "$dir" "$@" >/dev/null
fi
targets=${PARITY_BUILD_TARGETS:-parity}
[ "$targets" = all ] && targets=
ninja -C "$dir" $targets >/dev/null
