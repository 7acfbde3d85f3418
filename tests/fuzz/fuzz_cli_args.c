/* Fuzz target: the CLI option parser (cli/args.h) with a table of every
 * kind and check, the layout and network flags, then --set through the
 * config parser.  The input is argv, words separated by NUL bytes. */
#include "cli/args.h"
#include "cli/netargs.h"
#include "fuzz.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_begin();
    char *buf = malloc(size + 1);
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[66] = {"run"};
    int argc = 1;
    for (size_t i = 0; i <= size && argc < 65;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    int64_t steps = 1, seed = 0;
    double t = 0;
    const char *s = NULL;
    int q = 0;
    par_strlist sets;
    memset(&sets, 0, sizeof sets);
    par_layout_args la;
    par_layout_args_init(&la);
    par_net_args na;
    par_net_args_init(&na);
    par_opt opts[48] = {
        {"steps", PAR_OPT_INT, &steps, "K", "", PAR_CHK_POS, 1e8},
        {"seed", PAR_OPT_INT, &seed, "N", "", PAR_CHK_NONNEG, 0},
        {"comm-timeout", PAR_OPT_DOUBLE, &t, "S", "", PAR_CHK_POS_REAL, 1e9},
        {"dump", PAR_OPT_STR, &s, "DIR", "", PAR_CHK_NONEMPTY, 0},
        {"quiet", PAR_OPT_FLAG, &q, NULL, "", PAR_CHK_NONE, 0},
        {"set", PAR_OPT_LIST, &sets, "K=V", "", PAR_CHK_NONE, 0},
    };
    int n = par_layout_opts(opts, 6, 48, &la);
    n = par_net_opts(opts, n, 48, &na);
    FILE *saved = stdout; /* --help prints the usage */
    stdout = fopen("/dev/null", "w");
    FILE *err = stderr;
    stderr = stdout;
    par_positional pos;
    int rc = par_args_parse("run", "", opts, n, argc, argv, &pos);
    stderr = err;
    fclose(stdout);
    stdout = saved;
    if (rc == 0) {
        par_config c;
        par_config_preset(&c, "v4-tiny");
        for (int i = 0; i < sets.count; i++)
            if (par_config_set_arg(&c, sets.items[i]) != PAR_OK)
                break;
        (void)par_config_validate(&c);
        par_netmodel m;
        int on;
        (void)par_net_args_resolve(&na, &m, &on);
    }
    free(buf);
    fuzz_end();
    return 0;
}
