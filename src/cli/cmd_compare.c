/* parity compare A B [--policy auto|f64|f32|bf16|bitwise|derived] [--bounds FILE] [--json FILE] [--verbose]
 *                    [--only GLOB]... [--subset] [--strict-ties]
 * Exit: 0 equal within policy, 1 mismatch, 2 bad usage or unreadable input. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/outdir.h"
#include "core/status.h"
#include "model/bounds.h"
#include "model/compare.h"
#include "model/rootcause.h"
#include "matrix/rankof.h"

/* The pick lists that differ in tie order (exact ties of A, ties.K): what
 * the divergence after them follows from. */
static void print_ties(const par_compare_report *r)
{
    for (int i = 0; i < par_compare_report_count(r); i++) {
        const par_cmp_entry *e = par_compare_report_entry(r, i);
        if (e->tie_rows)
            printf("tie order: %s %s: %lld row%s pick other entries among exact ties of A (the top-k boundary's "
                   "score shared): a top-k that orders ties otherwise than MODEL.md's lower index; the values after "
                   "it differ for that reason (docs/gpu-rollout.md, \"Exact ties\")\n", e->file, e->tensor,
                   (long long)e->tie_rows, e->tie_rows == 1 ? "" : "s");
    }
}

/* The first divergent tensor in dataflow order (model/rootcause.h), its
 * first listed element and the rank of each parallel side that owned it. */
static void print_root_cause(const par_compare_report *r, const char *a, const char *b)
{
    par_root_cause rc;
    par_compare_root_cause(r, &rc);
    if (rc.root < 0 && rc.n_missing > 0) {
        const par_cmp_entry *m = par_compare_report_entry(r, rc.first_missing);
        printf("no value diverged: %d failing entr%s %s one side only (first: %s %s, %s); --subset compares what B "
               "holds, --only GLOB a selection\n", rc.n_missing, rc.n_missing == 1 ? "y is" : "ies are",
               rc.n_missing == 1 ? "on" : "each on", m->file, m->tensor[0] ? m->tensor : "(file)", m->reason);
        return;
    }
    if (rc.root < 0)
        return;
    const par_cmp_entry *e = par_compare_report_entry(r, rc.root);
    printf("first divergence (dataflow order): %s %s", e->file, e->tensor[0] ? e->tensor : "(file)");
    const char *side[2] = {a, b}, *lab[2] = {"A", "B"};
    for (int k = 0; k < 2 && e->nlist > 0; k++) {
        par_rankof x;
        char own[300];
        if (par_rankof_from_set(side[k], &x) == PAR_OK &&
            par_rankof_describe(&x, e->file, e->tensor, e->ndim, e->list[0].coord, own, sizeof own))
            printf("; %s's layout: %s", lab[k], own);
    }
    if (rc.n_consequences > 0)
        printf("; %d integer mismatch%s downstream", rc.n_consequences, rc.n_consequences > 1 ? "es" : "");
    if (rc.n_missing > 0)
        printf("; besides, %d entr%s on one side only", rc.n_missing, rc.n_missing > 1 ? "ies" : "y");
    printf("\n");
}

/* What the command line gave. */
typedef struct {
    const char *policy_s, *json, *bounds;
    int verbose, subset, strict_ties, overwrite;
    int64_t max_list;
    par_strlist only;
    par_positional pos;
} compare_cli;

/* Parses the options into c; 0 fine, -1 --help, 2 a usage error (said). */
static int parse_cli(int argc, char **argv, compare_cli *c)
{
    memset(c, 0, sizeof *c);
    c->policy_s = "auto";
    c->max_list = 5;
    const par_opt opts[] = {
        {"policy", PAR_OPT_STR, &c->policy_s, "auto|f64|f32|bf16|bitwise|derived",
         "comparison policy (auto: from the manifests' precision; f64 for bare files; derived: per tensor, the "
         "bounds of --bounds FILE)"},
        {"bounds", PAR_OPT_STR, &c->bounds, "FILE",
         "the derived policy's bounds (parity bounds; default: A/bounds.json when A is a directory)",
         PAR_CHK_NONEMPTY},
        {"json", PAR_OPT_STR, &c->json, "FILE", "write the full report as JSON"},
        {"overwrite", PAR_OPT_FLAG, &c->overwrite, NULL, PAR_OVERWRITE_HELP},
        {"verbose", PAR_OPT_FLAG, &c->verbose, NULL, "print every tensor, not only failing ones"},
        {"max-list", PAR_OPT_INT, &c->max_list, "N", "mismatching elements listed per failing tensor (default 5, max 32)", PAR_CHK_NONNEG},
        {"only", PAR_OPT_LIST, &c->only, "GLOB",
         "compare only the tensors whose name matches (repeatable; FILEGLOB:TENSORGLOB for a file's); a pattern "
         "that matches nothing fails"},
        {"subset", PAR_OPT_FLAG, &c->subset, NULL,
         "compare the entries B holds: A's entries missing in B are listed as left out, not failed (a partial or "
         "forward-only dump); B's extra entries still fail"},
        {"strict-ties", PAR_OPT_FLAG, &c->strict_ties, NULL,
         "fail indexer and router picks (and the router loads they move) that differ only among A's exact ties "
         "(tie order; A's ties.K file); by default they "
         "are reported as TIE and pass"},
    };
    const char *synopsis = "A B [options]\n\n"
                           "Compares two golden-set directories or two safetensors files, tensor by tensor\n"
                           "(A is the reference).  Exit 0: equal within policy; 1: mismatch; 2: bad usage or\n"
                           "unreadable input.  A partial dump: --subset (judge what B holds, list what it left\n"
                           "out) and/or --only GLOB.";
    int rc = par_args_parse("compare", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &c->pos);
    if (rc)
        return rc == 1 ? -1 : 2;
    if (c->pos.count != 2) {
        fprintf(stderr, "parity compare: expected two paths A B, got %d (see 'parity compare --help')\n", c->pos.count);
        return 2;
    }
    const par_cli_output outs[] = {{"--json", c->json, PAR_OUT_FILE, c->overwrite}};
    return par_cli_check_outputs("compare", outs, 1) ? 2 : 0;
}

/* The comparator's options from c; 0 fine, 2 with a message. */
static int make_opts(const compare_cli *c, par_compare_opts *o)
{
    par_compare_opts_init(o);
    if (par_policy_parse(c->policy_s, &o->policy) != PAR_OK) {
        fprintf(stderr, "parity compare: %s\n", par_last_error());
        return 2;
    }
    if (c->max_list < 0 || c->max_list > PAR_CMP_MAX_LIST) {
        fprintf(stderr, "parity compare: --max-list %lld is outside 0..%d\n", (long long)c->max_list, PAR_CMP_MAX_LIST);
        return 2;
    }
    o->max_list = (int)c->max_list;
    o->only = c->only.items;
    o->n_only = c->only.count;
    o->subset = c->subset;
    o->strict_ties = c->strict_ties;
    return 0;
}

/* The derived policy's bounds: --bounds FILE, else A/bounds.json; *b NULL
 * under another policy.  0 fine, 2 with a message. */
static int load_bounds(const compare_cli *c, const par_compare_opts *o, par_bounds **b)
{
    *b = NULL;
    if (o->policy != PAR_POLICY_DERIVED) {
        if (c->bounds)
            fprintf(stderr, "parity compare: --bounds applies to --policy derived (the policy is %s)\n", c->policy_s);
        return c->bounds ? 2 : 0;
    }
    char dflt[4096];
    const char *path = c->bounds;
    if (!path) {
        struct stat sb;
        if (stat(c->pos.argv[0], &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "parity compare: --policy derived needs --bounds FILE (A is no directory to hold "
                    "bounds.json)\n");
            return 2;
        }
        snprintf(dflt, sizeof dflt, "%s/bounds.json", c->pos.argv[0]);
        path = dflt;
    }
    if (par_bounds_read(path, b) != PAR_OK) {
        fprintf(stderr, "parity compare: %s\n", par_last_error());
        return 2;
    }
    return 0;
}

int par_cmd_compare(int argc, char **argv)
{
    compare_cli c;
    int rc = parse_cli(argc, argv, &c);
    if (rc)
        return rc < 0 ? 0 : rc;
    par_compare_opts o;
    par_err_set_quiet(1);
    par_compare_report *r;
    par_bounds *bounds = NULL;
    if ((rc = make_opts(&c, &o)) || (rc = load_bounds(&c, &o, &bounds)) ||
        (o.bounds = bounds, par_compare_paths(c.pos.argv[0], c.pos.argv[1], &o, &r) != PAR_OK)) {
        if (!rc)
            fprintf(stderr, "parity compare: %s\n", par_last_error());
        par_bounds_free(bounds);
        par_err_set_quiet(0);
        return 2;
    }
    par_compare_report_print(r, stdout, c.verbose);
    print_root_cause(r, c.pos.argv[0], c.pos.argv[1]);
    print_ties(r);
    fflush(stdout);
    int code = par_compare_report_ok(r) ? 0 : 1;
    if (c.json && par_compare_report_write_json(r, c.json) != PAR_OK) {
        fprintf(stderr, "parity compare: %s\n", par_last_error());
        code = 2;
    }
    par_err_set_quiet(0);
    par_compare_report_free(r);
    par_bounds_free(bounds);
    return code;
}
