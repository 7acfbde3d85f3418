#!/bin/bash
# Issue 13 item 8: every output path is checked before the first step, so
# a bad --dump cannot fail at the end after a checkpoint was committed.
. "$(dirname "$0")/lib.sh"
touch dumpfile
expect 2 "exists and is not a directory" "$P" run --steps 2 --save ck --dump dumpfile --quiet
check "no checkpoint was written" test ! -e ck
expect 2 "the parent directory nope does not exist" "$P" run --steps 2 --save ck --dump nope/d --quiet
check "no checkpoint was written" test ! -e ck
mkdir tdir
expect 2 "--trace tdir: exists and is a directory" "$P" run --steps 2 --save ck --trace tdir --quiet
check "no checkpoint was written" test ! -e ck
expect 2 "--json tdir: exists and is a directory" "$P" compare ck ck --json tdir
expect 2 "--svg tdir: exists and is a directory" "$P" schedule --pipeline-schedule 1f1b --pipeline-model-parallel-size 2 --microbatches 4 --svg tdir
if [ "$(id -u)" -ne 0 ]; then   # root writes anywhere: the read-only case needs a plain user
  mkdir ro && chmod a-w ro
  expect 2 "cannot write in the parent directory ro" "$P" run --steps 2 --save ck --dump ro/d --quiet
  check "no checkpoint was written" test ! -e ck
fi
finish
