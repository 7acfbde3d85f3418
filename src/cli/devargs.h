/* cli/devargs.h - the --device flag of run, golden and matrix (docs/gpu.md). */
#ifndef PAR_CLI_DEVARGS_H
#define PAR_CLI_DEVARGS_H

#include <stdint.h>
#include <stdio.h>

#include "model/config.h"

#define PAR_DEVICE_HELP                                                                     \
    "where the kernels run: cpu (default) or gpu (a build with -Doffload=nvptx; several "   \
    "ranks share a GPU, MPI processes take local rank mod the device count)"

/* --bitwise of golden, run and matrix (docs/bitwise.md). */
#define PAR_BITWISE_HELP                                                                    \
    "the bitwise mode: every gradient sum order-free (core/racc.h), so every layout gives "   \
    "the serial golden's bits (docs/bitwise.md; recorded in the manifest)"

/* --bitwise with --device gpu: 2 after the message (the device path has no
 * order-free accumulator), else 0. */
int par_cli_bitwise_device(const char *cmd, int bitwise, const char *device);

/* --recipe of golden, run and matrix (docs/recipes.md). */
#define PAR_RECIPE_HELP                                                                     \
    "the casts of a GPU training recipe: none (default), bf16, fp8 (block-scaled, fp32 "     \
    "scales) or v4 (UE8M0 scales, MXFP4 experts, FP4 indexer); recorded in the manifest"

/* --recipe NAME into cfg->recipe: 0, or 2 after the message (an unknown name;
 * --device gpu: the device GEMM has no cast hook). */
int par_cli_recipe(const char *cmd, const char *name, const char *device, par_config *cfg);
/* A recipe with block-scaled tiles (fp8, v4) under TP or ETP > 1: its tiles
 * are the whole tensors' (kernels/recipe.h).  PARITY_RECIPE_LOCAL_TILES=1
 * cuts them per shard instead (with a warning), to show that such a run
 * differs.  Returns 0. */
int par_cli_recipe_layout(const char *cmd, const par_config *cfg, int64_t tp, int64_t etp);

/* Selects the process's device from --device NAME (NULL = cpu).  0, or 2
 * after printing "parity CMD: <why>" to stderr (bad name, no offload in this
 * build, no device seen). */
int par_cli_device(const char *cmd, const char *name);
/* In GPU mode, one line "device: <what> (h2d ... MiB in N copies, d2h ...)". */
void par_cli_device_report(FILE *f);

#endif
