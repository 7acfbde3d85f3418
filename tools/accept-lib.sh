# Shared by tools/pp-accept.sh and tools/dp-ckpt-accept.sh (sourced, POSIX sh):
#   accept_run DEFAULT_CELLS [-p PARITY] [-w WORKDIR] [CELL...]
# runs the v4-mini matrix on the named cells of the built-in table (or the
# default list) into WORKDIR/matrix (a temporary directory, removed at exit,
# without -w); its exit status is the matrix's.
accept_run() {
    accept_default=$1
    shift
    P=build/parity
    W=
    while getopts p:w: o; do
        case $o in
        p) P=$OPTARG ;;
        w) W=$OPTARG ;;
        *) return 2 ;;
        esac
    done
    shift $((OPTIND - 1))
    [ -n "$W" ] || { W=$(mktemp -d) && trap 'rm -rf "$W"' EXIT; }
    mkdir -p "$W"
    CELLS=${*:-$accept_default}
    export PARITY_COMM_TIMEOUT=${PARITY_COMM_TIMEOUT:-7200}
    set --
    for c in $CELLS; do set -- "$@" --cell "$c"; done
    "$P" matrix --preset v4-mini "$@" --out "$W/matrix"
}
