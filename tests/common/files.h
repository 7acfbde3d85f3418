/* tests/common/files.h - file helpers for Criterion tests. */
#ifndef PAR_TESTS_FILES_H
#define PAR_TESTS_FILES_H

#include <criterion/criterion.h>
#include <stdio.h>

/* 1 when the two files have the same bytes (both must open). */
static inline int files_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    cr_assert(fa && fb);
    int eq = 1, ca, cb;
    do {
        ca = fgetc(fa);
        cb = fgetc(fb);
        if (ca != cb)
            eq = 0;
    } while (eq && ca != EOF);
    fclose(fa);
    fclose(fb);
    return eq;
}

#endif
