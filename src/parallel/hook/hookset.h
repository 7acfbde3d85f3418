/* parallel/hook/hookset.h - a hook set: one kind of executor hook (the
 * model's attention, MoE or vocabulary executor, model/model.h) as an entry
 * of the step executor's table (parallel/step/exec_hooks.c), the way NCCL
 * picks a transport from ncclTransports[] with canConnect (templated: see
 * kernels/real.h).  docs/parallel.md, "Hooks".
 *
 * The executor walks the table once at create: every entry whose applies()
 * says yes for the layout is created (configured and installed into M:
 * M->attn, M->moe or M->vocab) and kept until the executor is freed.  The
 * entries live with their hooks (tp/, cp/, moe/); the table names them.
 * Every hook keys its per-microbatch state by (par_mbctx.mb, block) through
 * parallel/hook/mbstate.h.
 */
#ifndef PAR_PARALLEL_HOOK_HOOKSET_H
#define PAR_PARALLEL_HOOK_HOOKSET_H

#include "core/status.h"
#include "kernels/real.h"
#include "model/model.h"
#include "parallel/layout/groups.h"
#include "parallel/layout/layout.h"

struct par_costas_s;          /* parallel/plan/costas.h */
struct par_ep_counters_s;     /* parallel/moe/ep.h */
struct par_cp_traffic_s;      /* parallel/cp/cp.h */
struct par_tp_shared_stats_s; /* parallel/tp/tp.h */

/* What a hook is created with: the rank's view of the layout and the
 * executor's numbers. */
typedef struct {
    const par_pctx *P;       /* the layout, the rank's coordinates and groups */
    int n_mb;                /* microbatches of a step: the key range of every hook's state */
    unsigned tp_faults;      /* parallel/tp/tp.h PAR_TP_FAULT_* (0 in real runs) */
    int moe_dispatch;        /* EP: 1 hierarchical (node-aware) dispatch, 0 flat */
    int gpus_per_node;       /* EP: ranks per node of the hierarchical dispatch */
    const struct par_costas_s *ca; /* --cost-as with a network (NULL: the counted work) */
} par_hook_env;

/* Where the hooks report (each pointer may be NULL): the EP counters and
 * the CP traffic are set by the hook that has them; the shared expert's
 * work is added by every hook that runs it. */
typedef struct {
    struct par_ep_counters_s *ep;
    struct par_cp_traffic_s *cp;
    struct par_tp_shared_stats_s *shared;
} par_hook_report;

typedef struct {
    const char *name;
    /* 1 when the layout runs this hook */
    int (*applies)(const par_layout *l);
    /* the hook for M, configured and installed into M; *out set only on success */
    par_status (*create)(void **out, const par_hook_env *e, PAR_FN(par_model) *M);
    /* before each step (keep: the step is dumped); NULL: nothing */
    void (*step)(void *h, PAR_FN(par_model) *M, int keep);
    /* its counters into r; NULL: none */
    void (*report)(const void *h, const par_hook_report *r);
    void (*free)(void *h);
} PAR_FN(par_hookset);

#endif
