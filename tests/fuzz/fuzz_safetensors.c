/* Fuzz target: the safetensors reader (core/safetensors.h) on any bytes. */
#include "core/safetensors.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_begin();
    par_st_file *f;
    if (par_st_read_mem(data, size, "fuzz", &f) == PAR_OK) {
        volatile double sink = 0;
        for (int i = 0; i < par_st_count(f); i++) {
            const par_tensor *t = par_st_tensor(f, i);
            size_t nb = par_tensor_nbytes(t);
            for (size_t b = 0; b < nb; b += 7) /* every tensor's bytes are readable */
                sink += ((const unsigned char *)t->data)[b];
            if (par_st_find(f, par_st_name(f, i)) != t)
                abort();
        }
        for (int i = 0; i < par_st_meta_count(f); i++)
            sink += (double)strlen(par_st_meta_value(f, i));
        (void)sink;
        par_st_close(f);
    }
    fuzz_end();
    return 0;
}
