#!/usr/bin/env bash
# The longest C functions of a tree, longest first:
#   tools/longest-functions.sh [-n N] [DIR...]      (default: -n 10 src)
# (paths relative to the current directory) prints "LINES  FILE:LINE  NAME" for each function definition.  LINES counts
# from the first line of the signature to the closing brace, both included.
# It reads the project's style (docs/architecture.md): a function's body
# opens with '{' alone in column 0 and closes with '}' in column 0; the
# signature starts at the last line before it that begins in column 0.
# PAR_FN(name) (kernels/real.h's templating) is reported as name.
set -euo pipefail
n=10
if [ "${1:-}" = "-n" ]; then n=$2; shift 2; fi
[ $# -gt 0 ] || set -- src
find "$@" -name '*.c' -print0 | sort -z | xargs -0 awk '
FNR == 1 { sig = 0; body = 0 }
body && /^}/ {
    printf "%d\t%s:%d\t%s\n", FNR - sig + 1, FILENAME, sig, name
    body = 0
    next
}
body { next }
/^\{[ \t]*$/ {
    if (sig && head ~ /\(/ && head !~ /=[ \t]*$/) {
        body = 1
        s = head
        if (match(s, /PAR_FN\([A-Za-z_0-9]+\)[ \t]*\(/)) {
            s = substr(s, RSTART + 7)
            sub(/\).*/, "", s)
        } else {
            sub(/[ \t]*\(.*/, "", s)
            sub(/.*[ \t*]/, "", s)
        }
        name = s
    }
    next
}
/^[A-Za-z_]/ { sig = FNR; head = $0; next }
/^[ \t]+[^ \t]/ { if (sig) head = head " " $0; next }
' | sort -t "$(printf '\t')" -k1,1nr -k2,2 | head -n "$n" | awk -F '\t' '{ printf "%5d  %-40s %s\n", $1, $2, $3 }'
