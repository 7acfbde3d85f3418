#!/bin/sh
# Offload build on a GPU; SKIP (77) with the reason where OpenMP sees none.
exec sh "$(dirname "$0")/against_cpu.sh" "$1" real
