/* parity run --preset v4-tiny|v4-mini [--data FILE | --fixture NAME] [--steps K] [--seed N]
 *            [--precision f64|f32] [--backend self|threads|fiber|mpi] [layout flags] [--set key=value]...
 *            [--dump DIR] [--summary FILE.json] [--quiet]
 * Training steps under a parallel layout (parallel/train/run.h); --dump writes the
 * unsharded golden-format set (CLI.md, GOLDEN.md).
 * Exit: 0 success, 2 bad usage, an invalid layout or unreadable input, 1 the run failed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backends/registry.h"
#include "cli/autobackend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/devargs.h"
#include "cli/fingerprint.h"
#include "cli/memlimit.h"
#include "cli/netargs.h"
#include "cli/netgroups.h"
#include "comm/trace.h"
#include "kernels/recipe.h"
#include "core/alloc.h"
#include "core/json.h"
#include "core/outdir.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/ckpt/ckpt.h"
#include "parallel/train/run.h"
#include "parallel/train/run_summary.h"

static int exit_code(par_status s)
{
    switch (s) {
    case PAR_ENOMEM:
    case PAR_EINTERNAL:
    case PAR_ERANGE:
    case PAR_ECOMM:
    case PAR_ETIMEOUT:
    case PAR_EMISMATCH:
        return 1;
    default:
        return 2;
    }
}

/* --comm-timeout, else PARITY_COMM_TIMEOUT, else 3600 s (a rank may wait
 * while rank 0 writes a large dump).  -1 after a message for a bad value. */
static double comm_timeout_of(double given)
{
    if (given > 0)
        return given;
    const char *e = getenv("PARITY_COMM_TIMEOUT");
    if (!e || !*e)
        return 3600.0;
    char *end;
    double v = strtod(e, &end);
    if (*end || !(v > 0) || !isfinite(v) || v > 1e9) {
        fprintf(stderr, "parity run: PARITY_COMM_TIMEOUT=%s: must be a number of seconds in (0, 1e9] (unset: 3600)\n",
                e);
        return -1;
    }
    return v;
}

static void human_bytes(char *buf, size_t n, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024.0 && i < 4) {
        b /= 1024.0;
        i++;
    }
    snprintf(buf, n, "%.2f %s", b, u[i]);
}

/* The table's last row: each rank's model structure (its tables: ownership
 * map, expert pointers, holders, plans' entry lists, schedule), the
 * allocator's `model` tag peak of the rank; the memory model's estimate
 * counts the same term (parallel/plan/memmodel.h). */
static void print_model_row(const par_run_summary *sum)
{
    int64_t N = sum->layout.world, lo = INT64_MAX, hi = 0;
    if (!sum->alloc_peak)
        return;
    char b0[32], b1[32];
    printf("  %-30s", "model structure (tag model)");
    for (int64_t r = 0; r < N; r++) {
        int64_t v = sum->alloc_peak[r * PAR_TAG_COUNT + PAR_TAG_MODEL];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        human_bytes(b0, sizeof b0, (double)v);
        if (N <= 8)
            printf("  r%lld %s", (long long)r, b0);
    }
    human_bytes(b0, sizeof b0, (double)lo);
    human_bytes(b1, sizeof b1, (double)hi);
    if (N > 8)
        printf(" min %s  max %s", b0, b1);
    printf("\n");
}

/* Per-rank memory accounting (parallel/dp/dpw.h): every rank for N <= 8,
 * else min / max over ranks. */
static void print_memory(const par_run_summary *sum)
{
    static const char *const kind[PAR_RUN_MEM] = {"weights", "gradients", "optimizer state",
                                                   "optimizer state unsharded", "activations (saved, peak)",
                                                   "communication (DP workspace)"};
    int64_t N = sum->layout.world;
    if (!sum->mem || N < 1)
        return;
    char b0[32], b1[32];
    printf("memory per rank (%s optimizer; accounted from the model and the plans, see docs/parallel.md):\n",
           sum->layout.distributed_optimizer ? "ZeRO-1" : "replicated");
    for (int k = 0; k < PAR_RUN_MEM; k++) {
        int64_t lo = INT64_MAX, hi = 0;
        for (int64_t r = 0; r < N; r++) {
            int64_t v = sum->mem[r * PAR_RUN_MEM + k];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        human_bytes(b0, sizeof b0, (double)lo);
        human_bytes(b1, sizeof b1, (double)hi);
        if (N <= 8) {
            printf("  %-30s", kind[k]);
            for (int64_t r = 0; r < N; r++) {
                human_bytes(b0, sizeof b0, (double)sum->mem[r * PAR_RUN_MEM + k]);
                printf("  r%lld %s", (long long)r, b0);
            }
            printf("\n");
        } else {
            printf("  %-30s min %s  max %s\n", kind[k], b0, b1);
        }
    }
    print_model_row(sum);
}

/* What the command line gave. */
typedef struct {
    const char *preset, *data, *fixture, *precision, *dump, *save, *load, *backend, *moe_dispatch, *summary;
    const char *max_memory, *device, *recipe;
    int64_t save_interval, steps, seed;
    double comm_timeout;
    int quiet, overwrite, bitwise;
    par_strlist sets;
    par_layout_args la;
    par_net_args na; /* --topology, --gpus-per-node, --nvlink-gbps, --ib-gbps, --trace */
    const char *cost_as, *cost_as_layout; /* --cost-as PRESET, --cost-as-layout STR */
    const char *rank_host;           /* --rank-host fiber|threads (mpi), NULL: not given */
} run_cli;

static const char synopsis[] =
    "--preset v4-tiny|v4-mini [--data FILE | --fixture NAME] [--steps K] [--seed N]\n"
    "       [--precision f64|f32] [--backend self|threads|fiber|mpi] [layout flags] [--set key=value]...\n"
    "       [--dump DIR] [--save DIR [--save-interval K]] [--load DIR] [--summary FILE.json] [--quiet]\n"
    "       [--device cpu|gpu] [--bitwise] [--recipe none|bf16|fp8|v4]\n\n"
    "Runs training steps under a parallel layout (data parallelism, expert parallelism with\n"
    "MoE parallel folding: N/PP = TP*CP*Da = ETP*EP*De) on the chosen backend.  The batches are\n"
    "those of `parity golden` with the same data and seed, so `parity compare GOLDEN DUMP`\n"
    "checks the layout against the serial reference.  --use-distributed-optimizer shards the\n"
    "optimizer state (ZeRO-1).  --save / --load write and resume distributed checkpoints (any\n"
    "layout loads any checkpoint).  CP splits every row into CP contiguous slices (S/CP >=\n"
    "D_window).  Network flags (--topology, --gpus-per-node, --nvlink-gbps, --ib-gbps,\n"
    "--trace FILE) attach the emulated network: a per-rank summary at the end.  PP runs any\n"
    "--pipeline-schedule (gpipe, 1f1b, interleaved, zb-h1, dualpipe, dualpipev) over the layout\n"
    "string's stages and prints the schedule's dry-run bubble, with a network also the bubble\n"
    "measured on the virtual clock.  --moe-dispatch hierarchical sends a token across nodes once\n"
    "per destination node, then over NVLink (bitwise the same results as flat; the EP report gives\n"
    "bytes per tier and, with a network, the emulated dispatch / combine time).  --summary writes\n"
    "the run's metrics as JSON (losses, emulated step time, bubble, exposed communication, bytes\n"
    "per tier, memory per rank, wall time; docs/matrix.md \"Run summary\").  TP splits the\n"
    "attention's heads, the vocab-parallel embedding, head and CE and the shared expert (with\n"
    "any EP and ETP; --tp-all-layers is a no-op; --sequence-parallel: the tokens between TP\n"
    "regions too, with CP, EP and ETP), ETP the routed experts' hidden units (with TP > 1: ETP 1\n"
    "or = TP, or any ETP under SP: Megatron-LM trains MoE under TP only with SP);\n"
    "docs/cli.md.  --cost-as PRESET (say v4-pro) charges the virtual clock with\n"
    "that preset's compute and message sizes while the numerics stay those of --preset (the\n"
    "same dump bitwise): the emulated step time, bubble and exposed communication predict the\n"
    "target on the network (reference unless --topology); docs/planning.md \"--cost-as\".";

/* Parses the options into c; 0 fine, 1 --help, 2 a usage error. */
static int parse_cli(int argc, char **argv, run_cli *c)
{
    memset(c, 0, sizeof *c);
    c->preset = "v4-tiny", c->precision = "f64", c->backend = NULL, c->moe_dispatch = "flat";
    c->steps = 1, c->seed = 1234;
    par_layout_args_init(&c->la);
    par_net_args_init(&c->na);
    par_opt opts[48] = {
        {"preset", PAR_OPT_STR, &c->preset, "NAME", "model preset: v4-tiny (default) or v4-mini"},
        {"data", PAR_OPT_STR, &c->data, "FILE",
         "safetensors with input.tokens, input.segments (I32 [R,S]); rows taken in order", PAR_CHK_NONEMPTY},
        {"fixture", PAR_OPT_STR, &c->fixture, "NAME", "packing fixture fixtures/NAME.json (synthetic tokens from --seed)",
         PAR_CHK_NONEMPTY},
        {"steps", PAR_OPT_INT, &c->steps, "K",
         "total training steps, as Megatron's --train-iters: with --load at step s, steps s..K-1 run (default 1)",
         PAR_CHK_POS, 1e8},
        {"seed", PAR_OPT_INT, &c->seed, "N", "seed of the init, the packing plan and the tokens (default 1234)",
         PAR_CHK_NONNEG},
        {"precision", PAR_OPT_STR, &c->precision, "f64|f32", "working precision (default f64)"},
        {"backend", PAR_OPT_STR, &c->backend, "NAME", "communication backend: self|threads|fiber|mpi (default: threads up to "
         "4 ranks per core, fiber beyond; fiber: thousands of ranks on a few threads; mpi under mpiexec)"},
        {"rank-host", PAR_OPT_STR, &c->rank_host, "threads|fiber",
         "--backend mpi: how each process hosts its ranks: one OS thread each or fibers on a few threads (default: fibers above 64 ranks per process)"},
        {"comm-timeout", PAR_OPT_DOUBLE, &c->comm_timeout, "SECONDS",
         "fail a wait that lasts longer (default: PARITY_COMM_TIMEOUT, else 3600)", PAR_CHK_POS_REAL, 1e9},
        {"dump", PAR_OPT_STR, &c->dump, "DIR", "write the unsharded golden-format set (replaced atomically)",
         PAR_CHK_NONEMPTY},
        {"save", PAR_OPT_STR, &c->save, "DIR", "write a distributed checkpoint (atomic) at the end and every --save-interval steps",
         PAR_CHK_NONEMPTY},
        {"save-interval", PAR_OPT_INT, &c->save_interval, "K", "checkpoint every K steps (counted from step 0 of training)",
         PAR_CHK_POS},
        {"load", PAR_OPT_STR, &c->load, "DIR", "resume from checkpoint DIR (any layout: resharded on load)",
         PAR_CHK_NONEMPTY},
        {"set", PAR_OPT_LIST, &c->sets, "key=value", "override a model/train key (repeatable)"},
        {"summary", PAR_OPT_STR, &c->summary, "FILE.json", "write the run's metrics as JSON (replaced atomically)",
         PAR_CHK_NONEMPTY},
        {"quiet", PAR_OPT_FLAG, &c->quiet, NULL, "no per-step progress lines"},
        {"bitwise", PAR_OPT_FLAG, &c->bitwise, NULL, PAR_BITWISE_HELP},
        {"recipe", PAR_OPT_STR, &c->recipe, "NAME", PAR_RECIPE_HELP},
        {"overwrite", PAR_OPT_FLAG, &c->overwrite, NULL, PAR_OVERWRITE_HELP " (--summary, --trace)"},
        {"moe-dispatch", PAR_OPT_STR, &c->moe_dispatch, "flat|hierarchical",
         "EP all-to-all: flat (default) or node-aware (once per destination node over IB, then NVLink)"},
        {"max-memory", PAR_OPT_STR, &c->max_memory, "SIZE", PAR_MEMLIMIT_HELP},
        {"device", PAR_OPT_STR, &c->device, "cpu|gpu", PAR_DEVICE_HELP},
        {"cost-as", PAR_OPT_STR, &c->cost_as, "PRESET",
         "charge the emulated clock with PRESET's sizes (v4-pro, ...); numerics unchanged"},
        {"cost-as-layout", PAR_OPT_STR, &c->cost_as_layout, "STR",
         "--cost-as: the target's pipeline layout (default: the even split, else the suggested uneven one)"},
    };
    int nopts = 0;
    while (nopts < (int)(sizeof opts / sizeof opts[0]) && opts[nopts].name)
        nopts++;
    nopts = par_layout_opts(opts, nopts, (int)(sizeof opts / sizeof opts[0]), &c->la);
    nopts = nopts < 0 ? -1 : par_net_opts(opts, nopts, (int)(sizeof opts / sizeof opts[0]), &c->na);
    if (nopts < 0) {
        fprintf(stderr, "parity run: internal error: option table too small\n");
        return 2;
    }
    par_positional pos;
    int rc = par_args_parse("run", synopsis, opts, nopts, argc, argv, &pos);
    if (!rc && pos.count) {
        fprintf(stderr, "parity run: unexpected argument '%s' (see 'parity run --help')\n", pos.argv[0]);
        rc = 2;
    }
    return rc;
}

/* The usage rules of the plain values; 0 fine, 2 with a message. */
static int check_cli(const run_cli *c, par_run_opts *o)
{
    char why[160] = "";
    if (c->data && c->fixture)
        snprintf(why, sizeof why, "give --data or --fixture, not both");
    else if (c->steps < 1)
        snprintf(why, sizeof why, "--steps must be >= 1 (got %lld)", (long long)c->steps);
    else if (c->seed < 0)
        snprintf(why, sizeof why, "--seed must be >= 0 (got %lld)", (long long)c->seed);
    else if (strcmp(c->precision, "f64") && strcmp(c->precision, "f32"))
        snprintf(why, sizeof why, "--precision expects f64 or f32, got '%s'", c->precision);
    else if (strcmp(c->moe_dispatch, "hierarchical") && strcmp(c->moe_dispatch, "hier") &&
             strcmp(c->moe_dispatch, "flat"))
        snprintf(why, sizeof why, "--moe-dispatch expects flat or hierarchical, got '%s'", c->moe_dispatch);
    else if (c->save_interval < 0 || (c->save_interval > 0 && !c->save))
        snprintf(why, sizeof why, "--save-interval needs --save DIR and K >= 1 (got %lld)",
                 (long long)c->save_interval);
    else if (c->la.ranks_per_process && strcmp(c->backend, "mpi"))
        snprintf(why, sizeof why, "--ranks-per-process applies to --backend mpi only (ranks per MPI "
                                  "process); the %s backend runs every rank in this process", c->backend);
    else if (c->rank_host && strcmp(c->backend, "mpi"))
        snprintf(why, sizeof why, "--rank-host applies to --backend mpi only (how an MPI process hosts its ranks)");
    else if (c->rank_host && strcmp(c->rank_host, "fiber") && strcmp(c->rank_host, "threads"))
        snprintf(why, sizeof why, "--rank-host expects fiber or threads, got '%s'", c->rank_host);
    if (why[0]) {
        fprintf(stderr, "parity run: %s\n", why);
        return 2;
    }
    /* before the first step: nothing is lost at the end */
    const par_cli_output outs[] = {{"--dump", c->dump, PAR_OUT_GOLDEN}, {"--save", c->save, PAR_OUT_CKPT},
                                   {"--trace", c->na.trace, PAR_OUT_FILE, c->overwrite},
                                   {"--summary", c->summary, PAR_OUT_FILE, c->overwrite}};
    if (par_cli_check_outputs("run", outs, 4))
        return 2;
    o->precision = strcmp(c->precision, "f32") ? 64 : 32;
    o->rank_host = !c->rank_host ? PAR_RANK_HOST_DEFAULT
                   : strcmp(c->rank_host, "fiber") ? PAR_RANK_HOST_THREADS : PAR_RANK_HOST_FIBER;
    o->moe_dispatch = strcmp(c->moe_dispatch, "flat") != 0;
    return 0;
}

/* The backend, config and layout of the run. */
static par_status build_config(const run_cli *c, par_run_opts *o)
{
    par_status s = par_backend_get(c->backend, &o->backend);
    if (!s)
        s = par_config_preset(&o->cfg, c->preset);
    for (int i = 0; !s && i < c->sets.count; i++)
        s = par_config_set_arg(&o->cfg, c->sets.items[i]);
    if (!s)
        s = par_config_validate(&o->cfg);
    if (!s && c->la.global_batch) { /* the layout's B replaces the preset's: the same ranges apply */
        par_config c2 = o->cfg;
        c2.global_batch_size = c->la.global_batch;
        s = par_config_validate(&c2);
    }
    if (!s)
        s = par_config_check_runnable(&o->cfg);
    o->cfg.bitwise = c->bitwise;
    par_recipe recipe;
    if (c->recipe && !par_recipe_parse(c->recipe, &recipe)) /* a bad name: refused by par_cmd_run first */
        o->cfg.recipe = recipe;
    par_layout *l = &o->layout;
    l->tp = c->la.tp;
    l->pp = c->la.pp;
    l->vpp = c->la.vpp;
    l->cp = c->la.cp;
    l->ep = c->la.ep;
    l->etp = c->la.etp;
    l->world = c->la.world_size;
    l->micro_batch = c->la.micro_batch;
    l->global_batch = c->la.global_batch;
    l->distributed_optimizer = c->la.distributed_optimizer;
    l->sequence_parallel = c->la.sequence_parallel;
    l->tp_all_layers = c->la.tp_all_layers; /* a deprecated no-op */
    if (!s)
        s = par_layout_set_pp_layout(l, c->la.pp_layout);
    if (!s)
        s = par_layout_set_schedule(l, c->la.pp_schedule);
    return s;
}

/* Everything of par_run_opts from the command line (net: the emulated
 * network's storage, ck: the opened --load checkpoint); 0 or an exit
 * status with its message printed. */
static int build_opts(const run_cli *c, par_run_opts *o, par_netmodel *net, par_ckpt **ck)
{
    par_run_opts_init(o);
    int rc = check_cli(c, o);
    if (rc)
        return rc;
    int net_on = 0;
    par_status s = build_config(c, o);
    if (!s)
        s = par_net_args_resolve(&c->na, net, &net_on);
    if (s) {
        fprintf(stderr, "parity run: %s\n", par_last_error());
        return 2;
    }
    if (!s && c->cost_as_layout && !c->cost_as)
        s = par_err(PAR_EINVAL, "--cost-as-layout needs --cost-as PRESET");
    if (!s && c->cost_as && !net_on && !(s = par_netmodel_preset("reference", net)))
        net_on = 1; /* --cost-as charges the clock: the reference network unless told */
    if (s) {
        fprintf(stderr, "parity run: %s\n", par_last_error());
        return 2;
    }
    o->cost_as = c->cost_as;
    o->cost_as_layout = c->cost_as_layout;
    o->netmodel = net_on ? net : NULL;
    o->net_spans = net_on; /* spans: the per-group table below, and the trace */
    o->steps = c->steps;
    o->seed = (uint64_t)c->seed;
    o->data_path = c->data;
    o->fixture = c->fixture;
    o->dump_dir = c->dump;
    o->save_dir = c->save;
    o->save_interval = c->save_interval;
    if (c->load && par_ckpt_open(c->load, ck) != PAR_OK) { /* validated before anything runs or is written */
        fprintf(stderr, "parity run: --load: %s\n", par_last_error());
        return 2;
    }
    o->load = *ck;
    o->progress = !c->quiet;
    o->timeout_s = comm_timeout_of(c->comm_timeout);
    return o->timeout_s < 0 ? 2 : 0;
}

static void print_header(const run_cli *c, const par_run_opts *o, const par_run_summary *sum)
{
    const par_layout *rl = &sum->layout;
    printf("run: preset %s, %s, backend %s, %lld steps, B=%lld S=%lld; N=%lld ranks: TP=%lld%s CP=%lld PP=%lld "
           "Da=%lld | ETP=%lld EP=%lld De=%lld; %lld parameters (largest rank holds %lld)\n",
           c->preset, c->precision, sum->backend, (long long)sum->steps, (long long)rl->global_batch,
           (long long)sum->seq_length, (long long)rl->world, (long long)rl->tp,
           rl->sequence_parallel ? "+SP" : "", (long long)rl->cp,
           (long long)rl->pp, (long long)rl->da, (long long)rl->etp, (long long)rl->ep, (long long)rl->de,
           (long long)sum->n_params, (long long)sum->max_rank_floats);
    if (c->dump)
        printf("golden-format set written: %s\n", c->dump);
    if (c->load)
        printf("resumed from %s at step %lld\n", c->load, (long long)sum->start_step);
    if (c->save)
        printf("checkpoint written: %s (%lld saves, last at step %lld)\n", c->save, (long long)sum->saves,
               (long long)(sum->start_step + sum->steps));
}

static void print_steps(const par_run_summary *sum)
{
    printf("%-5s %-20s %-20s %-20s %-14s %-14s %s\n", "step", "loss", "loss_main", "loss_mtp", "loss_aux",
           "grad_norm", "wall_s");
    for (int64_t k = 0; k < sum->steps; k++) {
        const par_run_step_info *si = &sum->step[k];
        printf("%-5lld %-20.14g %-20.14g %-20.14g %-14.8g %-14.8g %.3f\n", (long long)(sum->start_step + k), si->loss, si->loss_main,
               si->loss_mtp, si->loss_aux, si->grad_norm, si->wall_s);
    }
    printf("tokens per expert (all blocks, all steps): min %lld  mean %.1f  max %lld; hottest: block %d expert "
           "%lld with %lld\n",
           (long long)sum->load_min, sum->load_mean, (long long)sum->load_max, sum->load_hot_block,
           (long long)sum->load_hot_expert, (long long)sum->load_hot_tokens);
    static const char *const hl[PAR_RUN_HIST] = {"<0.25", "<0.5", "<0.75", "<1", "<1.25", "<1.5", "<2", ">=2"};
    printf("  histogram of load/mean over (block, expert):");
    for (int i = 0; i < PAR_RUN_HIST; i++)
        printf("  %s: %lld", hl[i], (long long)sum->hist[i]);
    printf("\n");
}

static void print_expert(const par_run_summary *sum)
{
    const par_layout *rl = &sum->layout;
    char db[32], cb[32];
    human_bytes(db, sizeof db, (double)sum->dispatch_bytes);
    human_bytes(cb, sizeof cb, (double)sum->combine_bytes);
    printf("expert parallel: rows received per rank min %lld  mean %.1f  max %lld; all-to-all bytes "
           "(to other ranks, all ranks, fwd+bwd): dispatch %s, combine %s; %lld all-to-all calls per rank\n",
           (long long)sum->recv_min, sum->recv_mean, (long long)sum->recv_max, db, cb, (long long)sum->a2a_calls);
    if (sum->ep_recv && rl->world <= 16) {
        printf("  rows received per rank:");
        for (int64_t r = 0; r < rl->world; r++)
            printf(" r%lld %lld", (long long)r, (long long)sum->ep_recv[r]);
        printf("\n");
    }
    char b[4][32];
    for (int k = 0; k < 4; k++)
        human_bytes(b[k], sizeof b[k], (double)sum->ep_bytes[k / 2][k % 2]);
    printf("  %s dispatch, nodes of %d ranks: all-to-all bytes by tier (all ranks, fwd+bwd): dispatch nvlink %s "
           "ib %s; combine nvlink %s ib %s\n",
           sum->moe_dispatch ? "hierarchical" : "flat", sum->ep_gpn, b[0], b[1], b[2], b[3]);
    if (sum->net)
        printf("  emulated time per rank (virtual clock, fwd+bwd, all steps): dispatch mean %.6g ms max %.6g ms; "
               "combine mean %.6g ms max %.6g ms\n",
               1e3 * sum->ep_time_mean[0], 1e3 * sum->ep_time_max[0], 1e3 * sum->ep_time_mean[1],
               1e3 * sum->ep_time_max[1]);
}

static void print_cp_pp(const par_run_summary *sum)
{
    const par_layout *rl = &sum->layout;
    if (rl->cp > 1) {
        char hb[32], gb[32], rb[32];
        human_bytes(hb, sizeof hb, (double)sum->cp_halo_bytes);
        human_bytes(gb, sizeof gb, (double)sum->cp_gather_bytes);
        human_bytes(rb, sizeof rb, (double)sum->cp_rs_bytes);
        printf("context parallel: attention bytes handed to comm (all ranks, all steps): halo exchange %s (fwd "
               "rows + bwd gradients), entry all-gathers %s, entry-gradient reduce-scatters %s\n",
               hb, gb, rb);
    }
    if (rl->pp > 1) {
        printf("pipeline: schedule %s, %d microbatches, %lld stages (VPP %lld); dry-run bubble %.1f %% (F=1 B=2 W=1)",
               sum->pp_schedule, sum->pp_micro, (long long)rl->pipe.n_segments, (long long)rl->vpp,
               100.0 * sum->pp_dry_bubble);
        if (sum->pp_net_bubble >= 0)
            printf("; emulated bubble %.1f %% of %.6g s (rank 0's pipeline, virtual clock, all steps)",
                   100.0 * sum->pp_net_bubble, sum->pp_net_makespan_s);
        printf("\n");
        if (sum->pp_net_bubble >= 0 && sum->pp_dry_bubble_measured >= 0)
            printf("pipeline: executor bubble %.4f %% (virtual clock) vs dry-run bubble %.4f %% with the executor's "
                   "own costs (mean F %.3g s, B or BW %.3g s, W %.3g s per stage, message %.3g s): "
                   "difference %.2g points\n",
                   100.0 * sum->pp_net_bubble, 100.0 * sum->pp_dry_bubble_measured, sum->pp_cost_f_s,
                   sum->pp_cost_b_s, sum->pp_cost_w_s, sum->pp_latency_s,
                   100.0 * (sum->pp_net_bubble - sum->pp_dry_bubble_measured));
    }
}

/* --cost-as: the target's predicted figures (rank maxima per step). */
static void print_cost_as(const par_run_summary *sum)
{
    if (!sum->cost_as[0] || !sum->net)
        return;
    double tmax = 0, cmax = 0, steps = sum->steps > 0 ? (double)sum->steps : 1;
    for (int r = 0; r < par_netrun_nranks(sum->net); r++) {
        const par_rankstats *st = par_netrun_stats(sum->net, r);
        tmax = st && st->total_s > tmax ? st->total_s : tmax;
        cmax = st && st->comm_s > cmax ? st->comm_s : cmax;
    }
    printf("cost-as %s (pipeline layout %s, %.0f tokens per microbatch; network %s): predicted step time %.4g s, ",
           sum->cost_as, sum->cost_as_layout[0] ? sum->cost_as_layout : "even", sum->cost_as_tokens,
           par_netrun_model(sum->net)->name, tmax / steps);
    if (sum->layout.pp > 1 && sum->pp_net_bubble >= 0)
        printf("bubble %.2f %%, ", 100.0 * sum->pp_net_bubble);
    printf("exposed communication %.4g s per step (largest rank)\n", cmax / steps);
    if (sum->layout.ep > 1)
        printf("  EP dispatch + combine bytes sent per step (all ranks): nvlink %.4g GB, ib %.4g GB; receive skew "
               "(max / mean rows) %.3f\n",
               (double)(sum->ep_bytes[0][0] + sum->ep_bytes[1][0]) / steps / 1e9,
               (double)(sum->ep_bytes[0][1] + sum->ep_bytes[1][1]) / steps / 1e9,
               sum->recv_mean > 0 ? (double)sum->recv_max / sum->recv_mean : 0.0);
}

/* The emulated network's tables (and the Chrome trace); 0 or exit 1. */
static int print_net(const run_cli *c, const par_run_summary *sum)
{
    if (!sum->net)
        return 0;
    printf("emulated network (%s):\n", c->na.topology ? c->na.topology : "reference");
    par_trace_summary(sum->net, stdout, 64);
    par_net_group_summary(sum->net, stdout);
    if (c->na.trace) {
        if (par_trace_write_chrome(sum->net, c->na.trace)) {
            fprintf(stderr, "parity run: %s\n", par_last_error());
            return 2;
        }
        printf("Chrome trace written: %s\n", c->na.trace);
    }
    return 0;
}

/* --summary: the run's metrics as JSON, written by the process that ran
 * world rank 0 (under MPI each process returns from the run). */
static int write_summary(const run_cli *c, const par_run_opts *o, const par_run_summary *sum)
{
    if (!c->summary || !sum->hosts_rank0)
        return 0;
    cJSON *doc = par_run_summary_json(sum, c->preset, o->precision);
    par_status s = doc ? par_json_write_file(c->summary, doc) : par_err(PAR_ENOMEM, "summary: out of memory");
    cJSON_Delete(doc);
    if (s) {
        fprintf(stderr, "parity run: --summary: %s\n", par_last_error());
        return 1;
    }
    return 0;
}

/* The process's high-water per tag, all its ranks together (core/alloc.h:
 * each tag's own peak, not one moment's sum): what the per-rank table above
 * cannot show when ranks hold their working buffers at the same time. */
static void print_process_peaks(void)
{
    printf("process peaks by tag (all ranks of this process, each tag's own high-water):");
    for (int t = 0; t < PAR_TAG_COUNT; t++)
        if (par_alloc_peak((par_tag)t) > 0)
            printf(" %s %.1f MiB", par_tag_name((par_tag)t), (double)par_alloc_peak((par_tag)t) / (1024.0 * 1024.0));
    printf("\n");
}

/* No --backend: the rule of cli/autobackend.h on the world the layout
 * flags give (--world-size, else the smallest that folds), said on stdout. */
static void default_backend(run_cli *c)
{
    if (c->backend)
        return;
    const par_layout_args *l = &c->la;
    int64_t world = l->world_size > 0 ? l->world_size : par_layout_default_world(l->tp, l->pp, l->cp, l->ep, l->etp);
    char why[240];
    c->backend = par_autobackend_pick(world, par_autobackend_cores(), why, sizeof why);
    printf("backend %s (%s)\n", c->backend, why);
    fflush(stdout);
}

int par_cmd_run(int argc, char **argv)
{
    run_cli c;
    int rc = parse_cli(argc, argv, &c);
    if (rc)
        return rc == 1 ? 0 : 2;
    default_backend(&c);
    par_run_opts o;
    par_netmodel netm;
    par_ckpt *ck = NULL;
    if (par_cli_bitwise_device("run", c.bitwise, c.device) || par_cli_device("run", c.device))
        return 2;
    par_config rcfg; /* --recipe checked before anything runs; applied in build_opts */
    if (par_cli_recipe("run", c.recipe ? c.recipe : "none", c.device, &rcfg))
        return 2;
    par_err_set_quiet(1);
    if (!(rc = build_opts(&c, &o, &netm, &ck)) && !(rc = par_cli_recipe_layout("run", &o.cfg, o.layout.tp, o.layout.etp)))
        rc = par_memlimit_run("run", c.max_memory, &o.cfg, &o.layout, o.precision, c.steps,
                              strcmp(c.backend, "mpi") ? 0 : (c.la.ranks_per_process ? c.la.ranks_per_process : 1));
    if (rc) {
        par_ckpt_close(ck);
        par_err_set_quiet(0);
        return rc;
    }
    /* MPI: the processes compare their whole configuration before they start */
    char *fp = strcmp(c.backend, "mpi") ? NULL : par_run_fingerprint(&o, c.moe_dispatch, &c.na);
    o.fingerprint = fp;
    par_alloc_reset_peaks();
    par_run_summary sum;
    par_status s = par_run(&o, &sum);
    par_ckpt_close(ck);
    free(fp);
    if (s) {
        fprintf(stderr, "parity run: %s\n", par_last_error());
        par_err_set_quiet(0);
        return exit_code(s);
    }
    if (!sum.hosts_rank0) { /* under MPI the process hosting rank 0 prints the results */
        par_run_summary_free(&sum);
        par_err_set_quiet(0);
        return 0;
    }
    if (sum.steps == 0) { /* Megatron's --train-iters: the checkpoint is at or past --steps */
        printf("run: %s is at step %lld and --steps %lld is the total step count (Megatron's --train-iters): "
               "nothing to do, nothing written\n",
               c.load, (long long)sum.start_step, (long long)c.steps);
        par_run_summary_free(&sum);
        par_err_set_quiet(0);
        return 0;
    }
    print_header(&c, &o, &sum);
    print_steps(&sum);
    if (sum.layout.ep > 1)
        print_expert(&sum);
    print_memory(&sum);
    print_cp_pp(&sum);
    rc = print_net(&c, &sum); /* still quiet: a write error's message once */
    print_cost_as(&sum);
    if (!rc)
        rc = write_summary(&c, &o, &sum);
    par_err_set_quiet(0);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("wall time %.3f s (launch and dump included); peak RSS %.1f MiB\n", sum.wall_s,
           (double)ru.ru_maxrss / 1024.0);
    print_process_peaks();
    par_cli_device_report(stdout);
    par_run_summary_free(&sum);
    return rc;
}
