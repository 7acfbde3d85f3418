/* tests/fuzz/fuzz.h - shared pieces of the fuzz targets (docs/fuzzing.md).
 *
 * Every target defines LLVMFuzzerTestOneInput.  Built with clang's
 * -fsanitize=fuzzer it is a libFuzzer binary (tools/fuzz.sh); built with any
 * compiler next to replay.c it replays files (the corpus and the crash
 * inputs) as a plain test.  A target must accept any bytes: no crash, no
 * leak, no hang; errors are expected and ignored. */
#ifndef PAR_TESTS_FUZZ_H
#define PAR_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Quiet errors and checks that nothing parity allocated is left. */
static inline void fuzz_begin(void) { par_err_set_quiet(1); }
static inline void fuzz_end(void)
{
    if (par_alloc_live_total() != 0) {
        fprintf(stderr, "fuzz: %lld bytes of parity memory leaked\n", (long long)par_alloc_live_total());
        abort();
    }
}

static char fuzz_dir_path[256];

static void fuzz_dir_remove(void)
{
    static const char *const names[] = {"metadata.json", "SHA256SUMS", "fixture.json", "bounds.json"};
    char p[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", fuzz_dir_path, names[i]);
        unlink(p);
    }
    rmdir(fuzz_dir_path);
}

/* A directory of this process for targets that read files (tmpfs when there
 * is one), made once and removed at exit. */
static inline const char *fuzz_dir(void)
{
    if (!fuzz_dir_path[0]) {
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/parity-fuzz-XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(fuzz_dir_path))
            abort();
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_path;
}

/* Writes bytes to dir/name (plain write: the target's own code is what is fuzzed). */
static inline void fuzz_put(const char *name, const void *data, size_t size)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
}

#endif
