/* kernels/recipe.h - the casts of a GPU training recipe (issue 32; docs/recipes.md).
 *
 * A recipe says where a GPU run rounds: which GEMM inputs go to BF16, which
 * to FP8 with block scales, which weights to MXFP4, and the indexer's FP4 QK
 * path.  The casts themselves are core/quant.h's; this module only decides
 * where they apply:
 *
 *   - a weight class per parameter (par_recipe_wclass_of), read from the V4
 *     inference code's dtypes (model.py): FP8 (wq_a, wq_b, wkv, wo_b,
 *     indexer.wq_b, shared experts, MTP e_proj/h_proj), FP4 (routed experts),
 *     BF16 (wo_a, indexer.weights_proj), F32 (compressors, gate, head: the
 *     reference computes them in float32, so no recipe casts them);
 *   - a cast table per (recipe, class): the activation's cast and the
 *     weight's (par_recipe_cast_of);
 *   - a registry of the weight buffers a model holds, with their class and
 *     recipe: par_linear_forward/backward (kernels/ops.c) ask it for the
 *     operands of each GEMM (par_recipe_operands).  With no model registered
 *     under a recipe the hook returns at once and moves no bit.
 *
 * The working precision stays f64/f32 between casts: the GEMM accumulates
 * as without a recipe, its output is not rounded.  The backward is the
 * straight-through estimator: din = dout @ q(W), dW = dout^T q(x), the
 * gradient of the quantized weight taken as the master weight's.
 */
#ifndef PAR_KERNELS_RECIPE_H
#define PAR_KERNELS_RECIPE_H

#include <stdint.h>

#include "core/quant.h"
#include "core/status.h"

typedef enum {
    PAR_RECIPE_NONE = 0, /* the f64/f32 golden: no cast                      */
    PAR_RECIPE_BF16 = 1, /* BF16 GEMM inputs, FP32/FP64 master weights        */
    PAR_RECIPE_FP8 = 2,  /* V3's: FP8 1x128 acts, 128x128 weights, fp32 scales */
    PAR_RECIPE_V4 = 3,   /* V4's: FP8 with UE8M0 scales, MXFP4 experts, FP4 QK */
    PAR_RECIPE_COUNT
} par_recipe;

typedef enum {
    PAR_WCLASS_F32 = 0,  /* computed in float32 by the reference: never cast */
    PAR_WCLASS_BF16 = 1, /* a BF16 weight                                    */
    PAR_WCLASS_FP8 = 2,  /* an FP8 weight (128x128 blocks)                   */
    PAR_WCLASS_FP4 = 3,  /* a routed expert (FP4 in V4)                      */
    PAR_WCLASS_COUNT
} par_wclass;

typedef enum {
    PAR_CAST_NONE = 0,  /* the working precision's value                       */
    PAR_CAST_BF16 = 1,  /* round to nearest even to BF16                       */
    PAR_CAST_QUANT = 2, /* (BF16 first for an activation) then block-quantize
                         * and dequantize with the spec (par_quant_sim)        */
} par_cast_kind;

typedef struct {
    par_cast_kind act;
    par_qspec act_spec; /* tiles along the GEMM's K (a row of x [T, K]) */
    par_cast_kind wt;
    par_qspec wt_spec;  /* tiles of W [N, K] as stored ([out, in])      */
} par_recipe_cast;

/* "none", "bf16", "fp8", "v4". */
const char *par_recipe_name(par_recipe r);
/* The name -> recipe; an unknown name is PAR_EINVAL naming the known ones. */
par_status par_recipe_parse(const char *s, par_recipe *out);
/* The class of parameter `name` (a param-table name). */
par_wclass par_recipe_wclass_of(const char *name);
/* The casts of class c under recipe r (never NULL). */
const par_recipe_cast *par_recipe_cast_of(par_recipe r, par_wclass c);
/* Whether recipe r cuts tiles (block scales) anywhere (fp8, v4). */
int par_recipe_has_tiles(par_recipe r);
/* Whether recipe r puts the indexer's q and k in FP4 and its scores in BF16. */
int par_recipe_fp4_indexer(par_recipe r);

/* A weight held as one of P equal blocks of its rows (cut 1) or columns
 * (cut 2) over a TP or ETP group: its tiles are the whole tensor's, and a
 * tile cut over the group takes the group's amax (tile_max: the element-wise
 * max, NaN wins, of n amaxes over the group that cuts `name`; a collective,
 * so every rank of the group casts the same GEMMs in the same order). */
typedef struct {
    int cut, rank, P; /* cut 0: whole */
    par_status (*tile_max)(void *ctx, const char *name, double *amax, int64_t n);
    void *ctx;
    char name[80];
} par_recipe_shard;

/* Registers [w, w + bytes) as a weight of class c under recipe r for owner
 * (a model; a no-op for PAR_RECIPE_NONE and for casts that do nothing).
 * Thread-safe: ranks register their models concurrently; a buffer several
 * models share (DP replicas of one process) is registered by each. */
par_status par_recipe_register(const void *owner, const void *w, int64_t bytes, par_recipe r, par_wclass c,
                               const par_recipe_shard *shard /* NULL: whole */);
/* Removes every registration of owner. */
void par_recipe_unregister(const void *owner);
/* The casts for a GEMM whose weight starts at w (NULL: not registered, or a
 * class the recipe leaves alone); *shard (may be NULL) its cut.  A pointer
 * inside a registered weight but not at its start is counted as a failure
 * (par_recipe_note_failure: its tiles would be unknown) and gets NULL. */
const par_recipe_cast *par_recipe_lookup(const void *w, par_recipe_shard *shard);
/* A cast that could not be applied (out of memory in a kernel, which has no
 * status to return): counted; a recipe step fails when the count moved. */
void par_recipe_note_failure(void);
int64_t par_recipe_failures(void);
/* 1: ignore every registration's cut, so that a TP/ETP block is cast with
 * tiles of its own (layout-local tiles: the bug class the global tiles
 * avoid; `PARITY_RECIPE_LOCAL_TILES=1`, to show that such a run differs). */
void par_recipe_set_local_tiles(int on);
/* Registrations alive (tests). */
int64_t par_recipe_registered(void);

#endif
