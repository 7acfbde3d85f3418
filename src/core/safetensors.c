#include "core/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/rng.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

typedef struct {
    char *name;
    par_tensor t;       /* view into buf, or an owned aligned copy */
    uint64_t begin;     /* data_offsets, relative to the data section */
    uint64_t end;
} st_entry;

struct par_st_file {
    char *label;
    int storage;        /* storage-only dtypes accepted (par_st_read_storage) */
    unsigned char *buf; /* the whole file (+1 NUL byte, unless mapped) */
    size_t len;
    int mapped;         /* buf is a mapping of the file (par_st_map): unmapped, not freed */
    int n;
    st_entry *e;        /* sorted by name */
    int nmeta;
    char **mkey;        /* sorted by key */
    char **mval;
};

/* ---- reading ---------------------------------------------------------- */

static uint64_t get_u64le(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int cmp_entry_ptr_begin(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

void par_st_close(par_st_file *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n; i++) {
        par_free(f->e[i].name);
        par_tensor_free(&f->e[i].t);
    }
    for (int i = 0; i < f->nmeta; i++) {
        par_free(f->mkey[i]);
        par_free(f->mval[i]);
    }
    par_free(f->e);
    par_free(f->mkey);
    par_free(f->mval);
    if (f->mapped)
        par_file_unmap(f->buf, f->len);
    else
        par_free(f->buf);
    par_free(f->label);
    par_free(f);
}

/* Parses one tensor entry into *e (name already set). */
static par_status parse_entry(const char *label, const char *name, const cJSON *j, uint64_t data_len, int storage,
                              st_entry *e)
{
    if (!cJSON_IsObject(j))
        return par_err(PAR_EFORMAT, "%s: tensor '%s': entry is not a JSON object", label, name);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!jd || !js || !jo)
        return par_err(PAR_EFORMAT, "%s: tensor '%s': missing key \"%s\"", label, name,
                       !jd ? "dtype" : !js ? "shape" : "data_offsets");
    if (!cJSON_IsString(jd))
        return par_err(PAR_EFORMAT, "%s: tensor '%s': dtype is not a string", label, name);
    par_dtype dt;
    if ((storage ? par_dtype_parse_storage : par_dtype_parse)(jd->valuestring, &dt) != PAR_OK)
        return par_err(PAR_EFORMAT, "%s: tensor '%s': dtype '%s' is not supported (parity reads F64 F32 BF16 I32 I64%s)",
                       label, name, jd->valuestring, storage ? " F8_E4M3 F8_E8M0 I8 U8" : "");
    if (!cJSON_IsArray(js))
        return par_err(PAR_EFORMAT, "%s: tensor '%s': shape is not a list", label, name);
    int nd = cJSON_GetArraySize(js);
    if (nd > PAR_MAX_DIMS)
        return par_err(PAR_EFORMAT, "%s: tensor '%s': shape has %d dims; parity supports at most %d", label, name, nd,
                       PAR_MAX_DIMS);
    int64_t shape[PAR_MAX_DIMS] = {0};
    int k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, js)
    {
        int64_t v;
        if (!par_json_as_int(it, &v) || v < 0)
            return par_err(PAR_EFORMAT, "%s: tensor '%s': shape entry %d is not a non-negative integer", label, name,
                           k);
        shape[k++] = v;
    }
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return par_err(PAR_EFORMAT, "%s: tensor '%s': data_offsets is not a list of two integers", label, name);
    int64_t off[2];
    for (int i = 0; i < 2; i++) {
        if (!par_json_as_int(cJSON_GetArrayItem(jo, i), &off[i]) || off[i] < 0)
            return par_err(PAR_EFORMAT, "%s: tensor '%s': data_offsets[%d] is not a non-negative integer", label,
                           name, i);
    }
    if (off[0] > off[1])
        return par_err(PAR_EFORMAT, "%s: tensor '%s': data_offsets [%lld,%lld] begin after they end", label, name,
                       (long long)off[0], (long long)off[1]);
    if ((uint64_t)off[1] > data_len)
        return par_err(PAR_EFORMAT, "%s: tensor '%s': data_offsets [%lld,%lld] run past the data section (%llu bytes)",
                       label, name, (long long)off[0], (long long)off[1], (unsigned long long)data_len);
    size_t es = par_dtype_size(dt);
    int64_t numel = par_shape_numel(nd, shape, es);
    char sb[160];
    if (numel < 0)
        return par_err(PAR_EFORMAT, "%s: tensor '%s': shape %s has too many bytes (overflow)", label, name,
                       par_shape_str(nd, shape, sb, sizeof sb));
    uint64_t need = (uint64_t)numel * es;
    if ((uint64_t)(off[1] - off[0]) != need)
        return par_err(PAR_EFORMAT,
                       "%s: tensor '%s': data_offsets [%lld,%lld] hold %lld bytes but %s %s needs %llu", label,
                       name, (long long)off[0], (long long)off[1], (long long)(off[1] - off[0]),
                       par_dtype_name(dt), par_shape_str(nd, shape, sb, sizeof sb), (unsigned long long)need);
    memset(&e->t, 0, sizeof e->t);
    e->t.dtype = dt;
    e->t.ndim = nd;
    for (int i = 0; i < nd; i++)
        e->t.shape[i] = shape[i];
    e->begin = (uint64_t)off[0];
    e->end = (uint64_t)off[1];
    return PAR_OK;
}

static par_status parse_meta(par_st_file *f, const cJSON *j)
{
    const char *label = f->label;
    if (!cJSON_IsObject(j))
        return par_err(PAR_EFORMAT, "%s: \"__metadata__\" is not a JSON object", label);
    int n = cJSON_GetArraySize(j);
    if (n == 0)
        return PAR_OK;
    f->mkey = par_calloc((size_t)n, sizeof(char *), PAR_TAG_IO);
    f->mval = par_calloc((size_t)n, sizeof(char *), PAR_TAG_IO);
    if (!f->mkey || !f->mval)
        return par_err(PAR_ENOMEM, "%s: out of memory for metadata", label);
    const cJSON *it;
    cJSON_ArrayForEach(it, j)
    {
        if (!cJSON_IsString(it))
            return par_err(PAR_EFORMAT, "%s: \"__metadata__\" entry '%s' is not a string", label, it->string);
        for (int i = 0; i < f->nmeta; i++)
            if (!strcmp(f->mkey[i], it->string))
                return par_err(PAR_EFORMAT, "%s: \"__metadata__\" key '%s' appears twice", label, it->string);
        /* insertion keeps keys sorted */
        int pos = f->nmeta;
        while (pos > 0 && strcmp(f->mkey[pos - 1], it->string) > 0)
            pos--;
        char *k = par_strdup(it->string, PAR_TAG_IO), *v = par_strdup(it->valuestring, PAR_TAG_IO);
        if (!k || !v) {
            par_free(k);
            par_free(v);
            return par_err(PAR_ENOMEM, "%s: out of memory for metadata", label);
        }
        memmove(f->mkey + pos + 1, f->mkey + pos, (size_t)(f->nmeta - pos) * sizeof(char *));
        memmove(f->mval + pos + 1, f->mval + pos, (size_t)(f->nmeta - pos) * sizeof(char *));
        f->mkey[pos] = k;
        f->mval[pos] = v;
        f->nmeta++;
    }
    return PAR_OK;
}

/* The 8-byte header length hn of a file of len bytes: within the cap and
 * the file, long enough for '{}', and the header starts with '{'. */
static par_status parse_header_len(const unsigned char *buf, size_t len, const char *label, uint64_t *hn_out)
{
    if (len < 8)
        return par_err(PAR_EFORMAT, "%s: file has %zu bytes, fewer than the 8-byte header length", label, len);
    uint64_t hn = get_u64le(buf);
    if (hn > PAR_ST_HEADER_CAP)
        return par_err(PAR_EFORMAT, "%s: header length %llu is above the cap of %llu bytes", label,
                       (unsigned long long)hn, (unsigned long long)PAR_ST_HEADER_CAP);
    if (hn > len - 8)
        return par_err(PAR_EFORMAT, "%s: header length %llu runs past the end of the file (%zu bytes follow the length)",
                       label, (unsigned long long)hn, len - 8);
    if (hn < 2)
        return par_err(PAR_EFORMAT, "%s: header of %llu bytes is too short for a JSON object ('{}')", label,
                       (unsigned long long)hn);
    if (buf[8] != '{')
        return par_err(PAR_EFORMAT, "%s: header does not start with '{'", label);
    *hn_out = hn;
    return PAR_OK;
}

/* The header object's entries: "__metadata__" (once) and the tensors, in
 * file order, into f->e / f->n. */
static par_status parse_entries(par_st_file *f, const cJSON *root, uint64_t data_len)
{
    const char *label = f->label;
    int nitems = cJSON_GetArraySize(root);
    f->e = par_calloc(nitems ? (size_t)nitems : 1, sizeof *f->e, PAR_TAG_IO);
    if (!f->e)
        return par_err(PAR_ENOMEM, "%s: out of memory for %d entries", label, nitems);
    int seen_meta = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, root)
    {
        if (!strcmp(it->string, "__metadata__")) {
            if (seen_meta++)
                return par_err(PAR_EFORMAT, "%s: \"__metadata__\" appears twice", label);
            par_status st = parse_meta(f, it);
            if (st)
                return st;
            continue;
        }
        st_entry *e = &f->e[f->n];
        par_status st = parse_entry(label, it->string, it, data_len, f->storage, e);
        if (st)
            return st;
        e->name = par_strdup(it->string, PAR_TAG_IO);
        if (!e->name)
            return par_err(PAR_ENOMEM, "%s: out of memory", label);
        f->n++;
    }
    return PAR_OK;
}

/* Sorts the entries by name; a name may appear once. */
static par_status sort_unique(par_st_file *f)
{
    qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_entry_name);
    for (int i = 1; i < f->n; i++)
        if (!strcmp(f->e[i - 1].name, f->e[i].name))
            return par_err(PAR_EFORMAT, "%s: tensor '%s' appears twice in the header", f->label, f->e[i].name);
    return PAR_OK;
}

/* The m non-empty tensors order[] (sorted by begin) tile the data section
 * of data_len bytes: no overlap, no gap, no trailing bytes. */
static par_status check_tiling(const char *label, const st_entry **order, int m, uint64_t data_len)
{
    for (int i = 1; i < m; i++) {
        const st_entry *p = order[i - 1], *q = order[i];
        if (q->begin < p->end)
            return par_err(PAR_EFORMAT, "%s: tensors '%s' [%llu,%llu] and '%s' [%llu,%llu] overlap", label, p->name,
                           (unsigned long long)p->begin, (unsigned long long)p->end, q->name,
                           (unsigned long long)q->begin, (unsigned long long)q->end);
    }
    for (int i = 0; i <= m; i++) {
        uint64_t at = i ? order[i - 1]->end : 0, next = i < m ? order[i]->begin : data_len;
        if (next == at)
            continue;
        if (i == m)
            return par_err(PAR_EFORMAT, "%s: %llu trailing bytes after the last tensor%s%s%s (the data section has "
                           "%llu bytes; safetensors data holds tensors only)", label, (unsigned long long)(next - at),
                           m ? " '" : "", m ? order[m - 1]->name : "", m ? "'" : "", (unsigned long long)data_len);
        return par_err(PAR_EFORMAT, "%s: bytes [%llu,%llu) of the data section belong to no tensor (a gap before "
                       "'%s'; safetensors data has no holes)", label, (unsigned long long)at,
                       (unsigned long long)next, order[i]->name);
    }
    return PAR_OK;
}

/* Overlap, gaps and trailing bytes: the non-empty tensors sorted by begin. */
static par_status check_layout(const par_st_file *f, uint64_t data_len)
{
    const st_entry **order = par_malloc((f->n ? (size_t)f->n : 1) * sizeof(st_entry *), PAR_TAG_IO);
    if (!order)
        return par_err(PAR_ENOMEM, "%s: out of memory", f->label);
    int m = 0;
    for (int i = 0; i < f->n; i++)
        if (f->e[i].end > f->e[i].begin)
            order[m++] = &f->e[i];
    qsort(order, (size_t)m, sizeof *order, cmp_entry_ptr_begin);
    par_status st = check_tiling(f->label, order, m, data_len);
    par_free(order);
    return st;
}

/* Each tensor's data: a view into the data section at base when aligned
 * for its dtype, else an owned aligned copy. */
static par_status bind_data(par_st_file *f, unsigned char *base)
{
    for (int i = 0; i < f->n; i++) {
        st_entry *e = &f->e[i];
        unsigned char *p = base + e->begin;
        size_t es = par_dtype_size(e->t.dtype);
        size_t nb = (size_t)(e->end - e->begin);
        if ((uintptr_t)p % es == 0) {
            e->t.data = p;
            e->t.owns = 0;
            continue;
        }
        void *c = par_malloc(nb ? nb : 1, PAR_TAG_TENSOR);
        if (!c)
            return par_err(PAR_ENOMEM, "%s: tensor '%s': out of memory for an aligned copy of %zu bytes", f->label,
                           e->name, nb);
        memcpy(c, p, nb);
        e->t.data = c;
        e->t.owns = 1;
    }
    return PAR_OK;
}

/* Takes ownership of buf (len bytes + 1 spare; or a mapping of len bytes). */
static par_status parse_owned(unsigned char *buf, size_t len, const char *label, int storage, int mapped,
                              par_st_file **out)
{
    par_status st = PAR_OK;
    cJSON *root = NULL;
    par_st_file *f = par_calloc(1, sizeof *f, PAR_TAG_IO);
    if (!f) {
        if (mapped)
            par_file_unmap(buf, len);
        else
            par_free(buf);
        return par_err(PAR_ENOMEM, "%s: out of memory", label);
    }
    f->buf = buf;
    f->len = len;
    f->mapped = mapped;
    f->storage = storage;
    f->label = par_strdup(label, PAR_TAG_IO);
    if (!f->label) {
        st = par_err(PAR_ENOMEM, "%s: out of memory", label);
        goto fail_close;
    }
    uint64_t hn = 0;
    if ((st = parse_header_len(buf, len, label, &hn)))
        goto fail_close;
    char hlabel[512];
    snprintf(hlabel, sizeof hlabel, "%s: header", label);
    if ((st = par_json_parse((const char *)buf + 8, (size_t)hn, hlabel, &root)))
        goto fail_close;
    if (!cJSON_IsObject(root)) {
        st = par_err(PAR_EFORMAT, "%s: header is not a JSON object", label);
        goto fail_close;
    }
    uint64_t data_len = len - 8 - hn;
    st = parse_entries(f, root, data_len);
    cJSON_Delete(root);
    root = NULL;
    if (st || (st = sort_unique(f)) || (st = check_layout(f, data_len)) || (st = bind_data(f, buf + 8 + hn)))
        goto fail_close;
    *out = f;
    return PAR_OK;

fail_close:
    cJSON_Delete(root);
    par_st_close(f);
    return st;
}

par_status par_st_read(const char *path, par_st_file **out)
{
    void *buf;
    size_t len;
    par_status st = par_file_read(path, PAR_TAG_IO, &buf, &len);
    if (st)
        return st;
    return parse_owned(buf, len, path, 0, 0, out);
}

par_status par_st_map(const char *path, par_st_file **out)
{
    void *buf;
    size_t len;
    par_status st = par_file_map(path, &buf, &len);
    if (st)
        return st;
    if (!len) /* nothing mapped: the reader's own message for an empty file */
        return par_st_read(path, out);
    return parse_owned(buf, len, path, 0, 1, out);
}

par_status par_st_read_storage(const char *path, par_st_file **out)
{
    void *buf;
    size_t len;
    par_status st = par_file_read(path, PAR_TAG_IO, &buf, &len);
    if (st)
        return st;
    return parse_owned(buf, len, path, 1, 0, out);
}

par_status par_st_read_mem(const void *buf, size_t len, const char *label, par_st_file **out)
{
    if (len == SIZE_MAX)
        return par_err(PAR_ERANGE, "%s: buffer too large", label);
    unsigned char *c = par_malloc(len + 1, PAR_TAG_IO);
    if (!c)
        return par_err(PAR_ENOMEM, "%s: out of memory for a %zu-byte copy", label, len);
    if (len)
        memcpy(c, buf, len);
    c[len] = 0;
    return parse_owned(c, len, label, 0, 0, out);
}

const char *par_st_label(const par_st_file *f) { return f->label; }
int par_st_count(const par_st_file *f) { return f->n; }
const char *par_st_name(const par_st_file *f, int i) { return (i >= 0 && i < f->n) ? f->e[i].name : NULL; }
const par_tensor *par_st_tensor(const par_st_file *f, int i) { return (i >= 0 && i < f->n) ? &f->e[i].t : NULL; }

int par_st_index(const par_st_file *f, const char *name)
{
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->e[mid].name, name);
        if (!c)
            return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

const par_tensor *par_st_find(const par_st_file *f, const char *name)
{
    int i = par_st_index(f, name);
    return i < 0 ? NULL : &f->e[i].t;
}

const char *par_st_meta(const par_st_file *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (!strcmp(f->mkey[i], key))
            return f->mval[i];
    return NULL;
}

int par_st_meta_count(const par_st_file *f) { return f->nmeta; }
const char *par_st_meta_key(const par_st_file *f, int i) { return (i >= 0 && i < f->nmeta) ? f->mkey[i] : NULL; }
const char *par_st_meta_value(const par_st_file *f, int i) { return (i >= 0 && i < f->nmeta) ? f->mval[i] : NULL; }

/* ---- writing ---------------------------------------------------------- */

typedef struct {
    char *name;
    par_tensor t; /* view */
    int deferred; /* declared by shape (par_st_writer_add_shape): a stream puts its data */
} w_entry;

struct par_st_writer {
    int n, cap;
    w_entry *e;
    int nm, capm;
    char **mk, **mv;
    int *slot;      /* open-addressing set of entry indices + 1 (0 = empty) */
    int nslot;      /* power of two, >= 2 * cap                             */
};

/* Finds `name` among the entries through the hash set: returns the slot
 * holding it, or the empty slot where it would go. */
static int name_slot(const par_st_writer *w, const char *name)
{
    unsigned mask = (unsigned)w->nslot - 1u;
    unsigned i = (unsigned)par_name_hash64(name) & mask;
    while (w->slot[i] && strcmp(w->e[w->slot[i] - 1].name, name) != 0)
        i = (i + 1u) & mask;
    return (int)i;
}

static par_status grow_slots(par_st_writer *w, int want)
{
    int ns = 64;
    while (ns < 2 * want)
        ns *= 2;
    if (ns <= w->nslot)
        return PAR_OK;
    int *old = w->slot;
    w->slot = par_calloc((size_t)ns, sizeof *w->slot, PAR_TAG_IO);
    if (!w->slot) {
        w->slot = old;
        return par_err(PAR_ENOMEM, "safetensors writer: out of memory");
    }
    w->nslot = ns;
    for (int k = 0; k < w->n; k++)
        w->slot[name_slot(w, w->e[k].name)] = k + 1;
    par_free(old);
    return PAR_OK;
}

par_status par_st_writer_new(par_st_writer **out)
{
    par_st_writer *w = par_calloc(1, sizeof *w, PAR_TAG_IO);
    if (!w)
        return par_err(PAR_ENOMEM, "safetensors writer: out of memory");
    *out = w;
    return PAR_OK;
}

void par_st_writer_free(par_st_writer *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n; i++)
        par_free(w->e[i].name);
    for (int i = 0; i < w->nm; i++) {
        par_free(w->mk[i]);
        par_free(w->mv[i]);
    }
    par_free(w->e);
    par_free(w->mk);
    par_free(w->mv);
    par_free(w->slot);
    par_free(w);
}

static par_status add_entry(par_st_writer *w, const char *name, const par_tensor *t, int deferred);

par_status par_st_writer_add(par_st_writer *w, const char *name, const par_tensor *t)
{
    return add_entry(w, name, t, 0);
}

par_status par_st_writer_add_shape(par_st_writer *w, const char *name, par_dtype dtype, int ndim,
                                   const int64_t *shape)
{
    if (ndim < 0 || ndim > PAR_MAX_DIMS)
        return par_err(PAR_EINVAL, "safetensors writer: tensor '%s': ndim %d not supported", name ? name : "?", ndim);
    par_tensor t = par_tensor_view(dtype, ndim, shape, NULL);
    return add_entry(w, name, &t, 1);
}

static par_status add_entry(par_st_writer *w, const char *name, const par_tensor *t, int deferred)
{
    if (!name || !t)
        return par_err(PAR_EINVAL, "safetensors writer: NULL name or tensor");
    if (!strcmp(name, "__metadata__"))
        return par_err(PAR_EINVAL, "safetensors writer: the name \"__metadata__\" is reserved");
    if (!par_dtype_valid(t->dtype) || t->ndim < 0 || t->ndim > PAR_MAX_DIMS)
        return par_err(PAR_EINVAL, "safetensors writer: tensor '%s': dtype %d / ndim %d not supported", name,
                       (int)t->dtype, t->ndim);
    int64_t nb = par_shape_numel(t->ndim, t->shape, par_dtype_size(t->dtype));
    if (nb < 0)
        return par_err(PAR_EINVAL, "safetensors writer: tensor '%s': shape has a negative dim or overflows", name);
    if (nb > 0 && !t->data && !deferred)
        return par_err(PAR_EINVAL, "safetensors writer: tensor '%s': NULL data for %lld elements", name,
                       (long long)nb);
    if (grow_slots(w, w->n + 1) != PAR_OK)
        return PAR_ENOMEM;
    int sl = name_slot(w, name);
    if (w->slot[sl])
        return par_err(PAR_EINVAL, "safetensors writer: tensor '%s' added twice", name);
    if (w->n == w->cap) {
        int nc = w->cap ? 2 * w->cap : 16;
        w_entry *ne = par_realloc(w->e, (size_t)nc * sizeof *ne, PAR_TAG_IO);
        if (!ne)
            return par_err(PAR_ENOMEM, "safetensors writer: out of memory");
        w->e = ne;
        w->cap = nc;
    }
    char *nm = par_strdup(name, PAR_TAG_IO);
    if (!nm)
        return par_err(PAR_ENOMEM, "safetensors writer: out of memory");
    w->e[w->n].name = nm;
    w->e[w->n].t = *t;
    w->e[w->n].deferred = deferred;
    if (deferred)
        w->e[w->n].t.data = NULL;
    w->e[w->n].t.owns = 0;
    w->n++;
    w->slot[sl] = w->n;
    return PAR_OK;
}

par_status par_st_writer_meta(par_st_writer *w, const char *key, const char *value)
{
    if (!key || !value)
        return par_err(PAR_EINVAL, "safetensors writer: NULL metadata key or value");
    for (int i = 0; i < w->nm; i++) {
        if (!strcmp(w->mk[i], key)) {
            char *v = par_strdup(value, PAR_TAG_IO);
            if (!v)
                return par_err(PAR_ENOMEM, "safetensors writer: out of memory");
            par_free(w->mv[i]);
            w->mv[i] = v;
            return PAR_OK;
        }
    }
    if (w->nm == w->capm) {
        int nc = w->capm ? 2 * w->capm : 8;
        char **a = par_realloc(w->mk, (size_t)nc * sizeof(char *), PAR_TAG_IO);
        if (!a)
            return par_err(PAR_ENOMEM, "safetensors writer: out of memory");
        w->mk = a;
        char **b = par_realloc(w->mv, (size_t)nc * sizeof(char *), PAR_TAG_IO);
        if (!b)
            return par_err(PAR_ENOMEM, "safetensors writer: out of memory");
        w->mv = b;
        w->capm = nc;
    }
    char *k = par_strdup(key, PAR_TAG_IO), *v = par_strdup(value, PAR_TAG_IO);
    if (!k || !v) {
        par_free(k);
        par_free(v);
        return par_err(PAR_ENOMEM, "safetensors writer: out of memory");
    }
    w->mk[w->nm] = k;
    w->mv[w->nm] = v;
    w->nm++;
    return PAR_OK;
}

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = par_realloc(b->p, nc, PAR_TAG_IO);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_json_string(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char tmp[8];
        switch (*p) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        default:
            if (*p < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", *p);
                sb_put(b, tmp, 6);
            } else {
                sb_put(b, (const char *)p, 1);
            }
        }
    }
    sb_put(b, "\"", 1);
}

static int cmp_w_ptr(const void *a, const void *b)
{
    return strcmp((*(const w_entry *const *)a)->name, (*(const w_entry *const *)b)->name);
}

static int cmp_key_ptr(const void *a, const void *b)
{
    return strcmp(**(char **const *)a, **(char **const *)b);
}

/* Builds the padded header; *order receives the tensor order (by name). */
static par_status build_header(par_st_writer *w, sbuf *h, const w_entry ***order_out)
{
    const w_entry **order = par_malloc((size_t)(w->n + 1) * sizeof *order, PAR_TAG_IO);
    char ***morder = par_malloc((size_t)(w->nm + 1) * sizeof *morder, PAR_TAG_IO);
    if (!order || !morder) {
        par_free(order);
        par_free(morder);
        return par_err(PAR_ENOMEM, "safetensors writer: out of memory");
    }
    for (int i = 0; i < w->n; i++)
        order[i] = &w->e[i];
    for (int i = 0; i < w->nm; i++)
        morder[i] = &w->mk[i];
    qsort(order, (size_t)w->n, sizeof *order, cmp_w_ptr);
    qsort(morder, (size_t)w->nm, sizeof *morder, cmp_key_ptr);

    sb_str(h, "{");
    int first = 1;
    if (w->nm) {
        sb_str(h, "\"__metadata__\":{");
        for (int i = 0; i < w->nm; i++) {
            if (i)
                sb_str(h, ",");
            sb_json_string(h, *morder[i]);
            sb_str(h, ":");
            sb_json_string(h, w->mv[morder[i] - w->mk]);
        }
        sb_str(h, "}");
        first = 0;
    }
    uint64_t off = 0;
    char num[64];
    for (int k = 0; k < w->n; k++) {
        const w_entry *e = order[k];
        if (!first)
            sb_str(h, ",");
        first = 0;
        sb_json_string(h, e->name);
        sb_str(h, ":{\"dtype\":\"");
        sb_str(h, par_dtype_name(e->t.dtype));
        sb_str(h, "\",\"shape\":[");
        for (int d = 0; d < e->t.ndim; d++) {
            snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)e->t.shape[d]);
            sb_str(h, num);
        }
        uint64_t nb = (uint64_t)par_tensor_nbytes(&e->t);
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + nb));
        sb_str(h, num);
        off += nb;
    }
    sb_str(h, "}");
    par_free(morder);
    while (!h->oom && h->n % 8)
        sb_str(h, " ");
    if (h->oom) {
        par_free(order);
        return par_err(PAR_ENOMEM, "safetensors writer: out of memory for the header");
    }
    if ((uint64_t)h->n > PAR_ST_HEADER_CAP) {
        par_free(order);
        return par_err(PAR_ERANGE, "safetensors writer: header of %zu bytes is above the cap of %llu", h->n,
                       (unsigned long long)PAR_ST_HEADER_CAP);
    }
    *order_out = order;
    return PAR_OK;
}

static void put_u64le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* PAR_EINVAL when an entry still has no data (par_st_writer_add_shape: a
 * stream's). */
static par_status all_have_data(const par_st_writer *w)
{
    for (int k = 0; k < w->n; k++)
        if (w->e[k].deferred && par_tensor_nbytes(&w->e[k].t) > 0)
            return par_err(PAR_EINVAL, "safetensors writer: tensor '%s' has no data (declared for a stream)",
                           w->e[k].name);
    return PAR_OK;
}

par_status par_st_writer_write(par_st_writer *w, const char *path)
{
    sbuf h = {0};
    const w_entry **order = NULL;
    par_status st = all_have_data(w);
    if (st)
        return st;
    st = build_header(w, &h, &order);
    if (st) {
        par_free(h.p);
        return st;
    }
    par_afile *f;
    st = par_afile_open(path, &f);
    if (st)
        goto done_free_header;
    unsigned char len8[8];
    put_u64le(len8, h.n);
    st = par_afile_write(f, len8, 8);
    if (!st)
        st = par_afile_write(f, h.p, h.n);
    for (int k = 0; k < w->n && !st; k++) {
        const w_entry *e = order[k];
        size_t nb = par_tensor_nbytes(&e->t);
        if (nb)
            st = par_afile_write(f, e->t.data, nb);
    }
    if (st)
        par_afile_abort(f);
    else
        st = par_afile_commit(f);
done_free_header:
    par_free(order);
    par_free(h.p);
    return st;
}

par_status par_st_writer_to_mem(par_st_writer *w, void **buf, size_t *len)
{
    sbuf h = {0};
    const w_entry **order = NULL;
    par_status st = all_have_data(w);
    if (st)
        return st;
    st = build_header(w, &h, &order);
    if (st) {
        par_free(h.p);
        return st;
    }
    size_t total = 8 + h.n;
    for (int k = 0; k < w->n; k++)
        total += par_tensor_nbytes(&w->e[k].t);
    unsigned char *out = par_malloc(total ? total : 1, PAR_TAG_IO);
    if (!out) {
        st = par_err(PAR_ENOMEM, "safetensors writer: out of memory for %zu bytes", total);
        goto done_free_header;
    }
    put_u64le(out, h.n);
    memcpy(out + 8, h.p, h.n);
    size_t o = 8 + h.n;
    for (int k = 0; k < w->n; k++) {
        const w_entry *e = order[k];
        size_t nb = par_tensor_nbytes(&e->t);
        if (nb)
            memcpy(out + o, e->t.data, nb);
        o += nb;
    }
    *buf = out;
    *len = total;
done_free_header:
    par_free(order);
    par_free(h.p);
    return st;
}

/* ---- streamed writing --------------------------------------------------- */

struct par_st_stream {
    par_st_writer *w; /* borrowed */
    par_afile *f;
    uint64_t *off;    /* [w->n] file offset of each entry's data */
    uint8_t *done;    /* [w->n] */
    int left;
};

static void stream_free(par_st_stream *s)
{
    par_free(s->off);
    par_free(s->done);
    par_free(s);
}

/* The header (as par_st_writer_write writes it), each entry's offset, the
 * entries that have data written at once. */
static par_status stream_start(par_st_stream *s, const char *path)
{
    sbuf h = {0};
    const w_entry **order = NULL;
    par_status st = build_header(s->w, &h, &order);
    if (st) {
        par_free(h.p);
        return st;
    }
    uint64_t at = 8 + (uint64_t)h.n;
    for (int k = 0; k < s->w->n; k++) {
        int i = (int)(order[k] - s->w->e);
        s->off[i] = at;
        at += (uint64_t)par_tensor_nbytes(&order[k]->t);
    }
    par_free(order);
    unsigned char len8[8];
    put_u64le(len8, h.n);
    if (!(st = par_afile_open(path, &s->f)) && !(st = par_afile_write(s->f, len8, 8)))
        st = par_afile_write(s->f, h.p, h.n);
    par_free(h.p);
    s->left = s->w->n;
    for (int i = 0; i < s->w->n && !st; i++) {
        const w_entry *e = &s->w->e[i];
        size_t nb = par_tensor_nbytes(&e->t);
        if (e->deferred)
            continue;
        if (nb)
            st = par_afile_pwrite(s->f, e->t.data, nb, s->off[i]);
        s->done[i] = 1;
        s->left--;
    }
    return st;
}

par_status par_st_stream_begin(par_st_writer *w, const char *path, par_st_stream **out)
{
    par_st_stream *s = par_calloc(1, sizeof *s, PAR_TAG_IO);
    if (!s)
        return par_err(PAR_ENOMEM, "safetensors stream: out of memory");
    s->w = w;
    s->off = par_calloc((size_t)(w->n + 1), sizeof *s->off, PAR_TAG_IO);
    s->done = par_calloc((size_t)(w->n + 1), 1, PAR_TAG_IO);
    par_status st = s->off && s->done ? stream_start(s, path) : par_err(PAR_ENOMEM, "safetensors stream: out of memory");
    if (st) {
        par_afile_abort(s->f);
        stream_free(s);
        return st;
    }
    *out = s;
    return PAR_OK;
}

par_status par_st_stream_put(par_st_stream *s, const char *name, const void *data, size_t nbytes)
{
    par_st_writer *w = s->w;
    int sl = w->nslot ? name_slot(w, name) : -1;
    if (sl < 0 || !w->slot[sl])
        return par_err(PAR_EINVAL, "safetensors stream: no tensor '%s' in the header", name);
    int i = w->slot[sl] - 1;
    size_t nb = par_tensor_nbytes(&w->e[i].t);
    if (s->done[i])
        return par_err(PAR_EINVAL, "safetensors stream: tensor '%s' written twice", name);
    if (nbytes != nb || (nb && !data))
        return par_err(PAR_EINVAL, "safetensors stream: tensor '%s' is %zu bytes, %zu given", name, nb, nbytes);
    par_status st = nb ? par_afile_pwrite(s->f, data, nb, s->off[i]) : PAR_OK;
    if (!st) {
        s->done[i] = 1;
        s->left--;
    }
    return st;
}

par_status par_st_stream_commit(par_st_stream *s)
{
    par_status st = PAR_OK;
    for (int i = 0; i < s->w->n && s->left; i++)
        if (!s->done[i]) {
            st = par_err(PAR_EINVAL, "safetensors stream: tensor '%s' (of %d not written) was never written",
                         s->w->e[i].name, s->left);
            break;
        }
    if (st)
        par_afile_abort(s->f);
    else
        st = par_afile_commit(s->f);
    stream_free(s);
    return st;
}

void par_st_stream_abort(par_st_stream *s)
{
    if (!s)
        return;
    par_afile_abort(s->f);
    stream_free(s);
}
