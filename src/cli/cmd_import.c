/* parity import hf DIR OUT.safetensors [--precision f64|f32]
 * A Hugging Face-style DeepSeek-V4 checkpoint back into a parity parameter
 * file (docs/gpu-rollout.md).  Exit: 0 written, 2 bad usage or an
 * unreadable/mismatched checkpoint, 1 an internal failure. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "model/hfckpt.h"

/* An existing OUT is replaced only when a parity import wrote it. */
static int out_is_ours(const char *out)
{
    if (!par_path_exists(out))
        return 1;
    par_st_file *f = NULL;
    int ok = !par_path_is_dir(out) && par_st_read(out, &f) == PAR_OK;
    const char *g = ok ? par_st_meta(f, "generator") : NULL;
    ok = ok && g && !strcmp(g, PAR_HF_IMPORT_GENERATOR);
    par_st_close(f);
    par_clear_error();
    return ok;
}

static int cmd_hf(int argc, char **argv)
{
    const char *precision = "f64";
    const par_opt opts[] = {
        {"precision", PAR_OPT_STR, &precision, "f64|f32", "float precision of the output (default f64)"},
    };
    const char *synopsis =
        "DIR OUT.safetensors [--precision f64|f32]\n\n"
        "Reads a Hugging Face-style DeepSeek-V4 checkpoint (config.json with the release's keys, the\n"
        "index and its shards, or one model.safetensors) and writes every parameter of its config under\n"
        "parity's names into OUT (atomic), with the optimizer state of parity_optimizer.safetensors when\n"
        "DIR has one.  Names go through the release's convert.py renames; a quantized checkpoint (.scale\n"
        "tensors) is refused.  `parity compare SET/params.K.safetensors OUT` then judges it.";
    par_positional pos;
    int rc = par_args_parse("import hf", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &pos);
    if (rc)
        return rc == 1 ? 0 : 2;
    if (pos.count != 2) {
        fprintf(stderr, "parity import hf: expected DIR OUT.safetensors, got %d paths (see --help)\n", pos.count);
        return 2;
    }
    int bits = !strcmp(precision, "f64") ? 64 : !strcmp(precision, "f32") ? 32 : 0;
    if (!bits) {
        fprintf(stderr, "parity import hf: --precision expects f64 or f32, got '%s'\n", precision);
        return 2;
    }
    if (!par_path_is_dir(pos.argv[0])) {
        fprintf(stderr, "parity import hf: '%s' is not a directory\n", pos.argv[0]);
        return 2;
    }
    par_err_set_quiet(1);
    if (!out_is_ours(pos.argv[1])) {
        par_err_set_quiet(0);
        fprintf(stderr, "parity import hf: '%s' exists and is not a file parity import wrote; parity replaces "
                        "only what it wrote: remove it or choose another OUT\n", pos.argv[1]);
        return 2;
    }
    par_hf_import_info info;
    par_status s = par_hf_import(pos.argv[0], bits, pos.argv[1], &info);
    if (s) {
        fprintf(stderr, "parity import hf: %s\n", par_last_error());
        par_err_set_quiet(0);
        return (s == PAR_ENOMEM || s == PAR_EINTERNAL) ? 1 : 2;
    }
    par_err_set_quiet(0);
    printf("imported %s -> %s: %d parameters%s, %s (%d dequantized from FP8/FP4 storage, %d shared tensors "
           "skipped)\n", pos.argv[0], pos.argv[1], info.n_tensors, info.n_opt ? " and optimizer state" : "", precision,
           info.n_quantized, info.n_skipped);
    return 0;
}

int par_cmd_import(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "hf"))
        return cmd_hf(argc - 1, argv + 1);
    FILE *f = (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) ? stdout : stderr;
    if (argc >= 2 && f == stderr)
        fprintf(stderr, "parity import: unknown format '%s' (hf)\n", argv[1]);
    fprintf(f, "usage: parity import hf DIR OUT.safetensors [--precision f64|f32]\n"
               "  hf  a Hugging Face-style DeepSeek-V4 checkpoint back into a parity parameter file\n");
    return f == stdout ? 0 : 2;
}
