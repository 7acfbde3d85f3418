/* parity ckpt reshard SRC DST [layout flags] | export SRC FILE | diff A B | info DIR
 * Distributed checkpoints (docs/checkpoints.md).
 * Exit: 0 success (diff: equal), 1 diff found differences, 2 bad usage,
 * unreadable or invalid checkpoint. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/outdir.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/ckpt/ckpt.h"
#include "parallel/ckpt/ckpt_owner.h"
#include "parallel/train/run.h"
#include "parallel/layout/layout.h"
#include "parallel/plan/plan.h"

static int fail(const char *sub)
{
    fprintf(stderr, "parity ckpt %s: %s\n", sub, par_last_error());
    par_err_set_quiet(0);
    return 2;
}

static int usage_top(FILE *f)
{
    fprintf(f, "usage: parity ckpt reshard SRC DST [layout flags]\n"
               "       parity ckpt export SRC FILE\n"
               "       parity ckpt diff A B\n"
               "       parity ckpt info DIR\n\n"
               "Distributed checkpoints (docs/checkpoints.md):\n"
               "  reshard  validate SRC and save it as DST under another layout (atomic)\n"
               "  export   every tensor whole, by the contract's names, into one safetensors file\n"
               "  diff     compare training state and full tensors bitwise (exit 1 when they differ)\n"
               "  info     validate a checkpoint and print its state, layout and shards\n"
               "Each subcommand has --help.  Exit: 0 ok / equal, 1 differences, 2 bad usage or an\n"
               "invalid checkpoint (the message names the file, tensor and element range).\n");
    return f == stdout ? 0 : 2;
}

static int cmd_reshard(int argc, char **argv)
{
    par_layout_args la;
    par_layout_args_init(&la);
    par_opt opts[32];
    int n = par_layout_opts(opts, 0, (int)(sizeof opts / sizeof opts[0]), &la);
    const char *synopsis =
        "SRC DST [layout flags]\n\n"
        "Validates checkpoint SRC (version, hashes, shapes, coverage) and writes it as DST with\n"
        "the shards of the layout the flags give (atomic: DST is replaced only when complete).\n"
        "When SRC records its model config the layout is checked against it.  Training state is\n"
        "kept.  Ownership: the training driver's rule, so DST holds the shards a run under those\n"
        "flags saves (docs/checkpoints.md, \"Ownership\").";
    par_positional pos;
    int rc = par_args_parse("ckpt reshard", synopsis, opts, n, argc, argv, &pos);
    if (rc == 1)
        return 0;
    if (rc)
        return 2;
    if (pos.count != 2) {
        fprintf(stderr, "parity ckpt reshard: expected SRC DST, got %d paths (see --help)\n", pos.count);
        return 2;
    }
    const par_cli_output outs[] = {{"DST", pos.argv[1], PAR_OUT_CKPT}};
    if (par_cli_check_outputs("ckpt reshard", outs, 1))
        return 2;
    par_err_set_quiet(1);
    par_layout l;
    par_layout_init(&l);
    l.tp = la.tp;
    l.pp = la.pp;
    l.vpp = la.vpp;
    l.cp = la.cp;
    l.ep = la.ep;
    l.etp = la.etp;
    l.world = la.world_size;
    l.micro_batch = la.micro_batch;
    l.global_batch = la.global_batch;
    l.distributed_optimizer = la.distributed_optimizer;
    if (par_layout_set_pp_layout(&l, la.pp_layout) != PAR_OK ||
        par_layout_set_schedule(&l, la.pp_schedule) != PAR_OK)
        return fail("reshard");
    /* Check the layout against the model the checkpoint records (if any). */
    par_ckpt *ck;
    if (par_ckpt_open(pos.argv[0], &ck) != PAR_OK)
        return fail("reshard");
    const cJSON *model = par_ckpt_model(ck);
    if (model) {
        par_config cfg;
        memset(&cfg, 0, sizeof cfg);
        par_status st = par_config_from_json(&cfg, model);
        if (!st)
            st = par_config_validate(&cfg);
        if (!st)
            st = par_plan_resolve(&l, &cfg);
        if (st) {
            par_ckpt_close(ck);
            return fail("reshard: target layout");
        }
    } else if (l.tp < 1 || l.pp < 1 || l.cp < 1 || l.ep < 1 || l.etp < 1 || par_ckpt_layout_world(&l) < 1) {
        par_ckpt_close(ck);
        fprintf(stderr, "parity ckpt reshard: layout sizes must be >= 1 and fold (world %lld)\n",
                (long long)par_ckpt_layout_world(&l));
        par_err_set_quiet(0);
        return 2;
    }
    /* the training driver's ownership: the shards are what a run under l holds */
    par_status st = par_ckpt_reshard_open(ck, pos.argv[1], &l, par_ckpt_owner_driver, NULL);
    par_ckpt_close(ck);
    if (st != PAR_OK)
        return fail("reshard");
    printf("resharded %s -> %s: %lld ranks\n", pos.argv[0], pos.argv[1], (long long)par_ckpt_layout_world(&l));
    par_err_set_quiet(0);
    return 0;
}

/* overwrite: NULL, or where --overwrite (of a file output) goes. */
static int two_paths(const char *sub, const char *synopsis, int argc, char **argv, par_positional *pos,
                     int *overwrite)
{
    par_opt ow[1] = {{"overwrite", PAR_OPT_FLAG, overwrite, NULL, PAR_OVERWRITE_HELP}};
    int rc = par_args_parse(sub, synopsis, ow, overwrite ? 1 : 0, argc, argv, pos);
    if (rc == 1)
        return 1;
    if (rc)
        return 2;
    int want = strstr(sub, "info") ? 1 : 2;
    if (pos->count != want) {
        fprintf(stderr, "parity %s: expected %d path%s, got %d (see --help)\n", sub, want, want > 1 ? "s" : "",
                pos->count);
        return 2;
    }
    return 0;
}

static int cmd_export(int argc, char **argv)
{
    par_positional pos;
    int overwrite = 0;
    int rc = two_paths("ckpt export",
                       "SRC FILE\n\nValidates checkpoint SRC and writes every tensor whole into the safetensors\n"
                       "FILE (parameters by the contract's names, optimizer state as opt.<name>.<slot>),\n"
                       "loadable by numpy or torch.",
                       argc, argv, &pos, &overwrite);
    if (rc)
        return rc == 1 ? 0 : 2;
    const par_cli_output outs[] = {{"FILE", pos.argv[1], PAR_OUT_FILE, overwrite}};
    if (par_cli_check_outputs("ckpt export", outs, 1))
        return 2;
    par_err_set_quiet(1);
    if (par_ckpt_export(pos.argv[0], pos.argv[1]) != PAR_OK)
        return fail("export");
    par_err_set_quiet(0);
    return 0;
}

static int cmd_diff(int argc, char **argv)
{
    par_positional pos;
    int rc = two_paths("ckpt diff",
                       "A B\n\nCompares the training state and every full tensor of two checkpoints bitwise (their\n"
                       "layouts may differ).  Exit 0: equal; 1: differences (one line each); 2: unreadable.",
                       argc, argv, &pos, NULL);
    if (rc)
        return rc == 1 ? 0 : 2;
    par_err_set_quiet(1);
    par_ckpt_diff_result r;
    if (par_ckpt_diff(pos.argv[0], pos.argv[1], stdout, &r) != PAR_OK)
        return fail("diff");
    par_err_set_quiet(0);
    int same = r.state_equal && r.tensors_equal;
    printf("%s: state %s, %d tensor%s differ\n", same ? "equal" : "DIFFERENT", r.state_equal ? "equal" : "differs",
           r.n_tensors_diff, r.n_tensors_diff == 1 ? "" : "s");
    return same ? 0 : 1;
}

static int cmd_info(int argc, char **argv)
{
    par_positional pos;
    int rc = two_paths("ckpt info", "DIR\n\nValidates a checkpoint and prints its state, layout and shards.", argc,
                       argv, &pos, NULL);
    if (rc)
        return rc == 1 ? 0 : 2;
    par_err_set_quiet(1);
    par_ckpt *ck;
    if (par_ckpt_open(pos.argv[0], &ck) != PAR_OK)
        return fail("info");
    par_err_set_quiet(0);
    const par_ckpt_state *s = par_ckpt_state_of(ck);
    printf("checkpoint %s: valid (format %s v%d)\n", pos.argv[0], PAR_CKPT_FORMAT, PAR_CKPT_VERSION);
    printf("  step %lld, data cursor %lld, seed %" PRIu64 ", precision %s\n", (long long)s->step,
           (long long)s->cursor, s->seed, s->precision);
    const par_layout *l = par_ckpt_layout(ck);
    if (l)
        printf("  layout: world %lld, TP %lld PP %lld VPP %lld CP %lld EP %lld ETP %lld, Da %lld De %lld, ZeRO-1 %s\n",
               (long long)l->world, (long long)l->tp, (long long)l->pp, (long long)l->vpp, (long long)l->cp,
               (long long)l->ep, (long long)l->etp, (long long)l->da, (long long)l->de,
               l->distributed_optimizer ? "on" : "off");
    int64_t elems = 0;
    int params = 0, experts = 0, states = 0;
    for (int i = 0; i < par_ckpt_ntensors(ck); i++) {
        const par_ckpt_tensor *t = par_ckpt_tensor_at(ck, i);
        elems += par_shape_numel(t->ndim, t->shape, 0);
        params += t->slot == PAR_CKPT_PARAM;
        experts += t->slot == PAR_CKPT_PARAM && t->expert >= 0;
        states += t->slot != PAR_CKPT_PARAM;
    }
    printf("  %d tensors, %lld elements, %d shards:", par_ckpt_ntensors(ck), (long long)elems, par_ckpt_nranks(ck));
    for (int r = 0; r < par_ckpt_nranks(ck); r++)
        printf(" %d", par_ckpt_rank_nslices(ck, r));
    printf(" slices\n");
    printf("  roles: %d parameters (%d of routed experts), %d optimizer state tensors\n", params, experts, states);
    par_ckpt_close(ck);
    return 0;
}

int par_cmd_ckpt(int argc, char **argv)
{
    if (argc < 2)
        return usage_top(stderr);
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help"))
        return usage_top(stdout);
    if (!strcmp(sub, "reshard"))
        return cmd_reshard(argc - 1, argv + 1);
    if (!strcmp(sub, "export"))
        return cmd_export(argc - 1, argv + 1);
    if (!strcmp(sub, "diff"))
        return cmd_diff(argc - 1, argv + 1);
    if (!strcmp(sub, "info"))
        return cmd_info(argc - 1, argv + 1);
    fprintf(stderr, "parity ckpt: unknown subcommand '%s' (reshard, export, diff, info)\n", sub);
    return 2;
}
