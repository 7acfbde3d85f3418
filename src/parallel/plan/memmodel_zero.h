/* parallel/plan/memmodel_zero.h - the memory model's view of a ZeRO-1 plan: which
 * rank of a data-parallel group owns what optimizer state (untemplated, no
 * state allocated, works for V4-Pro's tables).
 *
 * The geometry is parallel/layout/zero_geom.h's (par_zero_geom_build: AdamW
 * tensors concatenated in table order and sharded element-wise, shard =
 * ceil(n_adamw / dp); Muon matrices owned whole, greedy by numel descending,
 * ties table order, to the least-loaded rank, ties the lower rank; seg =
 * shard + load_max), the same geometry the executor (zero.c) and the
 * checkpoint owner rule use; this adds what the memory model needs on top:
 * every rank's load and the Muon scratch of the largest matrix it updates.
 */
#ifndef PAR_PARALLEL_PLAN_MEMMODEL_ZERO_H
#define PAR_PARALLEL_PLAN_MEMMODEL_ZERO_H

#include <stdint.h>

#include "core/status.h"
#include "model/params.h"

typedef struct {
    int dp;
    int n_ent;         /* optimized tensors (replicated: fields of the in-place reduction) */
    int64_t n_adamw, shard, n_muon, load_max, seg;
    int64_t *load;     /* [dp] Muon elements owned by each rank                   */
    int64_t *muon_ws;  /* [dp] Muon scratch elements of each rank: the largest over
                        * its matrices of 3 numel + 2 min(rows, cols)^2 (optim.c
                        * par_muon_update + par_muon_orthogonalize)                */
    int64_t muon_ws_all; /* the same over every matrix (replicated: one rank updates all) */
} par_memmodel_zero;

/* The geometry of table entries idx[0..n) (table order; entries without an
 * optimizer or not float are ignored, as zero.h does) over a group of dp
 * ranks.  *g is set only on success; free it with par_memmodel_zero_free. */
par_status par_memmodel_zero_build(par_memmodel_zero *g, const par_param_table *t, const int *idx, int n, int dp);
/* The same over held sizes numel[t->n] (TP shards; NULL: the table's). */
par_status par_memmodel_zero_build_sized(par_memmodel_zero *g, const par_param_table *t, const int64_t *numel, const int *idx,
                                   int n, int dp);
void par_memmodel_zero_free(par_memmodel_zero *g);

#endif
