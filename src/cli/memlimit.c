/* cli/memlimit.c - --max-memory (see cli/memlimit.h). */
#include "cli/memlimit.h"

#include <stdio.h>

#include "cli/sizearg.h"
#include "core/status.h"
#include "parallel/plan/memcheck.h"

double par_memlimit_limit(const char *cmd, const char *max_memory, char *what, size_t n)
{
    double machine = par_memcheck_machine(), lim = 0;
    if (max_memory && par_size_parse(max_memory, &lim)) {
        fprintf(stderr, "parity %s: --max-memory '%s' is not a size (e.g. 16GB, 16GiB, 1.6e10)\n", cmd, max_memory);
        return -1;
    }
    if (max_memory && (machine <= 0 || lim < machine)) {
        snprintf(what, n, "--max-memory %s", max_memory);
        return lim;
    }
    snprintf(what, n, "this machine's memory");
    return machine;
}

static int verdict(const char *cmd, par_status s, const par_memest *e, double lim, const char *what)
{
    if (s) /* no estimate (a layout the run will refuse itself): let it speak */
        return 0;
    if (par_memcheck_fits(e, lim, what) != PAR_OK) {
        fprintf(stderr, "parity %s: %s\n", cmd, par_last_error());
        return 2;
    }
    return 0;
}

int par_memlimit_run(const char *cmd, const char *max_memory, const par_config *cfg, const par_layout *l,
                     int precision, int64_t steps, int64_t local)
{
    char what[96];
    double lim = par_memlimit_limit(cmd, max_memory, what, sizeof what);
    if (lim < 0)
        return 2;
    par_memest e;
    par_status s = par_memcheck_run(cfg, l, precision, steps, local, lim, &e);
    return verdict(cmd, s, &e, lim, what);
}

int par_memlimit_golden(const char *cmd, const char *max_memory, const par_config *cfg, int precision, int64_t steps)
{
    char what[96];
    double lim = par_memlimit_limit(cmd, max_memory, what, sizeof what);
    if (lim < 0)
        return 2;
    par_memest e;
    par_status s = par_memcheck_golden(cfg, precision, steps, lim, &e);
    return verdict(cmd, s, &e, lim, what);
}

int par_memlimit_golden_rows(const char *cmd, const char *max_memory, const par_config *cfg, int precision,
                             int64_t steps, int64_t *rows)
{
    char what[96];
    double lim = par_memlimit_limit(cmd, max_memory, what, sizeof what);
    if (lim < 0)
        return 2;
    par_memest e;
    par_status s;
    if (*rows > 0) /* asked for */
        return verdict(cmd, par_memcheck_golden_blocked(cfg, precision, steps, *rows, &e), &e, lim, what);
    par_memest one;
    if ((s = par_memcheck_golden(cfg, precision, steps, 0, &one)) ||
        (s = par_memcheck_golden_rows(cfg, precision, steps, lim, rows, &e)))
        return 0; /* no estimate: the run speaks for itself */
    if (*rows > 0)
        fprintf(stderr,
                "parity %s: the one-shot golden of %lld rows needs an estimated %.3g GB, more than %s (%.3g GB): "
                "gradients accumulated over row blocks of %lld rows (estimated %.3g GB; --rows-per-block "
                "sets the blocks)\n",
                cmd, (long long)cfg->global_batch_size, one.total / 1e9, what, lim / 1e9, (long long)*rows,
                e.total / 1e9);
    return verdict(cmd, PAR_OK, &e, lim, what);
}
