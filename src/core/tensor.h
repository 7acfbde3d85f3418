/* core/tensor.h - dense contiguous tensors of up to 5 dims.
 *
 * Dtypes are the ones golden files use (GOLDEN.md): F64, F32, BF16, I32, I64.
 * Past PAR_DTYPE_COUNT, storage-only dtypes of quantized checkpoints (the
 * DeepSeek release: F8_E4M3 weights, F8_E8M0 scales, I8 packed FP4, U8):
 * only par_st_read_storage reads them and only the HF import/export use
 * them; par_dtype_parse and every golden or checkpoint reader refuse them.
 * BF16 values are stored as uint16 bit patterns; conversions round to nearest
 * even and keep NaN a NaN.  Data is row-major ("C order"), little-endian.
 */
#ifndef PAR_CORE_TENSOR_H
#define PAR_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"

#define PAR_MAX_DIMS 5

typedef enum {
    PAR_F64 = 0,
    PAR_F32 = 1,
    PAR_BF16 = 2,
    PAR_I32 = 3,
    PAR_I64 = 4,
    PAR_DTYPE_COUNT, /* the dtypes above; also "no dtype" (name "?") */
    PAR_F8_E4M3 = 6, /* storage only (see above), 1 byte */
    PAR_F8_E8M0 = 7,
    PAR_I8 = 8,
    PAR_U8 = 9,
    PAR_DTYPE_STORAGE_END
} par_dtype;

typedef struct {
    par_dtype dtype;
    int ndim;                     /* 0 (a scalar) .. PAR_MAX_DIMS */
    int64_t shape[PAR_MAX_DIMS];
    void *data;                   /* numel * dtype size bytes      */
    int owns;                     /* data freed by par_tensor_free */
} par_tensor;

size_t par_dtype_size(par_dtype dt);
const char *par_dtype_name(par_dtype dt);   /* "F64", "F32", "BF16", "I32", "I64" */
/* Parses a safetensors dtype name; returns 0 or PAR_EFORMAT (no message). */
par_status par_dtype_parse(const char *s, par_dtype *out);
/* The same, storage-only dtypes included ("F8_E4M3", "F8_E8M0", "I8", "U8"). */
par_status par_dtype_parse_storage(const char *s, par_dtype *out);
/* dt names a dtype: one of the basic ones or a storage-only one. */
int par_dtype_valid(par_dtype dt);
int par_dtype_is_float(par_dtype dt);

int64_t par_tensor_numel(const par_tensor *t);
size_t par_tensor_nbytes(const par_tensor *t);
/* Computes numel of a shape; returns -1 if any dim < 0 or it overflows
 * int64 (or numel * elsize overflows when elsize > 0). */
int64_t par_shape_numel(int ndim, const int64_t *shape, size_t elsize);

/* Allocates a zeroed tensor (owns its data, tag PAR_TAG_TENSOR unless
 * another tag is given). */
par_status par_tensor_alloc(par_tensor *t, par_dtype dt, int ndim, const int64_t *shape, par_tag tag);
/* A non-owning view of existing data. */
par_tensor par_tensor_view(par_dtype dt, int ndim, const int64_t *shape, void *data);
void par_tensor_free(par_tensor *t);
int par_tensor_same_shape(const par_tensor *a, const par_tensor *b);
/* "[8,64,4,32]" into buf; returns buf. */
char *par_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* Element i as double (any dtype). */
double par_tensor_get_f64(const par_tensor *t, int64_t i);

/* bf16 (device-callable in an offload build: the recipes' casts run in
 * kernels' device loops) */
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp declare target
#endif
uint16_t par_bf16_from_f32(float f);
uint16_t par_bf16_from_f64(double d);  /* rounds once, from the double */
float par_bf16_to_f32(uint16_t b);
#if defined(PAR_OFFLOAD) && PAR_OFFLOAD
#pragma omp end declare target
#endif

#endif
