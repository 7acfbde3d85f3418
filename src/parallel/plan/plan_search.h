/* parallel/plan/plan_search.h - `parity plan --search`: every (PP, VPP, CP, EP,
 * ETP, b) for a GPU count and a global batch (TP 1), checked by the layout
 * rules (parallel/layout/layout.h) and the schedule's, sized by the memory model
 * (parallel/plan/memmodel.h, heaviest rank of every stage), dropped when it does
 * not fit the budget, the rest ranked by the analytical step time
 * (parallel/plan/steptime.h).  Untemplated; docs/planning.md "Search".
 *
 * Enumerated: PP the divisors of N up to n_layers (and max_pp); VPP 1
 * (1f1b) and 2 (interleaved); CP 1, 2, 4, 8 dividing N/PP; EP the common
 * divisors of E and N/PP; ETP 1 and 2; b 1, 2, 4.  Layers that do not split
 * evenly over PP * VPP get par_pplayout_suggest's uneven layout.  With
 * recompute_both, every candidate also with full recomputation.
 *
 * Bounded: a candidate whose weights alone (a lower bound: (dense params / PP
 * + expert params / (PP x EP x ETP)) x 2 bytes) exceed the budget is dropped
 * without building its memory model; candidates are evaluated in a strided
 * order (spread over the enumeration) until max_seconds, the rest skipped.
 */
#ifndef PAR_PARALLEL_PLAN_PLAN_SEARCH_H
#define PAR_PARALLEL_PLAN_PLAN_SEARCH_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "comm/netmodel.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/layout/layout.h"
#include "parallel/plan/memmodel.h"
#include "parallel/plan/steptime.h"

typedef struct {
    int64_t world, global_batch;
    double memory;            /* budget per GPU in bytes (0: none)             */
    par_memmodel_opts mm;           /* the memory model's options                    */
    const par_netmodel *net;
    par_steptime_opts st;
    int64_t max_pp;           /* 0: no limit beyond n_layers                   */
    int distributed_optimizer;/* ZeRO-1 for every candidate                    */
    int recompute_both;       /* MEGATRON: try no and full recomputation (else mm.recompute) */
    /* Bounds (issue 34 item 5): stop evaluating after max_seconds of wall
     * time (0: none; the rest are PAR_CAND_SKIPPED), and call progress (when
     * set) at most once a second while evaluating. */
    double max_seconds;
    void (*progress)(int done, int total, double seconds, void *ud);
    void *progress_ud;
} par_search_opts;

typedef enum {
    PAR_CAND_KEPT = 0,
    PAR_CAND_ILLEGAL,     /* a layout or schedule rule refuses it   */
    PAR_CAND_UNSUPPORTED, /* TP / ETP > 1 on the V4 path            */
    PAR_CAND_MEMORY,      /* does not fit the budget                */
    PAR_CAND_SKIPPED,     /* not evaluated: max_seconds ran out     */
} par_cand_status;

/* A lower bound of every candidate's heaviest rank on N GPUs: its weights
 * alone, every parameter held by at least one GPU at >= 2 bytes (bf16):
 * 2 x params / N.  A budget below it: nothing fits, nothing to search. */
double par_plan_search_floor(const par_config *cfg, int64_t world);

typedef struct {
    int seq;                  /* enumeration order                        */
    int64_t pp, vpp, cp, ep, etp, b, da, de, m;
    int recompute;            /* full recomputation (MEGATRON runtime)   */
    char schedule[16];
    par_cand_status status;
    char reason[320];
    double mem_peak;          /* heaviest rank's M_peak (bytes)           */
    int mem_stage;            /* its stage                                */
    par_steptime t;           /* kept ones                                */
} par_search_cand;

/* Enumerates and evaluates; *out (par_free) gets every candidate, kept ones
 * first by step time, then the dropped ones in enumeration order. */
par_status par_plan_search(const par_config *cfg, const par_search_opts *o, par_search_cand **out, int *n);

/* The top `top` kept candidates and a count of the dropped by reason, and
 * the first dropped of each reason with its message. */
void par_plan_search_print(FILE *f, const par_search_cand *c, int n, int top, const par_search_opts *o);
/* Every candidate as a JSON array (cJSON_Delete it; NULL: out of memory). */
cJSON *par_plan_search_json(const par_search_cand *c, int n);

#endif
