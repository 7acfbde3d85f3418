#!/bin/sh
# v4-mini acceptance cells of issue 7 (pipeline parallelism in `parity run`):
# 2 training steps of each layout against the serial golden of the same data
# and seed (f64 policy).  The cells are rows of the matrix's scale tier
# (src/matrix/cells.c, docs/matrix.md): this runs
# `parity matrix --preset v4-mini --cell NAME...`.  Minutes per cell; not in
# CI (tests/parallel/meson.build registers them in the 'slow' suite with
# -Dslow_tests=true; docs/parallel.md "Pipeline parallelism").
#
#   tools/pp-accept.sh [-p PARITY] [-w WORKDIR] [CELL...]
#
# Cells (default: all):
#   pp2 pp4 pp8             PP 2 / 4 / 8, Megatron's even split, 1F1B (N = PP)
#   pp3_uneven              PP 3, 'Et*3|t*2|t*3mL'
#   pp2_vpp2                PP 2 x VPP 2, interleaved 1F1B (4 segments of 2 layers)
#   pp4_zbh1                PP 4, ZB-H1
#   pp4_dualpipe            PP 4, DualPipe (two directions, parameter copies)
#   pp4_dualpipev           PP 4 x VPP 2, DualPipeV (a V of 8 segments)
#   pp2_cp2                 PP 2 x CP 2 (N = 4)
#   pp2_cp2_ep64            PP 2 x CP 2 x EP 64, N = 128, B = 128 (Da 32, 4 microbatches)
# Prints the matrix's table (PASS/FAIL, the emulated bubble, wall time per
# cell); the results stay in WORKDIR/matrix.  Exit 1 if any cell failed.
. "$(dirname "$0")/accept-lib.sh"
accept_run "pp2 pp4 pp8 pp3_uneven pp2_vpp2 pp4_zbh1 pp4_dualpipe pp4_dualpipev pp2_cp2 pp2_cp2_ep64" "$@"
