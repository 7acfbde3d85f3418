/* model/layout_record.h - a parallel layout as JSON, plain fields: the one
 * writer of the "layout" object of golden manifests (GOLDEN.md), run
 * summaries (parallel/train/run_summary.h) and checkpoint metadata
 * (parallel/ckpt/ckpt.h), and its reader, which also reads the short key
 * names checkpoints were written with before (docs/checkpoints.md).  In the
 * model layer because the serial reference's manifest (model/golden.c)
 * writes one and the model knows no par_layout: a parallel layout fills a
 * record with par_layout_to_record (parallel/layout/layout.h).
 *
 * Keys, in this order (Megatron-LM's argument names):
 *   world_size, tensor_model_parallel_size, pipeline_model_parallel_size,
 *   virtual_pipeline_model_parallel_size, context_parallel_size,
 *   expert_model_parallel_size, expert_tensor_parallel_size,
 *   [data_parallel_size, expert_data_parallel_size: when da > 0],
 *   micro_batch_size, global_batch_size, use_distributed_optimizer,
 *   [pipeline_schedule: when schedule], [pipeline_model_parallel_layout:
 *   when pp_layout is not empty], [backend, blas_core, host: when backend],
 *   [sequence_parallel: when 1]. */
#ifndef PAR_MODEL_LAYOUT_RECORD_H
#define PAR_MODEL_LAYOUT_RECORD_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"

typedef struct {
    int64_t world, tp, pp, vpp, cp, ep, etp;
    int64_t da, de;            /* the data-parallel sizes; 0: not written (the serial reference) */
    int64_t micro_batch, global_batch;
    int distributed_optimizer;
    int sequence_parallel;     /* written only when 1 (records without it unchanged) */
    const char *schedule;      /* "none" for the serial reference; NULL: not written */
    const char *pp_layout;     /* the pipeline layout string; NULL or "": not written */
    /* the machine that produced a golden set (NULL: none of the three):
     * backend ("self", "threads", ...), blas_core (openblas_get_corename()),
     * and this process's host name */
    const char *backend;
    const char *blas_core;
} par_layout_record;

/* The serial reference's record: every size 1, micro = global batch,
 * schedule "none", backend "self" (blas_core: the caller's). */
static inline void par_layout_record_serial(par_layout_record *r, int64_t global_batch, const char *blas_core)
{
    *r = (par_layout_record){.world = 1, .tp = 1, .pp = 1, .vpp = 1, .cp = 1, .ep = 1, .etp = 1,
                             .micro_batch = global_batch, .global_batch = global_batch,
                             .schedule = "none", .backend = "self", .blas_core = blas_core};
}

/* The JSON object of r (NULL: out of memory). */
cJSON *par_layout_record_json(const par_layout_record *r);

/* Reads a layout object into *r (set on success): every size, da, de, the
 * batch sizes and the optimizer flag are needed, under the keys above or
 * the short names of checkpoints written before this writer ("tp", "pp",
 * "vpp", "cp", "ep", "etp", "da", "de", "micro_batch", "global_batch",
 * "distributed_optimizer", "schedule", "pp_layout"); schedule and pp_layout
 * are "" when absent, backend and blas_core NULL.  The strings point into o.
 * PAR_EFORMAT names the key ("what: layout.KEY ..."). */
par_status par_layout_record_read(const cJSON *o, const char *what, par_layout_record *r);

#endif
