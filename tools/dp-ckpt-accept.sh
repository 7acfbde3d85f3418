#!/bin/sh
# tools/dp-ckpt-accept.sh - v4-mini acceptance cells of data parallelism (the DP
# reduction, ZeRO-1) and of distributed checkpoints through `parity run`.  The
# cells are rows of the matrix's scale tier (src/matrix/cells.c, docs/matrix.md): this runs
# `parity matrix --preset v4-mini --cell NAME...`.  Minutes per cell; not in CI.
#
#   tools/dp-ckpt-accept.sh [-p PARITY] [-w WORKDIR] [CELL...]
#
# Cells (default: all):
#   dp8 dp8_zero            DP8 (N=8), 3 steps vs the serial golden
#   dp4_cp2 dp4_cp2_zero    DP4 x CP2 (N=8)
#   cp4_ep32 cp4_ep32_zero  CP4 x EP32, De = 4 (N=128)
#   pp2_ep16 pp2_ep16_zero  PP2 x DP16 x EP16 (N=32)
#   reshard_dp8z_dp2        DP8 + ZeRO-1's checkpoint after 1 step resharded to DP2 replicated:
#                           training state and every tensor bitwise equal (`parity ckpt diff`)
#   reshard_ep128_ep32      EP128 -> EP32 (N=32): the same
#   reshard_pp2ep32_pp4ep64cp2  PP2 x EP32 (N=64) -> PP4 x EP64 x CP2 (N=256): the same
#   reshard_pp4vpp2_pp1     PP4 x VPP2 interleaved (N=4) -> PP1 (N=1): the same
#   resume_ep32z_dp8        2 steps EP32 + ZeRO-1 saved, loaded under DP8 for 2 more: every file of
#                           the 4 steps (optimizer state included) vs the serial golden (f64 policy)
#   resume_pp2ep16z_ep32    2 steps PP2 x DP16 x EP16 + ZeRO-1, load under EP32 (no PP): the same
#   resume_dp8_pp4vpp2      2 steps DP8, load under PP4 x VPP2 x DP2 + ZeRO-1 (N=8): the same
# Every compare includes the optimizer state (opt.<name>.<slot>) of params.1.. .
# Prints the matrix's table; the results stay in WORKDIR/matrix.  Exit 1 if
# any cell failed.
. "$(dirname "$0")/accept-lib.sh"
accept_run "dp8 dp8_zero dp4_cp2 dp4_cp2_zero cp4_ep32 cp4_ep32_zero pp2_ep16 pp2_ep16_zero reshard_dp8z_dp2 reshard_ep128_ep32 resume_ep32z_dp8 reshard_pp2ep32_pp4ep64cp2 reshard_pp4vpp2_pp1 resume_pp2ep16z_ep32 resume_dp8_pp4vpp2" "$@"
