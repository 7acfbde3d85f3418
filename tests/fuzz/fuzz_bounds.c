/* Fuzz target: a derived-bounds file (model/bounds.h, docs/formats.md
 * "bounds.json"), the file `parity compare --policy derived --bounds` reads. */
#include "fuzz.h"
#include "model/bounds.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_begin();
    fuzz_put("bounds.json", data, size);
    char path[512];
    snprintf(path, sizeof path, "%s/bounds.json", fuzz_dir());
    par_bounds *b = NULL;
    if (par_bounds_read(path, &b) == PAR_OK) {
        /* everything read back must be usable: names, kinds, the lookup */
        for (int i = 0; i < par_bounds_count(b); i++) {
            const par_bound *e = par_bounds_at(b, i);
            if (!e || !e->file || !e->tensor || !par_bound_kind_name(e->kind) ||
                par_bounds_find(b, e->file, e->tensor) == NULL)
                abort();
        }
        (void)par_bounds_factor(b);
        (void)par_bounds_label(b);
        par_bounds_free(b);
    } else if (b) {
        abort(); /* output set only on success */
    }
    fuzz_end();
    return 0;
}
