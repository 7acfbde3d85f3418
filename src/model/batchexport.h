/* model/batchexport.h - a run's packed batches in the form a training
 * framework takes (untemplated): per step the tokens, THD sample boundaries,
 * position ids, labels and loss masks of MODEL.md section 1, as safetensors
 * and .npy, with batch.json describing every field.
 *
 * OUT/batch.json                 what the directory holds (fields, steps, sources)
 * OUT/batch.K.safetensors        step K's fields (K = first_step ..)
 * OUT/npy/K/<field>.npy          the same, one .npy per field
 * The directory is built in a temporary one and renamed over OUT.
 */
#ifndef PAR_MODEL_BATCHEXPORT_H
#define PAR_MODEL_BATCHEXPORT_H

#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/data.h"

#define PAR_BATCH_FORMAT "parity-batch"
#define PAR_BATCH_JSON "batch.json"

/* Where the batches come from: a golden set's step files, or the generator
 * the way `parity golden` makes them (a fixture's packing, or a random plan
 * from the seed). */
typedef struct {
    const char *set_dir;  /* golden set: step.K input.tokens / input.segments        */
    const char *fixture;  /* else: fixture name (NULL: random packing)               */
    const char *fixtures_dir;
    par_config cfg;       /* generator: vocab, B, S (S replaced by a fixture's)       */
    int64_t steps;        /* generator: steps to write                                */
    uint64_t seed;        /* generator: the seed of `parity golden --seed`            */
} par_batch_export_opts;

typedef struct {
    int64_t steps, B, S;
    int64_t first_step;
} par_batch_export_info;

/* Writes the batches as above.  A set's batches are checked as `--data` is
 * (par_batch_check) against its manifest's vocab.  *info (may be NULL) on
 * success. */
par_status par_batch_export(const par_batch_export_opts *o, const char *out_dir, par_batch_export_info *info);

/* A .npy (format 1.0) of an I32/I64/F32/F64 tensor of 0..5 dims into a
 * par_malloc'd buffer (tag IO). */
par_status par_npy_encode(par_dtype dt, int ndim, const int64_t *shape, const void *data, void **buf, size_t *len);

#endif
