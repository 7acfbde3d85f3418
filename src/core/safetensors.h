/* core/safetensors.h - reading and writing safetensors files (GOLDEN.md).
 *
 * Layout: u64 little-endian header length N, N bytes of JSON
 *   {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}
 * then the data section; offsets are relative to its start.  parity handles
 * the dtypes F64 F32 BF16 I32 I64 and up to PAR_MAX_DIMS dims.
 *
 * Reading loads the whole file once and validates every rule of
 * docs/formats.md; a violation is PAR_EFORMAT (PAR_ERANGE for sizes past the
 * caps) with a message naming the file, the tensor and the fault.  Tensors
 * are views into the loaded file, copied only when their data is not aligned
 * to the element size.  Tensors are listed in byte order of their names.
 *
 * Writing sorts tensors by name, packs their data in that order, pads the
 * header with spaces to a multiple of 8 bytes (as the reference
 * implementation does) and writes the file atomically (core/fileio.h).
 * Output arguments are set only on success.  Little-endian hosts only.
 */
#ifndef PAR_CORE_SAFETENSORS_H
#define PAR_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

/* Headers longer than this are refused (read and write). */
#define PAR_ST_HEADER_CAP ((uint64_t)100 << 20)

typedef struct par_st_file par_st_file;

/* Reads and validates a file. */
par_status par_st_read(const char *path, par_st_file **out);
/* Same through a read-only mapping of the file (core/fileio.h par_file_map):
 * the same checks and views, without the copy into a fresh buffer; the file
 * must not change while the par_st_file is open (the comparator's sets). */
par_status par_st_map(const char *path, par_st_file **out);
/* Same, also reading the storage-only dtypes of quantized checkpoints
 * (F8_E4M3, F8_E8M0, I8, U8; core/tensor.h): for the HF import only. */
par_status par_st_read_storage(const char *path, par_st_file **out);
/* Same from memory (copied); `label` names it in messages. */
par_status par_st_read_mem(const void *buf, size_t len, const char *label, par_st_file **out);
void par_st_close(par_st_file *f); /* NULL is fine */

const char *par_st_label(const par_st_file *f); /* the path given to read */
int par_st_count(const par_st_file *f);         /* number of tensors     */
const char *par_st_name(const par_st_file *f, int i);
const par_tensor *par_st_tensor(const par_st_file *f, int i);
/* Index of a tensor by name, or -1. */
int par_st_index(const par_st_file *f, const char *name);
/* Tensor by name, or NULL. */
const par_tensor *par_st_find(const par_st_file *f, const char *name);
/* "__metadata__" entries, sorted by key. */
const char *par_st_meta(const par_st_file *f, const char *key); /* NULL if absent */
int par_st_meta_count(const par_st_file *f);
const char *par_st_meta_key(const par_st_file *f, int i);
const char *par_st_meta_value(const par_st_file *f, int i);

/* Writer: collects (name, tensor view) pairs and metadata, then writes.
 * The writer copies names and metadata but only references tensor data,
 * which must stay alive until par_st_writer_write returns. */
typedef struct par_st_writer par_st_writer;
par_status par_st_writer_new(par_st_writer **out);
/* PAR_EINVAL for a bad dtype/ndim/shape, a NULL data pointer with a
 * non-zero size, the reserved name "__metadata__" or a repeated name. */
par_status par_st_writer_add(par_st_writer *w, const char *name, const par_tensor *t);
/* Sets (or replaces) a metadata entry. */
par_status par_st_writer_meta(par_st_writer *w, const char *key, const char *value);
/* Writes the file atomically.  The writer stays valid (may write again). */
par_status par_st_writer_write(par_st_writer *w, const char *path);
/* The same into a par_malloc'd buffer (tag IO) of *len bytes. */
par_status par_st_writer_to_mem(par_st_writer *w, void **buf, size_t *len);
void par_st_writer_free(par_st_writer *w); /* NULL is fine */

/* Streamed writing, for files whose tensors are produced one at a time (a
 * parallel dump gathers each to its writer): entries declared by shape
 * alone (add_shape: no data yet; par_st_writer_write refuses them), the
 * header and every entry that has data written by begin (the same bytes
 * par_st_writer_write would write), then each declared tensor's bytes put,
 * in any order, where the header places it (core/fileio.h
 * par_afile_pwrite); commit (atomic, as par_st_writer_write) refuses a
 * stream with a tensor never put, abort removes the temporary.  The writer
 * must outlive the stream and not change while it is open. */
par_status par_st_writer_add_shape(par_st_writer *w, const char *name, par_dtype dtype, int ndim,
                                   const int64_t *shape);
typedef struct par_st_stream par_st_stream;
par_status par_st_stream_begin(par_st_writer *w, const char *path, par_st_stream **out);
/* PAR_EINVAL for a name not declared, one already written or a size that
 * is not the declared one. */
par_status par_st_stream_put(par_st_stream *s, const char *name, const void *data, size_t nbytes);
par_status par_st_stream_commit(par_st_stream *s); /* frees s whatever happens */
void par_st_stream_abort(par_st_stream *s);        /* NULL is fine */

#endif
