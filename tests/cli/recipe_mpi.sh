#!/bin/sh
# Issue 32: layouts under a recipe on the MPI backend (`mpiexec -n N parity run --backend mpi
# --recipe R`) equal that recipe's serial golden, as the thread-backend cells of
# recipe_layouts.sh do.  Cut tiles (TP / ETP) take their amax over the group across processes.
#   - fp8 TP 2 (2 processes, 1 rank each): wo_b's 1x128 tiles and the TP-cut 128x128 blocks;
#   - v4 TP 2 x CP 2 (4 processes);
#   - v4 TP 2 x ETP 2 x EP 2 + SP (2 processes x 2 thread ranks; the 1x32 MXFP4 tiles of w2 cut);
#   - bf16 DP 2 x PP 2 (2 processes x 2 fiber ranks);
#   - under --bitwise, v4 TP 2 x CP 2 (4 processes) bit-identical to the bitwise recipe golden;
#   - the control: fp8 TP 2 with PARITY_RECIPE_LOCAL_TILES=1 (tiles cut per shard) fails;
#   - `parity matrix --backend mpi --recipe v4 --bitwise`: its launcher passes both flags to the
#     MPI runs (cells tp2 and cp2 against their references made under v4 in the bitwise mode).
# Usage: recipe_mpi.sh PATH/TO/parity PATH/TO/mpiexec
set -u
P=$(realpath "$1")
MPIEXEC=$2
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W" || exit 2
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
gold() { # gold NAME [flags]
  n=$1; shift
  "$P" golden --preset v4-tiny --quiet "$@" --out "$n" > "$n.log" 2>&1 || bad "golden $n: $(tail -1 "$n.log")"
}
mpi() { # mpi NPROC GOLDEN POLICY NAME FLAGS...: the MPI run's dump against GOLDEN
  np=$1 g=$2 pol=$3 n=$4; shift 4
  if ! timeout 240 "$MPIEXEC" -n "$np" "$P" run --backend mpi --preset v4-tiny --quiet "$@" --dump "$n" \
      > "$n.log" 2>&1; then bad "run $n: $(tail -2 "$n.log")"; return 1; fi
  grep -q '"backend":[[:space:]]*"mpi"' "$n/manifest.json" || { bad "$n: not an MPI run"; return 1; }
  line=$("$P" compare "$g" "$n" --policy "$pol" 2>&1 | grep -E '^(EQUAL|MISMATCH)')
  case $line in EQUAL*) ok "$n ($pol policy): $line" ;; *) bad "$n ($pol policy): $line"; return 1 ;; esac
}
for r in bf16 fp8 v4; do gold "g-$r" --recipe "$r"; done
gold g-v4-bw --recipe v4 --bitwise
mpi 2 g-fp8 f64 fp8-mpi2-tp2 --recipe fp8 --tensor-model-parallel-size 2
mpi 4 g-v4 f64 v4-mpi4-tp2-cp2 --recipe v4 --tensor-model-parallel-size 2 --context-parallel-size 2
mpi 2 g-v4 f64 v4-mpi2x2-tp2-etp2-ep2-sp --recipe v4 --world-size 4 --tensor-model-parallel-size 2 \
  --expert-tensor-parallel-size 2 --expert-model-parallel-size 2 --sequence-parallel
mpi 2 g-bf16 f64 bf16-mpi2xfiber2-dp2-pp2 --recipe bf16 --rank-host fiber --world-size 4 \
  --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout 'Et*2|tmL'
mpi 4 g-v4-bw bitwise v4-bw-mpi4-tp2-cp2 --recipe v4 --bitwise --tensor-model-parallel-size 2 --context-parallel-size 2
# the control: layout-local tiles give other bits; this check could fail
if PARITY_RECIPE_LOCAL_TILES=1 timeout 240 "$MPIEXEC" -n 2 "$P" run --backend mpi --preset v4-tiny --quiet \
    --recipe fp8 --tensor-model-parallel-size 2 --dump fp8-local > local.log 2>&1; then
  line=$("$P" compare g-fp8 fp8-local 2>&1 | grep -E '^(EQUAL|MISMATCH)')
  case $line in MISMATCH*) ok "layout-local tiles under MPI fail: $line" ;; *) bad "layout-local tiles passed: $line" ;; esac
else bad "the layout-local run failed: $(tail -1 local.log)"; fi
if timeout 280 "$P" matrix --quick --backend mpi --recipe v4 --bitwise --cell tp2 --cell cp2 \
    --fixture tiny-boundary-mix --quiet --out mx > mx.log 2>&1; then
  grep -q "2 cells: 2 passed" mx.log && ok "matrix --backend mpi --recipe v4 --bitwise: $(grep 'cells:' mx.log)" ||
    bad "matrix: $(grep 'cells:' mx.log)"
else bad "matrix --backend mpi --recipe v4 --bitwise: $(grep -E 'cells:|FAIL|parity matrix' mx.log | head -3)"; fi
echo "$fails failure(s)"
[ "$fails" -eq 0 ]
