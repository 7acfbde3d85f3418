/* parallel/layout/tp_split.h - how tensor parallelism (TP) and expert tensor
 * parallelism (ETP) cut each parameter of the model (untemplated; data:
 * one rule table in tp_split.c).  docs/parallel.md, "Tensor parallelism".
 *
 * A cut says which dimension of a [rows, cols] tensor (1-D tensors are
 * [n, 1]) is split into P equal contiguous blocks, rank r holding block r:
 *   PAR_TP_ROWS  rows (output features of a Linear: column-parallel; query
 *                heads of wq_b, whole groups of wo_a, vocabulary rows of
 *                embed / head, the heads' attn_sink, the index heads)
 *   PAR_TP_COLS  columns (input features: row-parallel; wo_b's group
 *                columns, w2 of the shared and routed experts)
 *   PAR_TP_REPLICATED  every rank holds the whole tensor (wq_a, q_norm,
 *                the single KV head wkv/kv_norm, both compressors, mHC,
 *                norms, the gate, MTP projections, hc_head)
 * Routed experts are cut over the expert-TP group (ETP), everything else
 * over the TP group.  The checkpoint reshard, the Muon owner rule and the
 * gradient norm of the driver read the same table (par_tp_storage_cut).
 */
#ifndef PAR_PARALLEL_LAYOUT_TP_SPLIT_H
#define PAR_PARALLEL_LAYOUT_TP_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/layout.h"

typedef enum { PAR_TP_REPLICATED = 0, PAR_TP_ROWS, PAR_TP_COLS } par_tp_cut;
typedef enum { PAR_TP_GROUP_TP = 0, PAR_TP_GROUP_ETP } par_tp_group;

typedef struct {
    par_tp_cut cut;
    par_tp_group group;
} par_tp_split;

/* The rule of a parameter name of the table (model/params.c names,
 * "layers.3.attn.wq_b.weight", "mtp.0.ffn.experts.5.w2.weight", ...).
 * Names the table does not know are replicated. */
par_tp_split par_tp_split_of(const char *name);
/* "replicated", "rows", "cols". */
const char *par_tp_cut_name(par_tp_cut cut);

/* Shape of one rank's shard of a [rows, cols] tensor cut `cut` over P ranks
 * (PAR_EINVAL naming the tensor and the numbers when P does not divide the
 * cut dimension). */
par_status par_tp_shard_shape(const char *name, int64_t rows, int64_t cols, par_tp_cut cut,
                              int64_t P, int64_t *srows, int64_t *scols);

/* Rank r's shard of a full [rows, cols] tensor of `es`-byte elements into
 * dst (packed [srows, scols]); par_tp_unslice is the inverse (writes only
 * rank r's block of the full tensor).  A replicated tensor is copied whole.
 * P must divide the cut dimension. */
void par_tp_slice(void *dst, const void *full, int64_t rows, int64_t cols, par_tp_cut cut,
                  int rank, int P, size_t es);
void par_tp_unslice(void *full, const void *src, int64_t rows, int64_t cols, par_tp_cut cut,
                    int rank, int P, size_t es);

/* Rank r's packed shard (above) against the logical tensor, for pieces that
 * are contiguous in both (checkpoint slices, parallel/ckpt/ckpt_owner.c and
 * ckpt_model.c): par_tp_shard_run gives the logical offset of shard element
 * j (0 <= j < rows*cols/P) and *run, the elements from there contiguous in
 * both (a row cut: to the shard's end; a column cut: to the end of the
 * shard's row, so a range of a column shard is one piece per row);
 * par_tp_logical_run is the inverse: the shard offset of logical element g
 * and *run, or -1 when g is not in rank r's block. */
int64_t par_tp_shard_run(int64_t rows, int64_t cols, par_tp_cut cut, int rank, int P, int64_t j, int64_t *run);
int64_t par_tp_logical_run(int64_t rows, int64_t cols, par_tp_cut cut, int rank, int P, int64_t g, int64_t *run);

/* How a rank of layout l STORES entry `name` (its weights, gradients and
 * optimizer state): the rule's cut when the entry is held as shards in this
 * layout, PAR_TP_REPLICATED when every rank of the group holds it whole.
 * *P: the group's size (TP or ETP; 1 when whole).  Every cut of the rule
 * table is held as shards once its group is larger than 1: under TP > 1
 * the row cuts (embed / head vocab rows, attn.wq_b, attn.attn_sink,
 * attn.wo_a, the indexer's wq_b / weights_proj, the shared expert's w1 /
 * w3) and the column cuts (attn.wo_b, the shared expert's w2; the shared
 * expert whatever EP and ETP are: par_tp_shared_expert_split), under ETP
 * > 1 the routed experts' w1 / w3 rows and w2 columns.  The hooks read and
 * accumulate the shards in place (docs/parallel.md "What each rank
 * stores"). */
par_tp_cut par_tp_storage_cut(const par_layout *l, const char *name, int64_t *P);

/* The model-wide TP / ETP rules (every message names the flag, the config
 * key and both numbers): TP divides n_heads, o_groups, index_n_heads,
 * vocab_size and moe_inter_dim (the shared expert); ETP divides
 * moe_inter_dim (the routed experts).  tp, etp >= 1. */
par_status par_tp_check_config(const par_config *cfg, int64_t tp, int64_t etp);

/* 1 when the layout runs the shared expert TP-split: column / row parallel
 * over the TP group (w1 / w3 rows, w2 columns of parallel/layout/tp_split.c's
 * cuts), whatever EP and ETP are (Megatron-LM: the shared expert is a TP
 * MLP); 0 when it runs whole (TP = 1).  The one predicate the executor's
 * hooks (tp_moe_hook.c, ep.c, etp_hook.c) and the shared expert's storage
 * (par_tp_storage_cut) key on. */
int par_tp_shared_expert_split(const par_layout *l);

#endif
