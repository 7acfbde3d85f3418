/* Test helper for the numpy interop test: reads IN with parity's reader and
 * writes every tensor and metadata entry to OUT with parity's writer.
 * Exit 0 ok, 2 on any error (message on stderr). */
#include <stdio.h>

#include "core/safetensors.h"
#include "core/status.h"

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
        return 2;
    }
    par_st_file *f;
    if (par_st_read(argv[1], &f) != PAR_OK)
        return 2;
    par_st_writer *w;
    int rc = 2;
    if (par_st_writer_new(&w) != PAR_OK)
        goto done_close;
    for (int i = 0; i < par_st_count(f); i++)
        if (par_st_writer_add(w, par_st_name(f, i), par_st_tensor(f, i)) != PAR_OK)
            goto done_free_writer;
    for (int i = 0; i < par_st_meta_count(f); i++)
        if (par_st_writer_meta(w, par_st_meta_key(f, i), par_st_meta_value(f, i)) != PAR_OK)
            goto done_free_writer;
    if (par_st_writer_write(w, argv[2]) == PAR_OK)
        rc = 0;
done_free_writer:
    par_st_writer_free(w);
done_close:
    par_st_close(f);
    return rc;
}
