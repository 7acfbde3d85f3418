/* core/datadir.c - finding fixtures/ and golden/ (datadir.h). */
#include "core/datadir.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fileio.h"
#include "core/log.h"
#include "parity_config.h"

/* The running executable's path (/proc/self/exe), or "" */
static void exe_path(char *exe, size_t n)
{
    ssize_t k = readlink("/proc/self/exe", exe, n - 1);
    exe[k > 0 ? k : 0] = '\0';
}

/* 1 when the running executable lies under the build directory this was built in. */
static int running_from_build(void)
{
    char exe[PATH_MAX];
    exe_path(exe, sizeof exe);
    if (!exe[0])
        return 0;
    char *root = realpath(PARITY_BUILD_ROOT, NULL);
    size_t k = root ? strlen(root) : 0;
    int inside = root && !strncmp(exe, root, k) && exe[k] == '/';
    free(root);
    return inside;
}

par_status par_data_dir(const char *sub, char *buf, size_t n)
{
    const char *env = getenv("PARITY_SOURCE_ROOT");
    const char *cand[6];
    int nc = 0;
    if (env && *env)
        cand[nc++] = env;
    if (running_from_build())
        cand[nc++] = PARITY_SOURCE_TREE;
    char rel[PATH_MAX + 64]; /* <the binary's directory>/<bindir -> datadir>/parity */
    exe_path(rel, PATH_MAX);
    char *slash = strrchr(rel, '/');
    if (slash && PARITY_DATA_REL[0]) {
        snprintf(slash + 1, sizeof rel - (size_t)(slash + 1 - rel), "%s", PARITY_DATA_REL);
        cand[nc++] = rel;
    }
    cand[nc++] = PARITY_DATA_DIR;
    cand[nc++] = PARITY_SOURCE_TREE;
    cand[nc++] = ".";
    char tried[1200] = "";
    size_t used = 0;
    for (int i = 0; i < nc; i++) {
        int w = snprintf(buf, n, "%s/%s", cand[i], sub);
        if (w > 0 && (size_t)w < n && par_path_is_dir(buf)) {
            PAR_LOG_I("%s: using %s", sub, buf);
            return PAR_OK;
        }
        if (used < sizeof tried)
            used += (size_t)snprintf(tried + used, sizeof tried - used, "%s%s/%s", i ? ", " : "", cand[i], sub);
    }
    return par_err(PAR_ENOTFOUND, "no %s directory found (looked in %s; set PARITY_SOURCE_ROOT or install parity "
                   "with `meson install`)", sub, tried);
}
