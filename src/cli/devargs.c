/* cli/devargs.c - the --device flag (see cli/devargs.h). */
#include "cli/devargs.h"

#include <stdlib.h>

#include "kernels/recipe.h"
#include "core/device.h"
#include "core/status.h"

/* The node-local rank the MPI launcher exported (MPICH's hydra, Open MPI,
 * Slurm), 0 without one. */
static int local_rank(void)
{
    static const char *const vars[] = {"MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return atoi(v);
    }
    return 0;
}

int par_cli_device(const char *cmd, const char *name)
{
    par_device_kind kind = PAR_DEV_CPU;
    par_err_set_quiet(1); /* the message once, below (callers quiet errors after this) */
    par_status s = name ? par_dev_parse(name, &kind) : PAR_OK;
    if (!s)
        s = par_dev_init(kind, local_rank());
    par_err_set_quiet(0);
    if (s) {
        fprintf(stderr, "parity %s: %s\n", cmd, par_last_error());
        return 2;
    }
    return 0;
}

void par_cli_device_report(FILE *f)
{
    if (!par_dev_gpu())
        return;
    par_dev_stats st;
    par_dev_get_stats(&st);
    const double mib = 1024.0 * 1024.0;
    fprintf(f,
            "device: %s (host to device %.2f MiB in %lld copies, device to host %.2f MiB in %lld "
            "copies, device to device %.2f MiB, %lld twins, %.2f MiB device memory at most; "
            "between ranks: device to device %.2f MiB in %lld copies, on the host %.2f MiB)\n",
            par_dev_describe(), (double)st.h2d_bytes / mib, (long long)st.h2d_calls,
            (double)st.d2h_bytes / mib, (long long)st.d2h_calls, (double)st.d2d_bytes / mib, (long long)st.twins,
            (double)st.twin_bytes_peak / mib, (double)st.comm_d2d_bytes / mib, (long long)st.comm_d2d_calls,
            (double)st.comm_host_bytes / mib);
}

int par_cli_bitwise_device(const char *cmd, int bitwise, const char *device)
{
    if (!bitwise || !device || !strcmp(device, "cpu"))
        return 0;
    fprintf(stderr, "parity %s: --bitwise runs on the CPU only (--device %s: the device path has no order-free "
            "accumulator, docs/bitwise.md)\n", cmd, device);
    return 2;
}

int par_cli_recipe(const char *cmd, const char *name, const char *device, par_config *cfg)
{
    int r = 0; /* looked up here: par_recipe_parse would report the error a second time */
    while (r < PAR_RECIPE_COUNT && strcmp(name, par_recipe_name((par_recipe)r)))
        r++;
    if (r == PAR_RECIPE_COUNT) {
        fprintf(stderr, "parity %s: --recipe '%s' is not one of none, bf16, fp8, v4\n", cmd, name);
        return 2;
    }
    if (r != PAR_RECIPE_NONE && device && strcmp(device, "cpu")) {
        fprintf(stderr, "parity %s: --recipe %s runs on the CPU only (--device %s: the device GEMM has no cast "
                "hook, docs/recipes.md)\n", cmd, name, device);
        return 2;
    }
    cfg->recipe = (par_recipe)r;
    return 0;
}

int par_cli_recipe_layout(const char *cmd, const par_config *cfg, int64_t tp, int64_t etp)
{
    if (!par_recipe_has_tiles((par_recipe)cfg->recipe) || (tp <= 1 && etp <= 1))
        return 0;
    const char *local = getenv("PARITY_RECIPE_LOCAL_TILES");
    if (local && !strcmp(local, "1")) {
        par_recipe_set_local_tiles(1);
        fprintf(stderr, "parity %s: warning: PARITY_RECIPE_LOCAL_TILES=1: the recipe's tiles are cut on each TP/ETP "
                "shard (layout-local), so this run is not the recipe's golden (docs/recipes.md)\n", cmd);
    }
    return 0;
}
