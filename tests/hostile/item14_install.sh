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
expect 0 "48 cells" env -u PARITY_SOURCE_ROOT -u PARITY_FIXTURES_DIR "$bin" matrix --quick --list
expect 0 "parity/golden/v4-tiny" env -u PARITY_SOURCE_ROOT -u PARITY_FIXTURES_DIR "$bin" matrix --quick --list
finish
