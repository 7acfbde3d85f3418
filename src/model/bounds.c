/* model/bounds.c - tolerances derived per tensor (model/bounds.h): the
 * derivation from golden sets, the bounds file (JSON) and its checks. */
#include "model/bounds.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "model/config.h"

#define BOUNDS_FORMAT "parity-bounds"
#define BOUNDS_VERSION 1
#define FLOOR_REL 5.9604644775390625e-08 /* 2^-24: the f32 unit roundoff */
#define MAX_VARIANTS 16

typedef struct {
    char *path, *recipe, *precision, *numerics;
} set_info;

struct par_bounds {
    char *label;
    double factor, floor_rel;
    set_info golden, exact; /* exact.path NULL: none */
    int nvar;
    set_info var[MAX_VARIANTS];
    int nfiles;
    par_manifest_file *files; /* the golden's files the bounds cover, with their sha256 */
    int n, cap;
    par_bound *b; /* sorted by (file, tensor) once complete */
};

static const char *const kind_names[] = {"norm", "margin", "load", "rows", "exact"};

const char *par_bound_kind_name(par_bound_kind k) { return (unsigned)k < 5 ? kind_names[k] : "?"; }
int par_bounds_count(const par_bounds *b) { return b->n; }
const par_bound *par_bounds_at(const par_bounds *b, int i) { return i >= 0 && i < b->n ? &b->b[i] : NULL; }
double par_bounds_factor(const par_bounds *b) { return b->factor; }
const char *par_bounds_label(const par_bounds *b) { return b->label; }

static void set_info_free(set_info *s)
{
    par_free(s->path);
    par_free(s->recipe);
    par_free(s->precision);
    par_free(s->numerics);
    memset(s, 0, sizeof *s);
}

void par_bounds_free(par_bounds *b)
{
    if (!b)
        return;
    for (int i = 0; i < b->n; i++) {
        par_free(b->b[i].file);
        par_free(b->b[i].tensor);
        par_free(b->b[i].source);
    }
    par_free(b->b);
    for (int i = 0; i < b->nfiles; i++)
        par_free(b->files[i].name);
    par_free(b->files);
    set_info_free(&b->golden);
    set_info_free(&b->exact);
    for (int i = 0; i < b->nvar; i++)
        set_info_free(&b->var[i]);
    par_free(b->label);
    par_free(b);
}

static int cmp_bound(const void *x, const void *y)
{
    const par_bound *a = x, *b = y;
    int c = strcmp(a->file, b->file);
    return c ? c : strcmp(a->tensor, b->tensor);
}

const par_bound *par_bounds_find(const par_bounds *b, const char *file, const char *tensor)
{
    par_bound key = {.file = (char *)file, .tensor = (char *)tensor};
    return b->n ? bsearch(&key, b->b, (size_t)b->n, sizeof *b->b, cmp_bound) : NULL;
}

/* Appends a bound (copies the strings); NULL when out of memory (said). */
static par_bound *bounds_add(par_bounds *b, const char *file, const char *tensor, const char *source)
{
    if (b->n == b->cap) {
        int nc = b->cap ? 2 * b->cap : 256;
        par_bound *nb = par_realloc(b->b, (size_t)nc * sizeof *nb, PAR_TAG_IO);
        if (!nb) {
            par_err(PAR_ENOMEM, "bounds: out of memory");
            return NULL;
        }
        b->b = nb;
        b->cap = nc;
    }
    par_bound *e = &b->b[b->n];
    memset(e, 0, sizeof *e);
    e->file = par_strdup(file, PAR_TAG_IO);
    e->tensor = par_strdup(tensor, PAR_TAG_IO);
    e->source = par_strdup(source, PAR_TAG_IO);
    if (!e->file || !e->tensor || !e->source) {
        par_free(e->file);
        par_free(e->tensor);
        par_free(e->source);
        par_err(PAR_ENOMEM, "bounds: out of memory");
        return NULL;
    }
    e->variant = -1;
    e->recipe_effect = -1;
    b->n++;
    return e;
}

par_status par_bounds_check_golden(const par_bounds *b, const par_manifest *m, const char *dir)
{
    for (int i = 0; i < b->nfiles; i++) {
        const char *sha = par_manifest_file_sha(m, b->files[i].name);
        if (!sha)
            return par_err(PAR_EINVAL, "bounds %s were derived from a golden with %s, which %s does not hold: "
                           "they belong to another golden", b->label, b->files[i].name, dir);
        if (strcmp(sha, b->files[i].sha256))
            return par_err(PAR_EINVAL, "bounds %s were derived from another golden: its %s has sha256 %.12s..., "
                           "%s's has %.12s...", b->label, b->files[i].name, b->files[i].sha256, dir, sha);
    }
    return PAR_OK;
}

/* ---- derivation: the sets ---------------------------------------------- */

/* ||b - a||_2 over the pairs finite on both sides (or ||a||_2 for b NULL);
 * *maxd: the largest |b - a| (may be NULL).  Float tensors only. */
static double diff_l2(const par_tensor *a, const par_tensor *b, double *maxd)
{
    long double s = 0;
    double m = 0;
    const int64_t n = par_tensor_numel(a);
    for (int64_t i = 0; i < n; i++) {
        double x = par_tensor_get_f64(a, i), y = b ? par_tensor_get_f64(b, i) : 0, d = fabs(y - x);
        if (!isfinite(x) || !isfinite(y))
            continue;
        s += (long double)d * d;
        m = d > m ? d : m;
    }
    if (maxd)
        *maxd = m;
    return (double)sqrtl(s);
}

/* Rows ([..., last dim]) where two integer tensors of equal shape differ. */
static int64_t rows_differ(const par_tensor *a, const par_tensor *b)
{
    const int64_t last = a->ndim ? a->shape[a->ndim - 1] : 1, n = par_tensor_numel(a);
    const size_t rb = (size_t)last * par_dtype_size(a->dtype);
    int64_t r = 0;
    for (int64_t i = 0; last > 0 && i < n / last; i++)
        r += memcmp((const char *)a->data + (size_t)i * rb, (const char *)b->data + (size_t)i * rb, rb) != 0;
    return r;
}

static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static int starts_with(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static par_status set_info_of(const char *dir, const par_manifest *m, set_info *si)
{
    const cJSON *r = m->train ? cJSON_GetObjectItemCaseSensitive(m->train, PAR_CONFIG_RECIPE_KEY) : NULL;
    const cJSON *n = m->train ? cJSON_GetObjectItemCaseSensitive(m->train, PAR_CONFIG_NUMERICS_KEY) : NULL;
    si->path = par_strdup(dir, PAR_TAG_IO);
    si->recipe = par_strdup(cJSON_IsString(r) ? r->valuestring : "none", PAR_TAG_IO);
    si->precision = par_strdup(m->precision ? m->precision : "?", PAR_TAG_IO);
    si->numerics = par_strdup(cJSON_IsString(n) ? n->valuestring : "tolerance", PAR_TAG_IO);
    return si->path && si->recipe && si->precision && si->numerics ? PAR_OK : par_err(PAR_ENOMEM, "bounds: out of memory");
}

/* The first key of section a that b lacks or holds another value of (the
 * mode and recipe aside); NULL when none. */
static const char *section_diff(const cJSON *a, const cJSON *b)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, a)
    {
        if (!it->string || !strcmp(it->string, PAR_CONFIG_NUMERICS_KEY) || !strcmp(it->string, PAR_CONFIG_RECIPE_KEY))
            continue;
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(b, it->string);
        if (!o || !cJSON_Compare(it, o, 1))
            return it->string;
    }
    return NULL;
}

/* v is the same run as g (the golden): model and train keys equal both ways. */
static par_status same_run(const par_manifest *g, const par_manifest *v, const char *gdir, const char *vdir)
{
    const cJSON *sg[2] = {g->model, g->train}, *sv[2] = {v->model, v->train};
    static const char *const sec[2] = {"model", "train"};
    for (int s = 0; s < 2; s++) {
        const char *k = section_diff(sg[s], sv[s]);
        if (!k)
            k = section_diff(sv[s], sg[s]);
        if (k)
            return par_err(PAR_EINVAL, "bounds: %s and %s are not the same run: their %s.%s differ (a variant or "
                           "the exact set computes the golden's steps on the same data)", gdir, vdir, sec[s], k);
    }
    if (v->first_step > g->first_step || v->steps < g->steps)
        return par_err(PAR_EINVAL, "bounds: %s holds steps %lld..%lld, the golden %s %lld..%lld: every set must "
                       "hold the golden's steps", vdir, (long long)v->first_step, (long long)v->steps, gdir,
                       (long long)g->first_step, (long long)g->steps);
    return PAR_OK;
}

/* ---- derivation: one file ---------------------------------------------- */

/* The open files of one golden file name: the golden's, the exact set's
 * (NULL when it lacks it), each variant's, and for a step file the sets'
 * scores.K (NULL where absent). */
typedef struct {
    const char *name;
    const par_st_file *g, *x, *v[MAX_VARIANTS];
    const par_st_file *gs, *vs[MAX_VARIANTS];
} file_view;

/* The variant's tensor `name`, of the golden tensor's shape (and of its
 * kind: float or the same integer dtype); an error naming both otherwise. */
static par_status variant_tensor(const par_bounds *b, const file_view *f, int i, const char *name,
                                 const par_tensor *ta, const par_tensor **out)
{
    const par_tensor *t = par_st_find(f->v[i], name);
    char s1[96], s2[96];
    if (!t)
        return par_err(PAR_EINVAL, "bounds: variant %s has no %s in %s (a variant holds every tensor of the golden)",
                       b->var[i].path, name, f->name);
    if (!par_tensor_same_shape(t, ta) ||
        (par_dtype_is_float(ta->dtype) ? !par_dtype_is_float(t->dtype) : t->dtype != ta->dtype))
        return par_err(PAR_EINVAL, "bounds: %s %s is %s %s in variant %s, %s %s in the golden", f->name, name,
                       par_dtype_name(t->dtype), par_shape_str(t->ndim, t->shape, s1, sizeof s1), b->var[i].path,
                       par_dtype_name(ta->dtype), par_shape_str(ta->ndim, ta->shape, s2, sizeof s2));
    *out = t;
    return PAR_OK;
}

/* The exact set's tensor when it has one of the golden's shape, else NULL. */
static const par_tensor *exact_tensor(const file_view *f, const char *name, const par_tensor *ta)
{
    const par_tensor *t = f->x ? par_st_find(f->x, name) : NULL;
    if (!t || !par_tensor_same_shape(t, ta) || par_dtype_is_float(t->dtype) != par_dtype_is_float(ta->dtype))
        return NULL;
    return t;
}

static const char *var_label(const par_bounds *b, int i, char *buf, size_t n)
{
    const set_info *s = &b->var[i];
    snprintf(buf, n, "variant %d (%s: %s, %s, recipe %s)", i, s->path, s->precision, s->numerics, s->recipe);
    return buf;
}

/* A float tensor: factor * the largest ||V-A||, at least the floor. */
static par_status derive_norm(par_bounds *b, const file_view *f, const char *name, const par_tensor *ta)
{
    double dev = -1, norm = diff_l2(ta, NULL, NULL);
    int vi = -1;
    for (int i = 0; i < b->nvar; i++) {
        const par_tensor *tv;
        par_status s = variant_tensor(b, f, i, name, ta, &tv);
        if (s)
            return s;
        double d = diff_l2(ta, tv, NULL);
        if (d > dev)
            dev = d, vi = i;
    }
    const par_tensor *tx = exact_tensor(f, name, ta);
    double eff = tx ? diff_l2(ta, tx, NULL) : -1, bound = b->factor * dev, floor = b->floor_rel * norm;
    char src[768], vl[200], ef[80] = "";
    if (eff >= 0)
        snprintf(ef, sizeof ef, "; recipe effect ||N-A|| = %.3e", eff);
    if (bound >= floor)
        snprintf(src, sizeof src, "%g x ||V-A|| of %s = %g x %.3e; ||A|| = %.3e%s", b->factor,
                 var_label(b, vi, vl, sizeof vl), b->factor, dev, norm, ef);
    else
        snprintf(src, sizeof src, "floor 2^-24 x ||A|| = 2^-24 x %.3e (largest ||V-A|| %.3e, of %s, times %g is "
                 "below it)%s", norm, dev, var_label(b, vi, vl, sizeof vl), b->factor, ef);
    par_bound *e = bounds_add(b, f->name, name, src);
    if (!e)
        return PAR_ENOMEM;
    e->kind = PAR_BOUND_NORM;
    e->bound = bound >= floor ? bound : floor;
    e->norm = norm;
    e->deviation = bound >= floor ? dev : 0;
    e->variant = bound >= floor ? vi : -1;
    e->recipe_effect = eff;
    return PAR_OK;
}

int par_bounds_score_name(const char *name, char *buf, size_t n)
{
    if (!starts_with(name, "router.") || !ends_with(name, ".idx") || strlen(name) + 8 > n)
        return 0;
    const size_t k = strlen(name) - 4; /* without ".idx"; k + 7 <= n by the test above */
    memcpy(buf, name, k);
    memcpy(buf + k, ".score", 7);
    return 1;
}

/* The router scores' eps of a score-routed idx (sc: the golden's scores):
 * factor * the largest |score difference| of a variant with scores, at
 * least 2^-24 max |score|. */
static par_status derive_margin(par_bounds *b, const file_view *f, const char *name, const char *sname,
                                const par_tensor *sc, double eff)
{
    double dev = -1, mx;
    int vi = -1;
    diff_l2(sc, NULL, &mx);
    for (int i = 0; i < b->nvar; i++) {
        const par_tensor *t = f->vs[i] ? par_st_find(f->vs[i], sname) : NULL;
        double d;
        if (!t || !par_tensor_same_shape(t, sc) || !par_dtype_is_float(t->dtype))
            continue;
        diff_l2(sc, t, &d);
        if (d > dev)
            dev = d, vi = i;
    }
    if (vi < 0)
        return par_err(PAR_EINVAL, "bounds: %s %s: no variant has %s in its scores file (make the variants with "
                       "parity golden --router-scores)", f->name, name, sname);
    double eps = b->factor * dev, floor = b->floor_rel * mx;
    char src[768], vl[200];
    snprintf(src, sizeof src, "eps = %s on the router's selection values: %g x max |dscore| of %s = %g x %.3e "
             "(max |score| %.3e); a token whose K-th and (K+1)-th values in A are closer than eps may pick other "
             "experts; %s%.0f rows differ from the set without the recipe", eps >= floor ? "" : "floor 2^-24 x max "
             "|score|, above", b->factor, var_label(b, vi, vl, sizeof vl), b->factor, dev, mx,
             eff >= 0 ? "" : "unknown: ", eff >= 0 ? eff : 0);
    par_bound *e = bounds_add(b, f->name, name, src);
    if (!e)
        return PAR_ENOMEM;
    e->kind = PAR_BOUND_MARGIN;
    e->bound = eps >= floor ? eps : floor;
    e->norm = mx;
    e->deviation = dev;
    e->variant = eps >= floor ? vi : -1;
    e->recipe_effect = eff;
    return PAR_OK;
}

/* attn.<block>.selected: factor * the most rows a variant changes. */
static par_status derive_rows(par_bounds *b, const file_view *f, const char *name, const par_tensor *ta, double eff)
{
    int64_t dev = -1;
    int vi = -1;
    for (int i = 0; i < b->nvar; i++) {
        const par_tensor *tv;
        par_status s = variant_tensor(b, f, i, name, ta, &tv);
        if (s)
            return s;
        int64_t r = rows_differ(ta, tv);
        if (r > dev)
            dev = r, vi = i;
    }
    char src[768], vl[200];
    snprintf(src, sizeof src, "rows that may differ (besides A's exact ties) = ceil(%g x %lld rows of %s); %s%.0f "
             "rows differ from the set without the recipe", b->factor, (long long)dev, var_label(b, vi, vl, sizeof vl),
             eff >= 0 ? "" : "unknown: ", eff >= 0 ? eff : 0);
    par_bound *e = bounds_add(b, f->name, name, src);
    if (!e)
        return PAR_ENOMEM;
    e->kind = PAR_BOUND_ROWS;
    e->bound = ceil(b->factor * (double)dev);
    e->deviation = (double)dev;
    e->variant = vi;
    e->recipe_effect = eff;
    return PAR_OK;
}

/* An integer tensor: margin (score-routed idx), load, rows or exact. */
static par_status derive_int(par_bounds *b, const file_view *f, const char *name, const par_tensor *ta)
{
    char sname[256];
    const par_tensor *tx = exact_tensor(f, name, ta);
    double eff = tx && tx->dtype == ta->dtype ? (double)rows_differ(ta, tx) : -1;
    const par_tensor *sc = f->gs && par_bounds_score_name(name, sname, sizeof sname) ? par_st_find(f->gs, sname) : NULL;
    if (sc && par_dtype_is_float(sc->dtype) && sc->ndim == 3 && ta->ndim == 3 && sc->shape[0] == ta->shape[0] &&
        sc->shape[1] == ta->shape[1])
        return derive_margin(b, f, name, sname, sc, eff);
    if (starts_with(name, "attn.") && ends_with(name, ".selected"))
        return derive_rows(b, f, name, ta, eff);
    int load = starts_with(name, "router.") && ends_with(name, ".load");
    for (int i = 0; i < b->nvar; i++) {
        const par_tensor *tv;
        par_status s = variant_tensor(b, f, i, name, ta, &tv);
        if (s)
            return s;
    }
    par_bound *e = bounds_add(b, f->name, name, load ? "the loads the block's idx moves, exactly" :
                              "integers: equal (no variant may change them: input, hash routing)");
    if (!e)
        return PAR_ENOMEM;
    e->kind = load ? PAR_BOUND_LOAD : PAR_BOUND_EXACT;
    e->recipe_effect = eff;
    return PAR_OK;
}

static par_status derive_file(par_bounds *b, const file_view *f)
{
    par_status s = PAR_OK;
    for (int i = 0; i < par_st_count(f->g) && !s; i++) {
        const par_tensor *ta = par_st_tensor(f->g, i);
        const char *name = par_st_name(f->g, i);
        s = par_dtype_is_float(ta->dtype) ? derive_norm(b, f, name, ta) : derive_int(b, f, name, ta);
    }
    return s;
}

/* ---- derivation: the driver -------------------------------------------- */

/* dir/name mapped; *f NULL when the file is not there and !required. */
static par_status open_in(const char *dir, const char *name, int required, par_st_file **f)
{
    *f = NULL;
    char *p = par_path_join(dir, name);
    if (!p)
        return par_err(PAR_ENOMEM, "bounds: out of memory");
    FILE *probe = fopen(p, "rb");
    par_status s = PAR_OK;
    if (probe) {
        fclose(probe);
        s = par_st_map(p, f);
    } else if (required) {
        s = par_err(PAR_EINVAL, "bounds: %s has no %s (a variant holds every file of the golden)", dir, name);
    }
    par_free(p);
    return s;
}

/* The step number of a "step.K.safetensors" (-1 for any other name). */
static int64_t step_of(const char *name)
{
    char *end;
    if (!starts_with(name, "step."))
        return -1;
    long long k = strtoll(name + 5, &end, 10);
    return !strcmp(end, ".safetensors") ? k : -1;
}

static void close_view(file_view *f, int nvar)
{
    par_st_close((par_st_file *)f->g);
    par_st_close((par_st_file *)f->x);
    par_st_close((par_st_file *)f->gs);
    for (int i = 0; i < nvar; i++) {
        par_st_close((par_st_file *)f->v[i]);
        par_st_close((par_st_file *)f->vs[i]);
    }
}

/* One golden file: opened on every set, derived, closed. */
static par_status derive_name(par_bounds *b, const char *name)
{
    file_view f;
    memset(&f, 0, sizeof f);
    f.name = name;
    par_st_file *t = NULL;
    par_status s = open_in(b->golden.path, name, 1, &t);
    f.g = t;
    if (!s && b->exact.path && !(s = open_in(b->exact.path, name, 0, &t)))
        f.x = t;
    for (int i = 0; i < b->nvar && !s; i++)
        if (!(s = open_in(b->var[i].path, name, 1, &t)))
            f.v[i] = t;
    int64_t k = step_of(name);
    char sn[64];
    snprintf(sn, sizeof sn, "scores.%lld.safetensors", (long long)k);
    if (!s && k >= 0 && !(s = open_in(b->golden.path, sn, 0, &t)))
        f.gs = t;
    for (int i = 0; i < b->nvar && !s && k >= 0; i++)
        if (!(s = open_in(b->var[i].path, sn, 0, &t)))
            f.vs[i] = t;
    if (!s)
        s = derive_file(b, &f);
    close_view(&f, b->nvar);
    return s;
}

/* The sets' manifests into b (paths, recipes, modes) with their checks. */
static par_status derive_sets(par_bounds *b, const char *golden, const char *exact, const char *const *variants,
                              par_manifest *gm)
{
    par_status s = par_manifest_read(golden, gm);
    if (s || (s = set_info_of(golden, gm, &b->golden)))
        return s;
    for (int i = 0; i <= b->nvar && !s; i++) {
        const char *dir = i < b->nvar ? variants[i] : exact;
        set_info *si = i < b->nvar ? &b->var[i] : &b->exact;
        if (!dir)
            continue;
        par_manifest m;
        if ((s = par_manifest_read(dir, &m)))
            break;
        if (!(s = same_run(gm, &m, golden, dir)) && !(s = set_info_of(dir, &m, si))) {
            const char *want = i < b->nvar ? b->golden.recipe : "none";
            if (strcmp(si->recipe, want))
                s = par_err(PAR_EINVAL, "bounds: %s was made under the recipe %s; %s is made under %s (%s)", dir,
                            si->recipe, i < b->nvar ? "a variant" : "the exact set (--exact)", want,
                            i < b->nvar ? "the golden's recipe in another precision or order" : "no recipe");
        }
        par_manifest_free(&m);
    }
    return s;
}

/* b->files: the golden's params.K and step.K files with their sha256. */
static par_status derive_files(par_bounds *b, const par_manifest *gm)
{
    b->files = par_calloc((size_t)gm->nfiles + 1, sizeof *b->files, PAR_TAG_IO);
    if (!b->files)
        return par_err(PAR_ENOMEM, "bounds: out of memory");
    for (int i = 0; i < gm->nfiles; i++) {
        const char *nm = gm->files[i].name;
        if (!(starts_with(nm, "params.") || starts_with(nm, "step.")) || !ends_with(nm, ".safetensors"))
            continue;
        par_manifest_file *f = &b->files[b->nfiles];
        if (!(f->name = par_strdup(nm, PAR_TAG_IO)))
            return par_err(PAR_ENOMEM, "bounds: out of memory");
        memcpy(f->sha256, gm->files[i].sha256, sizeof f->sha256);
        b->nfiles++;
    }
    return PAR_OK;
}

par_status par_bounds_derive(const char *golden, const char *exact, const char *const *variants, int nvar,
                             double factor, par_bounds **out)
{
    if (nvar < 1 || nvar > MAX_VARIANTS)
        return par_err(PAR_EINVAL, "bounds: %d variants; give 1 to %d (--variant DIR)", nvar, MAX_VARIANTS);
    if (!(factor > 0) || !isfinite(factor))
        return par_err(PAR_EINVAL, "bounds: factor %g; it is a finite number > 0", factor);
    par_bounds *b = par_calloc(1, sizeof *b, PAR_TAG_IO);
    if (!b)
        return par_err(PAR_ENOMEM, "bounds: out of memory");
    b->factor = factor;
    b->floor_rel = FLOOR_REL;
    b->nvar = nvar;
    par_manifest gm;
    par_manifest_init(&gm);
    par_status s = (b->label = par_strdup(golden, PAR_TAG_IO)) ? PAR_OK : par_err(PAR_ENOMEM, "bounds: out of memory");
    if (!s)
        s = derive_sets(b, golden, exact, variants, &gm);
    if (!s)
        s = derive_files(b, &gm);
    for (int i = 0; i < b->nfiles && !s; i++)
        s = derive_name(b, b->files[i].name);
    par_manifest_free(&gm);
    if (s) {
        par_bounds_free(b);
        return s;
    }
    if (b->n)
        qsort(b->b, (size_t)b->n, sizeof *b->b, cmp_bound);
    *out = b;
    return PAR_OK;
}

/* ---- the file ----------------------------------------------------------- */

static cJSON *set_json(const set_info *s)
{
    cJSON *o = cJSON_CreateObject();
    if (o && (!cJSON_AddStringToObject(o, "path", s->path) || !cJSON_AddStringToObject(o, "recipe", s->recipe) ||
              !cJSON_AddStringToObject(o, "precision", s->precision) ||
              !cJSON_AddStringToObject(o, "numerics", s->numerics))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static int bound_json(cJSON *arr, const par_bound *e)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return 0;
    cJSON_AddItemToArray(arr, o);
    int ok = cJSON_AddStringToObject(o, "file", e->file) && cJSON_AddStringToObject(o, "tensor", e->tensor) &&
             cJSON_AddStringToObject(o, "kind", par_bound_kind_name(e->kind)) &&
             cJSON_AddNumberToObject(o, "bound", e->bound);
    if (ok && (e->kind == PAR_BOUND_NORM || e->kind == PAR_BOUND_MARGIN))
        ok = cJSON_AddNumberToObject(o, "norm", e->norm) != NULL;
    ok = ok && cJSON_AddNumberToObject(o, "deviation", e->deviation) &&
         cJSON_AddNumberToObject(o, "variant", e->variant);
    if (ok && e->recipe_effect >= 0)
        ok = cJSON_AddNumberToObject(o, "recipe_effect", e->recipe_effect) != NULL;
    return ok && cJSON_AddStringToObject(o, "source", e->source);
}

par_status par_bounds_write(const par_bounds *b, const char *path)
{
    cJSON *root = cJSON_CreateObject(), *files = NULL, *vars = NULL, *arr = NULL;
    int ok = root && cJSON_AddStringToObject(root, "format", BOUNDS_FORMAT) &&
             cJSON_AddNumberToObject(root, "version", BOUNDS_VERSION) &&
             cJSON_AddNumberToObject(root, "factor", b->factor) &&
             cJSON_AddNumberToObject(root, "floor_rel", b->floor_rel);
    cJSON *g = ok ? set_json(&b->golden) : NULL;
    ok = g != NULL;
    if (ok)
        cJSON_AddItemToObject(root, "golden", g);
    ok = ok && (files = cJSON_AddObjectToObject(g, "files"));
    for (int i = 0; ok && i < b->nfiles; i++)
        ok = cJSON_AddStringToObject(files, b->files[i].name, b->files[i].sha256) != NULL;
    if (ok && b->exact.path) {
        cJSON *x = set_json(&b->exact);
        ok = x != NULL;
        if (ok)
            cJSON_AddItemToObject(root, "exact", x);
    }
    ok = ok && (vars = cJSON_AddArrayToObject(root, "variants"));
    for (int i = 0; ok && i < b->nvar; i++) {
        cJSON *v = set_json(&b->var[i]);
        ok = v != NULL;
        if (ok)
            cJSON_AddItemToArray(vars, v);
    }
    ok = ok && (arr = cJSON_AddArrayToObject(root, "tensors"));
    for (int i = 0; ok && i < b->n; i++)
        ok = bound_json(arr, &b->b[i]);
    par_status s = ok ? par_json_write_file(path, root) : par_err(PAR_ENOMEM, "%s: out of memory", path);
    cJSON_Delete(root);
    return s;
}

/* ---- reading (hostile input: every field checked) ----------------------- */

/* A number member in [lo, +inf) (finite); optional: absent leaves *out. */
static par_status get_num(const cJSON *o, const char *key, double lo, int optional, double *out, const char *path,
                          const char *where)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j && optional)
        return PAR_OK;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || j->valuedouble < lo)
        return par_err(PAR_EFORMAT, "bounds %s: %s \"%s\" is %s; it must be a finite number >= %g", path, where, key,
                       !j ? "missing" : cJSON_IsNumber(j) ? "out of range" : "not a number", lo);
    *out = j->valuedouble;
    return PAR_OK;
}

/* A string member, non-empty and shorter than 256 bytes (lim 0: any length). */
static par_status get_str(const cJSON *o, const char *key, size_t lim, const char **out, const char *path,
                          const char *where)
{
    const char *s = par_json_str(o, key);
    if (!s || !*s || (lim && strlen(s) >= lim))
        return par_err(PAR_EFORMAT, "bounds %s: %s \"%s\" is %s; it must be a non-empty string%s", path, where, key,
                       !s ? "missing or not a string" : !*s ? "empty" : "too long", lim ? " of under 256 bytes" : "");
    *out = s;
    return PAR_OK;
}

static par_status read_set(const cJSON *o, set_info *si, const char *path, const char *where)
{
    const char *v[4];
    static const char *const keys[4] = {"path", "recipe", "precision", "numerics"};
    if (!cJSON_IsObject(o))
        return par_err(PAR_EFORMAT, "bounds %s: \"%s\" is missing or not an object", path, where);
    for (int i = 0; i < 4; i++) {
        par_status s = get_str(o, keys[i], 4096, &v[i], path, where);
        if (s)
            return s;
    }
    si->path = par_strdup(v[0], PAR_TAG_IO);
    si->recipe = par_strdup(v[1], PAR_TAG_IO);
    si->precision = par_strdup(v[2], PAR_TAG_IO);
    si->numerics = par_strdup(v[3], PAR_TAG_IO);
    return si->path && si->recipe && si->precision && si->numerics ? PAR_OK : par_err(PAR_ENOMEM, "bounds: out of memory");
}

static int is_sha(const char *s)
{
    if (!s || strlen(s) != 64)
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return 0;
    return 1;
}

/* "golden": {..., "files": {name: sha256}}. */
static par_status read_golden(par_bounds *b, const cJSON *root, const char *path)
{
    const cJSON *g = par_json_obj(root, "golden"), *files = g ? par_json_obj(g, "files") : NULL, *it;
    par_status s = read_set(g, &b->golden, path, "golden");
    if (s)
        return s;
    if (!files || !cJSON_GetArraySize(files))
        return par_err(PAR_EFORMAT, "bounds %s: golden \"files\" is missing, empty or not an object (name -> sha256 "
                       "of the files the bounds were derived from)", path);
    b->files = par_calloc((size_t)cJSON_GetArraySize(files), sizeof *b->files, PAR_TAG_IO);
    if (!b->files)
        return par_err(PAR_ENOMEM, "bounds: out of memory");
    cJSON_ArrayForEach(it, files)
    {
        if (!it->string || !*it->string || strlen(it->string) > 200 || !is_sha(cJSON_GetStringValue(it)))
            return par_err(PAR_EFORMAT, "bounds %s: golden files[\"%.60s\"] is not a file name with a sha256 (64 "
                           "lowercase hex digits)", path, it->string ? it->string : "");
        par_manifest_file *f = &b->files[b->nfiles];
        if (!(f->name = par_strdup(it->string, PAR_TAG_IO)))
            return par_err(PAR_ENOMEM, "bounds: out of memory");
        memcpy(f->sha256, it->valuestring, 65);
        b->nfiles++;
    }
    return PAR_OK;
}

/* "exact" (optional) and "variants" (1..MAX_VARIANTS). */
static par_status read_sets(par_bounds *b, const cJSON *root, const char *path)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "exact");
    par_status s = x ? read_set(x, &b->exact, path, "exact") : PAR_OK;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "variants");
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (!s && (n < 1 || n > MAX_VARIANTS))
        return par_err(PAR_EFORMAT, "bounds %s: \"variants\" is %s; it lists the 1 to %d sets the bounds were derived "
                       "from", path, n < 0 ? "missing or not an array" : "of a wrong length", MAX_VARIANTS);
    for (int i = 0; i < n && !s; i++) {
        char w[32];
        snprintf(w, sizeof w, "variants[%d]", i);
        if ((s = read_set(cJSON_GetArrayItem(v, i), &b->var[i], path, w)))
            set_info_free(&b->var[i]);
        else
            b->nvar++;
    }
    return s;
}

static par_status read_kind(const cJSON *o, par_bound_kind *k, const char *path, const char *where)
{
    const char *s = par_json_str(o, "kind");
    for (int i = 0; s && i < 5; i++)
        if (!strcmp(s, kind_names[i])) {
            *k = (par_bound_kind)i;
            return PAR_OK;
        }
    return par_err(PAR_EFORMAT, "bounds %s: %s \"kind\" is %s; it is one of norm, margin, load, rows, exact", path,
                   where, s ? "unknown" : "missing or not a string");
}

/* tensors[i] into a new bound of b. */
static par_status read_bound(par_bounds *b, const cJSON *o, int i, const char *path)
{
    char w[600];
    const char *file, *tensor, *src;
    snprintf(w, sizeof w, "tensors[%d]", i);
    if (!cJSON_IsObject(o))
        return par_err(PAR_EFORMAT, "bounds %s: %s is not an object", path, w);
    par_status s = get_str(o, "file", 256, &file, path, w);
    if (!s)
        s = get_str(o, "tensor", 256, &tensor, path, w);
    if (s)
        return s;
    snprintf(w, sizeof w, "tensors[%d] (%s %s)", i, file, tensor);
    par_bound t = {.variant = -1, .recipe_effect = -1};
    double var = -1;
    if ((s = read_kind(o, &t.kind, path, w)) || (s = get_num(o, "bound", 0, 0, &t.bound, path, w)) ||
        (s = get_num(o, "norm", 0, 1, &t.norm, path, w)) || (s = get_num(o, "deviation", 0, 0, &t.deviation, path, w)) ||
        (s = get_num(o, "variant", -1, 0, &var, path, w)) ||
        (s = get_num(o, "recipe_effect", 0, 1, &t.recipe_effect, path, w)) ||
        (s = get_str(o, "source", 0, &src, path, w)))
        return s;
    if (var != floor(var) || var >= b->nvar)
        return par_err(PAR_EFORMAT, "bounds %s: %s \"variant\" is %g; it is -1 (the floor) or the index of one of the "
                       "%d variants", path, w, var, b->nvar);
    if (t.kind == PAR_BOUND_ROWS && (t.bound != floor(t.bound) || t.bound > PAR_JSON_INT_MAX))
        return par_err(PAR_EFORMAT, "bounds %s: %s \"bound\" is %g; a rows bound is a whole number of rows", path, w,
                       t.bound);
    par_bound *e = bounds_add(b, file, tensor, src);
    if (!e)
        return PAR_ENOMEM;
    t.file = e->file, t.tensor = e->tensor, t.source = e->source;
    t.variant = (int)var;
    *e = t;
    return PAR_OK;
}

/* "tensors": every bound, no (file, tensor) twice. */
static par_status read_bounds(par_bounds *b, const cJSON *root, const char *path)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    if (!cJSON_IsArray(arr) || !cJSON_GetArraySize(arr))
        return par_err(PAR_EFORMAT, "bounds %s: \"tensors\" is missing, empty or not an array", path);
    par_status s = PAR_OK;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if ((s = read_bound(b, it, i++, path)))
            return s;
    }
    qsort(b->b, (size_t)b->n, sizeof *b->b, cmp_bound);
    for (int k = 1; k < b->n; k++)
        if (!cmp_bound(&b->b[k - 1], &b->b[k]))
            return par_err(PAR_EFORMAT, "bounds %s: %s %s has two bounds", path, b->b[k].file, b->b[k].tensor);
    return PAR_OK;
}

par_status par_bounds_read(const char *path, par_bounds **out)
{
    cJSON *root = NULL;
    par_status s = par_json_read_file(path, &root);
    if (s)
        return s;
    par_bounds *b = par_calloc(1, sizeof *b, PAR_TAG_IO);
    int64_t ver = 0;
    const char *fmt = par_json_str(root, "format");
    if (!b)
        s = par_err(PAR_ENOMEM, "bounds: out of memory");
    else if (!(b->label = par_strdup(path, PAR_TAG_IO)))
        s = par_err(PAR_ENOMEM, "bounds: out of memory");
    else if (!cJSON_IsObject(root) || !fmt || strcmp(fmt, BOUNDS_FORMAT))
        s = par_err(PAR_EFORMAT, "bounds %s: \"format\" is not \"%s\" (not a bounds file: parity bounds writes one)",
                    path, BOUNDS_FORMAT);
    else if (!par_json_int(root, "version", &ver) || ver != BOUNDS_VERSION)
        s = par_err(PAR_EFORMAT, "bounds %s: \"version\" is not %d (the version this build reads)", path,
                    BOUNDS_VERSION);
    if (!s && !(s = get_num(root, "factor", 0, 0, &b->factor, path, "the file's")) && !(b->factor > 0))
        s = par_err(PAR_EFORMAT, "bounds %s: \"factor\" is 0; it is a number > 0", path);
    if (!s && !(s = get_num(root, "floor_rel", 0, 0, &b->floor_rel, path, "the file's")) &&
        !(s = read_golden(b, root, path)) && !(s = read_sets(b, root, path)))
        s = read_bounds(b, root, path);
    cJSON_Delete(root);
    if (s) {
        par_bounds_free(b);
        return s;
    }
    *out = b;
    return PAR_OK;
}
