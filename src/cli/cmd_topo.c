/* cli/cmd_topo.c - `parity topo`: the host topology and the rank binding. */
#include <stdio.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "comm/topology.h"
#include "core/status.h"

int par_cmd_topo(int argc, char **argv)
{
    int64_t world = 0, rpp = 0;
    par_opt opts[] = {
        {"world-size", PAR_OPT_INT, &world, "N",
         "ranks of the run (threads backend: all in this process; default: one per core)", PAR_CHK_POS, 1 << 20},
        {"ranks-per-process", PAR_OPT_INT, &rpp, "R",
         "ranks per process (MPI hybrid): the binding of one process's R ranks", PAR_CHK_POS, 1 << 20},
    };
    par_positional pos = {0};
    int rc = par_args_parse("topo", "[--world-size N] [--ranks-per-process R]", opts, 2, argc,
                            argv, &pos);
    if (rc)
        return rc == 1 ? 0 : 2;
    if (pos.count) {
        fprintf(stderr, "parity topo: unexpected argument '%s'\n", pos.argv[0]);
        return 2;
    }
    int64_t nranks = rpp ? rpp : world ? world : par_topo_ncores();
    if (nranks < 1 || nranks > 1 << 20 || world < 0 || rpp < 0) {
        fprintf(stderr, "parity topo: --world-size %lld / --ranks-per-process %lld must be in "
                        "1..%d\n", (long long)world, (long long)rpp, 1 << 20);
        return 2;
    }
    if (par_topo_print(stdout, (int)nranks) != PAR_OK) {
        fprintf(stderr, "parity topo: %s\n", par_last_error());
        return 2;
    }
    return 0;
}
