#!/bin/sh
# issue 29: a golden is byte-identical whatever the machine picks at run time:
# OpenBLAS's core (no longer used for any number), glibc's FMA / non-FMA
# variants (parity's own libm, core/pmath.h) and the GEMM's dispatch path
# (kernels/gemm_path.h; avx512 only where the CPU has it).  Every run is
# compared bitwise with the default one; a path the CPU cannot run is refused.
# Usage: portable_golden.sh PARITY
P="$1"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
run() { # NAME [VAR=VALUE ...]
    name=$1
    shift
    env "$@" "$P" golden --preset v4-tiny --steps 2 --out "$T/$name" >"$T/$name.log" 2>&1 ||
        fail "$name ($*): $(tail -3 "$T/$name.log")"
}
run base
settings="OPENBLAS_CORETYPE=Haswell OPENBLAS_CORETYPE=Zen OPENBLAS_CORETYPE=SkylakeX OPENBLAS_CORETYPE=Cooperlake
          GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX2,-FMA PARITY_GEMM_PATH=c"
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && settings="$settings PARITY_GEMM_PATH=avx2"
if grep -qw avx512f /proc/cpuinfo; then
    settings="$settings PARITY_GEMM_PATH=avx512"
else
    echo "no AVX-512 on this CPU: the avx512 path is not run (it must be refused)"
    PARITY_GEMM_PATH=avx512 "$P" golden --preset v4-tiny --steps 1 --out "$T/x512" >/dev/null 2>"$T/err"
    [ $? -eq 2 ] && grep -q "cannot run the avx512" "$T/err" && [ ! -e "$T/x512" ] ||
        fail "PARITY_GEMM_PATH=avx512 on a CPU without it: $(cat "$T/err")"
fi
i=0
for s in $settings; do
    i=$((i + 1))
    run "s$i" "$s"
    "$P" compare "$T/base" "$T/s$i" --policy bitwise >"$T/cmp$i" 2>&1 ||
        fail "$s: not bitwise the default run: $(tail -3 "$T/cmp$i")"
    echo "$s: bitwise equal ($(tail -1 "$T/cmp$i"))"
done
PARITY_GEMM_PATH=bogus "$P" compare "$T/base" "$T/base" >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q "unknown GEMM path" "$T/err" || fail "PARITY_GEMM_PATH=bogus: $(cat "$T/err")"
echo "PASS"
