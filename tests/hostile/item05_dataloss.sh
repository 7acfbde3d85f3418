#!/bin/bash
# Issue 13 item 5: parity replaces only a directory it wrote; anything else
# is refused with exit 2 and left untouched.
. "$(dirname "$0")/lib.sh"
mkdir d && echo precious > d/notes.txt && mkdir d/sub && echo x > d/sub/y
for c in "golden --out d" "run --dump d" "run --save d"; do
  expect 2 "was not written by parity" "$P" $c --quiet
  check "d/notes.txt and d/sub survive '$c'" test -f d/notes.txt -a -f d/sub/y
done
# a golden set with a foreign file in it, a checkpoint where a set is asked
"$P" golden --steps 1 --out g --quiet >/dev/null
echo mine > g/README
expect 2 "holds 'README', which parity did not write" "$P" golden --steps 1 --out g --quiet
check "g/README survives" test -f g/README
rm g/README
expect 2 "is a parity golden set, not a checkpoint" "$P" run --save g --quiet
expect 0 "golden set written" "$P" golden --steps 1 --out g --quiet
"$P" run --steps 1 --save ck --quiet >/dev/null
expect 2 "is a parity checkpoint, not a golden set" "$P" golden --out ck --quiet
expect 0 "checkpoint written" "$P" run --steps 1 --save ck --quiet
touch file
expect 2 "exists and is not a directory" "$P" golden --out file --quiet
mkdir empty
expect 0 "golden set written" "$P" golden --steps 1 --out empty --quiet
finish
