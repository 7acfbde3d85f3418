#!/bin/bash
# Issue 13 item 14: `meson install` puts fixtures and golden sets under the
# data directory and the installed binary finds them from any working
# directory.  usage: item14_install.sh PARITY BUILD_DIR
. "$(dirname "$0")/lib.sh"
build=$BUILD_ARG
dest=$W/dest
if ! meson install -C "$build" --no-rebuild --destdir "$dest" >install.log 2>&1; then
  echo "FAIL: meson install"; cat install.log; exit 1
fi
bin=$(find "$dest" -type f -name parity -path '*/bin/*' | head -1)
check "the binary is installed" test -x "$bin"
check "fixtures are installed" test -n "$(find "$dest" -path '*/parity/fixtures/tiny-boundary-mix.json')"
check "the golden set is installed" test -n "$(find "$dest" -path '*/parity/golden/v4-tiny/manifest.json')"
mkdir elsewhere && cd elsewhere
# the source tree must not be what it finds: no PARITY_SOURCE_ROOT, look at the log
expect 0 "fixtures: using $dest" env -u PARITY_SOURCE_ROOT -u PARITY_FIXTURES_DIR "$bin" --log info run --fixture tiny-full-row --quiet
# as many quick cells as the source tree's table (a missing fixture would drop or refuse cells)
cells=$("$P" matrix --quick --list 2>&1 | grep -o -m1 '^[0-9]* cells')
check "the source tree lists the quick cells" test -n "$cells"
expect 0 "$cells (preset v4-tiny, tier quick" env -u PARITY_SOURCE_ROOT -u PARITY_FIXTURES_DIR "$bin" matrix --quick --list
expect 0 "parity/golden/v4-tiny" env -u PARITY_SOURCE_ROOT -u PARITY_FIXTURES_DIR "$bin" matrix --quick --list
finish
