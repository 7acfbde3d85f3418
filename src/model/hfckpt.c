/* model/hfckpt.c - export of a parity parameter file as a Hugging Face-style
 * DeepSeek-V4 checkpoint directory, and the import back (model/hfckpt.h). */
#include "model/hfckpt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "model/hfquant.h"
#include "model/params.h"

par_status par_hf_tensor_convert(const par_tensor *t, par_dtype dt, const char *what, par_tensor *out)
{
    int fsrc = par_dtype_is_float(t->dtype), fdst = par_dtype_is_float(dt);
    if (fsrc != fdst)
        return par_err(PAR_EMISMATCH, "%s: %s cannot become %s (%s values)", what, par_dtype_name(t->dtype),
                       par_dtype_name(dt), fsrc ? "float" : "integer");
    par_tensor r;
    par_status s = par_tensor_alloc(&r, dt, t->ndim, t->shape, PAR_TAG_IO);
    if (s)
        return s;
    int64_t n = par_tensor_numel(t);
    if (t->dtype == dt) {
        memcpy(r.data, t->data, par_tensor_nbytes(t));
    } else if (fdst) {
        for (int64_t i = 0; i < n; i++) {
            double v = par_tensor_get_f64(t, i);
            if (dt == PAR_F64)
                ((double *)r.data)[i] = v;
            else if (dt == PAR_F32)
                ((float *)r.data)[i] = (float)v;
            else
                ((uint16_t *)r.data)[i] = par_bf16_from_f64(v);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t v = t->dtype == PAR_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
            if (dt == PAR_I32 && (v < INT32_MIN || v > INT32_MAX)) {
                par_tensor_free(&r);
                return par_err(PAR_ERANGE, "%s: element %lld = %lld does not fit in I32", what, (long long)i,
                               (long long)v);
            }
            if (dt == PAR_I64)
                ((int64_t *)r.data)[i] = v;
            else
                ((int32_t *)r.data)[i] = (int32_t)v;
        }
    }
    *out = r;
    return PAR_OK;
}

/* Shape of table entry p as a tensor shape. */
static void entry_shape(const par_param *p, int *ndim, int64_t shape[PAR_MAX_DIMS])
{
    *ndim = p->ndim;
    shape[0] = p->shape[0];
    shape[1] = p->shape[1];
}

/* Checks tensor t against table entry p: same shape; a float for a float
 * entry, an integer for tid2eid. */
static par_status check_entry(const par_param *p, const par_tensor *t, const char *label, const char *name)
{
    int nd;
    int64_t sh[PAR_MAX_DIMS];
    entry_shape(p, &nd, sh);
    par_tensor want = par_tensor_view(PAR_F64, nd, sh, NULL);
    char a[64], b[64];
    if (!par_tensor_same_shape(&want, t))
        return par_err(PAR_EMISMATCH, "%s: tensor '%s' has shape %s, the config's table says %s", label, name,
                       par_shape_str(t->ndim, t->shape, a, sizeof a), par_shape_str(nd, sh, b, sizeof b));
    int want_float = p->dtype == PAR_PDT_REAL;
    if (par_dtype_is_float(t->dtype) != want_float)
        return par_err(PAR_EMISMATCH, "%s: tensor '%s' is %s, expected %s", label, name, par_dtype_name(t->dtype),
                       want_float ? "a float (F64, F32 or BF16)" : "an integer (I32 or I64)");
    return PAR_OK;
}

/* opt.<name>.<slot> -> the table index of <name> (and the slot's validity),
 * or -1. */
static int opt_entry(const par_param_table *tab, const char *n)
{
    static const char *const slots[] = {".momentum", ".exp_avg", ".exp_avg_sq"};
    if (strncmp(n, "opt.", 4))
        return -1;
    char buf[PAR_PARAM_NAME_MAX + 16];
    for (size_t k = 0; k < 3; k++) {
        size_t len = strlen(n + 4), sl = strlen(slots[k]);
        if (len <= sl || len - sl >= sizeof buf || strcmp(n + 4 + len - sl, slots[k]))
            continue;
        memcpy(buf, n + 4, len - sl);
        buf[len - sl] = 0;
        int i = par_param_find(tab, buf);
        if (i >= 0)
            return i;
    }
    return -1;
}

/* ---------------------------------------------------------------- export -- */

typedef struct {
    const par_param_table *tab;
    const par_st_file *src;
    const char *label;
    par_hf_dtype dtype;
    int quantize;  /* the release's FP8 / FP4 storage */
    par_st_file **hints; /* the storage whose .scale tensors to reuse (opts.scales_from) */
    int n_hints;
    int64_t rescaled;    /* tiles a reused scale did not represent exactly */
    int *src_of;   /* [tab->n] index of the entry's tensor in src   */
    int *shard_of; /* [tab->n] shard (0-based) of the entry         */
    int n_shards, n_opt;
    int64_t total;
} export_plan;

/* Every table entry found and checked; every other tensor of the source an
 * optimizer slot of an entry. */
static par_status match_source(export_plan *x)
{
    const par_param_table *tab = x->tab;
    for (int i = 0; i < tab->n; i++) {
        int k = par_st_index(x->src, tab->p[i].name);
        if (k < 0)
            return par_err(PAR_ENOTFOUND, "%s: no tensor '%s' (the config's table has %d tensors: is the "
                           "config the one that produced this file?)", x->label, tab->p[i].name, tab->n);
        par_status s = check_entry(&tab->p[i], par_st_tensor(x->src, k), x->label, tab->p[i].name);
        if (s)
            return s;
        x->src_of[i] = k;
    }
    for (int k = 0; k < par_st_count(x->src); k++) {
        const char *n = par_st_name(x->src, k);
        if (par_param_find(tab, n) >= 0)
            continue;
        int i = opt_entry(tab, n);
        if (i < 0)
            return par_err(PAR_EINVAL, "%s: tensor '%s' is neither a parameter of the config's table nor "
                           "its optimizer state (opt.<name>.momentum|exp_avg|exp_avg_sq)", x->label, n);
        const par_tensor *t = par_st_tensor(x->src, k);
        par_status s = check_entry(&tab->p[i], t, x->label, n);
        if (!s && !par_dtype_is_float(t->dtype))
            s = par_err(PAR_EMISMATCH, "%s: optimizer tensor '%s' is not a float", x->label, n);
        if (s)
            return s;
        x->n_opt++;
    }
    return PAR_OK;
}

/* The storage class of entry p in this export: FP8 / FP4 only when quantizing. */
static par_hf_store export_store(const export_plan *x, const par_param *p)
{
    par_hf_store st = par_hf_store_of(p);
    return (x->quantize && (st == PAR_HF_STORE_FP8 || st == PAR_HF_STORE_FP4)) ? st : PAR_HF_STORE_BF16;
}

/* Bytes entry p takes in the export (codes + scale when quantized). */
static int64_t entry_bytes(const export_plan *x, const par_param *p)
{
    par_hf_store st = export_store(x, p);
    if (st == PAR_HF_STORE_BF16 || p->ndim != 2)
        return p->numel * (int64_t)par_dtype_size(par_hf_export_dtype(p, x->dtype));
    int64_t out = p->shape[0], in = p->shape[1];
    if (st == PAR_HF_STORE_FP4)
        return out * (in / 2) + out * ((in + 31) / 32);
    return out * in + ((out + 127) / 128) * ((in + 127) / 128);
}

/* NAME.weight -> NAME.scale into buf. */
static const char *scale_name(const char *w, char *buf, size_t n)
{
    size_t len = strlen(w), sl = strlen(".weight");
    if (len > sl && !strcmp(w + len - sl, ".weight"))
        len -= sl;
    snprintf(buf, n, "%.*s.scale", (int)len, w);
    return buf;
}

/* Entry i of shard k: converted (or quantized: codes + scale) into conv[*used..]. */
static par_status add_param(export_plan *x, int i, par_st_writer *w, par_tensor *conv, int *used)
{
    const par_param *p = &x->tab->p[i];
    const par_tensor *src = par_st_tensor(x->src, x->src_of[i]);
    par_hf_store st = export_store(x, p);
    par_status s;
    if (st == PAR_HF_STORE_BF16 || p->ndim != 2) {
        s = par_hf_tensor_convert(src, par_hf_export_dtype(p, x->dtype), p->name, &conv[*used]);
        return s ? s : par_st_writer_add(w, p->name, &conv[(*used)++]);
    }
    char sn[PAR_PARAM_NAME_MAX + 16];
    scale_name(p->name, sn, sizeof sn);
    const par_tensor *hint = NULL;
    for (int k = 0; !hint && k < x->n_hints; k++)
        hint = par_st_find(x->hints[k], sn);
    s = par_hfquant_quantize(p->name, st, src, hint, &conv[*used], &conv[*used + 1], &x->rescaled);
    if (s)
        return s;
    *used += 2;
    s = par_st_writer_add(w, p->name, &conv[*used - 2]);
    return s ? s : par_st_writer_add(w, sn, &conv[*used - 1]);
}

/* Greedy shards in table order: a shard is closed before it would pass the cap. */
static void plan_shards(export_plan *x, int64_t cap)
{
    int64_t cur = 0;
    int k = 0;
    x->total = 0;
    for (int i = 0; i < x->tab->n; i++) {
        const par_param *p = &x->tab->p[i];
        int64_t bytes = entry_bytes(x, p);
        if (cap > 0 && cur > 0 && cur + bytes > cap) {
            k++;
            cur = 0;
        }
        cur += bytes;
        x->total += bytes;
        x->shard_of[i] = k;
    }
    x->n_shards = k + 1;
}

static void shard_name(char *buf, size_t n, int k, int count)
{
    snprintf(buf, n, "model-%05d-of-%05d.safetensors", k + 1, count);
}

/* Writes one set of converted tensors: entries with shard_of == k (k >= 0),
 * or the optimizer tensors (k < 0), into dir/name. */
static par_status write_part(export_plan *x, int k, const char *dir, const char *name)
{
    int n = par_st_count(x->src);
    par_tensor *conv = par_calloc((size_t)(2 * n + 1), sizeof *conv, PAR_TAG_IO);
    par_st_writer *w = NULL;
    par_status s = conv ? par_st_writer_new(&w) : par_err(PAR_ENOMEM, "export: out of memory");
    if (!s)
        s = par_st_writer_meta(w, "format", "pt");
    int used = 0;
    for (int i = 0; !s && k >= 0 && i < x->tab->n; i++) {
        if (x->shard_of[i] == k)
            s = add_param(x, i, w, conv, &used);
    }
    par_dtype odt = x->dtype == PAR_HF_FP64 ? PAR_F64 : PAR_F32; /* optimizer state: never bf16 */
    for (int j = 0; !s && k < 0 && j < n; j++) {
        const char *nm = par_st_name(x->src, j);
        if (par_param_find(x->tab, nm) >= 0)
            continue;
        s = par_hf_tensor_convert(par_st_tensor(x->src, j), odt, nm, &conv[used]);
        if (!s)
            s = par_st_writer_add(w, nm, &conv[used++]);
    }
    char *path = s ? NULL : par_path_join(dir, name);
    if (!s)
        s = path ? par_st_writer_write(w, path) : par_err(PAR_ENOMEM, "export: out of memory");
    par_free(path);
    par_st_writer_free(w);
    for (int i = 0; conv && i < used; i++)
        par_tensor_free(&conv[i]);
    par_free(conv);
    return s;
}

static par_status write_index(const export_plan *x, const char *dir)
{
    cJSON *j = cJSON_CreateObject();
    cJSON *meta = j ? cJSON_AddObjectToObject(j, "metadata") : NULL;
    cJSON *map = j ? cJSON_AddObjectToObject(j, "weight_map") : NULL;
    int ok = meta && map && cJSON_AddNumberToObject(meta, "total_size", (double)x->total);
    char shard[64], sn[PAR_PARAM_NAME_MAX + 16];
    for (int i = 0; ok && i < x->tab->n; i++) {
        const par_param *p = &x->tab->p[i];
        shard_name(shard, sizeof shard, x->shard_of[i], x->n_shards);
        ok = cJSON_AddStringToObject(map, p->name, shard) != NULL;
        if (ok && export_store(x, p) != PAR_HF_STORE_BF16 && p->ndim == 2)
            ok = cJSON_AddStringToObject(map, scale_name(p->name, sn, sizeof sn), shard) != NULL;
    }
    char *path = ok ? par_path_join(dir, PAR_HF_INDEX_NAME) : NULL;
    par_status s = path ? par_json_write_file(path, j) : par_err(PAR_ENOMEM, "export: out of memory");
    par_free(path);
    cJSON_Delete(j);
    return s;
}

static par_status write_config(const par_config *cfg, par_hf_export_opts *o, const char *dir)
{
    cJSON *j = par_hf_config_json(cfg, o->dtype, o->source);
    o->source = NULL;
    if (j && o->quantize && !par_hf_quant_config_add(j)) {
        cJSON_Delete(j);
        j = NULL;
    }
    char *path = j ? par_path_join(dir, PAR_HF_CONFIG_NAME) : NULL;
    par_status s = path ? par_json_write_file(path, j) : par_err(PAR_ENOMEM, "export: out of memory");
    par_free(path);
    cJSON_Delete(j);
    return s;
}

/* The shards of checkpoint directory dir (its index's files, or
 * model.safetensors), opened for their .scale tensors. */
static par_status open_hints(export_plan *x, const char *dir)
{
    cJSON *idx = NULL;
    char *ip = par_path_join(dir, PAR_HF_INDEX_NAME);
    par_status s = ip ? PAR_OK : par_err(PAR_ENOMEM, "export: out of memory");
    int have = ip && par_path_exists(ip);
    const cJSON *map = NULL;
    if (!s && have && !(s = par_json_read_file(ip, &idx)) && !(map = par_json_obj(idx, "weight_map")))
        s = par_err(PAR_EFORMAT, "%s: needs the object 'weight_map'", ip);
    int n = map ? cJSON_GetArraySize(map) : 1;
    if (!s && !(x->hints = par_calloc((size_t)(n ? n : 1), sizeof *x->hints, PAR_TAG_IO)))
        s = par_err(PAR_ENOMEM, "export: out of memory");
    for (const cJSON *e = map ? map->child : NULL; !s && e; e = e->next) {
        int seen = !cJSON_IsString(e) || strchr(e->valuestring, '/');
        for (const cJSON *f = map->child; !seen && f != e; f = f->next)
            seen = cJSON_IsString(f) && !strcmp(f->valuestring, e->valuestring);
        char *fp = seen ? NULL : par_path_join(dir, e->valuestring);
        if (fp && !(s = par_st_read_storage(fp, &x->hints[x->n_hints])))
            x->n_hints++;
        par_free(fp);
    }
    char *mp = (!s && !map) ? par_path_join(dir, "model.safetensors") : NULL;
    if (mp && !(s = par_st_read_storage(mp, &x->hints[0])))
        x->n_hints = 1;
    par_free(mp);
    par_free(ip);
    cJSON_Delete(idx);
    return s;
}

static int count_quantized(const export_plan *x)
{
    int n = 0;
    for (int i = 0; i < x->tab->n; i++)
        n += export_store(x, &x->tab->p[i]) != PAR_HF_STORE_BF16 && x->tab->p[i].ndim == 2;
    return n;
}

par_status par_hf_export(const par_config *cfg, const par_st_file *params, const char *label,
                         const char *out_dir, par_hf_export_opts *o, par_hf_export_info *info)
{
    par_param_table tab;
    par_status s = par_param_table_build(&tab, cfg);
    if (s) {
        cJSON_Delete(o->source);
        o->source = NULL;
        return s;
    }
    export_plan x = {.tab = &tab, .src = params, .label = label, .dtype = o->dtype, .quantize = o->quantize};
    x.src_of = par_calloc((size_t)tab.n, sizeof *x.src_of, PAR_TAG_IO);
    x.shard_of = par_calloc((size_t)tab.n, sizeof *x.shard_of, PAR_TAG_IO);
    char *tmp = NULL;
    s = (x.src_of && x.shard_of) ? match_source(&x) : par_err(PAR_ENOMEM, "export: out of memory");
    if (!s && o->quantize && o->scales_from)
        s = open_hints(&x, o->scales_from);
    if (!s) {
        plan_shards(&x, o->max_shard_bytes);
        s = par_adir_begin(out_dir, &tmp);
    }
    char name[64];
    for (int k = 0; !s && k < x.n_shards; k++) {
        shard_name(name, sizeof name, k, x.n_shards);
        s = write_part(&x, k, tmp, name);
    }
    if (!s && x.n_opt)
        s = write_part(&x, -1, tmp, PAR_HF_OPTIM_NAME);
    if (!s)
        s = write_index(&x, tmp);
    if (!s)
        s = write_config(cfg, o, tmp);
    if (!s) {
        s = par_adir_commit(tmp, out_dir);
        tmp = NULL;
    }
    par_adir_abort(tmp);
    cJSON_Delete(o->source);
    o->source = NULL;
    if (!s && info)
        *info = (par_hf_export_info){.n_tensors = tab.n, .n_shards = x.n_shards, .n_opt = x.n_opt,
                                     .total_bytes = x.total, .n_quantized = count_quantized(&x),
                                     .n_rescaled = x.rescaled};
    for (int k = 0; k < x.n_hints; k++)
        par_st_close(x.hints[k]);
    par_free(x.hints);
    x.hints = NULL;
    par_free(x.src_of);
    par_free(x.shard_of);
    par_param_table_free(&tab);
    return s;
}

/* ---------------------------------------------------------------- import -- */

typedef struct {
    const char *dir;
    par_param_table tab;
    par_dtype fdt;       /* F64 or F32 */
    par_tensor *got;     /* [tab.n]; data NULL until read */
    par_tensor *qcodes;  /* [tab.n] quantized storage (owned copies), or data NULL */
    par_tensor *qscale;  /* [tab.n] its .scale (owned copy), or data NULL */
    int n_quant;         /* weights dequantized */
    par_st_file *optf;   /* parity_optimizer.safetensors, or NULL */
    par_tensor *opt;     /* [count of optf] converted */
    int n_opt, n_skipped;
    int64_t n_in_files;  /* tensors found in the shards (skipped and scales too) */
} import_ctx;

static par_status read_json_in(const char *dir, const char *name, cJSON **out)
{
    char *path = par_path_join(dir, name);
    if (!path)
        return par_err(PAR_ENOMEM, "import: out of memory");
    par_status s = par_json_read_file(path, out);
    par_free(path);
    return s;
}

static par_status owned_copy(const par_tensor *t, const char *what, par_tensor *out)
{
    par_tensor r;
    par_status s = par_tensor_alloc(&r, t->dtype, t->ndim, t->shape, PAR_TAG_IO);
    if (s)
        return s;
    memcpy(r.data, t->data, par_tensor_nbytes(t));
    (void)what;
    *out = r;
    return PAR_OK;
}

/* NAME.scale: kept for NAME.weight (dequantized in import_dequant). */
static par_status keep_scale(import_ctx *c, const char *where, const char *hf, const char *name, const par_tensor *t)
{
    char w[300];
    size_t n = strlen(name) - strlen(".scale");
    snprintf(w, sizeof w, "%.*s.weight", (int)n, name);
    int i = par_param_find(&c->tab, w);
    if (i < 0)
        return par_err(PAR_EINVAL, "%s: tensor '%s' is the scale of '%s', which is not a parameter of the "
                       "config's table", where, hf, w);
    if (c->qscale[i].data)
        return par_err(PAR_EINVAL, "%s: tensor '%s' (as '%s') appears twice", where, hf, name);
    return owned_copy(t, hf, &c->qscale[i]);
}

/* Pairs every quantized weight with its scale and dequantizes it. */
static par_status import_dequant(import_ctx *c)
{
    for (int i = 0; i < c->tab.n; i++) {
        const par_param *p = &c->tab.p[i];
        int hc = c->qcodes[i].data != NULL, hs = c->qscale[i].data != NULL;
        if (!hc && !hs)
            continue;
        if (hs && c->got[i].data)
            return par_err(PAR_EINVAL, "%s: '%s' is stored unquantized (%s) but has a .scale tensor", c->dir,
                           p->name, par_dtype_name(c->got[i].dtype));
        if (hs != hc)
            return par_err(PAR_ENOTFOUND, "%s: '%s' %s", c->dir, p->name,
                           hc ? "is quantized but has no .scale tensor" : "has a .scale tensor but no weight");
        int64_t shape[2] = {p->shape[0], p->ndim == 2 ? p->shape[1] : 1};
        if (p->ndim != 2)
            return par_err(PAR_EFORMAT, "%s: '%s' is stored quantized, but it is not a 2-D weight", c->dir, p->name);
        par_status s = par_hfquant_dequant(c->dir, p->name, shape, &c->qcodes[i], &c->qscale[i], c->fdt, &c->got[i]);
        if (s)
            return s;
        c->n_quant++;
    }
    return PAR_OK;
}

/* One checkpoint tensor: renamed, classified, checked, converted. */
static par_status import_tensor(import_ctx *c, const char *file, const char *hf, const par_tensor *t,
                                const cJSON *map)
{
    char name[256], where[512];
    par_hf_name_kind kind;
    par_status s = par_hf_normalize_name(hf, name, sizeof name, &kind);
    snprintf(where, sizeof where, "%s/%s", c->dir, file);
    const char *mapped = map ? par_json_str(map, hf) : NULL;
    if (!s && map && (!mapped || strcmp(mapped, file)))
        s = par_err(PAR_EFORMAT, "%s: tensor '%s' is not listed for this file in %s (it says %s)", where, hf,
                    PAR_HF_INDEX_NAME, mapped ? mapped : "nothing");
    c->n_in_files++;
    if (s || kind == PAR_HF_NAME_SKIP) {
        c->n_skipped += !s;
        return s;
    }
    if (kind == PAR_HF_NAME_SCALE)
        return keep_scale(c, where, hf, name, t);
    int i = par_param_find(&c->tab, name);
    if (i < 0)
        return par_err(PAR_EINVAL, "%s: tensor '%s' (as '%s') is not a parameter of the config's table", where,
                       hf, name);
    if (c->got[i].data || c->qcodes[i].data)
        return par_err(PAR_EINVAL, "%s: tensor '%s' (as '%s') appears twice", where, hf, name);
    const par_param *p = &c->tab.p[i];
    if (par_hfquant_is_codes(t->dtype) && p->dtype == PAR_PDT_REAL)
        return owned_copy(t, hf, &c->qcodes[i]); /* dequantized once its scale is read */
    if ((s = check_entry(p, t, where, hf)))
        return s;
    s = par_hf_tensor_convert(t, p->dtype == PAR_PDT_REAL ? c->fdt : PAR_I32, hf, &c->got[i]);
    if (!s && p->dtype == PAR_PDT_I32) {
        const int32_t *v = c->got[i].data;
        for (int64_t k = 0; k < p->numel; k++)
            if (v[k] < 0 || v[k] >= c->tab.cfg.n_routed_experts)
                return par_err(PAR_ERANGE, "%s: '%s' element %lld = %d is no expert in [0, %lld)", where, hf,
                               (long long)k, v[k], (long long)c->tab.cfg.n_routed_experts);
    }
    return s;
}

static par_status import_file(import_ctx *c, const char *file, const cJSON *map)
{
    char *path = par_path_join(c->dir, file);
    if (!path)
        return par_err(PAR_ENOMEM, "import: out of memory");
    par_st_file *f = NULL;
    par_status s = par_st_read_storage(path, &f);
    par_free(path);
    for (int k = 0; !s && k < par_st_count(f); k++)
        s = import_tensor(c, file, par_st_name(f, k), par_st_tensor(f, k), map);
    if (f)
        par_st_close(f);
    return s;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The shards: the distinct files of the index's weight_map (sorted), or
 * model.safetensors alone when there is no index. */
static par_status import_shards(import_ctx *c)
{
    cJSON *idx = NULL;
    const cJSON *map = NULL;
    char *ipath = par_path_join(c->dir, PAR_HF_INDEX_NAME);
    if (!ipath)
        return par_err(PAR_ENOMEM, "import: out of memory");
    int have_index = par_path_exists(ipath);
    par_free(ipath);
    if (!have_index)
        return import_file(c, "model.safetensors", NULL);
    par_status s = read_json_in(c->dir, PAR_HF_INDEX_NAME, &idx);
    if (!s && !(map = par_json_obj(idx, "weight_map")))
        s = par_err(PAR_EFORMAT, "%s/%s: needs the object 'weight_map'", c->dir, PAR_HF_INDEX_NAME);
    int n = s ? 0 : cJSON_GetArraySize(map), nf = 0;
    const char **files = par_calloc((size_t)(n > 0 ? n : 1), sizeof *files, PAR_TAG_IO);
    if (!s && !files)
        s = par_err(PAR_ENOMEM, "import: out of memory");
    for (const cJSON *e = s ? NULL : map->child; e; e = e->next) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !strcmp(e->valuestring, "..")) {
            s = par_err(PAR_EFORMAT, "%s/%s: weight_map['%s'] is not a plain file name", c->dir, PAR_HF_INDEX_NAME,
                        e->string);
            break;
        }
        files[nf++] = e->valuestring;
    }
    if (!s)
        qsort(files, (size_t)nf, sizeof *files, cmp_str);
    for (int k = 0; !s && k < nf; k++)
        if (k == 0 || strcmp(files[k], files[k - 1]))
            s = import_file(c, files[k], map);
    if (!s && c->n_in_files != n)
        s = par_err(PAR_EFORMAT, "%s/%s lists %d tensors, its shards hold %lld", c->dir, PAR_HF_INDEX_NAME, n,
                    (long long)c->n_in_files);
    par_free(files);
    cJSON_Delete(idx);
    return s;
}

static par_status import_optim(import_ctx *c)
{
    char *path = par_path_join(c->dir, PAR_HF_OPTIM_NAME);
    if (!path)
        return par_err(PAR_ENOMEM, "import: out of memory");
    par_status s = par_path_exists(path) ? par_st_read(path, &c->optf) : PAR_OK;
    int n = c->optf ? par_st_count(c->optf) : 0;
    if (!s && n && !(c->opt = par_calloc((size_t)n, sizeof *c->opt, PAR_TAG_IO)))
        s = par_err(PAR_ENOMEM, "import: out of memory");
    for (int k = 0; !s && k < n; k++) {
        const char *nm = par_st_name(c->optf, k);
        const par_tensor *t = par_st_tensor(c->optf, k);
        int i = opt_entry(&c->tab, nm);
        if (i < 0)
            s = par_err(PAR_EINVAL, "%s: tensor '%s' is not opt.<parameter>.<slot> of the config's table", path, nm);
        if (!s && !par_dtype_is_float(t->dtype))
            s = par_err(PAR_EMISMATCH, "%s: optimizer tensor '%s' is not a float", path, nm);
        if (!s)
            s = check_entry(&c->tab.p[i], t, path, nm);
        if (!s && !(s = par_hf_tensor_convert(t, c->fdt, nm, &c->opt[k])))
            c->n_opt++;
    }
    par_free(path);
    return s;
}

static par_status import_write(import_ctx *c, const char *out_file)
{
    for (int i = 0; i < c->tab.n; i++)
        if (!c->got[i].data && c->tab.p[i].numel > 0)
            return par_err(PAR_ENOTFOUND, "%s: parameter '%s' is missing (the config's table has %d tensors)",
                           c->dir, c->tab.p[i].name, c->tab.n);
    par_st_writer *w = NULL;
    par_status s = par_st_writer_new(&w);
    if (!s)
        s = par_st_writer_meta(w, "format", "parity-params");
    if (!s)
        s = par_st_writer_meta(w, "generator", PAR_HF_IMPORT_GENERATOR);
    if (!s)
        s = par_st_writer_meta(w, "precision", c->fdt == PAR_F64 ? "f64" : "f32");
    if (!s)
        s = par_st_writer_meta(w, "source", c->dir);
    for (int i = 0; !s && i < c->tab.n; i++)
        s = par_st_writer_add(w, c->tab.p[i].name, &c->got[i]);
    for (int k = 0; !s && k < c->n_opt; k++)
        s = par_st_writer_add(w, par_st_name(c->optf, k), &c->opt[k]);
    if (!s)
        s = par_st_writer_write(w, out_file);
    par_st_writer_free(w);
    return s;
}

par_status par_hf_import(const char *dir, int bits, const char *out_file, par_hf_import_info *info)
{
    if (bits != 64 && bits != 32)
        return par_err(PAR_EINVAL, "import: precision must be 64 or 32 bits (got %d)", bits);
    import_ctx c = {.dir = dir, .fdt = bits == 64 ? PAR_F64 : PAR_F32};
    cJSON *cj = NULL;
    par_config cfg;
    char label[512];
    snprintf(label, sizeof label, "%s/%s", dir, PAR_HF_CONFIG_NAME);
    par_status s = read_json_in(dir, PAR_HF_CONFIG_NAME, &cj);
    if (!s)
        s = par_hf_config_from_json(&cfg, cj, label);
    cJSON_Delete(cj);
    if (s)
        return s;
    if ((s = par_param_table_build(&c.tab, &cfg)))
        return s;
    c.got = par_calloc((size_t)c.tab.n, sizeof *c.got, PAR_TAG_IO);
    c.qcodes = par_calloc((size_t)c.tab.n, sizeof *c.qcodes, PAR_TAG_IO);
    c.qscale = par_calloc((size_t)c.tab.n, sizeof *c.qscale, PAR_TAG_IO);
    if (!c.got || !c.qcodes || !c.qscale)
        s = par_err(PAR_ENOMEM, "import: out of memory");
    if (!s)
        s = import_shards(&c);
    if (!s)
        s = import_dequant(&c);
    if (!s)
        s = import_optim(&c);
    if (!s)
        s = import_write(&c, out_file);
    if (!s && info)
        *info = (par_hf_import_info){.cfg = cfg, .n_tensors = c.tab.n, .n_opt = c.n_opt, .n_skipped = c.n_skipped,
                                     .n_quantized = c.n_quant};
    for (int i = 0; c.got && i < c.tab.n; i++)
        par_tensor_free(&c.got[i]);
    for (int i = 0; c.qcodes && c.qscale && i < c.tab.n; i++) {
        par_tensor_free(&c.qcodes[i]);
        par_tensor_free(&c.qscale[i]);
    }
    par_free(c.qcodes);
    par_free(c.qscale);
    for (int k = 0; c.opt && k < c.n_opt; k++)
        par_tensor_free(&c.opt[k]);
    par_free(c.got);
    par_free(c.opt);
    par_st_close(c.optf);
    par_param_table_free(&c.tab);
    return s;
}
