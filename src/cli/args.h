/* cli/args.h - one option parser for every subcommand.
 *
 * Long options only, Megatron-LM style: `--name value` or `--name=value`.
 * A command declares a table of par_opt; parse fills the destinations and
 * collects positional arguments.  Errors print one line naming the option
 * and what was wrong, and make the command exit 2.  An option given twice
 * is an error (but PAR_OPT_LIST, which repeats), reals must be finite, and
 * an option's `check` range is applied to a value the user gave (so a
 * default such as 0 = "not given" stays possible).  `--log LEVEL` is
 * accepted by every command (as before the command).
 */
#ifndef PAR_CLI_ARGS_H
#define PAR_CLI_ARGS_H

#include <stdint.h>

typedef enum {
    PAR_OPT_FLAG,   /* no value; sets int dest to 1                   */
    PAR_OPT_INT,    /* int64_t dest                                   */
    PAR_OPT_DOUBLE, /* double dest                                    */
    PAR_OPT_STR,    /* const char * dest (points into argv)           */
    PAR_OPT_LIST,   /* repeatable string: par_strlist dest            */
} par_arg_kind;

typedef struct {
    const char *items[64];
    int count;
} par_strlist;

/* Range a given value must be in (`check` of par_opt). */
typedef enum {
    PAR_CHK_NONE = 0,
    PAR_CHK_POS,      /* INT >= 1                          */
    PAR_CHK_NONNEG,   /* INT >= 0                          */
    PAR_CHK_POS_REAL, /* DOUBLE > 0                        */
    PAR_CHK_NONNEG_REAL, /* DOUBLE >= 0                    */
    PAR_CHK_NONEMPTY, /* STR not ""                        */
} par_arg_check;

typedef struct {
    const char *name;  /* without the leading "--" */
    par_arg_kind kind;
    void *dest;
    const char *metavar;
    const char *help;
    par_arg_check check; /* optional (0: none)                        */
    double hi;           /* optional upper bound of INT/DOUBLE (0: none) */
} par_opt;

typedef struct {
    const char *argv[16];
    int count;
} par_positional;

/* Returns 0 ok, 1 when --help was given (usage printed to stdout), 2 on a
 * usage error (message printed to stderr). */
int par_args_parse(const char *cmd, const char *synopsis, const par_opt *opts, int nopts, int argc,
                   char **argv, par_positional *pos);
void par_args_usage(const char *cmd, const char *synopsis, const par_opt *opts, int nopts);

/* Parallel layout flags shared by run/matrix/ckpt/plan (Megatron-LM names). */
typedef struct {
    int64_t tp, pp, vpp, cp, ep, etp;
    int64_t micro_batch, global_batch;
    int64_t world_size, ranks_per_process;
    int distributed_optimizer;
    int sequence_parallel, tp_all_layers;
    const char *pp_layout;
    const char *pp_schedule;
} par_layout_args;

void par_layout_args_init(par_layout_args *l);
/* Appends the layout options to `opts` (capacity checked); returns the new
 * count or -1. */
int par_layout_opts(par_opt *opts, int n, int cap, par_layout_args *l);

/* An output path of a command (NULL path: not given). */
typedef struct {
    const char *flag;  /* "--dump", "--save", "--trace", ...      */
    const char *path;
    int kind;          /* par_out_kind (core/outdir.h)             */
    int overwrite;     /* PAR_OUT_FILE: --overwrite (core/outfile.h) */
} par_cli_output;

#define PAR_OVERWRITE_HELP                                                                                  \
    "replace an existing output file even when parity did not write it (never a symlink or a directory)"

/* Checks every given output before anything runs (core/outdir.h): each may
 * be written (a directory only replaced when parity wrote it, a file only
 * when parity wrote it or `overwrite`, never a symlink, parents writable)
 * and no two name the same path.  File outputs are recorded
 * (par_outfile_guard) so the final rename applies the rule again.  Prints one message and returns
 * 2, else 0. */
int par_cli_check_outputs(const char *cmd, const par_cli_output *outs, int n);

#endif
