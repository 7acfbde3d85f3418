#!/bin/bash
# Issue 13 item 4: a FIFO (or directory) given as an input file is refused
# at once by name instead of blocking forever.
EXPECT_TIMEOUT=10
. "$(dirname "$0")/lib.sh"
mkfifo fifo
"$P" golden --steps 1 --out g --quiet >/dev/null 2>&1
expect 2 "is a FIFO" "$P" compare g/params.0.safetensors fifo
expect 2 "is a FIFO" "$P" run --data fifo --quiet
expect 2 "is a FIFO" "$P" golden --data fifo --out g2 --quiet
expect 2 "is a FIFO" "$P" plan --config fifo
expect 2 "is a FIFO" "$P" run --topology fifo --quiet
expect 2 "is a directory" "$P" plan --config .
mkdir fx && mkfifo fx/tiny-x.json
PARITY_FIXTURES_DIR=$W/fx expect 2 "is a FIFO" "$P" run --fixture tiny-x --quiet
cp -r g g3 && rm g3/manifest.json && mkfifo g3/manifest.json
expect 2 "is a FIFO" "$P" compare g g3
finish
