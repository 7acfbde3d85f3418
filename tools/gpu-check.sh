#!/usr/bin/env bash
# The GPU checks of the OpenMP offload route (docs/gpu.md), in two halves:
#
#   tools/gpu-check.sh --prepare   on a Debian 12 build machine (network, the
#       offload compiler: tools/setup.sh --with-offload).  Builds build-gpu/
#       (-Doffload=nvptx, no MPI, no tests) and downloads with `apt-get
#       download` the .deb of every shared library build-gpu/parity loads
#       (glibc included) into .gpu-debs/ (git-ignored).  Carry build-gpu and
#       .gpu-debs to the GPU machine (the run tool's carry: ["build-gpu/parity",
#       ".gpu-debs"], about 17 MiB).
#
#   tools/gpu-check.sh             on the lent GPU machine (no network, none
#       of parity's Debian libraries, any glibc).  Unpacks .gpu-debs/*.deb into
#       .gpu-root (dpkg-deb, or python3 where there is no dpkg), writes
#       .gpu-root/parity, a wrapper that starts build-gpu/parity with the
#       unpacked loader and libraries (the host's libcuda.so.1 found after
#       them), and runs tests/gpu/against_cpu.sh real: the serial golden in
#       f64 and f32, then every quick-tier matrix cell on the GPU (PASS against
#       the serial reference on the GPU, and each set against the CPU golden:
#       f64 policy, f32 cells' steps under the f32 policy), then the step time
#       on the GPU and the CPU (v4-tiny and v4-mini, one step; measured first,
#       after a probe that times the first kernel, PTX JIT included).  The
#       GPU matrix gets what is left of PARITY_GPU_CHECK_S (default 420 s):
#       cells it did not reach are reported, the run ends INCOMPLETE (exit 3).
#       The log goes to $OUT/gpu-check.log, the per-cell table (verdict on the
#       device, largest error against the CPU golden) to $OUT/gpu-table.md
#       (/tmp without OUT).
#
# Options of the second half: --emulated runs the same checks on the host's
# emulated device (what tests/gpu/host_fallback.sh does), to try the unpack
# and wrapper path on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
DEBS=.gpu-debs
ROOT=.gpu-root # the unpacked packages (git-ignored; not carried)
BUILD=build-gpu

prepare() {
  bash tools/setup.sh --with-offload || return 1
  if [ ! -f "$BUILD/build.ninja" ]; then
    meson setup "$BUILD" -Doffload=nvptx -Dmpi=disabled -Dtests=disabled >/dev/null || return 1
  fi
  ninja -C "$BUILD" parity >/dev/null || return 1
  mkdir -p "$DEBS"
  # the packages of the libraries the binary loads (and of its loader)
  local libs pkgs
  libs=$(ldd "$BUILD/parity" | awk '/=>/ {print $3} /ld-linux/ {print $1}' | xargs -r readlink -f)
  libs="$libs $(readlink -f /usr/lib/x86_64-linux-gnu/libgomp-plugin-nvptx.so.1)"
  pkgs=$(for l in $libs; do dpkg -S "$l" 2>/dev/null || dpkg -S "${l#/usr}" 2>/dev/null; done |
         cut -d: -f1 | sort -u)
  [ -n "$pkgs" ] || { echo "gpu-check: no packages found for the binary's libraries" >&2; return 1; }
  (cd "$DEBS" && rm -f ./*.deb && apt-get download $pkgs >/dev/null) || return 1
  echo "gpu-check: prepared $BUILD/parity and $(ls "$DEBS"/*.deb | wc -l) packages in $DEBS" \
       "($(du -sh "$DEBS" "$BUILD/parity" | awk '{print $1}' | paste -sd+)):" $pkgs
}

# ar archive member data.tar.* of a .deb, extracted into $2 (no dpkg needed)
unpack_py() {
  python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, "rb").read()
assert data[:8] == b"!<arch>\n", deb
i = 8
while i < len(data):
    name = data[i:i + 16].decode().strip().rstrip("/")
    size = int(data[i + 48:i + 58].decode().strip())
    body = data[i + 60:i + 60 + size]
    if name.startswith("data.tar"):
        if name.endswith(".zst"):
            import subprocess
            body = subprocess.run(["zstd", "-dc"], input=body, capture_output=True, check=True).stdout
        tarfile.open(fileobj=io.BytesIO(body)).extractall(dest)
    i += 60 + size + (size & 1)
PY
}

unpack() {
  local root="$ROOT"
  ls "$DEBS"/*.deb >/dev/null 2>&1 || { echo "gpu-check: no .deb in $DEBS (run --prepare on a build machine)" >&2; return 2; }
  [ -x "$BUILD/parity" ] || { echo "gpu-check: no $BUILD/parity (run --prepare on a build machine)" >&2; return 2; }
  rm -rf "$root" && mkdir -p "$root"
  for d in "$DEBS"/*.deb; do
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$d" "$root"; else unpack_py "$d" "$root"; fi || return 1
  done
  local abs lp loader
  abs=$(cd "$root" && pwd)
  # the unpacked loader itself: /lib64's is an absolute link (to the host's)
  loader=
  for l in "$abs/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$abs/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"; do
    [ -f "$l" ] && [ ! -L "$l" ] && { loader=$l; break; }
  done
  [ -n "$loader" ] || { echo "gpu-check: the unpacked glibc has no loader" >&2; return 1; }
  lp="$abs/lib/x86_64-linux-gnu:$abs/usr/lib/x86_64-linux-gnu:$abs/usr/lib/x86_64-linux-gnu/openblas-pthread"
  # the host's driver library (libcuda.so.1) after the unpacked ones
  # (where ldconfig knows it, then the usual driver folders: /usr/local/nvidia is a container's mount)
  local cu
  cu=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF}' | xargs -r -n1 dirname | sort -u | paste -sd:)
  lp="$lp${cu:+:$cu}:/usr/local/nvidia/lib64:/usr/local/nvidia/lib:/usr/lib/x86_64-linux-gnu:/usr/lib64"
  lp="$lp:/usr/local/cuda/compat:/usr/local/cuda/lib64:/usr/lib/wsl/lib"
  cat >"$ROOT/parity" <<EOF
#!/bin/sh
exec "$loader" --library-path "$lp" "$(pwd)/$BUILD/parity" "\$@"
EOF
  chmod +x "$ROOT/parity"
  "$ROOT/parity" --version >/dev/null || { echo "gpu-check: the wrapper does not start parity" >&2; return 1; }
}

step_time() { # device preset: seconds of one step (parity golden's wall), or "failed"/"timeout"
  local t0 t1 dir rc
  dir=$(mktemp -d)
  t0=$(date +%s.%N)
  timeout "${STEP_LIMIT:-100}" "$ROOT/parity" golden --preset "$2" --steps 1 --quiet --device "$1" \
    --out "$dir/g" >/dev/null 2>"$dir/err"
  rc=$?
  t1=$(date +%s.%N)
  [ $rc -eq 0 ] || { [ $rc -eq 124 ] && echo "timeout (${STEP_LIMIT:-100} s)" || echo "failed: $(head -c 300 "$dir/err")"
                     rm -rf "$dir"; return; }
  rm -rf "$dir"
  python3 -c "print(f'{$t1 - $t0:.2f} s')"
}

# The first kernel on a real device: libgomp's plugin, libcuda.so.1 and the PTX JIT (timed: the
# JIT's result is cached for the later processes); on failure libgomp's own account of it.
probe() {
  local log=$1 t0 t1 dir
  dir=$(mktemp -d)
  t0=$(date +%s.%N)
  if timeout 180 "$ROOT/parity" golden --preset v4-tiny --steps 1 --quiet --device gpu --out "$dir/g" >"$dir/out" 2>"$dir/err"; then
    t1=$(date +%s.%N)
    echo "probe: v4-tiny 1 step on the GPU in $(python3 -c "print(f'{$t1 - $t0:.2f}')") s (first process: PTX JIT included)" | tee -a "$log"
    grep "^device:" "$dir/out" | tee -a "$log"
    rm -rf "$dir"
    return 0
  fi
  echo "probe: the first GPU run failed: $(cat "$dir/err")" | tee -a "$log"
  GOMP_DEBUG=1 timeout 60 "$ROOT/parity" golden --preset v4-tiny --steps 1 --quiet --device gpu --out "$dir/g2" 2>&1 |
    tail -40 | tee -a "$log"
  echo "probe: the loader's search for the plugin and libcuda (LD_DEBUG=libs):" | tee -a "$log"
  LD_DEBUG=libs timeout 60 "$ROOT/parity" golden --preset v4-tiny --steps 1 --quiet --device gpu --out "$dir/g3" 2>&1 |
    grep -E 'nvptx|libcuda' | tail -20 | tee -a "$log"
  echo "probe: libcuda.so* on this machine: $(find /usr /lib /lib64 /opt -name 'libcuda.so*' 2>/dev/null | head -5 | paste -sd' ')" |
    tee -a "$log"
  rm -rf "$dir"
  return 1
}

check() {
  local mode=$1 log=${OUT:-/tmp}/gpu-check.log t_start
  t_start=$(date +%s)
  mkdir -p "${OUT:-/tmp}"
  unpack || return $?
  echo "gpu-check: $(date -u +%FT%TZ) on $(uname -n); mode $mode; $(nproc) CPUs" | tee "$log"
  if [ "$mode" = real ]; then
    command -v nvidia-smi >/dev/null &&
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"
    echo "libcuda.so.1: $(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF}' | head -2 | paste -sd' ')" | tee -a "$log"
    # the PTX JIT's cache, shared by the check's processes
    export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-/tmp/parity-cuda-cache} CUDA_CACHE_MAXSIZE=4294967296
    if [ "${PARITY_GPU_STEP:-1}" != 0 ]; then
      probe "$log" || { echo "gpu-check: no kernel ran on the GPU" | tee -a "$log"; return 1; }
      echo "step time (1 step, parity golden wall, this machine's $(nproc) CPUs for cpu):" | tee -a "$log"
      for pre in v4-tiny v4-mini; do
        echo "  $pre: cpu $(step_time cpu $pre), gpu $(step_time gpu $pre)" | tee -a "$log"
      done
    fi
    # the GPU matrix ends by this time (PARITY_GPU_CHECK_S after the start, default 7 minutes, less
    # a minute for the compares): against_cpu.sh gives it what is left when it starts
    export PARITY_GPU_DEADLINE=${PARITY_GPU_DEADLINE:-$(( t_start + ${PARITY_GPU_CHECK_S:-420} - 60 ))}
  fi
  # every quick-tier cell on every fixture (PARITY_GPU_CELLS / _FIXTURE narrow it)
  PARITY_GPU_TABLE=${OUT:-/tmp}/gpu-table.md \
  PARITY_GPU_CELLS=${PARITY_GPU_CELLS:-all} PARITY_GPU_FIXTURE=${PARITY_GPU_FIXTURE:-all} \
    sh tests/gpu/against_cpu.sh "$ROOT/parity" "$mode" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "gpu-check: $(( $(date +%s) - t_start )) s in all; checks exit $rc" | tee -a "$log"
  [ "$mode" = emulated ] && echo "step time: not measured (emulated device)" | tee -a "$log"
  return "$rc"
}

case "${1:-}" in
  --prepare) prepare ;;
  --emulated) check emulated ;;
  "") check real ;;
  *) echo "gpu-check: unknown option '$1' (known: --prepare, --emulated)" >&2; exit 2 ;;
esac
