/* parity - proves parallel layouts of the DeepSeek-V4 training step equal to
 * the serial reference.  This file only dispatches to subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/outdir.h"
#include "core/status.h"
#include "kernels/gemm_path.h"
#include "parity_config.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"golden", par_cmd_golden, "run the serial reference and write a golden set"},
    {"run", par_cmd_run, "run training steps under a parallel layout (optionally --dump a golden set)"},
    {"compare", par_cmd_compare, "compare two golden sets or safetensors files (GOLDEN.md policy)"},
    {"bounds", par_cmd_bounds, "derive per-tensor tolerances of a recipe golden (compare --policy derived)"},
    {"matrix", par_cmd_matrix, "run the conformance matrix against the serial golden"},
    {"ckpt", par_cmd_ckpt, "reshard, export and diff distributed checkpoints"},
    {"plan", par_cmd_plan, "check a layout and print its sizes, stages and groups"},
    {"schedule", par_cmd_schedule, "dry-run a pipeline schedule: bubbles, deadlocks, timeline"},
    {"topo", par_cmd_topo, "print the host topology and the rank-to-core binding"},
    {"export", par_cmd_export, "write a golden set as an HF checkpoint or a framework's packed batches"},
    {"import", par_cmd_import, "read an HF checkpoint back into a parity parameter file"},
    {NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: parity [--log LEVEL] <command> [options]\n\ncommands:\n");
    for (size_t i = 0; commands[i].name; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'parity <command> --help' describes a command.  "
               "'parity --version' prints the version and build features.\n");
}

int main(int argc, char **argv)
{
    par_tmp_install_signal_cleanup(); /* SIGINT/SIGTERM/SIGHUP remove live temporaries */
    par_alloc_process_init();         /* big blocks mapped on their own (core/alloc.h) */
    int i = 1;
    while (i < argc && !strncmp(argv[i], "--", 2)) {
        if (!strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("parity %s (mpi: %s)\n", PARITY_VERSION, HAVE_MPI ? "yes" : "no");
            return 0;
        }
        if (!strcmp(argv[i], "--log") || !strncmp(argv[i], "--log=", 6)) {
            const char *v = argv[i][5] == '=' ? argv[i] + 6 : (i + 1 < argc ? argv[++i] : NULL);
            par_log_level lv;
            if (!v) {
                fprintf(stderr, "parity: --log needs a value (error|warn|info|debug|trace)\n");
                return 2;
            }
            if (par_log_parse_level(v, &lv) != 0) {
                fprintf(stderr, "parity: --log expects error|warn|info|debug|trace, got '%s'\n", v);
                return 2;
            }
            par_log_set_level(lv);
            i++;
            continue;
        }
        fprintf(stderr, "parity: unknown option '%s' before the command\n", argv[i]);
        usage(stderr);
        return 2;
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    /* a forced GEMM path the CPU cannot run: refused before any work */
    par_err_set_quiet(1);
    par_status gp = par_gemm_path_check();
    par_err_set_quiet(0);
    if (gp != PAR_OK) {
        fprintf(stderr, "parity: %s\n", par_last_error());
        return 2;
    }
    for (size_t c = 0; commands[c].name; c++)
        if (!strcmp(argv[i], commands[c].name))
            return commands[c].fn(argc - i, argv + i);
    fprintf(stderr, "parity: unknown command '%s'\n", argv[i]);
    usage(stderr);
    return 2;
}
