#include "cli/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const par_opt *find_opt(const par_opt *opts, int nopts, const char *name, size_t len)
{
    for (int i = 0; i < nopts; i++)
        if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len))
            return &opts[i];
    return NULL;
}

static int set_value(const char *cmd, const par_opt *o, const char *v)
{
    char *end;
    switch (o->kind) {
    case PAR_OPT_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end) {
            fprintf(stderr, "parity %s: --%s expects an integer, got '%s'\n", cmd, o->name, v);
            return 2;
        }
        *(int64_t *)o->dest = x;
        return 0;
    }
    case PAR_OPT_DOUBLE: {
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end) {
            fprintf(stderr, "parity %s: --%s expects a number, got '%s'\n", cmd, o->name, v);
            return 2;
        }
        *(double *)o->dest = x;
        return 0;
    }
    case PAR_OPT_STR:
        *(const char **)o->dest = v;
        return 0;
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

int par_args_parse(const char *cmd, const char *synopsis, const par_opt *opts, int nopts, int argc,
                   char **argv, par_positional *pos)
{
    pos->count = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            par_args_usage(cmd, synopsis, opts, nopts);
            return 1;
        }
        if (!strcmp(a, "--")) {
            for (i++; i < argc; i++) {
                if (pos->count >= 16) {
                    fprintf(stderr, "parity %s: too many arguments\n", cmd);
                    return 2;
                }
                pos->argv[pos->count++] = argv[i];
            }
            break;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (a[0] == '-' && a[1] != '\0') {
                fprintf(stderr, "parity %s: unknown option '%s' (options are long: --name; see --help)\n",
                        cmd, a);
                return 2;
            }
            if (pos->count >= 16) {
                fprintf(stderr, "parity %s: too many arguments\n", cmd);
                return 2;
            }
            pos->argv[pos->count++] = a;
            continue;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const par_opt *o = find_opt(opts, nopts, name, len);
        if (!o) {
            fprintf(stderr, "parity %s: unknown option '--%.*s' (see 'parity %s --help')\n", cmd, (int)len,
                    name, cmd);
            return 2;
        }
        if (o->kind == PAR_OPT_FLAG) {
            if (eq) {
                fprintf(stderr, "parity %s: --%s takes no value\n", cmd, o->name);
                return 2;
            }
            *(int *)o->dest = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "parity %s: --%s needs a value (%s)\n", cmd, o->name,
                        o->metavar ? o->metavar : "VALUE");
                return 2;
            }
            v = argv[++i];
        }
        int rc = set_value(cmd, o, v);
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
    printf("  %-44s %s\n", "--help", "this text");
}

void par_layout_args_init(par_layout_args *l)
{
    memset(l, 0, sizeof *l);
    l->tp = l->pp = l->cp = l->ep = l->etp = 1;
    l->vpp = 0;
    l->micro_batch = 0;
    l->global_batch = 0;
    l->world_size = 0;
    l->ranks_per_process = 1;
}

int par_layout_opts(par_opt *opts, int n, int cap, par_layout_args *l)
{
    const par_opt add[] = {
        {"tensor-model-parallel-size", PAR_OPT_INT, &l->tp, "N", "TP size (attention heads split; parity run: no CP / EP with it yet)"},
        {"pipeline-model-parallel-size", PAR_OPT_INT, &l->pp, "N", "pipeline stages"},
        {"virtual-pipeline-model-parallel-size", PAR_OPT_INT, &l->vpp, "N", "virtual stages per rank"},
        {"pipeline-model-parallel-layout", PAR_OPT_STR, &l->pp_layout, "STR", "Megatron layout string, e.g. 'Et*3|t*2|t*3mL'"},
        {"pipeline-schedule", PAR_OPT_STR, &l->pp_schedule, "NAME", "gpipe|1f1b|interleaved|zb-h1|dualpipe|dualpipev"},
        {"context-parallel-size", PAR_OPT_INT, &l->cp, "N", "CP size (contiguous split of each row)"},
        {"expert-model-parallel-size", PAR_OPT_INT, &l->ep, "N", "EP size"},
        {"expert-tensor-parallel-size", PAR_OPT_INT, &l->etp, "N", "ETP size (routed experts' hidden units split; parity run: TP = EP = 1 with it)"},
        {"micro-batch-size", PAR_OPT_INT, &l->micro_batch, "ROWS", "rows per microbatch"},
        {"global-batch-size", PAR_OPT_INT, &l->global_batch, "ROWS", "rows per step (default: the preset's)"},
        {"world-size", PAR_OPT_INT, &l->world_size, "N", "ranks (default: the smallest the folding allows)"},
        {"ranks-per-process", PAR_OPT_INT, &l->ranks_per_process, "N", "thread ranks per MPI process"},
        {"use-distributed-optimizer", PAR_OPT_FLAG, &l->distributed_optimizer, NULL, "ZeRO-1 optimizer sharding"},
    };
    int k = (int)(sizeof add / sizeof add[0]);
    if (n + k > cap)
        return -1;
    for (int i = 0; i < k; i++)
        opts[n + i] = add[i];
    return n + k;
}
