/* parallel/ckpt/ckpt.h - distributed checkpoints (docs/checkpoints.md).
 *
 * A checkpoint is a directory:
 *   rank-RRRRR.safetensors  one shard per rank of the layout it was saved
 *                           under: SLICES of global tensors, each a
 *                           contiguous flat (row-major) element range
 *                           [begin, end), stored 1-D as "<name>@<begin>";
 *   metadata.json           format "parity-ckpt", version, training state
 *                           (step, data cursor, seed), precision, layout,
 *                           model config, every tensor's global shape and
 *                           dtype, every shard's slices, sha256 of every shard;
 *   SHA256SUMS              sha256 of every other file, metadata.json
 *                           included (`sha256sum -c SHA256SUMS` checks it).
 * Tensors are the parameters by the contract's names and the optimizer
 * state as "opt.<parameter name>.<slot>" (slot momentum for Muon, exp_avg
 * and exp_avg_sq for AdamW; GOLDEN.md), but this file moves bytes by dtype
 * and knows nothing of the model: any tensor list works.  What a tensor IS
 * (a parameter or which state slot of which parameter, its routed expert and
 * block) is a field of the list, recorded in metadata.json and never parsed
 * from a name (par_ckpt_tensor; the one exception is reading a checkpoint
 * written before the fields were recorded, see par_ckpt_open).
 *
 * Coverage rule: every element of every tensor is held by exactly one slice
 * of one shard.  A replicated tensor is written by one designated owner;
 * ZeRO-1 padding is never written (slices stop at the tensor's numel).
 *
 * Saving is atomic: shards and metadata are written into DIR.tmp-XXXXXX,
 * fsync'ed, and the directory is renamed over DIR (core/fileio.h); a crash
 * at any point leaves the previous DIR intact (a stale DIR.tmp-* may stay).
 * Coverage is checked before the rename, so an invalid set of slices never
 * becomes a checkpoint.
 *
 * Loading (par_ckpt_open) validates format, version, every hash, every
 * shard against the metadata, shapes and coverage, and reports the first
 * fault naming the file / tensor / element range; then par_ckpt_read fills
 * any wanted slices (any layout: slices may cut across the saved ones) from
 * whatever shards cover them.  Nothing is copied until every wanted slice
 * has been checked, so a failed read leaves the destination untouched.
 *
 * Ownership: which slices a rank writes is a rule, a par_ckpt_owner_fn of
 * (layout, rank, tensor list), always passed explicitly: the caller of a save
 * gathers its items with it, reshard takes it as an argument.  The rules
 * live in parallel/ckpt/ckpt_owner.h (the training driver's, and a simple one).
 *
 * Untemplated.  Thread safety: par_ckpt_read on one open handle may run
 * from many thread ranks at once (it only reads the handle).
 */
#ifndef PAR_PARALLEL_CKPT_CKPT_H
#define PAR_PARALLEL_CKPT_CKPT_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>

#include "comm/comm.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/params.h"
#include "parallel/layout/layout.h"

#define PAR_CKPT_FORMAT "parity-ckpt"
#define PAR_CKPT_VERSION 1
#define PAR_CKPT_META "metadata.json"
#define PAR_CKPT_SUMS "SHA256SUMS"
#define PAR_CKPT_NAME_MAX 128 /* tensor names, NUL included */

/* A contiguous flat element range [begin, end) of the global tensor `name`
 * (row-major).  begin == end is an empty slice (allowed, never stored). */
typedef struct {
    char name[PAR_CKPT_NAME_MAX];
    int64_t begin, end;
} par_ckpt_slice;

/* What a checkpoint tensor holds: a parameter, or one optimizer state slot
 * of a parameter (GOLDEN.md's slot names). */
typedef enum {
    PAR_CKPT_PARAM = 0,      /* a parameter                                */
    PAR_CKPT_MOMENTUM = 1,   /* Muon momentum of tensors[param]            */
    PAR_CKPT_EXP_AVG = 2,    /* AdamW exp_avg of tensors[param]            */
    PAR_CKPT_EXP_AVG_SQ = 3, /* AdamW exp_avg_sq of tensors[param]         */
} par_ckpt_slot;
#define PAR_CKPT_SLOT_COUNT 4

/* A global tensor of a checkpoint: name, dtype, global shape, and its role
 * (what ownership rules read; recorded in metadata.json).  Role rules,
 * checked on save and open: a parameter has param = -1; optimizer state has
 * param = the list index of a parameter with the same shape, and the same
 * expert / layer / mtp as it; expert, layer, mtp >= -1, not both a layer and
 * an MTP block.  par_ckpt_tensor_init makes a plain parameter. */
typedef struct {
    char name[PAR_CKPT_NAME_MAX];
    par_dtype dtype;
    int ndim;
    int64_t shape[PAR_MAX_DIMS];
    par_ckpt_slot slot;
    int param;  /* optimizer state: list index of its parameter; -1 for a parameter */
    int expert; /* routed expert index (layers.N.ffn.experts.E.*: E); -1 none     */
    int layer;  /* main block (layers.N.*: N); -1 none                            */
    int mtp;    /* MTP block (mtp.N.*: N); -1 none                                */
} par_ckpt_tensor;

/* *x = a parameter `name` (truncated to PAR_CKPT_NAME_MAX - 1) of that dtype
 * and shape[ndim], no expert, no block. */
void par_ckpt_tensor_init(par_ckpt_tensor *x, const char *name, par_dtype dtype, int ndim, const int64_t *shape);
/* "param", "momentum", "exp_avg", "exp_avg_sq" (NULL outside the enum). */
const char *par_ckpt_slot_name(par_ckpt_slot s);

/* A slice with its data: (end - begin) elements of the tensor's dtype.
 * Read on save, written on load. */
typedef struct {
    par_ckpt_slice s;
    void *data;
} par_ckpt_item;

/* Training state.  Our RNG is counter-based (Philox keyed by (seed, name),
 * core/rng.h) and the data stream is a pure function of (seed, global sample
 * index), so (seed, step, cursor) is the whole RNG state and it reshards
 * trivially: nothing per rank is saved. */
typedef struct {
    int64_t step;    /* optimizer steps taken                         */
    int64_t cursor;  /* data cursor: index of the next global sample  */
    uint64_t seed;   /* the run's seed (init, packing, tokens)        */
    char precision[8]; /* "f64" | "f32" ("" is written as "unknown")  */
} par_ckpt_state;

/* What a save records besides the slices (the same on every rank). */
typedef struct {
    par_ckpt_state state;
    const par_ckpt_tensor *tensors; /* [ntensors] global tensors, unique names */
    int ntensors;
    const par_layout *layout;       /* recorded (given fields, N, Da, De); NULL: none */
    const cJSON *model;             /* model config object, copied; NULL: none */
} par_ckpt_info;

/* The checkpoint tensor list of a model (model/params.h): every parameter
 * in table order (float ones as F64 for precision 64, F32 for 32; tid2eid
 * as I32), then the optimizer state in table order: "opt.<name>.momentum"
 * for Muon tensors, "opt.<name>.exp_avg" and "opt.<name>.exp_avg_sq" for
 * AdamW tensors (none for PAR_OPT_NONE).  Roles from the table (entry i is
 * list index i; expert, layer / mtp from the entry's expert and block).
 * *out par_malloc'd (tag IO). */
par_status par_ckpt_tensors_of_params(const par_param_table *t, int precision_bits, par_ckpt_tensor **out,
                                      int *n);

/* ---- ownership ---------------------------------------------------------- */

/* Fills *out (par_malloc'd, tag IO; *n entries; the caller frees) with the
 * slices world rank `rank` of `nranks` holds under `layout`, for the
 * checkpoint tensors tensors[ntensors].  Over all ranks every element must
 * be covered exactly once (save checks it). */
typedef par_status (*par_ckpt_owner_fn)(const par_layout *layout, int nranks, int rank,
                                        const par_ckpt_tensor *tensors, int ntensors,
                                        par_ckpt_slice **out, int *n, void *ud);

/* World size of a layout: l->world, else PP * lcm(TP*CP, ETP*EP). */
int64_t par_ckpt_layout_world(const par_layout *l);

/* ---- saving ------------------------------------------------------------- */

/* Collective over `world` (every rank calls it with its own items, which
 * may be none): writes the checkpoint DIR atomically.  Steps: rank 0 makes
 * DIR.tmp-XXXXXX and broadcasts its name; every rank writes
 * rank-<world rank>.safetensors; the shards' slice lists and hashes are
 * gathered; rank 0 checks the tensor tables agree and coverage, writes
 * metadata.json and SHA256SUMS and renames the directory over DIR.  Every
 * rank returns the same verdict (a rank that failed reports its own error,
 * the others PAR_EIO naming it); on failure DIR is untouched and the
 * temporary is removed.  MPI: the same steps on a shared filesystem. */
par_status par_ckpt_save(par_comm *world, const char *dir, const par_ckpt_info *info,
                         const par_ckpt_item *items, int nitems);

/* ---- loading ------------------------------------------------------------ */

typedef struct par_ckpt par_ckpt;

/* Opens DIR and validates everything (see above); the shards are loaded
 * into memory (tag IO).  The tensors' roles come from metadata.json; a
 * checkpoint written before they were recorded (no "slot" on any tensor) gets
 * them from the contract's names, once, here: "opt.<P>.<slot>" with P a
 * listed tensor of the same shape is that slot of P, ".experts.<E>." is
 * expert E, a "layers.<N>." / "mtp.<N>." prefix the block.  Errors: PAR_ENOTFOUND missing directory / file,
 * PAR_EFORMAT bad structure or truncated file, PAR_EUNSUPPORTED other
 * format version, PAR_EMISMATCH hash / shape / dtype / shard disagreement,
 * PAR_EFORMAT gap or overlap (first one, by tensor and element range). */
par_status par_ckpt_open(const char *dir, par_ckpt **out);
void par_ckpt_close(par_ckpt *ck); /* NULL is fine */

const char *par_ckpt_dir(const par_ckpt *ck);
const par_ckpt_state *par_ckpt_state_of(const par_ckpt *ck);
int par_ckpt_ntensors(const par_ckpt *ck);
const par_ckpt_tensor *par_ckpt_tensor_at(const par_ckpt *ck, int i); /* metadata order */
const par_ckpt_tensor *par_ckpt_find(const par_ckpt *ck, const char *name); /* or NULL */
int par_ckpt_nranks(const par_ckpt *ck);      /* shards (world size saved under) */
/* The layout saved under (given fields, world, da, de; resolved = 0), or
 * NULL when none was recorded. */
const par_layout *par_ckpt_layout(const par_ckpt *ck);
const cJSON *par_ckpt_model(const par_ckpt *ck); /* or NULL */
/* Slices of rank r's shard (empty ones omitted). */
int par_ckpt_rank_nslices(const par_ckpt *ck, int r);
const par_ckpt_slice *par_ckpt_rank_slice(const par_ckpt *ck, int r, int i);

/* Fills every item from the shards.  Checks first (nothing copied on
 * failure): names exist (PAR_ENOTFOUND), 0 <= begin <= end <= numel
 * (PAR_ERANGE), data non-NULL for non-empty items. */
par_status par_ckpt_read(const par_ckpt *ck, const par_ckpt_item *items, int nitems);
/* A whole tensor into a new tensor (owns its data, tag `tag`). */
par_status par_ckpt_read_tensor(const par_ckpt *ck, const char *name, par_tag tag, par_tensor *out);

/* ---- tools (parity ckpt) ------------------------------------------------ */

/* Writes every tensor whole into one safetensors file (atomic), metadata
 * "format": "parity-ckpt-export", step, cursor, seed, precision. */
par_status par_ckpt_export(const char *src_dir, const char *file);

/* Reads SRC and saves it as DST (atomic) with the ownership rule fn (with
 * its ud) under `layout` (world size par_ckpt_layout_world); fn NULL is
 * PAR_EINVAL.  Training state and model are kept; the layout is replaced. */
par_status par_ckpt_reshard(const char *src_dir, const char *dst_dir, const par_layout *layout,
                            par_ckpt_owner_fn fn, void *ud);
/* The same from an open checkpoint (dst_dir may be its own directory). */
par_status par_ckpt_reshard_open(const par_ckpt *ck, const char *dst_dir, const par_layout *layout,
                                 par_ckpt_owner_fn fn, void *ud);

/* Result of comparing two checkpoints. */
typedef struct {
    int state_equal;     /* step, cursor, seed, precision              */
    int tensors_equal;   /* same names, dtypes, shapes, roles, bitwise values */
    int n_tensors_diff;  /* tensors missing on a side or different      */
    char first[320];     /* the first difference, "" when none          */
} par_ckpt_diff_result;

/* Compares two checkpoints' training state and full tensors, bitwise
 * (layouts may differ).  When out is not NULL, one line per difference is
 * printed there.  PAR_OK when the comparison ran; the verdict is in *res. */
par_status par_ckpt_diff(const char *a_dir, const char *b_dir, FILE *out, par_ckpt_diff_result *res);

/* ---- test hook ---------------------------------------------------------- */

/* Called (when set) at each phase of a save on the rank that runs it:
 * "tmp", "shard", "gathered", "metadata", "sums", "commit", "done".  Tests
 * use it to crash a save at a chosen point.  Not for production. */
void par__ckpt_set_test_hook(void (*hook)(const char *phase, int rank));

#endif
