/* Fuzz target: checkpoint metadata.json (parallel/ckpt/ckpt.h par_ckpt_open).  The
 * input is written as metadata.json with a SHA256SUMS that lists its true
 * hash, so the fuzzer reaches the structure checks behind the hash. */
#include "core/sha256.h"
#include "fuzz.h"
#include "parallel/ckpt/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_begin();
    char hex[PAR_SHA256_HEX], sums[200];
    par_sha256_hex(data, size, hex);
    int n = snprintf(sums, sizeof sums, "%s  metadata.json\n", hex);
    fuzz_put("metadata.json", data, size);
    fuzz_put("SHA256SUMS", sums, (size_t)n);
    par_ckpt *ck;
    if (par_ckpt_open(fuzz_dir(), &ck) == PAR_OK) {
        for (int i = 0; i < par_ckpt_ntensors(ck); i++)
            (void)par_ckpt_find(ck, par_ckpt_tensor_at(ck, i)->name);
        par_ckpt_close(ck);
    }
    fuzz_end();
    return 0;
}
