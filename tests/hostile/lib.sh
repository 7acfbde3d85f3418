# Shared helpers of the hostile-input scripts (issue 13).  Each script takes
# the parity binary as $1 and works in a temporary directory it removes.
set -u
P=$(realpath "$1")
BUILD_ARG=$(realpath "${2:-.}")
W=$(mktemp -d)
trap 'chmod -R u+w "$W" 2>/dev/null; rm -rf "$W"' EXIT
cd "$W"
fails=0
# expect RC NEEDLE CMD...: CMD exits RC and its stderr+stdout holds NEEDLE
expect() {
  local rc=$1 needle=$2
  shift 2
  local out got
  out=$(timeout "${EXPECT_TIMEOUT:-120}" "$@" 2>&1 </dev/null)
  got=$?
  if [ "$got" -ne "$rc" ] || ! printf '%s' "$out" | grep -qF -- "$needle"; then
    echo "FAIL: $* -> exit $got (want $rc), output lacks '$needle':"
    printf '%s\n' "$out" | head -5 | sed 's/^/    /'
    fails=$((fails + 1))
  else
    echo "ok: $* -> $got: $(printf '%s' "$out" | grep -F -m1 -- "$needle" | cut -c1-150)"
  fi
}
check() { # check DESCRIPTION COMMAND...: COMMAND succeeds
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}
finish() {
  echo "$fails failure(s)"
  [ "$fails" -eq 0 ]
  exit $?
}
