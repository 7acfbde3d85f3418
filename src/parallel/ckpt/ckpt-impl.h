/* parallel/ckpt/ckpt-impl.h - what the checkpoint's files share (ckpt.c the format, ckpt_save.c,
 * ckpt_load.c, ckpt_tools.c): the tensor index, shard descriptors, the open checkpoint.  Private
 * to src/parallel/ckpt. */
#ifndef PAR_PARALLEL_CKPT_CKPT_IMPL_H
#define PAR_PARALLEL_CKPT_CKPT_IMPL_H

#include "core/safetensors.h"
#include "core/sha256.h"
#include "parallel/ckpt/ckpt.h"

#define ERRMSG_MAX 400
#define KEY_MAX (PAR_CKPT_NAME_MAX + 24)

/* Sorted index of tensor names for lookups. */
typedef struct {
    const par_ckpt_tensor *t;
    int n;
    int *order; /* indices sorted by name */
} name_index;

/* ---- coverage ------------------------------------------------------------- */

typedef struct {
    int t;        /* tensor index */
    int rank;     /* shard        */
    int64_t b, e; /* range        */
} span;

/* ---- shard descriptors ----------------------------------------------------- */

typedef struct {
    int rank;
    char file[32];
    char sha[PAR_SHA256_HEX];
    int n;               /* non-empty slices */
    par_ckpt_slice *s;   /* [n] */
} shard_desc;

/* ---- loading ------------------------------------------------------------------ */

typedef struct {
    int64_t b, e;
    int rank;
    const void *data; /* element b of the tensor */
} piece;

struct par_ckpt {
    char *dir;
    par_ckpt_state state;
    int nt;
    par_ckpt_tensor *t;
    name_index ix;
    int nranks;
    shard_desc *d;
    par_st_file **files;  /* [nranks] */
    int has_layout;
    par_layout layout;
    cJSON *model;
    /* per tensor: its pieces sorted by begin */
    int64_t *poff;        /* [nt+1] */
    piece *pieces;
};

void par__ckpt_hook(const char *phase, int rank);
int64_t par__ckpt_tensor_numel(const par_ckpt_tensor *t);
void par__ckpt_index_free(name_index *ix);
par_status par__ckpt_index_build(name_index *ix, const par_ckpt_tensor *t, int n, const char *what);
int par__ckpt_index_find(const name_index *ix, const char *name);
par_status par__ckpt_check_tensors(const par_ckpt_tensor *t, int n, const char *what);
par_status par__ckpt_check_roles(const par_ckpt_tensor *t, int n, const char *what);
void par__ckpt_roles_from_names(par_ckpt_tensor *t, int n, const name_index *ix);
void par__ckpt_desc_free(shard_desc *d);
void par__ckpt_shard_file_name(char *buf, size_t n, int rank);
void par__ckpt_slice_key(char *buf, size_t n, const char *name, int64_t begin);
cJSON *par__ckpt_desc_json(const shard_desc *d);
par_status par__ckpt_desc_parse(const cJSON *o, const char *what, int idx, shard_desc *d);
par_status par__ckpt_check_slice(const name_index *ix, const par_ckpt_slice *s, const char *what, int *ti);
par_status par__ckpt_write_shard(const char *tmp, int rank, const name_index *ix, const par_ckpt_item *items, int nitems, shard_desc *d);
par_status par__ckpt_layout_parse(const cJSON *o, const char *what, par_layout *l);
cJSON *par__ckpt_tensors_json(const par_ckpt_tensor *t, int n);
char *par__ckpt_seed_str(uint64_t seed, char *buf, size_t n);
cJSON *par__ckpt_metadata_json(const par_ckpt_info *info, int64_t world, const shard_desc *d, int nshards);
par_status par__ckpt_check_descs(const char *what, const name_index *ix, const shard_desc *d, int nshards);
par_status par__ckpt_finalize(char *tmp, const char *dir, const par_ckpt_info *info, const name_index *ix, int64_t world, const shard_desc *d, int nshards);

#endif
