# tools/fault-lib.sh - what tools/fault-demo.sh and tools/tp-fault-demo.sh
# share: build parity with one fault compiled in (meson -Dfault=NAME) in its
# own build directory, run the quick matrix with it, and insist it exits 1.
# Sourced, not run.  fault_matrix TAG FAULT BUILD_DIR [matrix args...] leaves
# $out/report.json, $out/table.txt and $out/stderr.txt; $out is removed on exit.
# PARITY_FAULT_SELECT: the matrix's selection instead of --quick (e.g. "--preset v4-mini").

fault_matrix() {
    tag=$1 fault=$2 bdir=$3
    shift 3
    out=$(mktemp -d "/tmp/parity-$tag-XXXXXX")
    trap 'rm -rf "$out"' EXIT
    cd "$root"
    if [ ! -d "$bdir" ]; then
        meson setup "$bdir" -Dfault="$fault" -Dtests=disabled -Dmpi=disabled >/dev/null
    else
        meson configure "$bdir" -Dfault="$fault" >/dev/null
    fi
    ninja -C "$bdir" -j2 parity >/dev/null
    export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
    set +e
    # shellcheck disable=SC2086
    "$bdir/parity" matrix ${PARITY_FAULT_SELECT:---quick} --quiet "$@" --out "$out/m" --report "$out/report.json" \
        >"$out/table.txt" 2>"$out/stderr.txt"
    rc=$?
    set -e
    cat "$out/table.txt"
    if [ "$rc" -ne 1 ]; then
        echo "$tag: FAILED: the broken build's matrix exited $rc, expected 1" >&2
        cat "$out/stderr.txt" >&2
        exit 1
    fi
}
