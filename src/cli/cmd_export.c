/* parity export hf SET|PARAMS.safetensors OUT [--dtype bf16|fp32|fp64] [--step K] ...
 * parity export batch SET OUT | parity export batch [--fixture NAME] [--preset P] ... OUT
 * Golden sets in the forms a GPU team loads (docs/gpu-rollout.md).
 * Exit: 0 written, 2 bad usage or unreadable/mismatched input (as parity golden,
 * I/O faults included), 1 an internal failure (out of memory, an invariant). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/manifest.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "core/status.h"
#include "model/batchexport.h"
#include "model/config.h"
#include "model/hfckpt.h"

static int fail(const char *sub, par_status s)
{
    fprintf(stderr, "parity export %s: %s\n", sub, par_last_error());
    par_err_set_quiet(0);
    return (s == PAR_ENOMEM || s == PAR_EINTERNAL) ? 1 : 2;
}

/* An existing OUT is replaced only when parity wrote it: a directory whose
 * `marker` JSON file has "format" `format` at `path` (dotted: "parity.format"). */
static int out_is_ours(const char *out, const char *marker, const char *outer, const char *format)
{
    if (!par_path_exists(out))
        return 1;
    char *p = par_path_join(out, marker);
    cJSON *j = NULL;
    int ok = p && par_path_is_dir(out) && par_json_read_file(p, &j) == PAR_OK;
    const cJSON *o = ok && outer ? par_json_obj(j, outer) : j;
    const char *f = o ? par_json_str(o, "format") : NULL;
    ok = ok && f && !strcmp(f, format);
    cJSON_Delete(j);
    par_free(p);
    par_clear_error();
    return ok;
}

static int refuse_out(const char *sub, const char *out, const char *what)
{
    fprintf(stderr,
            "parity export %s: '%s' exists and is not %s; parity replaces only what it wrote: remove it or "
            "choose another OUT\n",
            sub, out, what);
    return 2;
}

static void dir_of(const char *file, char *dir, size_t n)
{
    const char *slash = strrchr(file, '/');
    if (!slash)
        snprintf(dir, n, ".");
    else
        snprintf(dir, n, "%.*s", (int)(slash == file ? 1 : slash - file), file);
}

/* A golden set's model config (manifest "model" + "train"). */
static par_status config_of_set(const char *dir, par_config *cfg)
{
    par_manifest m;
    par_status s = par_manifest_read(dir, &m);
    if (s)
        return s;
    s = par_config_preset(cfg, "v4-tiny");
    if (!s)
        s = par_config_from_json(cfg, m.model);
    if (!s)
        s = par_config_from_json(cfg, m.train);
    par_manifest_free(&m);
    return s;
}

/* The model config of a bare parameter file: --config / --preset + --set, or
 * the golden set it lies in. */
static par_status config_for_file(const char *file, const char *config, const char *preset,
                                  const par_strlist *sets, par_config *cfg)
{
    par_status s;
    if (config || preset) {
        s = par_config_preset(cfg, preset ? preset : "v4-tiny");
        if (!s && config)
            s = par_config_load_file(cfg, config);
    } else {
        char dir[4096];
        dir_of(file, dir, sizeof dir);
        s = config_of_set(dir, cfg);
        if (s) {
            char why[512];
            snprintf(why, sizeof why, "%s", par_last_error());
            return par_err(PAR_EINVAL, "%s: no model config: give --preset (and --set) or --config FILE, or "
                           "keep the file in its golden set (%s)", file, why);
        }
    }
    for (int i = 0; !s && i < sets->count; i++)
        s = par_config_set_arg(cfg, sets->items[i]);
    if (!s)
        s = par_config_validate(cfg);
    return s;
}

/* "5000000", "500MB", "4GiB", ... -> bytes (> 0). */
static int parse_size(const char *v, int64_t *out)
{
    char *end;
    double x = strtod(v, &end);
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"KiB", 1024.0},
                 {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
    for (size_t i = 0; end != v && x > 0 && i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].suffix) && x * units[i].mult < 9.0e18) {
            *out = (int64_t)(x * units[i].mult);
            return *out > 0;
        }
    return 0;
}

/* Opens the parameters to export: SET/params.K.safetensors or the file. */
static par_status open_params(const char *src, int64_t step, const char *config, const char *preset,
                              const par_strlist *sets, par_config *cfg, par_st_file **f, cJSON *prov)
{
    char path[4096];
    par_status s;
    if (par_path_is_dir(src)) {
        if (config || preset || sets->count)
            return par_err(PAR_EINVAL, "%s is a golden set: its manifest gives the config (--config, --preset "
                           "and --set are for a bare parameter file)", src);
        if ((s = config_of_set(src, cfg)))
            return s;
        snprintf(path, sizeof path, "%s/params.%lld.safetensors", src, (long long)step);
        cJSON_AddStringToObject(prov, "kind", "golden-set");
        cJSON_AddNumberToObject(prov, "step", (double)step);
    } else {
        if (step)
            return par_err(PAR_EINVAL, "--step selects params.K of a golden set; %s is a file", src);
        if ((s = config_for_file(src, config, preset, sets, cfg)))
            return s;
        snprintf(path, sizeof path, "%s", src);
        cJSON_AddStringToObject(prov, "kind", "file");
    }
    char hex[PAR_SHA256_HEX];
    if ((s = par_sha256_file(path, hex)) || (s = par_st_read(path, f)))
        return s;
    cJSON_AddStringToObject(prov, "path", path);
    cJSON_AddStringToObject(prov, "sha256", hex);
    return PAR_OK;
}

static int cmd_hf(int argc, char **argv)
{
    const char *dtype_s = "fp64", *config = NULL, *preset = NULL, *shard_s = "4GiB", *scales_from = NULL;
    int64_t step = 0;
    int quantize = 0;
    par_strlist sets;
    memset(&sets, 0, sizeof sets);
    const par_opt opts[] = {
        {"dtype", PAR_OPT_STR, &dtype_s, "bf16|fp32|fp64",
         "float dtype (default fp64, bitwise; bf16 keeps the release's float32 tensors in F32)"},
        {"quantize", PAR_OPT_FLAG, &quantize, NULL,
         "the release's storage: FP8 weights (E4M3, 128x128 UE8M0 .scale) and FP4 routed experts (packed E2M1, "
         "1x32 UE8M0 .scale); --dtype applies to the rest"},
        {"scales-from", PAR_OPT_STR, &scales_from, "DIR",
         "with --quantize: reuse the .scale tensors of checkpoint DIR where they represent a tile exactly "
         "(DIR -> import -> export gives DIR's storage back bit for bit)"},
        {"step", PAR_OPT_INT, &step, "K", "a golden set's params.K (default 0: before the first update)"},
        {"max-shard-size", PAR_OPT_STR, &shard_s, "SIZE", "close a shard before it passes SIZE (default 4GiB)"},
        {"preset", PAR_OPT_STR, &preset, "NAME", "bare file: the model preset"},
        {"config", PAR_OPT_STR, &config, "FILE", "bare file: a JSON model config"},
        {"set", PAR_OPT_LIST, &sets, "key=value", "bare file: override a model key (repeatable)"},
    };
    const char *synopsis =
        "SET|PARAMS.safetensors OUT [--dtype bf16|fp32|fp64] [--quantize [--scales-from DIR]] [--step K] [--max-shard-size SIZE]\n"
        "       [--preset NAME | --config FILE] [--set key=value]...\n\n"
        "Writes a Hugging Face-style DeepSeek-V4 checkpoint directory OUT: config.json with the release's\n"
        "key names, model.safetensors.index.json and model-0000i-of-0000N.safetensors shards with the\n"
        "release's tensor names (docs/gpu-rollout.md), plus parity_optimizer.safetensors when the source\n"
        "holds optimizer state.  A bare file takes its config from the golden set it lies in, unless\n"
        "--preset/--config is given.";
    par_positional pos;
    int rc = par_args_parse("export hf", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &pos);
    if (rc)
        return rc == 1 ? 0 : 2;
    par_hf_export_opts o = {.quantize = quantize, .scales_from = scales_from};
    if (scales_from && !quantize) {
        fprintf(stderr, "parity export hf: --scales-from needs --quantize\n");
        return 2;
    }
    if (pos.count != 2) {
        fprintf(stderr, "parity export hf: expected SET|PARAMS.safetensors OUT, got %d paths (see --help)\n",
                pos.count);
        return 2;
    }
    if (step < 0 || !parse_size(shard_s, &o.max_shard_bytes)) {
        fprintf(stderr, "parity export hf: %s\n", step < 0 ? "--step must be >= 0"
                : "--max-shard-size expects a size such as 500MB or 4GiB");
        return 2;
    }
    par_err_set_quiet(1);
    if (par_hf_dtype_parse(dtype_s, &o.dtype))
        return fail("hf", PAR_EINVAL);
    if (!out_is_ours(pos.argv[1], PAR_HF_CONFIG_NAME, "parity", "parity-hf-export")) {
        par_err_set_quiet(0);
        return refuse_out("hf", pos.argv[1], "a parity HF export");
    }
    par_config cfg;
    par_st_file *f = NULL;
    o.source = cJSON_CreateObject();
    par_status s = open_params(pos.argv[0], step, config, preset, &sets, &cfg, &f, o.source);
    par_hf_export_info info;
    if (!s)
        s = par_hf_export(&cfg, f, par_st_label(f), pos.argv[1], &o, &info);
    else
        cJSON_Delete(o.source);
    par_st_close(f);
    if (s)
        return fail("hf", s);
    par_err_set_quiet(0);
    printf("exported %s -> %s: %d tensors in %d shard%s (%lld bytes, %s%s)%s\n", pos.argv[0], pos.argv[1],
           info.n_tensors, info.n_shards, info.n_shards == 1 ? "" : "s", (long long)info.total_bytes,
           par_hf_torch_dtype(o.dtype), info.n_quantized ? ", FP8/FP4 weights quantized with a .scale each" : "",
           info.n_opt ? ", optimizer state in " PAR_HF_OPTIM_NAME : "");
    if (scales_from)
        printf("scales from %s: %lld tile%s not represented exactly by them, rescaled\n", scales_from,
               (long long)info.n_rescaled, info.n_rescaled == 1 ? "" : "s");
    return 0;
}

/* The generator's config: preset, --set, --global-batch-size. */
static par_status batch_config(const char *preset, const par_strlist *sets, int64_t gbs, par_config *cfg)
{
    par_status s = par_config_preset(cfg, preset);
    for (int i = 0; !s && i < sets->count; i++)
        s = par_config_set_arg(cfg, sets->items[i]);
    if (!s && gbs)
        s = gbs > 0 ? (cfg->global_batch_size = gbs, PAR_OK)
                    : par_err(PAR_EINVAL, "--global-batch-size must be >= 1 (got %lld)", (long long)gbs);
    if (!s)
        s = par_config_validate(cfg);
    return s;
}

static int cmd_batch(int argc, char **argv)
{
    const char *fixture = NULL, *preset = NULL;
    int64_t steps = 0, seed = -1, gbs = 0;
    par_strlist sets;
    memset(&sets, 0, sizeof sets);
    const par_opt opts[] = {
        {"fixture", PAR_OPT_STR, &fixture, "NAME", "packing fixture fixtures/NAME.json (as parity golden)"},
        {"preset", PAR_OPT_STR, &preset, "NAME", "model preset of the generator (default v4-tiny)"},
        {"steps", PAR_OPT_INT, &steps, "K", "steps to generate (default 1)"},
        {"seed", PAR_OPT_INT, &seed, "N", "seed of the packing plan and tokens (default 1234)"},
        {"global-batch-size", PAR_OPT_INT, &gbs, "B", "rows per step (default: the preset's)"},
        {"set", PAR_OPT_LIST, &sets, "key=value", "override a model key (repeatable)"},
    };
    const char *synopsis =
        "SET OUT | [--fixture NAME] [--preset NAME] [--steps K] [--seed N] [--global-batch-size B] OUT\n\n"
        "Writes each step's packed batch in the form a training framework takes: tokens, cu_seqlens per\n"
        "row (packed THD), position ids, labels and loss masks of the main and MTP losses (MODEL.md 1),\n"
        "as OUT/batch.K.safetensors and OUT/npy/K/<field>.npy, described by OUT/batch.json.  From a\n"
        "golden set SET (its step.K inputs), or generated exactly as `parity golden` generates them.";
    par_positional pos;
    int rc = par_args_parse("export batch", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &pos);
    if (rc)
        return rc == 1 ? 0 : 2;
    int from_set = pos.count == 2;
    if (pos.count < 1 || pos.count > 2 || (from_set && (fixture || preset || steps || seed >= 0 || gbs || sets.count))) {
        fprintf(stderr, "parity export batch: expected SET OUT, or generator options and OUT (see --help)\n");
        return 2;
    }
    if (!from_set && (steps < 0 || seed < -1)) {
        fprintf(stderr, "parity export batch: --steps and --seed must be >= 0\n");
        return 2;
    }
    const char *out = pos.argv[pos.count - 1];
    par_err_set_quiet(1);
    if (!out_is_ours(out, PAR_BATCH_JSON, NULL, PAR_BATCH_FORMAT)) {
        par_err_set_quiet(0);
        return refuse_out("batch", out, "a parity batch export");
    }
    par_batch_export_opts o;
    memset(&o, 0, sizeof o);
    par_status s = PAR_OK;
    if (from_set) {
        o.set_dir = pos.argv[0];
    } else {
        o.fixture = fixture;
        o.steps = steps ? steps : 1;
        o.seed = (uint64_t)(seed >= 0 ? seed : 1234);
        s = batch_config(preset ? preset : "v4-tiny", &sets, gbs, &o.cfg);
    }
    par_batch_export_info info;
    if (!s)
        s = par_batch_export(&o, out, &info);
    if (s)
        return fail("batch", s);
    par_err_set_quiet(0);
    printf("exported %lld step%s of B=%lld x S=%lld -> %s (steps %lld..%lld; fields in %s/%s)\n",
           (long long)info.steps, info.steps == 1 ? "" : "s", (long long)info.B, (long long)info.S, out,
           (long long)info.first_step, (long long)(info.first_step + info.steps - 1), out, PAR_BATCH_JSON);
    return 0;
}

static int usage(FILE *f)
{
    fprintf(f, "usage: parity export hf SET|PARAMS.safetensors OUT [options]\n"
               "       parity export batch SET OUT | parity export batch [generator options] OUT\n\n"
               "  hf     a Hugging Face-style DeepSeek-V4 checkpoint (config.json, index, shards)\n"
               "  batch  the packed batches as tokens, cu_seqlens, position ids, labels, loss masks\n"
               "Each has --help.  docs/gpu-rollout.md walks through a GPU team's use of both.\n");
    return f == stdout ? 0 : 2;
}

int par_cmd_export(int argc, char **argv)
{
    if (argc < 2)
        return usage(stderr);
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
        return usage(stdout);
    if (!strcmp(argv[1], "hf"))
        return cmd_hf(argc - 1, argv + 1);
    if (!strcmp(argv[1], "batch"))
        return cmd_batch(argc - 1, argv + 1);
    fprintf(stderr, "parity export: unknown format '%s' (hf or batch)\n", argv[1]);
    return usage(stderr);
}
