/* model/batchexport.c - packed batches for a training framework (see
 * model/batchexport.h). */
#include "model/batchexport.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/manifest.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "parity_config.h"

/* The fields of one step, in batch.json's order. */
typedef struct {
    const char *name, *dtype, *shape, *what;
} field_doc;

static const field_doc fields[] = {
    {"tokens", "I32", "[B,S]", "input token ids; rows packed with whole samples, no padding (MODEL.md 1)"},
    {"segments", "I32", "[B,S]", "sample number within the row: 0,1,2,... (parity's input.segments)"},
    {"position_ids", "I32", "[B,S]", "position within the sample, restarting at 0 at each sample start"},
    {"labels", "I32", "[B,S]", "main target: token t+1 of the same sample; -1 at a sample's last token"},
    {"loss_mask", "F32", "[B,S]", "1 where labels >= 0, else 0"},
    {"mtp_input_ids", "I32", "[B,S]", "MTP input: token t+1 of the same sample; 0 at a sample's last token"},
    {"mtp_labels", "I32", "[B,S]", "MTP target: token t+2 of the same sample; -1 where there is none"},
    {"mtp_loss_mask", "F32", "[B,S]", "1 where mtp_labels >= 0, else 0"},
    {"cu_seqlens", "I32", "[B,max_samples+1]",
     "packed THD per row: sample boundaries 0..S within the row, padded with -1 after the row's last (S)"},
    {"num_samples", "I32", "[B]", "samples of each row: cu_seqlens[r, :num_samples[r]+1] are the boundaries"},
    {"max_seqlen", "I32", "[B]", "longest sample of each row"},
    {"cu_seqlens_flat", "I32", "[n_samples+1]",
     "the whole step as one THD stream: boundaries in the flattened [B*S] tokens (rows in order)"},
    {"sample_ids", "I32", "[B,S]", "global sample index over the step (rows in order): the aux loss's samples"},
    {"n_main", "I64", "[]", "tokens with a main target over the global batch: the main loss divides by it"},
    {"n_mtp", "I64", "[]", "tokens with an MTP target over the global batch: the MTP loss divides by it"},
    {"n_samples", "I64", "[]", "samples in the global batch: the aux loss's mean divides by it"},
};
#define N_FIELDS ((int)(sizeof fields / sizeof fields[0]))

/* One step's fields, derived from a checked batch. */
typedef struct {
    par_tensor t[N_FIELDS];
    int64_t n_samples, max_row_samples;
} step_fields;

static void step_fields_free(step_fields *f)
{
    for (int i = 0; i < N_FIELDS; i++)
        par_tensor_free(&f->t[i]);
}

static par_status alloc_field(step_fields *f, int i, par_dtype dt, int ndim, int64_t d0, int64_t d1)
{
    int64_t sh[2] = {d0, d1};
    return par_tensor_alloc(&f->t[i], dt, ndim, sh, PAR_TAG_IO);
}

/* Row boundaries: per row the starts of its samples plus S. */
static par_status fill_thd(step_fields *f, const par_batch *b)
{
    int64_t B = b->B, S = b->S, maxn = 0, ns = 0;
    for (int64_t r = 0; r < B; r++) {
        int64_t n = S ? (int64_t)b->segments[r * S + S - 1] + 1 : 0;
        maxn = n > maxn ? n : maxn;
        ns += n;
    }
    par_status s = alloc_field(f, 8, PAR_I32, 2, B, maxn + 1);
    if (!s)
        s = alloc_field(f, 9, PAR_I32, 1, B, 0);
    if (!s)
        s = alloc_field(f, 10, PAR_I32, 1, B, 0);
    if (!s)
        s = alloc_field(f, 11, PAR_I32, 1, ns + 1, 0);
    if (s)
        return s;
    int32_t *cu = f->t[8].data, *num = f->t[9].data, *mx = f->t[10].data, *flat = f->t[11].data;
    int64_t q = 0;
    for (int64_t r = 0; r < B; r++) {
        int32_t *row = cu + r * (maxn + 1);
        int64_t k = 0;
        for (int64_t s2 = 0; s2 < S; s2++)
            if (b->pos[r * S + s2] == 0) {
                row[k++] = (int32_t)s2;
                flat[q++] = (int32_t)(r * S + s2);
            }
        row[k] = (int32_t)S;
        num[r] = (int32_t)k;
        mx[r] = 0;
        for (int64_t j = 0; j < k; j++)
            mx[r] = row[j + 1] - row[j] > mx[r] ? row[j + 1] - row[j] : mx[r];
        for (int64_t j = k + 1; j <= maxn; j++)
            row[j] = -1;
    }
    flat[q] = (int32_t)(B * S);
    f->n_samples = ns;
    f->max_row_samples = maxn;
    return PAR_OK;
}

static par_status fill_fields(step_fields *f, const par_batch *b)
{
    int64_t B = b->B, S = b->S, T = B * S;
    memset(f, 0, sizeof *f);
    const int32_t *src[] = {b->tokens, b->segments, b->pos, b->labels, NULL, b->mtp_inputs, b->mtp_labels};
    par_status s = PAR_OK;
    for (int i = 0; !s && i < 8; i++) {
        s = alloc_field(f, i, (i == 4 || i == 7) ? PAR_F32 : PAR_I32, 2, B, S);
        if (!s && i == 4)
            for (int64_t t = 0; t < T; t++)
                ((float *)f->t[4].data)[t] = b->labels[t] >= 0 ? 1.0f : 0.0f;
        else if (!s && i == 7)
            for (int64_t t = 0; t < T; t++)
                ((float *)f->t[7].data)[t] = b->mtp_labels[t] >= 0 ? 1.0f : 0.0f;
        else if (!s)
            memcpy(f->t[i].data, src[i], (size_t)T * sizeof(int32_t));
    }
    if (!s)
        s = fill_thd(f, b);
    if (!s && !(s = alloc_field(f, 12, PAR_I32, 2, B, S))) {
        int32_t *ids = f->t[12].data;
        int64_t q = -1;
        for (int64_t t = 0; t < T; t++)
            ids[t] = (int32_t)(b->pos[t] == 0 ? ++q : q);
    }
    int64_t counts[3] = {b->n_labels, b->n_mtp_labels, f->n_samples};
    for (int i = 13; !s && i < 16; i++)
        if (!(s = par_tensor_alloc(&f->t[i], PAR_I64, 0, NULL, PAR_TAG_IO)))
            *(int64_t *)f->t[i].data = counts[i - 13];
    if (s)
        step_fields_free(f);
    return s;
}

par_status par_npy_encode(par_dtype dt, int ndim, const int64_t *shape, const void *data, void **buf, size_t *len)
{
    const char *descr = dt == PAR_I32 ? "<i4" : dt == PAR_I64 ? "<i8" : dt == PAR_F32 ? "<f4" : dt == PAR_F64 ? "<f8" : NULL;
    if (!descr || ndim < 0 || ndim > PAR_MAX_DIMS)
        return par_err(PAR_EINVAL, "npy: dtype %s / %d dims not supported", par_dtype_name(dt), ndim);
    char hdr[256], sh[160];
    size_t k = 0;
    sh[0] = 0;
    for (int i = 0; i < ndim; i++)
        k += (size_t)snprintf(sh + k, sizeof sh - k, "%lld,%s", (long long)shape[i], i + 1 < ndim ? " " : "");
    if (ndim > 1)
        sh[k - 1] = 0; /* "(8, 64)"; a single dim keeps its comma: "(8,)" */
    int h = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, sh);
    size_t total_hdr = 10 + (size_t)h + 1, pad = (64 - total_hdr % 64) % 64;
    int64_t numel = par_shape_numel(ndim, shape, par_dtype_size(dt));
    if (numel < 0)
        return par_err(PAR_ERANGE, "npy: shape too large");
    size_t nb = (size_t)numel * par_dtype_size(dt), hl = (size_t)h + pad + 1;
    unsigned char *b = par_malloc(10 + hl + nb, PAR_TAG_IO);
    if (!b)
        return par_err(PAR_ENOMEM, "npy: out of memory (%zu bytes)", 10 + hl + nb);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)(hl & 0xff);
    b[9] = (unsigned char)(hl >> 8);
    memcpy(b + 10, hdr, (size_t)h);
    memset(b + 10 + h, ' ', pad);
    b[10 + hl - 1] = '\n';
    if (nb)
        memcpy(b + 10 + hl, data, nb);
    *buf = b;
    *len = 10 + hl + nb;
    return PAR_OK;
}

/* batch.K.safetensors and npy/K/<field>.npy of one step. */
static par_status write_step(const step_fields *f, const char *dir, int64_t k)
{
    char name[96];
    par_st_writer *w = NULL;
    par_status s = par_st_writer_new(&w);
    snprintf(name, sizeof name, "%lld", (long long)k);
    if (!s)
        s = par_st_writer_meta(w, "format", PAR_BATCH_FORMAT);
    if (!s)
        s = par_st_writer_meta(w, "step", name);
    for (int i = 0; !s && i < N_FIELDS; i++)
        s = par_st_writer_add(w, fields[i].name, &f->t[i]);
    snprintf(name, sizeof name, "batch.%lld.safetensors", (long long)k);
    char *path = s ? NULL : par_path_join(dir, name);
    if (!s)
        s = path ? par_st_writer_write(w, path) : par_err(PAR_ENOMEM, "export batch: out of memory");
    par_free(path);
    par_st_writer_free(w);
    snprintf(name, sizeof name, "npy/%lld", (long long)k);
    char *npy = s ? NULL : par_path_join(dir, name);
    if (!s && (!npy || mkdir(npy, 0777) != 0))
        s = par_err(PAR_EIO, "export batch: cannot create %s", npy ? npy : name);
    for (int i = 0; !s && i < N_FIELDS; i++) {
        void *buf = NULL;
        size_t len = 0;
        snprintf(name, sizeof name, "%s.npy", fields[i].name);
        char *p = par_path_join(npy, name);
        s = p ? par_npy_encode(f->t[i].dtype, f->t[i].ndim, f->t[i].shape, f->t[i].data, &buf, &len)
              : par_err(PAR_ENOMEM, "export batch: out of memory");
        if (!s)
            s = par_file_write_atomic(p, buf, len);
        par_free(buf);
        par_free(p);
    }
    par_free(npy);
    return s;
}

/* ---------------------------------------------------------------- sources -- */

typedef struct {
    const par_batch_export_opts *o;
    par_config cfg;
    int64_t steps, first_step, cursor;
    int have_fx;
    par_fixture fx;
    par_pack_plan plan;
} batch_src;

static par_status src_open_set(batch_src *b, const char *dir)
{
    par_manifest m;
    par_status s = par_manifest_read(dir, &m);
    if (s)
        return s;
    s = par_config_preset(&b->cfg, "v4-tiny");
    if (!s)
        s = par_config_from_json(&b->cfg, m.model);
    if (!s)
        s = par_config_from_json(&b->cfg, m.train);
    b->steps = m.steps;
    par_manifest_free(&m);
    char *path = par_path_join(dir, PAR_MANIFEST_NAME);
    cJSON *raw = NULL;
    if (!s)
        s = path ? par_json_read_file(path, &raw) : par_err(PAR_ENOMEM, "export batch: out of memory");
    if (!s && !par_json_int(raw, "first_step", &b->first_step))
        b->first_step = 0;
    cJSON_Delete(raw);
    par_free(path);
    return s;
}

static par_status src_open(batch_src *b, const par_batch_export_opts *o)
{
    memset(b, 0, sizeof *b);
    b->o = o;
    if (o->set_dir)
        return src_open_set(b, o->set_dir);
    b->cfg = o->cfg;
    b->steps = o->steps;
    if (!o->fixture)
        return PAR_OK;
    par_status s = par_fixture_load_named(&b->fx, o->fixture, o->fixtures_dir);
    if (s)
        return s;
    b->have_fx = 1;
    b->cfg.seq_length = b->fx.seq_length; /* a fixture fixes the row length, as in `parity golden` */
    s = par_config_validate(&b->cfg);
    if (!s)
        s = par_fixture_plan(&b->fx, b->cfg.global_batch_size, b->cfg.seq_length, &b->plan);
    return s;
}

static void src_close(batch_src *b)
{
    if (b->have_fx) {
        par_pack_plan_free(&b->plan);
        par_fixture_free(&b->fx);
    }
}

/* Step k (0-based within the source) into *batch (allocated here). */
static par_status src_step(batch_src *b, int64_t k, par_batch *batch)
{
    const par_config *c = &b->cfg;
    par_status s;
    if (!b->o->set_dir) {
        if ((s = par_batch_alloc(batch, c->global_batch_size, c->seq_length)))
            return s;
        if (b->have_fx)
            return par_batch_fill(batch, &b->plan, b->o->seed, b->cursor, c->vocab_size, &b->cursor);
        par_pack_plan plan;
        if ((s = par_pack_plan_random(&plan, c->global_batch_size, c->seq_length, b->o->seed,
                                      k * c->global_batch_size)))
            return s;
        s = par_batch_fill(batch, &plan, b->o->seed, b->cursor, c->vocab_size, &b->cursor);
        par_pack_plan_free(&plan);
        return s;
    }
    char name[64];
    snprintf(name, sizeof name, "step.%lld.safetensors", (long long)(b->first_step + k));
    char *path = par_path_join(b->o->set_dir, name);
    par_st_file *f = NULL;
    s = path ? par_st_read(path, &f) : par_err(PAR_ENOMEM, "export batch: out of memory");
    const par_tensor *tt = s ? NULL : par_st_find(f, "input.tokens");
    const par_tensor *ts = s ? NULL : par_st_find(f, "input.segments");
    if (!s && (!tt || !ts || tt->dtype != PAR_I32 || ts->dtype != PAR_I32 || tt->ndim != 2 ||
               !par_tensor_same_shape(tt, ts)))
        s = par_err(PAR_EFORMAT, "%s: needs input.tokens and input.segments, I32 [B,S] of one shape", path);
    if (!s)
        s = par_batch_alloc(batch, tt->shape[0], tt->shape[1]);
    if (!s)
        s = par_batch_set(batch, tt->data, ts->data, c->vocab_size, path);
    par_st_close(f);
    par_free(path);
    return s;
}

/* ------------------------------------------------------------ batch.json -- */

static cJSON *source_json(const batch_src *b)
{
    const par_batch_export_opts *o = b->o;
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    if (o->set_dir) {
        cJSON_AddStringToObject(j, "source", "golden-set");
        cJSON_AddStringToObject(j, "path", o->set_dir);
    } else {
        cJSON_AddStringToObject(j, "source", o->fixture ? "fixture" : "generator");
        if (o->fixture)
            cJSON_AddStringToObject(j, "fixture", o->fixture);
        cJSON_AddStringToObject(j, "generator", "parity-synthetic");
        cJSON_AddStringToObject(j, "packing", o->fixture ? "fixture" : "random");
        cJSON_AddNumberToObject(j, "seed", (double)o->seed);
        cJSON_AddNumberToObject(j, "cursor", 0);
        cJSON_AddNumberToObject(j, "next_cursor", (double)b->cursor);
    }
    return j;
}

static cJSON *fields_json(void)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < N_FIELDS; i++) {
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(a, e)) {
            cJSON_Delete(e);
            cJSON_Delete(a);
            return NULL;
        }
        cJSON_AddStringToObject(e, "name", fields[i].name);
        cJSON_AddStringToObject(e, "dtype", fields[i].dtype);
        cJSON_AddStringToObject(e, "shape", fields[i].shape);
        cJSON_AddStringToObject(e, "description", fields[i].what);
    }
    return a;
}

/* sha256 of every file written (batch.K.safetensors, npy/K/<field>.npy). */
static par_status files_json(const char *dir, const batch_src *b, cJSON *files)
{
    char name[128], hex[PAR_SHA256_HEX];
    for (int64_t k = 0; k < b->steps; k++)
        for (int i = -1; i < N_FIELDS; i++) {
            int64_t g = b->first_step + k;
            if (i < 0)
                snprintf(name, sizeof name, "batch.%lld.safetensors", (long long)g);
            else
                snprintf(name, sizeof name, "npy/%lld/%s.npy", (long long)g, fields[i].name);
            char *p = par_path_join(dir, name);
            par_status s = p ? par_sha256_file(p, hex) : par_err(PAR_ENOMEM, "export batch: out of memory");
            par_free(p);
            if (s)
                return s;
            if (!cJSON_AddStringToObject(files, name, hex))
                return par_err(PAR_ENOMEM, "export batch: out of memory");
        }
    return PAR_OK;
}

static par_status write_doc(const char *dir, const batch_src *b, cJSON *steps_info)
{
    cJSON *j = cJSON_CreateObject(), *gen = cJSON_CreateObject(), *files = cJSON_CreateObject();
    par_status s = PAR_OK;
    if (!j || !gen || !files) {
        cJSON_Delete(j);
        cJSON_Delete(gen);
        cJSON_Delete(files);
        cJSON_Delete(steps_info);
        return par_err(PAR_ENOMEM, "export batch: out of memory");
    }
    cJSON_AddStringToObject(j, "format", PAR_BATCH_FORMAT);
    cJSON_AddNumberToObject(j, "version", 1);
    cJSON_AddStringToObject(gen, "name", "parity");
    cJSON_AddStringToObject(gen, "version", PARITY_VERSION);
    cJSON_AddItemToObject(j, "generator", gen);
    cJSON_AddItemToObject(j, "data", source_json(b));
    cJSON_AddNumberToObject(j, "global_batch_size", (double)b->cfg.global_batch_size);
    cJSON_AddNumberToObject(j, "seq_length", (double)b->cfg.seq_length);
    cJSON_AddNumberToObject(j, "vocab_size", (double)b->cfg.vocab_size);
    cJSON_AddNumberToObject(j, "first_step", (double)b->first_step);
    cJSON_AddNumberToObject(j, "steps", (double)b->steps);
    cJSON_AddStringToObject(j, "layout", "per step K: batch.K.safetensors and npy/K/<field>.npy; row-major, "
                                         "little-endian; rows are Megatron's micro-batch rows in order");
    cJSON_AddItemToObject(j, "fields", fields_json());
    cJSON_AddItemToObject(j, "step_info", steps_info);
    s = files_json(dir, b, files);
    cJSON_AddItemToObject(j, "files", files);
    char *path = s ? NULL : par_path_join(dir, PAR_BATCH_JSON);
    if (!s)
        s = path ? par_json_write_file(path, j) : par_err(PAR_ENOMEM, "export batch: out of memory");
    par_free(path);
    cJSON_Delete(j);
    return s;
}

static cJSON *step_info_json(int64_t g, const step_fields *f, const par_batch *b)
{
    cJSON *e = cJSON_CreateObject();
    if (e) {
        cJSON_AddNumberToObject(e, "step", (double)g);
        cJSON_AddNumberToObject(e, "n_samples", (double)f->n_samples);
        cJSON_AddNumberToObject(e, "max_samples_per_row", (double)f->max_row_samples);
        cJSON_AddNumberToObject(e, "n_main", (double)b->n_labels);
        cJSON_AddNumberToObject(e, "n_mtp", (double)b->n_mtp_labels);
    }
    return e;
}

par_status par_batch_export(const par_batch_export_opts *o, const char *out_dir, par_batch_export_info *info)
{
    batch_src b;
    memset(&b, 0, sizeof b);
    char *tmp = NULL, *npy = NULL;
    cJSON *steps_info = cJSON_CreateArray();
    par_status s = steps_info ? src_open(&b, o) : par_err(PAR_ENOMEM, "export batch: out of memory");
    if (!s && b.steps < 1)
        s = par_err(PAR_EINVAL, "export batch: nothing to export (%lld steps)", (long long)b.steps);
    if (!s)
        s = par_adir_begin(out_dir, &tmp);
    if (!s && (!(npy = par_path_join(tmp, "npy")) || mkdir(npy, 0777) != 0))
        s = par_err(PAR_EIO, "export batch: cannot create %s/npy", tmp);
    for (int64_t k = 0; !s && k < b.steps; k++) {
        par_batch batch;
        step_fields f;
        memset(&batch, 0, sizeof batch);
        s = src_step(&b, k, &batch);
        if (!s)
            s = fill_fields(&f, &batch);
        if (!s) {
            s = write_step(&f, tmp, b.first_step + k);
            cJSON *e = s ? NULL : step_info_json(b.first_step + k, &f, &batch);
            if (!s && !cJSON_AddItemToArray(steps_info, e)) {
                cJSON_Delete(e);
                s = par_err(PAR_ENOMEM, "export batch: out of memory");
            }
            step_fields_free(&f);
        }
        if (!s && k == 0)
            b.cfg.global_batch_size = batch.B, b.cfg.seq_length = batch.S;
        par_batch_free(&batch);
    }
    if (!s) {
        s = write_doc(tmp, &b, steps_info);
        steps_info = NULL;
    }
    if (!s) {
        s = par_adir_commit(tmp, out_dir);
        tmp = NULL;
    }
    if (!s && info)
        *info = (par_batch_export_info){.steps = b.steps, .B = b.cfg.global_batch_size, .S = b.cfg.seq_length,
                                        .first_step = b.first_step};
    par_adir_abort(tmp);
    par_free(npy);
    cJSON_Delete(steps_info);
    src_close(&b);
    return s;
}
