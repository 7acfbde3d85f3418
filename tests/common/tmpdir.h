/* tests/common/tmpdir.h - temporary directories for tests that run parity
 * end to end (golden sets, dumps, checkpoints). */
#ifndef PAR_TESTS_TMPDIR_H
#define PAR_TESTS_TMPDIR_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A fresh directory under /tmp (free() the name, rmtree() the directory). */
static inline char *mktmp(void)
{
    char *d = strdup("/tmp/parity-test-XXXXXX");
    cr_assert(d && mkdtemp(d), "mkdtemp");
    return d;
}

/* "dir/name", malloc'd. */
static inline char *sub(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    cr_assert(p != NULL, "malloc");
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static inline void rmtree(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

#endif
