/* parity schedule --pipeline-schedule NAME --pipeline-model-parallel-size P
 *   [--virtual-pipeline-model-parallel-size V] --microbatches M
 *   [--microbatch-group-size-per-virtual-pipeline-stage G]
 *   [--cost-f 1 --cost-b 2 --cost-w 1 --cost-fb 0 --latency 0]
 *   [--svg FILE] [--trace FILE] [--max-cols N]
 * Dry-runs a pipeline schedule (docs/schedules.md): prints the bubble
 * fraction, makespan, peak live activations per rank and a text timeline.
 * Exit: 0 the schedule passes the dry run, 1 it fails a check, 2 bad usage. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/outdir.h"
#include "core/status.h"
#include "parallel/schedule/schedule.h"

int par_cmd_schedule(int argc, char **argv)
{
    const char *name = NULL, *svg = NULL, *trace = NULL;
    int64_t pp = 0, vpp = 0, m = 0, group = 0, max_cols = 120;
    int overwrite = 0;
    par_sched_costs c;
    par_sched_costs_init(&c);
    const par_opt opts[] = {
        {"pipeline-schedule", PAR_OPT_STR, &name, "NAME", "gpipe|1f1b|interleaved|zb-h1|dualpipe|dualpipev"},
        {"pipeline-model-parallel-size", PAR_OPT_INT, &pp, "P", "pipeline ranks", PAR_CHK_POS, 1000000},
        {"virtual-pipeline-model-parallel-size", PAR_OPT_INT, &vpp, "V",
         "model chunks per rank (interleaved: default 2; dualpipev: 2; others 1)", PAR_CHK_POS, 1000},
        {"microbatches", PAR_OPT_INT, &m, "M", "microbatches per step", PAR_CHK_POS, 1000000},
        {"microbatch-group-size-per-virtual-pipeline-stage", PAR_OPT_INT, &group, "G",
         "interleaved: contiguous microbatches per virtual stage, in [P, M] (default P)", PAR_CHK_POS, 1000000},
        {"cost-f", PAR_OPT_DOUBLE, &c.f, "T", "forward time of one stage (default 1)", PAR_CHK_NONNEG_REAL, 1e12},
        {"cost-b", PAR_OPT_DOUBLE, &c.b, "T", "whole backward time of one stage, B+W (default 2)", PAR_CHK_NONNEG_REAL, 1e12},
        {"cost-w", PAR_OPT_DOUBLE, &c.w, "T", "weight-gradient part of the backward (default 1; split B = b - w)", PAR_CHK_NONNEG_REAL, 1e12},
        {"cost-fb", PAR_OPT_DOUBLE, &c.fb, "T", "one overlapped F&B unit (DualPipe; default 0 = F + its backward)", PAR_CHK_NONNEG_REAL, 1e12},
        {"latency", PAR_OPT_DOUBLE, &c.latency, "T", "time a message travels (default 0)", PAR_CHK_NONNEG_REAL, 1e12},
        {"svg", PAR_OPT_STR, &svg, "FILE", "write the timeline as SVG"},
        {"trace", PAR_OPT_STR, &trace, "FILE", "write the timeline as Chrome trace JSON (Perfetto)"},
        {"overwrite", PAR_OPT_FLAG, &overwrite, NULL, PAR_OVERWRITE_HELP},
        {"max-cols", PAR_OPT_INT, &max_cols, "N", "width of the text timeline (default 120)", PAR_CHK_POS, 100000},
    };
    const char *synopsis = "--pipeline-schedule NAME --pipeline-model-parallel-size P --microbatches M [options]\n\n"
                           "Builds the schedule's per-rank action lists and dry-runs them: every send matched,\n"
                           "no deadlock, dependencies in order, one F and one backward per (microbatch, stage).\n"
                           "Prints the bubble fraction (idle / (P * makespan)), the makespan, peak live\n"
                           "activations per rank and a text timeline.  Exit 0: the schedule passes; 1: a check\n"
                           "failed; 2: bad usage or an invalid combination.";
    par_positional pos;
    int rc = par_args_parse("schedule", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &pos);
    if (rc == 1)
        return 0;
    if (rc)
        return 2;
    if (pos.count != 0) {
        fprintf(stderr, "parity schedule: unexpected argument '%s' (see 'parity schedule --help')\n", pos.argv[0]);
        return 2;
    }
    if (!name || pp == 0 || m == 0) {
        fprintf(stderr, "parity schedule: --pipeline-schedule, --pipeline-model-parallel-size and --microbatches are "
                        "required (see 'parity schedule --help')\n");
        return 2;
    }
    if (pp < 0 || pp > 1000000 || m < 0 || m > 1000000 || vpp < 0 || vpp > 1000 || group < 0 || group > 1000000) {
        fprintf(stderr, "parity schedule: sizes out of range: P %lld, V %lld, M %lld, G %lld\n", (long long)pp,
                (long long)vpp, (long long)m, (long long)group);
        return 2;
    }
    const par_cli_output outs[] = {{"--svg", svg, PAR_OUT_FILE, overwrite},
                                   {"--trace", trace, PAR_OUT_FILE, overwrite}};
    if (par_cli_check_outputs("schedule", outs, 2))
        return 2;
    par_err_set_quiet(1);
    par_schedule_params sp;
    par_schedule_params_init(&sp);
    if (par_schedule_kind_parse(name, &sp.kind) != PAR_OK) {
        fprintf(stderr, "parity schedule: %s\n", par_last_error());
        return 2;
    }
    sp.pp = (int)pp;
    sp.vpp = (int)vpp;
    sp.n_micro = (int)m;
    sp.mb_group = (int)group;
    par_schedule s;
    if (par_schedule_build(&sp, &s) != PAR_OK) {
        fprintf(stderr, "parity schedule: %s\n", par_last_error());
        return 2;
    }
    par_sched_sim sim;
    par_status st = par_schedule_simulate(&s, &c, &sim);
    if (st != PAR_OK) {
        fprintf(stderr, "parity schedule: %s\n", par_last_error());
        par_schedule_free(&s);
        return st == PAR_EINVAL ? 2 : 1;
    }
    printf("schedule %s: PP %d, VPP %d, m %d%s; costs F %g, B %g (split: B %g + W %g), F&B %g, latency %g\n",
           par_schedule_kind_name(s.params.kind), s.params.pp, s.params.vpp, s.params.n_micro,
           s.n_dirs == 2 ? " (m/2 per direction)" : "", c.f, c.b, c.b - c.w, c.w, c.fb > 0 ? c.fb : c.f + c.b,
           c.latency);
    if (s.params.kind == PAR_SCHED_INTERLEAVED)
        printf("microbatch group size per virtual stage: %d\n", s.params.mb_group);
    printf("dry run: ok (%lld messages matched, no deadlock, dependencies in order)\n", (long long)sim.n_messages);
    printf("makespan: %g\n", sim.makespan);
    printf("bubble: %.4f (%.2f %%) = idle / (P * makespan)\n", sim.bubble, 100.0 * sim.bubble);
    printf("rank  busy      idle      peak-live  peak-held-until-W\n");
    for (int r = 0; r < s.params.pp; r++)
        printf("%-5d %-9g %-9g %-10d %d\n", r, sim.busy[r], sim.idle[r], sim.peak_live[r], sim.peak_held[r]);
    par_sched_timeline_text(&s, &sim, 0, (int)(max_cols > 0 ? max_cols : 120), stdout);
    int code = 0;
    if (svg && par_sched_write_svg(&s, &sim, svg) != PAR_OK) {
        fprintf(stderr, "parity schedule: %s\n", par_last_error());
        code = 2;
    } else if (svg) {
        printf("wrote %s\n", svg);
    }
    if (trace && par_sched_write_trace(&s, &sim, trace) != PAR_OK) {
        fprintf(stderr, "parity schedule: %s\n", par_last_error());
        code = 2;
    } else if (trace) {
        printf("wrote %s\n", trace);
    }
    par_sched_sim_free(&sim);
    par_schedule_free(&s);
    return code;
}
