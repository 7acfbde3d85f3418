#!/usr/bin/env bash
# Configures (once) and builds parity in ./build (or $1).  Extra arguments
# after the directory go to `meson setup`.
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
ninja -C "$dir" >/dev/null
