/* Helpers shared by the io tests: temporary directories and raw safetensors
 * bytes built from a header string. */
#ifndef PAR_TESTS_IO_UTIL_H
#define PAR_TESTS_IO_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"

/* A fresh directory under $TMPDIR (or /tmp); free with io_rmtree. */
static inline char *io_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/parity-io-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

static inline void io_rmtree(char *p)
{
    if (p) {
        par_remove_tree(p);
        free(p);
    }
}

/* u64 LE length + header (no padding added) + data, in a malloc'd buffer. */
static inline unsigned char *io_raw(const char *hdr, const void *data, size_t dn, size_t *len)
{
    size_t hn = strlen(hdr);
    unsigned char *b = malloc(8 + hn + dn + 1);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hn >> (8 * i));
    memcpy(b + 8, hdr, hn);
    if (dn)
        memcpy(b + 8 + hn, data, dn);
    *len = 8 + hn + dn;
    return b;
}

static inline int io_write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(b, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

/* Number of directory entries whose name contains `needle`. */
#include <dirent.h>
static inline int io_count_entries(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, needle))
            n++;
    closedir(d);
    return n;
}

#endif
