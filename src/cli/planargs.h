/* cli/planargs.h - the planning flags of `parity plan` (issue 14) and what
 * they print / write, so that cmd_plan.c stays a thin parser:
 *
 *   --json FILE                       the report as JSON (atomic write)
 *   --guide                           also the tuning guide's configs A, B, C
 *   --runtime megatron|parity         the memory model's runtime (memmodel.h; default megatron)
 *   --precision f64|f32               parity's working precision (runtime parity)
 *   --recompute-granularity none|full Megatron's activation recomputation (runtime megatron)
 *   --moe-skew F                      EP receive skew (default 1.5)
 *   --measured-loads RUN.json         per-stage skews of a `parity run --cost-as` summary
 *   --gemm-efficiency F               fraction of peak FLOP/s for the step time (default 1)
 *   --search                          enumerate layouts for --world-size / --global-batch-size
 *   --memory-per-gpu SIZE             the search's budget (e.g. 80GB)
 *   --top K                           candidates the search prints (default 10)
 *   --search-seconds S                the search's time bound (default 5; the rest not evaluated)
 *   --overwrite                       --json may replace a file parity did not write
 * plus the network flags of cli/netargs.h (default: the "reference" preset).
 */
#ifndef PAR_CLI_PLANARGS_H
#define PAR_CLI_PLANARGS_H

#include <stdint.h>

#include "cli/args.h"
#include "cli/netargs.h"
#include "model/config.h"
#include "parallel/layout/layout.h"

typedef struct {
    const char *json, *runtime, *precision, *recompute, *memory;
    const char *measured;   /* --measured-loads RUN.json (a `parity run --cost-as` summary) */
    int guide, search, overwrite;
    double skew, efficiency, search_seconds;
    int64_t top;
    par_net_args net;
} par_plan_args;

void par_plan_args_init(par_plan_args *a);
/* Appends the options above (capacity checked); returns the new count or -1. */
int par_plan_opts(par_opt *opts, int n, int cap, par_plan_args *a);

/* Checks the planning flags before anything is printed (0, or 2 with one
 * message on stderr). */
int par_plan_args_check(const par_plan_args *a);

/* After the layout summary: the guide, memory and step-time sections of a
 * resolved layout, and the JSON file.  Returns the exit status (0, or 2
 * with one message on stderr). */
int par_plan_report(const par_plan_args *a, const par_config *cfg, const par_layout *l);

/* --search: every legal layout of the given world size and batch (the
 * layout flags fix nothing else), table and JSON.  Returns the exit status. */
int par_plan_search_cmd(const par_plan_args *a, const par_config *cfg, const par_layout *given);

#endif
