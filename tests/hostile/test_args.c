/* The option parser (src/cli/args.c, compiled into this test): duplicates,
 * ranges, finite reals, --log (issue 13 item 16). */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"

static int64_t n_i;
static double n_d;
static const char *n_s;
static int n_f;
static par_strlist n_l;

static const par_opt opts[] = {
    {"count", PAR_OPT_INT, &n_i, "N", "", PAR_CHK_POS, 100},
    {"time", PAR_OPT_DOUBLE, &n_d, "S", "", PAR_CHK_POS_REAL, 0},
    {"name", PAR_OPT_STR, &n_s, "S", "", PAR_CHK_NONEMPTY, 0},
    {"flag", PAR_OPT_FLAG, &n_f, NULL, "", PAR_CHK_NONE, 0},
    {"set", PAR_OPT_LIST, &n_l, "K=V", "", PAR_CHK_NONE, 0},
    {"free", PAR_OPT_INT, &n_i, "N", "", PAR_CHK_NONE, 0},
};

static int parse(const char *line)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", line);
    char *argv[32] = {"t"};
    int argc = 1;
    for (char *t = strtok(buf, " "); t && argc < 31; t = strtok(NULL, " "))
        argv[argc++] = t;
    n_i = 0, n_d = 0, n_s = NULL, n_f = 0;
    memset(&n_l, 0, sizeof n_l);
    par_positional pos;
    return par_args_parse("t", "", opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, &pos);
}

Test(args, ranges_and_values, .init = cr_redirect_stderr)
{
    cr_expect_eq(parse("--count 5 --time 0.5 --name x --flag"), 0);
    cr_expect_eq(n_i, 5);
    cr_expect_eq(parse("--count 0"), 2);
    cr_expect_eq(parse("--count -1"), 2);
    cr_expect_eq(parse("--count 101"), 2);
    cr_expect_eq(parse("--count 100"), 0);
    cr_expect_eq(parse("--count 99999999999999999999"), 2);
    cr_expect_eq(parse("--time 0"), 2);
    cr_expect_eq(parse("--time nan"), 2);
    cr_expect_eq(parse("--time inf"), 2);
    cr_expect_eq(parse("--time 1e400"), 2);
    cr_expect_eq(parse("--name="), 2);
    cr_expect_eq(parse("--free -7"), 0, "no check: any integer");
    cr_expect_eq(n_i, -7);
    cr_expect_eq(parse("--flag=1"), 2);
    cr_expect_eq(parse("--count"), 2);
}

Test(args, duplicates_are_refused_but_lists_repeat, .init = cr_redirect_stderr)
{
    cr_expect_eq(parse("--count 1 --count 2"), 2);
    cr_expect_eq(parse("--count 1 --count=1"), 2, "even the same value");
    cr_expect_eq(parse("--flag --flag"), 2);
    cr_expect_eq(parse("--name a --name b"), 2);
    cr_expect_eq(parse("--set a=1 --set b=2 --set a=3"), 0);
    cr_expect_eq(n_l.count, 3);
    fflush(stderr);
}

Test(args, log_is_accepted_anywhere, .init = cr_redirect_stderr)
{
    cr_expect_eq(parse("--log debug --count 1"), 0);
    cr_expect_eq(parse("--log=warn"), 0);
    cr_expect_eq(parse("--log"), 2);
    cr_expect_eq(parse("--log loud"), 2);
}
