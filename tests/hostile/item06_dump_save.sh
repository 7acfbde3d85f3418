#!/bin/bash
# Issue 13 item 6: --dump X --save X is refused (X would hold only one of them).
. "$(dirname "$0")/lib.sh"
expect 2 "--dump X and --save X name the same path" "$P" run --dump X --save X --quiet
check "nothing written" test ! -e X
mkdir sub
expect 2 "name the same path" "$P" run --dump sub/../X --save ./X --quiet
expect 2 "name the same path" "$P" run --dump X/ --save X --quiet
expect 2 "name the same path" "$P" run --dump t.json --trace t.json --quiet
expect 0 "checkpoint written" "$P" run --dump X --save Y --quiet
check "X is a golden set, Y a checkpoint" test -f X/manifest.json -a -f Y/metadata.json
finish
