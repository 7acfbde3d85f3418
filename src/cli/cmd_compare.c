/* parity compare A B [--policy auto|f64|f32|bf16|bitwise] [--json FILE] [--verbose]
 * Exit: 0 equal within policy, 1 mismatch, 2 bad usage or unreadable input. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/outdir.h"
#include "core/status.h"
#include "model/compare.h"
#include "model/rootcause.h"
#include "matrix/rankof.h"

/* The first divergent tensor in dataflow order (model/rootcause.h), its
 * first listed element and the rank of each parallel side that owned it. */
static void print_root_cause(const par_compare_report *r, const char *a, const char *b)
{
    par_root_cause rc;
    par_compare_root_cause(r, &rc);
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
    printf("\n");
}

int par_cmd_compare(int argc, char **argv)
{
    const char *policy_s = "auto", *json = NULL;
    int verbose = 0, overwrite = 0;
    int64_t max_list = 5;
    const par_opt opts[] = {
        {"policy", PAR_OPT_STR, &policy_s, "auto|f64|f32|bf16|bitwise",
         "comparison policy (auto: from the manifests' precision; f64 for bare files)"},
        {"json", PAR_OPT_STR, &json, "FILE", "write the full report as JSON"},
        {"overwrite", PAR_OPT_FLAG, &overwrite, NULL, PAR_OVERWRITE_HELP},
        {"verbose", PAR_OPT_FLAG, &verbose, NULL, "print every tensor, not only failing ones"},
        {"max-list", PAR_OPT_INT, &max_list, "N", "mismatching elements listed per failing tensor (default 5, max 32)", PAR_CHK_NONNEG},
    };
    const char *synopsis = "A B [options]\n\n"
                           "Compares two golden-set directories or two safetensors files, tensor by tensor\n"
                           "(A is the reference).  Exit 0: equal within policy; 1: mismatch; 2: bad usage or\n"
                           "unreadable input.";
    par_positional pos;
    int rc = par_args_parse("compare", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &pos);
    if (rc == 1)
        return 0;
    if (rc)
        return 2;
    if (pos.count != 2) {
        fprintf(stderr, "parity compare: expected two paths A B, got %d (see 'parity compare --help')\n", pos.count);
        return 2;
    }
    const par_cli_output outs[] = {{"--json", json, PAR_OUT_FILE, overwrite}};
    if (par_cli_check_outputs("compare", outs, 1))
        return 2;
    par_compare_opts o;
    par_compare_opts_init(&o);
    par_err_set_quiet(1);
    if (par_policy_parse(policy_s, &o.policy) != PAR_OK) {
        fprintf(stderr, "parity compare: %s\n", par_last_error());
        par_err_set_quiet(0);
        return 2;
    }
    if (max_list < 0 || max_list > PAR_CMP_MAX_LIST) {
        fprintf(stderr, "parity compare: --max-list %lld is outside 0..%d\n", (long long)max_list, PAR_CMP_MAX_LIST);
        par_err_set_quiet(0);
        return 2;
    }
    o.max_list = (int)max_list;
    par_compare_report *r;
    par_status st = par_compare_paths(pos.argv[0], pos.argv[1], &o, &r);
    if (st) {
        fprintf(stderr, "parity compare: %s\n", par_last_error());
        par_err_set_quiet(0);
        return 2;
    }
    par_compare_report_print(r, stdout, verbose);
    print_root_cause(r, pos.argv[0], pos.argv[1]);
    fflush(stdout);
    int code = par_compare_report_ok(r) ? 0 : 1;
    if (json && par_compare_report_write_json(r, json) != PAR_OK) {
        fprintf(stderr, "parity compare: %s\n", par_last_error());
        code = 2;
    }
    par_err_set_quiet(0);
    par_compare_report_free(r);
    return code;
}
