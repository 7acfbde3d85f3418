#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/outdir.h"
#include "core/outfile.h"
#include "core/status.h"

static const par_opt *find_opt(const par_opt *opts, int nopts, const char *name, size_t len)
{
    for (int i = 0; i < nopts; i++)
        if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len))
            return &opts[i];
    return NULL;
}

static int check_value(const char *cmd, const par_opt *o, const char *v)
{
    double x = o->kind == PAR_OPT_INT ? (double)*(const int64_t *)o->dest
               : o->kind == PAR_OPT_DOUBLE ? *(const double *)o->dest : 0;
    const char *rule = NULL;
    switch (o->check) {
    case PAR_CHK_NONE: break;
    case PAR_CHK_POS: rule = x >= 1 ? NULL : ">= 1"; break;
    case PAR_CHK_NONNEG: rule = x >= 0 ? NULL : ">= 0"; break;
    case PAR_CHK_POS_REAL: rule = x > 0 ? NULL : "> 0"; break;
    case PAR_CHK_NONNEG_REAL: rule = x >= 0 ? NULL : ">= 0"; break;
    case PAR_CHK_NONEMPTY:
        if (!**(const char *const *)o->dest) {
            fprintf(stderr, "parity %s: --%s needs a non-empty value (%s)\n", cmd, o->name,
                    o->metavar ? o->metavar : "VALUE");
            return 2;
        }
        break;
    }
    if (rule) {
        fprintf(stderr, "parity %s: --%s must be %s, got %s\n", cmd, o->name, rule, v);
        return 2;
    }
    if (o->hi > 0 && x > o->hi && (o->kind == PAR_OPT_INT || o->kind == PAR_OPT_DOUBLE)) {
        fprintf(stderr, "parity %s: --%s must be <= %.17g, got %s\n", cmd, o->name, o->hi, v);
        return 2;
    }
    return 0;
}

static int set_value(const char *cmd, const par_opt *o, const char *v)
{
    char *end;
    switch (o->kind) {
    case PAR_OPT_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end) {
            fprintf(stderr, "parity %s: --%s expects an integer%s, got '%s'\n", cmd, o->name,
                    errno == ERANGE ? " within 64 bits" : "", v);
            return 2;
        }
        *(int64_t *)o->dest = x;
        return check_value(cmd, o, v);
    }
    case PAR_OPT_DOUBLE: {
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x)) {
            fprintf(stderr, "parity %s: --%s expects a finite number, got '%s'\n", cmd, o->name, v);
            return 2;
        }
        *(double *)o->dest = x;
        return check_value(cmd, o, v);
    }
    case PAR_OPT_STR:
        *(const char **)o->dest = v;
        return check_value(cmd, o, v);
    case PAR_OPT_LIST: {
        par_strlist *l = o->dest;
        if (l->count >= (int)(sizeof l->items / sizeof l->items[0])) {
            fprintf(stderr, "parity %s: too many --%s options (at most 64)\n", cmd, o->name);
            return 2;
        }
        l->items[l->count++] = v;
        return 0;
    }
    case PAR_OPT_FLAG:
        break;
    }
    return 2;
}

static int add_positional(const char *cmd, par_positional *pos, const char *a)
{
    if (pos->count >= 16) {
        fprintf(stderr, "parity %s: too many arguments\n", cmd);
        return 2;
    }
    pos->argv[pos->count++] = a;
    return 0;
}

/* --log LEVEL after the command (as `parity --log LEVEL cmd`). */
static int log_option(const char *cmd, const char *v)
{
    par_log_level lv;
    if (!v) {
        fprintf(stderr, "parity %s: --log needs a value (error|warn|info|debug|trace)\n", cmd);
        return 2;
    }
    if (par_log_parse_level(v, &lv) != 0) {
        fprintf(stderr, "parity %s: --log expects error|warn|info|debug|trace, got '%s'\n", cmd, v);
        return 2;
    }
    par_log_set_level(lv);
    return 0;
}

#define MAX_OPTS 256

/* One option: name[=value] at argv[*i]; the value may be the next word. */
static int parse_one(const char *cmd, const par_opt *opts, int nopts, int argc, char **argv, int *i,
                     const char **first)
{
    const char *name = argv[*i] + 2;
    const char *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const par_opt *o = find_opt(opts, nopts, name, len);
    if (!o && len == 3 && !strncmp(name, "log", 3))
        return log_option(cmd, eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL));
    if (!o) {
        fprintf(stderr, "parity %s: unknown option '--%.*s' (see 'parity %s --help')\n", cmd, (int)len, name, cmd);
        return 2;
    }
    const char *v = eq ? eq + 1 : NULL;
    if (o->kind == PAR_OPT_FLAG && eq) {
        fprintf(stderr, "parity %s: --%s takes no value\n", cmd, o->name);
        return 2;
    }
    if (o->kind != PAR_OPT_FLAG && !v) {
        if (*i + 1 >= argc) {
            fprintf(stderr, "parity %s: --%s needs a value (%s)\n", cmd, o->name, o->metavar ? o->metavar : "VALUE");
            return 2;
        }
        v = argv[++*i];
    }
    int k = (int)(o - opts);
    if (o->kind != PAR_OPT_LIST && k < MAX_OPTS) {
        if (first[k] && o->kind == PAR_OPT_FLAG) {
            fprintf(stderr, "parity %s: --%s is given twice; give it once\n", cmd, o->name);
            return 2;
        }
        if (first[k]) {
            fprintf(stderr, "parity %s: --%s is given twice ('%s' and '%s'); give it once\n", cmd, o->name, first[k],
                    v);
            return 2;
        }
        first[k] = o->kind == PAR_OPT_FLAG ? "" : v;
    }
    if (o->kind == PAR_OPT_FLAG) {
        *(int *)o->dest = 1;
        return 0;
    }
    return set_value(cmd, o, v);
}

int par_args_parse(const char *cmd, const char *synopsis, const par_opt *opts, int nopts, int argc,
                   char **argv, par_positional *pos)
{
    const char *first[MAX_OPTS] = {0}; /* value of each option already given */
    pos->count = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            par_args_usage(cmd, synopsis, opts, nopts);
            return 1;
        }
        if (!strcmp(a, "--")) {
            for (i++; i < argc; i++)
                if (add_positional(cmd, pos, argv[i]))
                    return 2;
            break;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (a[0] == '-' && a[1] != '\0') {
                fprintf(stderr, "parity %s: unknown option '%s' (options are long: --name; see --help)\n", cmd, a);
                return 2;
            }
            if (add_positional(cmd, pos, a))
                return 2;
            continue;
        }
        int rc = parse_one(cmd, opts, nopts, argc, argv, &i, first);
        if (rc)
            return rc;
    }
    return 0;
}

void par_args_usage(const char *cmd, const char *synopsis, const par_opt *opts, int nopts)
{
    printf("usage: parity %s %s\n\noptions:\n", cmd, synopsis);
    for (int i = 0; i < nopts; i++) {
        char left[80];
        if (opts[i].kind == PAR_OPT_FLAG)
            snprintf(left, sizeof left, "--%s", opts[i].name);
        else
            snprintf(left, sizeof left, "--%s %s", opts[i].name, opts[i].metavar ? opts[i].metavar : "V");
        printf("  %-44s %s\n", left, opts[i].help ? opts[i].help : "");
    }
    printf("  %-44s %s\n", "--log LEVEL", "error|warn|info|debug|trace (as before the command)");
    printf("  %-44s %s\n", "--help", "this text");
}

void par_layout_args_init(par_layout_args *l)
{
    memset(l, 0, sizeof *l);
    l->tp = l->pp = l->cp = l->ep = l->etp = 1;
    l->vpp = 0;
    l->micro_batch = 0;
    l->global_batch = 0;
    l->world_size = 0;        /* not given: the smallest the folding allows */
    l->ranks_per_process = 0; /* not given (MPI: world size / processes) */
}

int par_layout_opts(par_opt *opts, int n, int cap, par_layout_args *l)
{
    const par_opt add[] = {
        {"tensor-model-parallel-size", PAR_OPT_INT, &l->tp, "N", "TP size (attention heads, vocab-parallel embedding / head / CE and the shared expert split)", PAR_CHK_POS, 1 << 20},
        {"pipeline-model-parallel-size", PAR_OPT_INT, &l->pp, "N", "pipeline stages", PAR_CHK_POS, 1 << 20},
        {"virtual-pipeline-model-parallel-size", PAR_OPT_INT, &l->vpp, "N", "virtual stages per rank", PAR_CHK_POS, 1 << 20},
        {"pipeline-model-parallel-layout", PAR_OPT_STR, &l->pp_layout, "STR", "Megatron layout string, e.g. 'Et*3|t*2|t*3mL'", PAR_CHK_NONEMPTY, 0},
        {"pipeline-schedule", PAR_OPT_STR, &l->pp_schedule, "NAME", "gpipe|1f1b|interleaved|zb-h1|dualpipe|dualpipev", PAR_CHK_NONEMPTY, 0},
        {"context-parallel-size", PAR_OPT_INT, &l->cp, "N", "CP size (contiguous split of each row)", PAR_CHK_POS, 1 << 20},
        {"expert-model-parallel-size", PAR_OPT_INT, &l->ep, "N", "EP size", PAR_CHK_POS, 1 << 20},
        {"expert-tensor-parallel-size", PAR_OPT_INT, &l->etp, "N", "ETP size (routed experts' hidden units split; with TP > 1: ETP 1 or = TP, any ETP with --sequence-parallel)", PAR_CHK_POS, 1 << 20},
        {"micro-batch-size", PAR_OPT_INT, &l->micro_batch, "ROWS", "rows per microbatch", PAR_CHK_POS, 0},
        {"global-batch-size", PAR_OPT_INT, &l->global_batch, "ROWS", "rows per step (default: the preset's)", PAR_CHK_POS, 0},
        {"world-size", PAR_OPT_INT, &l->world_size, "N", "ranks (default: the smallest the folding allows)", PAR_CHK_POS, 1 << 20},
        {"ranks-per-process", PAR_OPT_INT, &l->ranks_per_process, "N", "ranks per MPI process (fibers or threads, --rank-host)", PAR_CHK_POS, 1 << 20},
        {"use-distributed-optimizer", PAR_OPT_FLAG, &l->distributed_optimizer, NULL, "ZeRO-1 optimizer sharding"},
        {"sequence-parallel", PAR_OPT_FLAG, &l->sequence_parallel, NULL, "TP > 1: tokens between TP regions split over the TP group (with CP, EP, ETP too)"},
        {"tp-all-layers", PAR_OPT_FLAG, &l->tp_all_layers, NULL, "deprecated no-op: TP > 1 always splits every layer (vocab-parallel embedding, head and cross-entropy, the shared expert), as Megatron-LM"},
    };
    int k = (int)(sizeof add / sizeof add[0]);
    if (n + k > cap)
        return -1;
    for (int i = 0; i < k; i++)
        opts[n + i] = add[i];
    return n + k;
}

int par_cli_check_outputs(const char *cmd, const par_cli_output *outs, int n)
{
    par_err_set_quiet(1); /* the message is printed here, once */
    for (int i = 0; i < n; i++) {
        if (!outs[i].path)
            continue;
        for (int j = 0; j < i; j++)
            if (outs[j].path && par_outdir_same(outs[i].path, outs[j].path)) {
                fprintf(stderr, "parity %s: %s %s and %s %s name the same path; each output needs its own\n", cmd,
                        outs[j].flag, outs[j].path, outs[i].flag, outs[i].path);
                return 2;
            }
        if ((outs[i].kind == PAR_OUT_FILE &&
             par_outfile_guard(outs[i].path, outs[i].overwrite, outs[i].flag) != PAR_OK) ||
            par_outdir_check(outs[i].path, (par_out_kind)outs[i].kind, outs[i].flag) != PAR_OK) {
            fprintf(stderr, "parity %s: %s\n", cmd, par_last_error());
            return 2;
        }
    }
    return 0;
}
