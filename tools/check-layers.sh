#!/usr/bin/env bash
# The layer rules, checked from the includes (a meson test, suite 'build'):
#   core <- kernels <- model <- parallel <- matrix <- cli;  comm on core only;
#   inside src/parallel, one rule per room (folder): the sibling rooms it may include;
#   no include circle between the files of src/parallel and src/matrix;
#   a NAME-impl.h header is included only from its own folder;
#   backends on comm + core only (and backends/host, the shared ranks-hosting code;
#   no backend includes another backend's directory);  backends/registry.c the
#   only file with #if HAVE_*;
#   no exit() in library code (outside src/cli);
#   every _Thread_local of src/ carried across fiber switches or listed as scratch.
# Prints each violation and ends with "N passed, N failed" (one check per rule).
set -uo pipefail
cd "${1:-$(dirname "$0")/..}"
passed=0 failed=0
# check_includes MSG DIR PREFIX ALLOWED...: every '#include "PREFIX NAME/..."' under DIR names an
# allowed NAME; otherwise prints "MSG {ALLOWED}:" and the offending lines
check_includes() {
  local msg=$1 dir=$2 prefix=$3; shift 3
  local allowed="$*" bad="" name re
  # bash's own regex, not a sed per line: a process per include took minutes on a VM
  re="^[^:]*:[0-9]+:[[:space:]]*#[[:space:]]*include[[:space:]]+\"${prefix}([a-z_]+)/"
  while IFS= read -r line; do
    name=""
    [[ $line =~ $re ]] && name=${BASH_REMATCH[1]}
    case " $allowed " in *" $name "*) ;; *) bad+="$line"$'\n' ;; esac
  done < <(grep -rnE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"${prefix}[a-z_]+/" "$dir" --include='*.c' --include='*.h')
  if [ -n "$bad" ]; then
    printf '%s {%s}:\n%s' "$msg" "$allowed" "$bad"
    failed=$((failed + 1))
  else
    passed=$((passed + 1))
  fi
}
# rule DIR ALLOWED...: every '#include "LAYER/..."' under DIR names an allowed layer
rule() { check_includes "layer rule: $1 may include only" "$1" "" "${@:2}"; }
rule src/core core
rule src/comm comm core
rule src/kernels kernels core
rule src/model model kernels core
rule src/parallel parallel model kernels comm core
rule src/matrix matrix parallel model kernels comm core
rule src/cli cli matrix parallel model kernels comm core backends
# room DIR ALLOWED...: every '#include "parallel/ROOM/..."' under src/parallel/DIR names DIR or an
# allowed room (lowest first; docs/architecture.md "src/parallel, room by room" gives the reasons)
ruled=""
room() {
  ruled+=" $1 "
  check_includes "room rule: src/parallel/$1 may include only the rooms" "src/parallel/$1" "parallel/" "$@"
}
room layout
room schedule
room plan layout schedule
room reduce layout
room hook layout
room tp layout reduce hook
room cp layout reduce hook tp
room moe layout plan reduce hook tp
room dp layout reduce tp
room ckpt layout reduce dp
room step layout schedule plan reduce hook tp cp moe dp
room train layout plan reduce tp dp ckpt step
# every folder of src/parallel has its rule above
v=""
for d in src/parallel/*/; do
  d=${d%/}; d=${d#src/parallel/}
  case "$ruled" in *" $d "*) ;; *) v+="$d " ;; esac
done
if [ -n "$v" ]; then
  printf 'room rule: src/parallel/{%s} has no rule in tools/check-layers.sh\n' "$v"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
# no include circle: the files of src/parallel and src/matrix as modules (x.c, x.h and x-impl.h are
# one), each include an arrow; tsort names the modules of a circle
loops=$(grep -rnoE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"(parallel|matrix)/[a-z_/-]+\.h"' src/parallel src/matrix \
          --include='*.c' --include='*.h' 2>/dev/null |
        sed -E 's/^src\/([^:]+)\.[ch]:[0-9]+:.*"([^"]+)\.h"/\1 \2/; s/-impl( |$)/\1/g' |
        awk '$1 != $2' | sort -u | tsort 2>&1 >/dev/null)
if [ -n "$loops" ]; then
  printf 'include circle in src/parallel or src/matrix:\n%s\n' "$loops"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
# a NAME-impl.h is private to its folder
v=""
while IFS= read -r line; do
  f=${line%%:*}
  h=""
  [[ $line =~ \#[[:space:]]*include[[:space:]]+\"([^\"]+)\" ]] && h=${BASH_REMATCH[1]}
  case $h in backends/*) hp=$h ;; *) hp=src/$h ;; esac
  [ "${hp%/*}" = "${f%/*}" ] || v+="$line"$'\n'
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[a-z_/]+-impl\.h"' src backends tests tools --include='*.c' --include='*.h')
if [ -n "$v" ]; then
  printf 'impl rule: a NAME-impl.h header is included only from its own folder:\n%s' "$v"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
rule backends backends comm core
# each backend sees comm, core, backends/host and its own directory only
bad=""
for d in backends/*/; do
  d=${d%/}; name=${d#backends/}
  v=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"backends/' "$d" --include='*.c' --include='*.h' |
      grep -vE "include[[:space:]]+\"backends/(host|$name)/")
  [ "$name" = host ] && v=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"backends/' "$d" --include='*.c' --include='*.h' |
      grep -vE 'include[[:space:]]+"backends/host/')
  [ -n "$v" ] && bad+="$v"$'\n'
done
if [ -n "$bad" ]; then
  printf 'backend rule: a backend includes only comm, core, backends/host and its own directory:\n%s' "$bad"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
v=$(grep -rnE '^[[:space:]]*#[[:space:]]*(if|ifdef|ifndef|elif)[[:space:]].*HAVE_' src backends --include='*.c' --include='*.h' | grep -v '^backends/registry.c:')
if [ -n "$v" ]; then
  printf 'build rule: only backends/registry.c may test HAVE_* with #if:\n%s\n' "$v"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
v=$(grep -rnE '(^|[^_a-zA-Z])exit[[:space:]]*\(' src backends --include='*.c' | grep -v '^src/cli/')
if [ -n "$v" ]; then
  printf 'library rule: no exit() outside src/cli (return a par_status):\n%s\n' "$v"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
# Thread-local state: the fiber backend runs many ranks on one thread, so every
# _Thread_local of src/ is either carried across fiber switches
# (backends/host/sched.c tls_save / tls_load) or scratch used between two
# switches.  A new one fails here until it is added to one of the two lists.
tls_carried='src/core/counters.c:tl_counts src/core/alloc.c:cur_scope src/core/status.c:last_msg src/core/log.c:thread_tag'
tls_scratch='src/parallel/layout/pplayout.c:p src/parallel/layout/pplayout.c:r src/kernels/gemm.c:memo'
v=""
while IFS= read -r line; do
  f=${line%%:*}
  name=$(printf '%s\n' "$line" | sed -E 's/.*[[:space:]*]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*(\[[^]]*\])?[[:space:]]*(=.*)?;.*/\1/')
  case " $tls_carried $tls_scratch " in *" $f:$name "*) ;; *) v+="$line"$'\n' ;; esac
done < <(grep -rnE '(_Thread_local|__thread|thread_local)[[:space:]]' src --include='*.c' --include='*.h')
if [ -n "$v" ]; then
  printf 'fiber rule: thread-local state not carried by backends/host/sched.c (add it to tls_save/tls_load\nand tls_carried here, or to tls_scratch if no comm call happens while it is in use):\n%s' "$v"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
