#!/bin/sh
# Offload build without a GPU: the emulated device (tests/gpu/against_cpu.sh).
exec sh "$(dirname "$0")/against_cpu.sh" "$1" emulated
