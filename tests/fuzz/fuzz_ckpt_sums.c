/* Fuzz target: a checkpoint's SHA256SUMS (parallel/ckpt/ckpt.h par_ckpt_open) next
 * to a fixed, valid metadata.json of an empty checkpoint. */
#include "fuzz.h"
#include "parallel/ckpt/ckpt.h"

static const char meta[] =
    "{\"format\": \"parity-ckpt\", \"version\": 1, \"state\": {\"step\": 1, \"data_cursor\": 8},"
    " \"rng\": {\"scheme\": \"philox\", \"seed\": \"1234\", \"step\": 1}, \"precision\": \"f64\", \"world_size\": 1,"
    " \"tensors\": [], \"shards\": [{\"rank\": 0, \"file\": \"rank-00000.safetensors\", \"sha256\": \"\", "
    "\"slices\": []}], \"files\": {}}\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_begin();
    static int once;
    if (!once) {
        fuzz_put("metadata.json", meta, sizeof meta - 1);
        once = 1;
    }
    fuzz_put("SHA256SUMS", data, size);
    par_ckpt *ck;
    if (par_ckpt_open(fuzz_dir(), &ck) == PAR_OK)
        par_ckpt_close(ck);
    fuzz_end();
    return 0;
}
