#include "model/compare.h"

#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "model/config.h"
#include "core/json.h"
#include "core/manifest.h"

/* ---- policies --------------------------------------------------------- */

static const char *policy_names[] = {"auto", "f64", "f32", "bf16", "bitwise", "derived"};

par_status par_policy_parse(const char *s, par_policy *out)
{
    for (int i = 0; i < 6; i++) {
        if (s && !strcmp(s, policy_names[i])) {
            *out = (par_policy)i;
            return PAR_OK;
        }
    }
    return par_err(PAR_EINVAL, "policy '%s' is not one of auto, f64, f32, bf16, bitwise, derived", s ? s : "(null)");
}

const char *par_policy_name(par_policy p) { return (unsigned)p < 6 ? policy_names[p] : "?"; }

par_status par_policy_from_precision(const char *precision, par_policy *out)
{
    if (precision && (!strcmp(precision, "f64") || !strcmp(precision, "fp64") || !strcmp(precision, "float64")))
        *out = PAR_POLICY_F64;
    else if (precision && (!strcmp(precision, "f32") || !strcmp(precision, "fp32") || !strcmp(precision, "float32")))
        *out = PAR_POLICY_F32;
    else if (precision && (!strcmp(precision, "bf16") || !strcmp(precision, "bfloat16")))
        *out = PAR_POLICY_BF16;
    else
        return par_err(PAR_EINVAL, "cannot pick a comparison policy from precision '%s' (f64, f32 or bf16); pass --policy",
                       precision ? precision : "(none)");
    return PAR_OK;
}

void par_policy_tolerance(par_policy p, double *rtol, double *atol)
{
    switch (p) {
    case PAR_POLICY_F64: *rtol = 1e-10; *atol = 1e-14; return;
    case PAR_POLICY_F32: *rtol = 1e-4; *atol = 1e-7; return;
    case PAR_POLICY_BF16: *rtol = 2e-2; *atol = 1e-4; return;
    default: *rtol = 0; *atol = 0; return;
    }
}

void par_compare_opts_init(par_compare_opts *o)
{
    o->policy = PAR_POLICY_AUTO;
    o->max_list = 5;
    o->only = NULL;
    o->n_only = 0;
    o->subset = 0;
    o->strict_ties = 0;
    o->trust_hashes = 0;
    o->bounds = NULL;
}

/* ---- report ----------------------------------------------------------- */

struct par_compare_report {
    char *a, *b;
    par_policy policy;
    char policy_why[200];
    char numerics[2][16]; /* each set's mode: "bitwise" or "tolerance" (manifests' train.numerics) */
    char recipe[2][16];   /* each set's recipe (train.recipe, absent: "none"; docs/recipes.md) */
    int nfiles;         /* file pairs compared (or listed missing) */
    /* directories: the steps each set holds (manifest first_step..steps)
     * and those compared, the ones in both; files outside are skipped */
    int have_steps;
    int64_t steps_a[2], steps_b[2], steps_cmp[2];
    int skipped_a, skipped_b;
    int n, cap;
    par_cmp_entry *e;
    int nfail;
    int subset, n_left_out, n_unselected;
    int n_only;
    const char **only;  /* the patterns (owned copies) */
    int64_t *only_hits; /* entries each pattern matched */
    char bounds_label[300]; /* the derived policy's bounds file and factor */
};

static par_status report_new(const char *a, const char *b, par_compare_report **out)
{
    par_compare_report *r = par_calloc(1, sizeof *r, PAR_TAG_IO);
    if (!r)
        return par_err(PAR_ENOMEM, "compare: out of memory");
    r->a = par_strdup(a, PAR_TAG_IO);
    r->b = par_strdup(b, PAR_TAG_IO);
    if (!r->a || !r->b) {
        par_free(r->a);
        par_free(r->b);
        par_free(r);
        return par_err(PAR_ENOMEM, "compare: out of memory");
    }
    *out = r;
    return PAR_OK;
}

void par_compare_report_free(par_compare_report *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n; i++) {
        par_free(r->e[i].file);
        par_free(r->e[i].tensor);
        par_free(r->e[i].list);
        par_free(r->e[i].override_reason);
        par_free(r->e[i].bound_source);
    }
    par_free(r->e);
    par_free(r->a);
    par_free(r->b);
    for (int k = 0; k < r->n_only; k++)
        par_free((void *)r->only[k]);
    par_free(r->only);
    par_free(r->only_hits);
    par_free(r);
}

/* Copies the selection options into r (the patterns and their hit counts). */
static par_status report_select(par_compare_report *r, const par_compare_opts *o)
{
    r->subset = o->subset != 0;
    if (o->n_only <= 0)
        return PAR_OK;
    r->only = par_calloc((size_t)o->n_only, sizeof *r->only, PAR_TAG_IO);
    r->only_hits = par_calloc((size_t)o->n_only, sizeof *r->only_hits, PAR_TAG_IO);
    if (!r->only || !r->only_hits)
        return par_err(PAR_ENOMEM, "compare: out of memory");
    for (int k = 0; k < o->n_only; k++, r->n_only++)
        if (!(r->only[k] = par_strdup(o->only[k], PAR_TAG_IO)))
            return par_err(PAR_ENOMEM, "compare: out of memory");
    return PAR_OK;
}

/* Appends a zeroed entry with names set; NULL when out of memory. */
static par_cmp_entry *report_add(par_compare_report *r, const char *file, const char *tensor)
{
    if (r->n == r->cap) {
        int nc = r->cap ? 2 * r->cap : 64;
        par_cmp_entry *ne = par_realloc(r->e, (size_t)nc * sizeof *ne, PAR_TAG_IO);
        if (!ne)
            return NULL;
        r->e = ne;
        r->cap = nc;
    }
    par_cmp_entry *e = &r->e[r->n];
    memset(e, 0, sizeof *e);
    e->file = par_strdup(file, PAR_TAG_IO);
    e->tensor = par_strdup(tensor, PAR_TAG_IO);
    if (!e->file || !e->tensor) {
        par_free(e->file);
        par_free(e->tensor);
        return NULL;
    }
    e->mode = "-";
    e->pass = 1;
    r->n++;
    return e;
}

static void entry_fail(par_compare_report *r, par_cmp_entry *e)
{
    if (e->pass)
        r->nfail++;
    e->pass = 0;
}

int par_compare_report_ok(const par_compare_report *r) { return r->nfail == 0; }
int par_compare_report_count(const par_compare_report *r) { return r->n; }
int par_compare_report_failed(const par_compare_report *r) { return r->nfail; }
int par_compare_report_left_out(const par_compare_report *r) { return r->n_left_out; }
int par_compare_report_unselected(const par_compare_report *r) { return r->n_unselected; }
int par_compare_report_tie_entries(const par_compare_report *r)
{
    int n = 0;
    for (int i = 0; i < r->n; i++)
        n += r->e[i].tie_rows > 0;
    return n;
}

/* Whether an --only pattern matches (file, tensor): "FILEGLOB:TENSORGLOB",
 * or a glob of the tensor name. */
static int only_match(const char *pat, const char *file, const char *tensor)
{
    const char *colon = strchr(pat, ':');
    if (!colon)
        return fnmatch(pat, tensor, 0) == 0;
    char fg[256];
    size_t n = (size_t)(colon - pat);
    if (n >= sizeof fg)
        return 0;
    memcpy(fg, pat, n);
    fg[n] = 0;
    const char *base = strrchr(file, '/');
    return fnmatch(fg, base ? base + 1 : file, 0) == 0 && fnmatch(colon + 1, tensor, 0) == 0;
}

/* Whether the entry (file, tensor) is compared under --only (every pattern
 * it matches counts the hit). */
static int entry_selected(par_compare_report *r, const char *file, const char *tensor)
{
    if (r->n_only == 0)
        return 1;
    int hit = 0;
    for (int k = 0; k < r->n_only; k++)
        if (only_match(r->only[k], file, tensor)) {
            r->only_hits[k]++;
            hit = 1;
        }
    r->n_unselected += !hit;
    return hit;
}

/* The selection's own failing entries: an --only pattern that matched
 * nothing, --subset with nothing compared. */
static par_status finish_selection(par_compare_report *r)
{
    for (int k = 0; k < r->n_only; k++) {
        if (r->only_hits[k])
            continue;
        par_cmp_entry *e = report_add(r, "(--only)", r->only[k]);
        if (!e)
            return par_err(PAR_ENOMEM, "compare: out of memory");
        snprintf(e->reason, sizeof e->reason, "--only '%s' matches no tensor of A or B (a tensor glob, or "
                 "FILEGLOB:TENSORGLOB)", r->only[k]);
        e->side = PAR_CMP_SELECTION;
        e->dtype = PAR_DTYPE_COUNT;
        entry_fail(r, e);
    }
    int compared = 0;
    for (int i = 0; i < r->n; i++)
        compared += r->e[i].side == PAR_CMP_BOTH && r->e[i].tensor[0] && strcmp(r->e[i].file, PAR_MANIFEST_NAME);
    if (r->subset && compared == 0) {
        par_cmp_entry *e = report_add(r, "(--subset)", "");
        if (!e)
            return par_err(PAR_ENOMEM, "compare: out of memory");
        snprintf(e->reason, sizeof e->reason, "nothing was compared: B holds none of the selected entries of A "
                 "(%d left out)", r->n_left_out);
        e->side = PAR_CMP_SELECTION;
        e->dtype = PAR_DTYPE_COUNT;
        entry_fail(r, e);
    }
    return PAR_OK;
}
int par_compare_report_steps(const par_compare_report *r, int64_t cmp[2], int64_t a[2], int64_t b[2])
{
    if (!r->have_steps)
        return 0;
    for (int h = 0; h < 2; h++)
        cmp[h] = r->steps_cmp[h], a[h] = r->steps_a[h], b[h] = r->steps_b[h];
    return 1;
}

par_policy par_compare_report_policy(const par_compare_report *r) { return r->policy; }

const par_cmp_entry *par_compare_report_entry(const par_compare_report *r, int i)
{
    return (i >= 0 && i < r->n) ? &r->e[i] : NULL;
}

const par_cmp_entry *par_compare_report_find(const par_compare_report *r, const char *file, const char *tensor)
{
    for (int i = 0; i < r->n; i++)
        if ((!file || !strcmp(r->e[i].file, file)) && !strcmp(r->e[i].tensor, tensor))
            return &r->e[i];
    return NULL;
}

/* ---- decoding coordinates --------------------------------------------- */

typedef struct {
    int is_step;             /* a step.K file: [B,S,...] tensors are decoded */
    const par_tensor *seg;   /* input.segments [B,S] I32 of this step, or NULL */
    int64_t B, S;            /* 0 when unknown */
    int ncp;
    int64_t cp[2];           /* context-parallel sizes > 1 of A's / B's layout */
    const char *cp_side[2];
    const par_st_file *ties; /* A's ties.K of this step file, or NULL */
    int strict_ties;
    const par_st_file *fa, *fb; /* the pair's files (a router load reads its block's idx) */
    const char *file;           /* the pair's file name (the derived policy's bounds are per file) */
    const par_bounds *bounds;   /* the derived policy's, or NULL */
    const par_st_file *scores;  /* A's scores.K of this step file, or NULL (routing margins) */
} decode_ctx;

/* Finds a name component `key` followed by ".<digits>" (key at the start or
 * after a '.', the number followed by '.' or the end).  Returns the number or
 * -1. */
static int64_t component_num(const char *name, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = strstr(name, key); p; p = strstr(p + 1, key)) {
        if (p != name && p[-1] != '.')
            continue;
        const char *q = p + kl;
        if (*q != '.' || q[1] < '0' || q[1] > '9')
            continue;
        q++;
        int64_t v = 0;
        while (*q >= '0' && *q <= '9' && v < (INT64_MAX - 9) / 10)
            v = v * 10 + (*q++ - '0');
        if (*q == '.' || *q == '\0')
            return v;
    }
    return -1;
}

static int has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* Whether a tensor of a step file is indexed [B,S,...]. */
static int is_bs_tensor(const decode_ctx *c, const char *name, const par_tensor *t)
{
    if (!c->is_step || t->ndim < 2)
        return 0;
    if (!(has_prefix(name, "input.") || has_prefix(name, "out.") || has_prefix(name, "act.") ||
          has_prefix(name, "router.") || has_prefix(name, "attn.")))
        return 0;
    if (c->B && c->S && (t->shape[0] != c->B || t->shape[1] != c->S))
        return 0;
    return 1;
}

static void describe(const decode_ctx *c, const char *name, const par_tensor *t, par_cmp_elem *el)
{
    char *w = el->where;
    size_t n = sizeof el->where, o = 0;
    w[0] = '\0';
#define ADD(...)                                                                                                       \
    do {                                                                                                               \
        if (o < n)                                                                                                     \
            o += (size_t)snprintf(w + o, n - o, __VA_ARGS__);                                                          \
    } while (0)
    int64_t layer = component_num(name, "layers");
    int64_t mtp = component_num(name, "mtp");
    int64_t expert = component_num(name, "experts");
    if (layer >= 0)
        ADD("%slayer %lld", o ? ", " : "", (long long)layer);
    if (mtp >= 0)
        ADD("%smtp %lld", o ? ", " : "", (long long)mtp);
    if (expert >= 0)
        ADD("%sexpert %lld", o ? ", " : "", (long long)expert);
    if (is_bs_tensor(c, name, t)) {
        int64_t b = el->coord[0], s = el->coord[1];
        ADD("%srow %lld, pos %lld", o ? ", " : "", (long long)b, (long long)s);
        if (c->seg && b < c->seg->shape[0] && s < c->seg->shape[1]) {
            const int32_t *row = (const int32_t *)c->seg->data + b * c->seg->shape[1];
            int64_t st = s;
            while (st > 0 && row[st - 1] == row[s])
                st--;
            ADD(" (sample %d, pos %lld in sample)", (int)row[s], (long long)(s - st));
        }
        for (int k = 0; k < c->ncp; k++) {
            int64_t S = t->shape[1], cp = c->cp[k];
            if (S % cp == 0)
                ADD(", cp rank %lld of %lld (%s)", (long long)(s / (S / cp)), (long long)cp, c->cp_side[k]);
        }
        if (has_prefix(name, "act.") && t->ndim == 4)
            ADD(", stream %lld", (long long)el->coord[2]);
    }
#undef ADD
}

/* ---- one tensor ------------------------------------------------------- */

static inline double elem_f(const par_tensor *t, int64_t i)
{
    switch (t->dtype) {
    case PAR_F64: return ((const double *)t->data)[i];
    case PAR_F32: return ((const float *)t->data)[i];
    case PAR_BF16: return par_bf16_to_f32(((const uint16_t *)t->data)[i]);
    default: return 0;
    }
}

static inline int64_t elem_i(const par_tensor *t, int64_t i)
{
    return t->dtype == PAR_I32 ? ((const int32_t *)t->data)[i] : ((const int64_t *)t->data)[i];
}

static inline uint64_t elem_bits(par_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case PAR_F64: return ((const uint64_t *)p)[i];
    case PAR_F32: return ((const uint32_t *)p)[i];
    default: return ((const uint16_t *)p)[i];
    }
}

/* Keeps the k largest errors (ties: lower index first, i.e. earlier wins). */
typedef struct {
    int k, n;
    par_cmp_elem *v;
} topk;

static void topk_offer(topk *t, int64_t idx, double err, double a, double b, int64_t ia, int64_t ib)
{
    if (t->k <= 0)
        return;
    if (t->n == t->k && !(err > t->v[t->n - 1].err))
        return;
    int pos = t->n < t->k ? t->n : t->k - 1;
    while (pos > 0 && err > t->v[pos - 1].err) {
        t->v[pos] = t->v[pos - 1];
        pos--;
    }
    par_cmp_elem *e = &t->v[pos];
    memset(e, 0, sizeof *e);
    e->index = idx;
    e->err = err;
    e->a = a;
    e->b = b;
    e->ia = ia;
    e->ib = ib;
    if (t->n < t->k)
        t->n++;
}

static int same_nonfinite(double x, double y)
{
    if (isnan(x) || isnan(y))
        return isnan(x) && isnan(y);
    return x == y; /* infinities: same sign */
}

typedef struct {
    long double sd2, sr2; /* sums of squares of B-A and of A over finite pairs */
    double max_abs, max_rel;
    int64_t ndiff, nnf;
} float_acc;

/* The element loop of float tensors, specialized per dtype (dt is a constant
 * at every call site). */
static inline __attribute__((always_inline)) void float_loop(par_dtype dt, const par_tensor *ta, const par_tensor *tb,
                                                             int64_t numel, int bitwise, topk *tk, float_acc *acc)
{
    long double sd2 = 0, sr2 = 0;
    double max_abs = 0, max_rel = 0;
    int64_t ndiff = 0, nnf = 0;
    par_tensor va = *ta, vb = *tb;
    va.dtype = vb.dtype = dt;
    for (int64_t i = 0; i < numel; i++) {
        double x = elem_f(&va, i), y = elem_f(&vb, i);
        int bd = elem_bits(dt, va.data, i) != elem_bits(dt, vb.data, i);
        ndiff += bd;
        if (!isfinite(x) || !isfinite(y)) {
            if (!same_nonfinite(x, y)) {
                nnf++;
                topk_offer(tk, i, INFINITY, x, y, 0, 0);
            } else if (bitwise && bd) {
                topk_offer(tk, i, 0, x, y, 0, 0); /* NaN payloads differ */
            }
            continue;
        }
        sr2 += (long double)x * x;
        if (!bd)
            continue;
        double d = x - y, ad = fabs(d);
        sd2 += (long double)d * d;
        if (ad > max_abs)
            max_abs = ad;
        if (x != 0 && ad / fabs(x) > max_rel)
            max_rel = ad / fabs(x);
        if (ad > 0 || bitwise)
            topk_offer(tk, i, ad, x, y, 0, 0);
    }
    acc->sd2 = sd2;
    acc->sr2 = sr2;
    acc->max_abs = max_abs;
    acc->max_rel = max_rel;
    acc->ndiff = ndiff;
    acc->nnf = nnf;
}

/* Whether row r of two pick lists ([.., k], ascending, -1 padding) differs
 * only among A's exact ties (tie [.., ne]): every entry in one list and
 * not the other is a valid index marked tied. */
static int row_tie_only(const int32_t *pa, const int32_t *pb, int64_t k, const int32_t *tie, int64_t ne)
{
    for (int side = 0; side < 2; side++) {
        const int32_t *x = side ? pb : pa, *y = side ? pa : pb;
        for (int64_t i = 0; i < k; i++) {
            int found = 0;
            for (int64_t j = 0; j < k && !found; j++)
                found = x[i] == y[j];
            if (!found && (x[i] < 0 || x[i] >= ne || !tie[x[i]]))
                return 0;
        }
    }
    return 1;
}

/* The ties tensor of a pick list: attn.<block>.selected [B, S, k] ->
 * attn.<block>.ties [B, S, S/4] (the indexer), router.<block>.idx [B, S, K]
 * -> router.<block>.ties [B, S, E] (a score-routed gate); NULL when A's
 * ties.K has none (no exact tie at a boundary in that block). */
static const par_tensor *ties_of(const char *name, const par_tensor *ta, const decode_ctx *c)
{
    static const char *const sfx[2][2] = {{"attn.", ".selected"}, {"router.", ".idx"}};
    size_t nl = strlen(name);
    if (!c->ties || ta->dtype != PAR_I32 || ta->ndim != 3)
        return NULL;
    for (int i = 0; i < 2; i++) {
        size_t sl = strlen(sfx[i][1]);
        if (nl <= sl || !has_prefix(name, sfx[i][0]) || strcmp(name + nl - sl, sfx[i][1]))
            continue;
        char tname[256];
        snprintf(tname, sizeof tname, "%.*s.ties", (int)(nl - sl), name);
        const par_tensor *t = par_st_find(c->ties, tname);
        if (t && t->dtype == PAR_I32 && t->ndim == 3 && t->shape[0] == ta->shape[0] && t->shape[1] == ta->shape[1])
            return t;
    }
    return NULL;
}

/* A pick list (attn.<block>.selected, router.<block>.idx) that differs,
 * with its ties in A's ties.K: the rows that differ, those that differ
 * only in tie order; all of them tie order: a pass unless strict (the
 * reason says so either way). */
static void judge_ties(par_cmp_entry *e, const char *name, const par_tensor *ta, const par_tensor *tb,
                       const decode_ctx *c)
{
    const par_tensor *t = ties_of(name, ta, c);
    if (!t)
        return;
    const int64_t rows = ta->shape[0] * ta->shape[1], k = ta->shape[2], ne = t->shape[2];
    const int32_t *pa = ta->data, *pb = tb->data, *tie = t->data;
    for (int64_t r = 0; r < rows; r++) {
        if (!memcmp(pa + r * k, pb + r * k, (size_t)k * sizeof(int32_t)))
            continue;
        e->rows_differ++;
        e->tie_rows += row_tie_only(pa + r * k, pb + r * k, k, tie + r * ne, ne);
    }
    if (e->tie_rows == 0) {
        snprintf(e->reason, sizeof e->reason, "integers differ in %lld of %lld rows, none of them only among exact "
                 "ties of A (ties.K)", (long long)e->rows_differ, (long long)rows);
        return;
    }
    if (e->tie_rows == e->rows_differ && !c->strict_ties) {
        e->pass = 1;
        snprintf(e->reason, sizeof e->reason, "tie order: %lld of %lld rows differ, each only among entries A "
                 "scores exactly equal at the top-k boundary (ties.K); --strict-ties fails them",
                 (long long)e->tie_rows, (long long)rows);
        return;
    }
    snprintf(e->reason, sizeof e->reason, "integers differ in %lld of %lld rows: %lld only among exact ties of A "
             "(tie order%s), %lld elsewhere", (long long)e->rows_differ, (long long)rows, (long long)e->tie_rows,
             c->strict_ties ? ", failed under --strict-ties" : "", (long long)(e->rows_differ - e->tie_rows));
}

/* The pair's router.<block>.idx of load `name` (router.<block>.load, I64
 * [E]) from both files, into iname, *ia, *ib; 0 when name is no such load or
 * a file lacks an I32 idx of one shape. */
static int load_idx_of(const char *name, const par_tensor *ta, const decode_ctx *c, char iname[256],
                       const par_tensor **ia, const par_tensor **ib)
{
    size_t nl = strlen(name), sl = strlen(".load");
    if (!c->fa || !c->fb || ta->dtype != PAR_I64 || ta->ndim != 1 || !has_prefix(name, "router.") || nl <= sl ||
        nl > 200 || strcmp(name + nl - sl, ".load"))
        return 0;
    snprintf(iname, 256, "%.*s.idx", (int)(nl - sl), name);
    *ia = par_st_find(c->fa, iname);
    *ib = par_st_find(c->fb, iname);
    return *ia && *ib && (*ia)->dtype == PAR_I32 && par_tensor_same_shape(*ia, *ib);
}

/* Whether loads lb - la are exactly what the picks moving from ia to ib
 * make them; *moved: the picks that arrive somewhere (may be NULL). */
static int loads_follow_idx(const par_tensor *ta, const par_tensor *tb, const par_tensor *ia, const par_tensor *ib,
                            int64_t *moved)
{
    const int64_t E = ta->shape[0], n = par_tensor_numel(ia);
    const int32_t *xa = ia->data, *xb = ib->data;
    const int64_t *la = ta->data, *lb = tb->data;
    int64_t mv = 0;
    for (int64_t x = 0; x < E; x++) {
        int64_t d = 0;
        for (int64_t i = 0; i < n; i++)
            d += (xb[i] == x) - (xa[i] == x);
        if (lb[x] - la[x] != d)
            return 0;
        mv += d > 0 ? d : 0;
    }
    if (moved)
        *moved = mv;
    return 1;
}

/* router.<block>.load [E] that differs: a consequence of tie order when the
 * block's idx differs only in A's ties (judge_ties would pass it) and the
 * load difference is exactly what those rows move (B's picks counted in,
 * A's out).  Marked as tie rows then: a pass unless strict. */
static void judge_load_ties(par_cmp_entry *e, const char *name, const par_tensor *ta, const par_tensor *tb,
                            const decode_ctx *c)
{
    char iname[256];
    const par_tensor *ia, *ib;
    if (!load_idx_of(name, ta, c, iname, &ia, &ib) || !ties_of(iname, ia, c))
        return;
    par_cmp_entry ie = {0};
    judge_ties(&ie, iname, ia, ib, &(decode_ctx){.ties = c->ties});
    int64_t moved = 0;
    if (!ie.pass || !loads_follow_idx(ta, tb, ia, ib, &moved))
        return;
    e->rows_differ = e->tie_rows = ie.tie_rows;
    e->pass = !c->strict_ties;
    snprintf(e->reason, sizeof e->reason, "tie order: %lld picks move, exactly those of the %lld "
             "rows of %.48s that differ only among A's exact ties (ties.K)%s", (long long)moved,
             (long long)ie.tie_rows, iname, c->strict_ties ? ", failed under --strict-ties" : "");
}

/* ---- the derived policy (model/bounds.h) -------------------------------- */

/* A float pair of any float dtypes against a norm bound: ||B-A||_2 <= bound
 * over the finite pairs, the non-finite positions and values equal; the
 * cosine of the two beside it (what a cosine gate would see). */
static void derived_float(par_cmp_entry *e, const par_tensor *ta, const par_tensor *tb, double bound, topk *tk)
{
    long double sd2 = 0, sa2 = 0, sb2 = 0, sab = 0;
    const int64_t n = par_tensor_numel(ta);
    for (int64_t i = 0; i < n; i++) {
        double x = elem_f(ta, i), y = elem_f(tb, i);
        if (!isfinite(x) || !isfinite(y)) {
            if (!same_nonfinite(x, y)) {
                e->n_nonfinite++;
                topk_offer(tk, i, INFINITY, x, y, 0, 0);
            }
            continue;
        }
        double d = fabs(x - y);
        sd2 += (long double)d * d, sa2 += (long double)x * x, sb2 += (long double)y * y, sab += (long double)x * y;
        e->n_diff += x != y;
        e->max_abs = d > e->max_abs ? d : e->max_abs;
        if (x != 0 && d / fabs(x) > e->max_rel)
            e->max_rel = d / fabs(x);
        if (d > 0)
            topk_offer(tk, i, d, x, y, 0, 0);
    }
    double dn = (double)sqrtl(sd2), an = (double)sqrtl(sa2), bn = (double)sqrtl(sb2);
    e->diff_norm = dn;
    e->rel_l2 = an > 0 ? dn / an : (dn > 0 ? INFINITY : 0);
    e->cosine = an > 0 && bn > 0 ? (double)(sab / (sqrtl(sa2) * sqrtl(sb2))) : (an == bn ? 1 : 0);
    e->bound = bound;
    e->pass = dn <= bound && e->n_nonfinite == 0;
    if (e->n_nonfinite)
        snprintf(e->reason, sizeof e->reason, "NaN/Inf differ at %lld of %lld elements", (long long)e->n_nonfinite,
                 (long long)n);
    else if (!e->pass)
        snprintf(e->reason, sizeof e->reason, "||B-A|| = %.3e > %.3e, the derived bound (%.1fx it; cos(A,B) = %.6f)",
                 dn, bound, dn / bound, e->cosine);
}

/* The gap between the K-th and (K+1)-th largest of a row's E selection values. */
static double row_margin(const par_tensor *sc, int64_t row, int64_t K)
{
    const int64_t E = sc->shape[2];
    double top[65];
    int n = 0;
    if (K + 1 > 64 || K >= E)
        return INFINITY; /* no choice (K >= E) or too many picks to track: no margin */
    for (int64_t e = 0; e < E; e++) {
        double x = elem_f(sc, row * E + e);
        if (n == K + 1 && !(x > top[K]))
            continue;
        int j = n < K + 1 ? n++ : (int)K;
        while (j > 0 && top[j - 1] < x) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = x;
    }
    return top[K - 1] - top[K];
}

/* A's router.<block>.score for idx `name` of shape [B, S, K], or NULL. */
static const par_tensor *scores_of(const char *name, const par_tensor *ta, const decode_ctx *c)
{
    char sname[256];
    if (!c->scores || !par_bounds_score_name(name, sname, sizeof sname))
        return NULL;
    const par_tensor *t = par_st_find(c->scores, sname);
    if (!t || !par_dtype_is_float(t->dtype) || t->ndim != 3 || ta->ndim != 3 || t->shape[0] != ta->shape[0] ||
        t->shape[1] != ta->shape[1])
        return NULL;
    return t;
}

/* Router picks judged by margins: a token whose picks differ passes when
 * A's K-th and (K+1)-th selection values are closer than eps; the others
 * are listed (largest margin first).  Returns the failing tokens, or -1
 * when A has no scores for the block. */
static int64_t judge_margin(par_cmp_entry *e, const char *name, const par_tensor *ta, const par_tensor *tb,
                            double eps, const decode_ctx *c, topk *tk)
{
    const par_tensor *sc = scores_of(name, ta, c);
    if (!sc)
        return -1;
    const int64_t K = ta->shape[2], rows = ta->shape[0] * ta->shape[1];
    const int32_t *pa = ta->data, *pb = tb->data;
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (!memcmp(pa + r * K, pb + r * K, (size_t)K * sizeof *pa))
            continue;
        e->flips++;
        double m = row_margin(sc, r, K);
        if (m < eps) {
            e->flips_allowed++;
            continue;
        }
        bad++;
        int64_t j = 0;
        while (j < K - 1 && pa[r * K + j] == pb[r * K + j])
            j++;
        if (tk)
            topk_offer(tk, r * K + j, m, pa[r * K + j], pb[r * K + j], pa[r * K + j], pb[r * K + j]);
    }
    return bad;
}

/* router.<block>.load under the derived policy: the block's idx within its
 * margins (or equal, for an exact one), and the loads exactly what it moves. */
static void judge_load_margin(par_cmp_entry *e, const char *name, const par_tensor *ta, const par_tensor *tb,
                              const decode_ctx *c)
{
    char iname[256];
    const par_tensor *ia, *ib;
    if (!load_idx_of(name, ta, c, iname, &ia, &ib))
        return;
    const par_bound *bi = c->bounds ? par_bounds_find(c->bounds, c->file, iname) : NULL;
    if (!bi || bi->kind != PAR_BOUND_MARGIN)
        return;
    par_cmp_entry ie = {0};
    int64_t bad = judge_margin(&ie, iname, ia, ib, bi->bound, c, NULL);
    const int consistent = loads_follow_idx(ta, tb, ia, ib, NULL);
    e->pass = bad == 0 && consistent;
    if (e->pass)
        snprintf(e->reason, sizeof e->reason, "the loads move exactly with %.80s's %lld tokens that flip within the "
                 "margins", iname, (long long)ie.flips);
    else
        snprintf(e->reason, sizeof e->reason, "%s", !consistent ? "the loads differ otherwise than the block's idx "
                 "moves them" : bad < 0 ? "A has no scores for the block (make the golden with --router-scores)" :
                 "the block's idx flips tokens outside the margins");
}

/* attn.<block>.selected: at most `bound` rows differ besides A's exact ties. */
static void judge_rows(par_cmp_entry *e, const char *name, const par_tensor *ta, const par_tensor *tb, double bound,
                       const decode_ctx *c)
{
    judge_ties(e, name, ta, tb, c);
    if (!ties_of(name, ta, c) && ta->ndim == 3) {
        const int64_t k = ta->shape[2], rows = ta->shape[0] * ta->shape[1];
        e->rows_differ = 0;
        for (int64_t r = 0; r < rows; r++)
            e->rows_differ += memcmp((const int32_t *)ta->data + r * k, (const int32_t *)tb->data + r * k,
                                     (size_t)k * sizeof(int32_t)) != 0;
    }
    int64_t other = e->rows_differ - e->tie_rows;
    e->bound = bound;
    e->pass = (double)other <= bound;
    snprintf(e->reason, sizeof e->reason, "%lld rows differ besides A's exact ties (%lld tie order), %s the %.0f "
             "the bound allows", (long long)other, (long long)e->tie_rows, e->pass ? "within" : "more than", bound);
}

/* An integer pair under the derived policy (e->pass: exact equality so far;
 * tk: the differing elements, replaced by the failing flips for a margin). */
static void derived_int(par_cmp_entry *e, const char *name, const par_tensor *ta, const par_tensor *tb,
                        const par_bound *bd, const decode_ctx *c, topk *tk)
{
    if (!bd || e->pass)
        return;
    switch (bd->kind) {
    case PAR_BOUND_MARGIN: {
        topk mk = {tk->k, 0, tk->v};
        e->bound = bd->bound;
        int64_t bad = judge_margin(e, name, ta, tb, bd->bound, c, &mk);
        if (bad < 0) {
            snprintf(e->reason, sizeof e->reason, "A has no router scores for this block (scores.K: make the golden "
                     "with parity golden --router-scores)");
            return;
        }
        tk->n = mk.n;
        for (int j = 0; j < tk->n; j++)
            tk->v[j].has_margin = 1, tk->v[j].margin = tk->v[j].err;
        e->pass = bad == 0;
        snprintf(e->reason, sizeof e->reason, "%lld tokens pick other experts: %lld with a margin in A below eps "
                 "= %.3e (may flip), %lld at or above it", (long long)e->flips, (long long)e->flips_allowed,
                 bd->bound, (long long)bad);
        return;
    }
    case PAR_BOUND_LOAD: judge_load_margin(e, name, ta, tb, c); return;
    case PAR_BOUND_ROWS: judge_rows(e, name, ta, tb, bd->bound, c); return;
    default: judge_ties(e, name, ta, tb, c); return; /* exact, with A's exact ties as everywhere */
    }
}

/* No usable bound for a tensor under the derived policy: a failing entry. */
static void derived_missing(par_cmp_entry *e, const char *file, const char *name, const par_bound *bd)
{
    e->pass = 0;
    if (bd)
        snprintf(e->reason, sizeof e->reason, "the bound of this float tensor is of kind %s, not norm",
                 par_bound_kind_name(bd->kind));
    else
        snprintf(e->reason, sizeof e->reason, "no derived bound for %.60s %.80s in the bounds file (derived from a "
                 "set without it)", file, name);
}

/* A failing entry keeps its listed elements, their coordinates decoded;
 * else they are freed. */
static void attach_list(par_cmp_entry *e, const char *name, const par_tensor *ta, const decode_ctx *ctx, topk *tk)
{
    if (e->pass || tk->n == 0) {
        par_free(tk->v);
        return;
    }
    for (int j = 0; j < tk->n; j++) {
        par_cmp_elem *el = &tk->v[j];
        int64_t rem = el->index;
        for (int d = ta->ndim - 1; d >= 0; d--) {
            int64_t s = ta->shape[d] ? ta->shape[d] : 1;
            el->coord[d] = rem % s;
            rem /= s;
        }
        describe(ctx, name, ta, el);
    }
    e->list = tk->v;
    e->nlist = tk->n;
}

/* e's mode and tolerances under the policy (a manifest override, the
 * derived policy's bound: *bd, NULL when the bounds have none). */
static par_status entry_mode(par_cmp_entry *e, const char *name, int isint, int bitwise, par_policy policy,
                             const par_tol_override *ov, const decode_ctx *ctx, const par_bound **bd)
{
    if (policy == PAR_POLICY_DERIVED) { /* the bounds file's, never a manifest override */
        e->mode = "derived";
        *bd = ctx->bounds ? par_bounds_find(ctx->bounds, ctx->file, name) : NULL;
        if (*bd && !(e->bound_source = par_strdup((*bd)->source, PAR_TAG_IO)))
            return par_err(PAR_ENOMEM, "compare: out of memory");
    } else if (isint) {
        e->mode = "integer";
    } else if (ov) {
        e->mode = "override";
        e->rtol = ov->rtol;
        e->atol = ov->atol;
        e->override_reason = par_strdup(ov->reason, PAR_TAG_IO);
        if (!e->override_reason)
            return par_err(PAR_ENOMEM, "compare: out of memory");
    } else if (bitwise) {
        e->mode = "bitwise";
    } else {
        e->mode = par_policy_name(policy);
        par_policy_tolerance(policy, &e->rtol, &e->atol);
    }
    return PAR_OK;
}

/* Compares values of two tensors of equal dtype and shape into e (the
 * derived policy: of equal shape, floats of any float dtypes). */
static par_status compare_values(par_cmp_entry *e, const char *name, const par_tensor *ta, const par_tensor *tb,
                                 par_policy policy, const par_tol_override *ov, int max_list, const decode_ctx *ctx)
{
    int64_t numel = par_tensor_numel(ta);
    int isint = !par_dtype_is_float(ta->dtype);
    int bitwise = !isint && policy == PAR_POLICY_BITWISE && !ov;
    const par_bound *bd = NULL;
    par_status st = entry_mode(e, name, isint, bitwise, policy, ov, ctx, &bd);
    if (st)
        return st;
    topk tk = {max_list, 0, NULL};
    if (max_list > 0) {
        tk.v = par_calloc((size_t)max_list, sizeof *tk.v, PAR_TAG_IO);
        if (!tk.v)
            return par_err(PAR_ENOMEM, "compare: out of memory");
    }

    if (policy == PAR_POLICY_DERIVED && !isint) {
        if (bd && bd->kind == PAR_BOUND_NORM)
            derived_float(e, ta, tb, bd->bound, &tk);
        else
            derived_missing(e, ctx->file, name, bd);
        attach_list(e, name, ta, ctx, &tk);
        return PAR_OK;
    }
    long double sd2 = 0, sr2 = 0;
    double max_abs = 0, max_rel = 0;
    int64_t ndiff = 0, nnf = 0;
    if (isint) {
        for (int64_t i = 0; i < numel; i++) {
            int64_t x = elem_i(ta, i), y = elem_i(tb, i);
            double dx = (double)x, dy = (double)y;
            sr2 += (long double)dx * dx;
            if (x == y)
                continue;
            ndiff++;
            double d = fabs(dx - dy);
            sd2 += (long double)d * d;
            if (d > max_abs)
                max_abs = d;
            if (x != 0 && d / fabs(dx) > max_rel)
                max_rel = d / fabs(dx);
            topk_offer(&tk, i, d, dx, dy, x, y);
        }
    } else {
        float_acc acc = {0, 0, 0, 0, 0, 0};
        switch (ta->dtype) {
        case PAR_F64: float_loop(PAR_F64, ta, tb, numel, bitwise, &tk, &acc); break;
        case PAR_F32: float_loop(PAR_F32, ta, tb, numel, bitwise, &tk, &acc); break;
        default: float_loop(PAR_BF16, ta, tb, numel, bitwise, &tk, &acc); break;
        }
        sd2 = acc.sd2;
        sr2 = acc.sr2;
        max_abs = acc.max_abs;
        max_rel = acc.max_rel;
        ndiff = acc.ndiff;
        nnf = acc.nnf;
    }
    double dn = (double)sqrtl(sd2), rn = (double)sqrtl(sr2);
    e->diff_norm = dn;
    e->max_abs = max_abs;
    e->max_rel = max_rel;
    e->rel_l2 = rn > 0 ? dn / rn : (dn > 0 ? INFINITY : 0);
    e->n_diff = ndiff;
    e->n_nonfinite = nnf;

    if (isint) {
        e->pass = ndiff == 0;
        if (!e->pass)
            snprintf(e->reason, sizeof e->reason, "integers differ at %lld of %lld elements", (long long)ndiff,
                     (long long)numel);
        if (policy == PAR_POLICY_DERIVED) {
            if (!bd)
                derived_missing(e, ctx->file, name, NULL);
            derived_int(e, name, ta, tb, bd, ctx, &tk);
        } else {
            if (!e->pass)
                judge_ties(e, name, ta, tb, ctx);
            if (!e->pass && !e->tie_rows)
                judge_load_ties(e, name, ta, tb, ctx);
        }
    } else if (bitwise) {
        e->pass = ndiff == 0;
        if (!e->pass)
            snprintf(e->reason, sizeof e->reason, "bits differ at %lld of %lld elements", (long long)ndiff,
                     (long long)numel);
    } else {
        e->bound = e->rtol * rn + e->atol * sqrt((double)numel);
        int norm_ok = dn <= e->bound; /* false for NaN/inf norms */
        e->pass = norm_ok && nnf == 0;
        if (nnf)
            snprintf(e->reason, sizeof e->reason, "NaN/Inf differ at %lld of %lld elements%s", (long long)nnf,
                     (long long)numel, norm_ok ? "" : "; finite values outside the policy too");
        else if (!norm_ok)
            snprintf(e->reason, sizeof e->reason, "||B-A|| = %.3e > %.3e = %g*||A|| + %g*sqrt(%lld)", dn, e->bound,
                     e->rtol, e->atol, (long long)numel);
    }
    attach_list(e, name, ta, ctx, &tk);
    return PAR_OK;
}

static void fill_shape(par_cmp_entry *e, const par_tensor *t)
{
    e->dtype = t->dtype;
    e->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++)
        e->shape[d] = t->shape[d];
    e->numel = par_tensor_numel(t);
}

/* ---- one file pair ---------------------------------------------------- */

typedef struct {
    par_policy policy;            /* resolved */
    int max_list;
    const par_manifest *ma;       /* A's manifest (overrides), or NULL */
    int64_t cp[2];
    const par_st_file *ties;      /* A's ties.K for the step file compared, or NULL */
    int strict_ties;
    const par_bounds *bounds;     /* the derived policy's, or NULL */
    const par_st_file *scores;    /* A's scores.K for the step file compared, or NULL */
} file_ctx;

static const par_tensor *find_i32_bs(const par_st_file *f, const char *name)
{
    const par_tensor *t = par_st_find(f, name);
    return (t && t->dtype == PAR_I32 && t->ndim == 2) ? t : NULL;
}

/* An entry one side lacks: failing, or left out (--subset, missing in B). */
static void entry_missing(par_compare_report *r, par_cmp_entry *e, par_cmp_side side)
{
    e->side = side;
    if (side == PAR_CMP_ONLY_A && r->subset) {
        snprintf(e->reason, sizeof e->reason, "not in B (left out: --subset)");
        e->left_out = 1;
        r->n_left_out++;
        return;
    }
    snprintf(e->reason, sizeof e->reason, side == PAR_CMP_ONLY_A ? "missing in B" : "missing in A (extra in B)");
    entry_fail(r, e);
}

/* The decoding context of a file pair (either file may be NULL: a file
 * one side lacks). */
static void pair_decode_ctx(decode_ctx *dc, const par_st_file *a, const par_st_file *b, const char *file,
                            const file_ctx *fc)
{
    memset(dc, 0, sizeof *dc);
    dc->is_step = has_prefix(file, "step.");
    dc->ties = fc->ties;
    dc->strict_ties = fc->strict_ties;
    dc->fa = a;
    dc->fb = b;
    dc->file = file;
    dc->bounds = fc->bounds;
    dc->scores = fc->scores;
    if (!dc->is_step)
        return;
    const par_tensor *seg = a ? find_i32_bs(a, "input.segments") : NULL;
    if (!seg && b)
        seg = find_i32_bs(b, "input.segments");
    const par_tensor *tok = a ? find_i32_bs(a, "input.tokens") : NULL;
    if (!tok && b)
        tok = find_i32_bs(b, "input.tokens");
    const par_tensor *bs = seg ? seg : tok;
    dc->seg = seg;
    if (bs) {
        dc->B = bs->shape[0];
        dc->S = bs->shape[1];
    }
    static const char *side[2] = {"A's layout", "B's layout"};
    for (int k = 0; k < 2; k++) {
        if (fc->cp[k] > 1) {
            dc->cp[dc->ncp] = fc->cp[k];
            dc->cp_side[dc->ncp] = side[k];
            dc->ncp++;
        }
    }
    if (dc->ncp == 2 && dc->cp[0] == dc->cp[1]) {
        dc->ncp = 1;
        dc->cp_side[0] = "both layouts";
    }
}

/* A pair of tensors to compare into entry e of the report. */
typedef struct {
    int e;
    const char *name;
    const par_tensor *ta, *tb;
    const par_tol_override *ov;
    par_status st;
} cmp_job;

/* The values of a file's pairs: each entry is computed from its two tensors
 * alone (compare_values touches nothing else), so they run in parallel, and
 * the failures are counted afterwards in the entries' order: the report is
 * the one a loop over them would make. */
static par_status run_jobs(par_compare_report *r, cmp_job *jobs, int nj, const file_ctx *fc, const decode_ctx *dc)
{
#pragma omp parallel for schedule(dynamic, 1) if (nj > 1)
    for (int k = 0; k < nj; k++)
        jobs[k].st = compare_values(&r->e[jobs[k].e], jobs[k].name, jobs[k].ta, jobs[k].tb, fc->policy, jobs[k].ov,
                                    fc->max_list, dc);
    for (int k = 0; k < nj; k++) {
        if (jobs[k].st) /* out of memory (its message was made on a worker thread) */
            return par_err(PAR_ENOMEM, "compare: out of memory");
        par_cmp_entry *e = &r->e[jobs[k].e];
        if (!e->pass) {
            e->pass = 1; /* let entry_fail count it */
            entry_fail(r, e);
        }
    }
    return PAR_OK;
}

/* Compares a file pair tensor by tensor; a or b NULL: a file one side
 * lacks, every tensor of the other side's is an entry missing there. */
static par_status compare_pair(par_compare_report *r, const par_st_file *a, const par_st_file *b, const char *file,
                               const file_ctx *fc)
{
    decode_ctx dc;
    pair_decode_ctx(&dc, a, b, file, fc);
    int na = a ? par_st_count(a) : 0, nb = b ? par_st_count(b) : 0;
    int i = 0, j = 0, nj = 0;
    char s1[160], s2[160];
    cmp_job *jobs = par_malloc((size_t)(na < nb ? na : nb) * sizeof *jobs + 1, PAR_TAG_IO);
    if (!jobs)
        return par_err(PAR_ENOMEM, "compare: out of memory");
    while (i < na || j < nb) {
        int c = i >= na ? 1 : j >= nb ? -1 : strcmp(par_st_name(a, i), par_st_name(b, j));
        const char *name = c <= 0 ? par_st_name(a, i) : par_st_name(b, j);
        if (!entry_selected(r, file, name)) {
            i += c <= 0;
            j += c >= 0;
            continue;
        }
        par_cmp_entry *e = report_add(r, file, name);
        if (!e) {
            par_free(jobs);
            return par_err(PAR_ENOMEM, "compare: out of memory");
        }
        if (c != 0) {
            fill_shape(e, c < 0 ? par_st_tensor(a, i++) : par_st_tensor(b, j++));
            entry_missing(r, e, c < 0 ? PAR_CMP_ONLY_A : PAR_CMP_ONLY_B);
            continue;
        }
        const par_tensor *ta = par_st_tensor(a, i), *tb = par_st_tensor(b, j);
        i++;
        j++;
        fill_shape(e, ta);
        if (ta->dtype != tb->dtype &&
            !(fc->policy == PAR_POLICY_DERIVED && par_dtype_is_float(ta->dtype) && par_dtype_is_float(tb->dtype))) {
            snprintf(e->reason, sizeof e->reason, "dtype differs: A %s, B %s", par_dtype_name(ta->dtype),
                     par_dtype_name(tb->dtype));
            entry_fail(r, e);
            continue;
        }
        if (!par_tensor_same_shape(ta, tb)) {
            snprintf(e->reason, sizeof e->reason, "shape differs: A %s, B %s",
                     par_shape_str(ta->ndim, ta->shape, s1, sizeof s1),
                     par_shape_str(tb->ndim, tb->shape, s2, sizeof s2));
            entry_fail(r, e);
            continue;
        }
        const par_tol_override *ov = fc->ma ? par_manifest_tolerance(fc->ma, name) : NULL;
        jobs[nj++] = (cmp_job){(int)(e - r->e), name, ta, tb, ov, PAR_OK};
    }
    par_status st = run_jobs(r, jobs, nj, fc, &dc);
    par_free(jobs);
    if (st)
        return st;
    r->nfiles++;
    return PAR_OK;
}

static int clamp_list(int k)
{
    if (k < 0)
        return 0;
    return k > PAR_CMP_MAX_LIST ? PAR_CMP_MAX_LIST : k;
}

/* A set's ties.K.safetensors (model/golden.h) in dir, for step k: *out NULL
 * when there is none (a set written before it, a parallel dump, row
 * blocks); an error when it is there but unreadable. */
static par_status open_side(const char *dir, const char *kind, int64_t k, par_st_file **out)
{
    char name[64];
    snprintf(name, sizeof name, "%s.%lld.safetensors", kind, (long long)k);
    char *p = par_path_join(dir, name);
    if (!p)
        return par_err(PAR_ENOMEM, "compare: out of memory");
    struct stat sb;
    par_status st = PAR_OK;
    *out = NULL;
    if (stat(p, &sb) == 0)
        st = par_st_read(p, out);
    par_free(p);
    return st;
}

static par_status compare_st_ties(const par_st_file *a, const par_st_file *b, const char *file,
                                  const par_compare_opts *o, const par_st_file *ties, const par_st_file *scores,
                                  par_compare_report **out);

par_status par_compare_st(const par_st_file *a, const par_st_file *b, const char *file, const par_compare_opts *o,
                          par_compare_report **out)
{
    return compare_st_ties(a, b, file, o, NULL, NULL, out);
}

/* The derived policy needs its bounds; the report names them. */
static par_status derived_setup(par_compare_report *r, const par_compare_opts *o)
{
    if (o->policy != PAR_POLICY_DERIVED)
        return PAR_OK;
    if (!o->bounds)
        return par_err(PAR_EINVAL, "compare: the derived policy needs a bounds file (parity bounds; --bounds FILE)");
    snprintf(r->bounds_label, sizeof r->bounds_label, "%s, factor %g", par_bounds_label(o->bounds),
             par_bounds_factor(o->bounds));
    return PAR_OK;
}

static par_status compare_st_ties(const par_st_file *a, const par_st_file *b, const char *file,
                                  const par_compare_opts *o, const par_st_file *ties, const par_st_file *scores,
                                  par_compare_report **out)
{
    par_compare_opts def;
    if (!o) {
        par_compare_opts_init(&def);
        o = &def;
    }
    par_compare_report *r;
    par_status st = report_new(par_st_label(a), par_st_label(b), &r);
    if (st)
        return st;
    r->policy = o->policy == PAR_POLICY_AUTO ? PAR_POLICY_F64 : o->policy;
    snprintf(r->policy_why, sizeof r->policy_why, "%s", o->policy == PAR_POLICY_AUTO ? "auto: bare files" : "given");
    file_ctx fc = {r->policy, clamp_list(o->max_list), NULL, {0, 0}, ties, o->strict_ties, o->bounds, scores};
    if (!(st = derived_setup(r, o)) && !(st = report_select(r, o)) &&
        !(st = compare_pair(r, a, b, file ? file : par_st_label(a), &fc)))
        st = finish_selection(r);
    if (st) {
        par_compare_report_free(r);
        return st;
    }
    *out = r;
    return PAR_OK;
}

/* ---- golden-set directories ------------------------------------------- */

typedef struct {
    int kind; /* 0 params, 1 step */
    int64_t k;
    char name[64];
} gfile;

/* Parses "params.K.safetensors" / "step.K.safetensors". */
static int parse_gname(const char *s, gfile *g)
{
    const char *p;
    if (has_prefix(s, "params."))
        g->kind = 0, p = s + 7;
    else if (has_prefix(s, "step."))
        g->kind = 1, p = s + 5;
    else
        return 0;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
        return 0;
    int64_t k = 0;
    while (*p >= '0' && *p <= '9') {
        if (k > (INT64_MAX - 9) / 10)
            return 0;
        k = k * 10 + (*p++ - '0');
    }
    if (strcmp(p, ".safetensors"))
        return 0;
    if (strlen(s) >= sizeof g->name)
        return 0;
    g->k = k;
    strcpy(g->name, s);
    return 1;
}

static int cmp_gfile(const void *x, const void *y)
{
    const gfile *a = x, *b = y;
    if (a->k != b->k)
        return a->k < b->k ? -1 : 1;
    return a->kind - b->kind;
}

static par_status list_gfiles(const char *dir, gfile **out, int *n)
{
    DIR *d = opendir(dir);
    if (!d)
        return par_err(PAR_EIO, "%s: cannot list the directory: %s", dir, strerror(errno));
    gfile *v = NULL;
    int cnt = 0, cap = 0;
    struct dirent *de;
    par_status st = PAR_OK;
    while ((de = readdir(d)) != NULL) {
        gfile g;
        if (!parse_gname(de->d_name, &g))
            continue;
        if (cnt == cap) {
            int nc = cap ? 2 * cap : 16;
            gfile *nv = par_realloc(v, (size_t)nc * sizeof *nv, PAR_TAG_IO);
            if (!nv) {
                st = par_err(PAR_ENOMEM, "%s: out of memory", dir);
                break;
            }
            v = nv;
            cap = nc;
        }
        v[cnt++] = g;
    }
    closedir(d);
    if (st) {
        par_free(v);
        return st;
    }
    if (cnt)
        qsort(v, (size_t)cnt, sizeof *v, cmp_gfile);
    *out = v;
    *n = cnt;
    return PAR_OK;
}

static int64_t layout_cp(const par_manifest *m)
{
    static const char *keys[] = {"context_parallel_size", "context-parallel-size", "cp"};
    int64_t v;
    for (int i = 0; i < 3; i++)
        if (m->layout && par_json_int(m->layout, keys[i], &v))
            return v;
    return 1;
}

/* A set's files agree with its manifest: every params/step file is listed
 * in "files" (so its sha256 was checked), params.K only for first_step <=
 * K <= steps and step.K only for first_step <= K < steps, each kind contiguous, and the claimed end
 * (params.steps or step.steps-1) present.  A selection of a set's files
 * (as the matrix compares) passes; a claim the files do not back does not. */
static par_status check_set(const char *dir, const par_manifest *m, const gfile *g, int n)
{
    int64_t lo[2] = {-1, -1}, hi[2] = {-1, -1}, cnt[2] = {0, 0};
    for (int i = 0; i < n; i++) {
        if (!par_manifest_file_sha(m, g[i].name))
            return par_err(PAR_EFORMAT, "%s: %s is not listed in %s \"files\" (its sha256 would go unchecked); a "
                           "golden set lists every file", dir, g[i].name, PAR_MANIFEST_NAME);
        int k = g[i].kind;
        if (g[i].k > m->steps - (k == 1))
            return par_err(PAR_EFORMAT, "%s: %s is past the manifest's \"steps\": %lld (%s.K exists for K %s %lld)",
                           dir, g[i].name, (long long)m->steps, k ? "step" : "params", k ? "<" : "<=",
                           (long long)m->steps);
        if (g[i].k < m->first_step)
            return par_err(PAR_EFORMAT, "%s: %s is before the manifest's \"first_step\": %lld (a resumed run's set "
                           "starts there)", dir, g[i].name, (long long)m->first_step);
        lo[k] = lo[k] < 0 || g[i].k < lo[k] ? g[i].k : lo[k];
        hi[k] = g[i].k > hi[k] ? g[i].k : hi[k];
        cnt[k]++;
    }
    for (int k = 0; k < 2; k++)
        if (cnt[k] && hi[k] - lo[k] + 1 != cnt[k])
            return par_err(PAR_EFORMAT, "%s: the %s files are not contiguous (%lld files for steps %lld..%lld)", dir,
                           k ? "step" : "params", (long long)cnt[k], (long long)lo[k], (long long)hi[k]);
    if (n && hi[0] != m->steps && hi[1] != m->steps - 1)
        return par_err(PAR_EFORMAT, "%s: the manifest claims \"steps\": %lld, but neither params.%lld nor step.%lld is "
                       "in the set (its last files: params %lld, step %lld; -1 = none)", dir, (long long)m->steps,
                       (long long)m->steps, (long long)(m->steps - 1), (long long)hi[0], (long long)hi[1]);
    return PAR_OK;
}

/* One failing entry per config key whose value differs between the sets'
 * manifests ("model" and "train": a reported difference, not an error). */
/* Directories: each set's mode in the JSON report (1, or 0 out of memory). */
static int numerics_json(const par_compare_report *r, cJSON *root)
{
    return !r->numerics[0][0] || (cJSON_AddStringToObject(root, "numerics_a", r->numerics[0]) &&
                                  cJSON_AddStringToObject(root, "numerics_b", r->numerics[1]) &&
                                  cJSON_AddStringToObject(root, "recipe_a", r->recipe[0]) &&
                                  cJSON_AddStringToObject(root, "recipe_b", r->recipe[1]));
}

/* The mode a set was made in (docs/bitwise.md): train.numerics, absent = tolerance. */
static void numerics_of(const par_manifest *m, char out[16])
{
    const cJSON *n = m->train ? cJSON_GetObjectItemCaseSensitive(m->train, PAR_CONFIG_NUMERICS_KEY) : NULL;
    snprintf(out, 16, "%s", cJSON_IsString(n) ? n->valuestring : "tolerance");
}

/* The recipe a set was made under (docs/recipes.md): train.recipe, absent = none. */
static void recipe_of(const par_manifest *m, char out[16])
{
    const cJSON *n = m->train ? cJSON_GetObjectItemCaseSensitive(m->train, PAR_CONFIG_RECIPE_KEY) : NULL;
    snprintf(out, 16, "%s", cJSON_IsString(n) ? n->valuestring : "none");
}

static par_status compare_configs(par_compare_report *r, const par_manifest *ma, const par_manifest *mb)
{
    numerics_of(ma, r->numerics[0]);
    numerics_of(mb, r->numerics[1]);
    recipe_of(ma, r->recipe[0]);
    recipe_of(mb, r->recipe[1]);
    const cJSON *sec[2][2] = {{ma->model, mb->model}, {ma->train, mb->train}};
    static const char *const secname[2] = {"model", "train"};
    for (int s = 0; s < 2; s++) {
        for (int side = 0; side < 2; side++) {
            const cJSON *it;
            cJSON_ArrayForEach(it, sec[s][side])
            {
                if (!it->string || !strcmp(it->string, PAR_CONFIG_NUMERICS_KEY) || /* the mode: a note */
                    !strcmp(it->string, PAR_CONFIG_RECIPE_KEY))                     /* the recipe: a note */
                    continue;
                const cJSON *other = cJSON_GetObjectItemCaseSensitive(sec[s][!side], it->string);
                if (side == 1 && other)
                    continue; /* seen from A's side */
                if (other && cJSON_Compare(it, other, 1))
                    continue;
                char key[160], va[96] = "(absent)", vb[96] = "(absent)";
                snprintf(key, sizeof key, "%s.%s", secname[s], it->string);
                char *pa = cJSON_PrintUnformatted(side ? other : it), *pb = cJSON_PrintUnformatted(side ? it : other);
                if (pa)
                    snprintf(va, sizeof va, "%s", pa);
                if (pb)
                    snprintf(vb, sizeof vb, "%s", pb);
                cJSON_free(pa);
                cJSON_free(pb);
                par_cmp_entry *e = report_add(r, PAR_MANIFEST_NAME, key);
                if (!e)
                    return par_err(PAR_ENOMEM, "compare: out of memory");
                snprintf(e->reason, sizeof e->reason, "config differs: A %s = %s, B %s = %s (the sets are of different "
                         "runs)", it->string, va, it->string, vb);
                e->mode = "-";
                e->dtype = PAR_DTYPE_COUNT; /* not a tensor: printed as "?" */
                entry_fail(r, e);
            }
        }
    }
    return PAR_OK;
}

/* Keeps the files of g inside the compared steps [lo, hi] (params.lo ..
 * params.hi, step.lo .. step.hi-1); returns how many it dropped. */
static int keep_steps(gfile *g, int *n, int64_t lo, int64_t hi)
{
    int kept = 0, n0 = *n;
    for (int i = 0; i < n0; i++)
        if (g[i].k >= lo && (g[i].kind == 0 ? g[i].k <= hi : g[i].k < hi))
            g[kept++] = g[i];
    *n = kept;
    return n0 - kept;
}

/* The steps present in both sets (GOLDEN.md: a resumed run's set holds
 * first_step..steps): recorded in r, the lists cut to them; no step in
 * common is a failing entry. */
static par_status common_steps(par_compare_report *r, const par_manifest *ma, const par_manifest *mb, gfile *fa,
                               int *na, gfile *fb, int *nb)
{
    r->have_steps = 1;
    r->steps_a[0] = ma->first_step, r->steps_a[1] = ma->steps;
    r->steps_b[0] = mb->first_step, r->steps_b[1] = mb->steps;
    int64_t lo = ma->first_step > mb->first_step ? ma->first_step : mb->first_step;
    int64_t hi = ma->steps < mb->steps ? ma->steps : mb->steps;
    r->steps_cmp[0] = lo, r->steps_cmp[1] = hi;
    if (lo > hi) {
        par_cmp_entry *e = report_add(r, PAR_MANIFEST_NAME, "");
        if (!e)
            return par_err(PAR_ENOMEM, "compare: out of memory");
        snprintf(e->reason, sizeof e->reason, "no step in common: A holds steps %lld..%lld, B %lld..%lld",
                 (long long)ma->first_step, (long long)ma->steps, (long long)mb->first_step, (long long)mb->steps);
        e->mode = "-";
        e->dtype = PAR_DTYPE_COUNT;
        entry_fail(r, e);
        *na = *nb = 0;
        return PAR_OK;
    }
    r->skipped_a = keep_steps(fa, na, lo, hi);
    r->skipped_b = keep_steps(fb, nb, lo, hi);
    return PAR_OK;
}

/* A set file one side lacks: one failing entry for the file; under --only
 * or --subset the file is read and each of its (selected) tensors is an
 * entry of its own, missing on the other side (left out under --subset). */
static par_status missing_file(par_compare_report *r, const char *dir, const char *name, par_cmp_side side,
                               const file_ctx *fc)
{
    if (!r->n_only && !r->subset) {
        par_cmp_entry *e = report_add(r, name, "");
        if (!e)
            return par_err(PAR_ENOMEM, "compare: out of memory");
        e->side = side;
        snprintf(e->reason, sizeof e->reason, "file %s", side == PAR_CMP_ONLY_A ? "missing in B" :
                 "missing in A (extra in B)");
        entry_fail(r, e);
        r->nfiles++;
        return PAR_OK;
    }
    char *path = par_path_join(dir, name);
    if (!path)
        return par_err(PAR_ENOMEM, "compare: out of memory");
    par_st_file *f = NULL;
    par_status st = par_st_read(path, &f);
    par_free(path);
    if (st)
        return st;
    st = side == PAR_CMP_ONLY_A ? compare_pair(r, f, NULL, name, fc) : compare_pair(r, NULL, f, name, fc);
    par_st_close(f);
    return st;
}

static par_status compare_dirs(par_compare_report *r, const char *da, const char *db, const par_compare_opts *o)
{
    par_status (*read)(const char *, par_manifest *) = o->trust_hashes ? par_manifest_read_unverified
                                                                       : par_manifest_read;
    par_manifest ma, mb;
    par_status st = read(da, &ma);
    if (st)
        return st;
    st = read(db, &mb);
    if (st)
        goto done_free_ma;
    if (o->policy == PAR_POLICY_AUTO) {
        par_policy pa, pb;
        if ((st = par_policy_from_precision(ma.precision, &pa)) || (st = par_policy_from_precision(mb.precision, &pb)))
            goto done_free_mb;
        r->policy = pa > pb ? pa : pb; /* the looser of the two (f64 < f32 < bf16) */
        snprintf(r->policy_why, sizeof r->policy_why, "auto: precision %s / %s", ma.precision, mb.precision);
    } else {
        r->policy = o->policy;
        snprintf(r->policy_why, sizeof r->policy_why, "given");
    }
    file_ctx fc = {r->policy, clamp_list(o->max_list), &ma, {layout_cp(&ma), layout_cp(&mb)}, NULL, o->strict_ties,
                   o->bounds, NULL};
    if (r->policy == PAR_POLICY_DERIVED && ((st = derived_setup(r, o)) ||
                                            (st = par_bounds_check_golden(o->bounds, &ma, da))))
        goto done_free_mb;

    gfile *fa = NULL, *fb = NULL;
    int na = 0, nb = 0;
    if ((st = list_gfiles(da, &fa, &na)))
        goto done_free_mb;
    if ((st = list_gfiles(db, &fb, &nb)))
        goto done_free_lists;
    if ((st = check_set(da, &ma, fa, na)) || (st = check_set(db, &mb, fb, nb)) ||
        (st = compare_configs(r, &ma, &mb)) || (st = common_steps(r, &ma, &mb, fa, &na, fb, &nb)))
        goto done_free_lists;
    int i = 0, j = 0;
    while (i < na || j < nb) {
        int c = i >= na ? 1 : j >= nb ? -1 : cmp_gfile(&fa[i], &fb[j]);
        if (c != 0) {
            const gfile *g = c < 0 ? &fa[i++] : &fb[j++];
            if ((st = missing_file(r, c < 0 ? da : db, g->name, c < 0 ? PAR_CMP_ONLY_A : PAR_CMP_ONLY_B, &fc)))
                goto done_free_lists;
            continue;
        }
        const char *name = fa[i].name;
        i++;
        j++;
        char *pa = par_path_join(da, name), *pb = par_path_join(db, name);
        par_st_file *sa = NULL, *sb = NULL;
        if (!pa || !pb)
            st = par_err(PAR_ENOMEM, "compare: out of memory");
        if (!st)
            st = par_st_map(pa, &sa);
        if (!st)
            st = par_st_map(pb, &sb);
        par_st_file *ties = NULL, *scores = NULL;
        if (!st && fa[i - 1].kind == 1)
            st = open_side(da, "ties", fa[i - 1].k, &ties);
        if (!st && fa[i - 1].kind == 1 && r->policy == PAR_POLICY_DERIVED)
            st = open_side(da, "scores", fa[i - 1].k, &scores);
        fc.ties = ties;
        fc.scores = scores;
        if (!st)
            st = compare_pair(r, sa, sb, name, &fc);
        fc.ties = NULL;
        fc.scores = NULL;
        par_st_close(ties);
        par_st_close(scores);
        par_st_close(sa);
        par_st_close(sb);
        par_free(pa);
        par_free(pb);
        if (st)
            goto done_free_lists;
    }
done_free_lists:
    par_free(fa);
    par_free(fb);
done_free_mb:
    par_manifest_free(&mb);
done_free_ma:
    par_manifest_free(&ma);
    return st;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* Two bare files (a step.K beside its ties.K, and scores.K under the
 * derived policy, when a's name says so). */
static par_status compare_bare_files(const char *a, const char *b, const par_compare_opts *o,
                                     par_compare_report **out)
{
    par_st_file *fa, *fb;
    par_status st = par_st_read(a, &fa);
    if (st)
        return st;
    st = par_st_read(b, &fb);
    if (st) {
        par_st_close(fa);
        return st;
    }
    par_st_file *ties = NULL, *scores = NULL;
    gfile g;
    char *dir = NULL;
    if (parse_gname(base_name(a), &g) && g.kind == 1) { /* a bare step.K: A's ties.K next to it */
        size_t dl = (size_t)(base_name(a) - a);
        dir = par_strdup(dl ? a : ".", PAR_TAG_IO);
        if (!dir)
            st = par_err(PAR_ENOMEM, "compare: out of memory");
        else if (dl)
            dir[dl - 1 > 0 ? dl - 1 : 1] = 0;
        if (!st)
            st = open_side(dir, "ties", g.k, &ties);
        if (!st && o->policy == PAR_POLICY_DERIVED)
            st = open_side(dir, "scores", g.k, &scores);
    }
    if (!st)
        st = compare_st_ties(fa, fb, base_name(a), o, ties, scores, out);
    par_free(dir);
    par_st_close(ties);
    par_st_close(scores);
    par_st_close(fa);
    par_st_close(fb);
    return st;
}

par_status par_compare_paths(const char *a, const char *b, const par_compare_opts *o, par_compare_report **out)
{
    par_compare_opts def;
    if (!o) {
        par_compare_opts_init(&def);
        o = &def;
    }
    struct stat sa, sb;
    if (stat(a, &sa) != 0)
        return par_err(errno == ENOENT ? PAR_ENOTFOUND : PAR_EIO, "%s: %s", a, strerror(errno));
    if (stat(b, &sb) != 0)
        return par_err(errno == ENOENT ? PAR_ENOTFOUND : PAR_EIO, "%s: %s", b, strerror(errno));
    int da = S_ISDIR(sa.st_mode), db = S_ISDIR(sb.st_mode);
    if (da != db)
        return par_err(PAR_EINVAL, "compare: %s is a %s but %s is a %s; compare two golden-set directories or two files",
                       a, da ? "directory" : "file", b, db ? "directory" : "file");
    if (!da)
        return compare_bare_files(a, b, o, out);
    par_compare_report *r;
    par_status st = report_new(a, b, &r);
    if (st)
        return st;
    if (!(st = report_select(r, o)) && !(st = compare_dirs(r, a, b, o)))
        st = finish_selection(r);
    if (st) {
        par_compare_report_free(r);
        return st;
    }
    *out = r;
    return PAR_OK;
}

/* ---- output ----------------------------------------------------------- */

static void print_elem(FILE *out, const par_cmp_entry *e, const par_cmp_elem *el)
{
    char c[160];
    par_shape_str(e->ndim, el->coord, c, sizeof c);
    if (!par_dtype_is_float(e->dtype))
        fprintf(out, "      at %-16s A=%lld B=%lld", c, (long long)el->ia, (long long)el->ib);
    else
        fprintf(out, "      at %-16s A=%-24.17g B=%-24.17g |B-A|=%.3e", c, el->a, el->b, el->err);
    if (el->where[0])
        fprintf(out, "  %s", el->where);
    if (el->has_margin)
        fprintf(out, "; margin in A %.3e", el->margin);
    fputc('\n', out);
}

static void print_entry(FILE *out, const par_cmp_entry *e)
{
    char sh[160];
    par_shape_str(e->ndim, e->shape, sh, sizeof sh);
    fprintf(out, "%s %s %s %s %s", !e->pass ? "FAIL" : e->tie_rows ? "TIE " : "PASS", e->file, e->tensor[0] ? e->tensor : "-",
            par_dtype_name(e->dtype), e->tensor[0] ? sh : "");
    if (strcmp(e->mode, "-"))
        fprintf(out, " [%s] max_abs %.3e max_rel %.3e rel_l2 %.3e", e->mode, e->max_abs, e->max_rel, e->rel_l2);
    if (!e->pass || e->tie_rows)
        fprintf(out, ": %s", e->reason);
    fputc('\n', out);
    if (e->override_reason)
        fprintf(out, "      override rtol %g atol %g: %s\n", e->rtol, e->atol, e->override_reason);
    if (e->bound_source && par_dtype_is_float(e->dtype))
        fprintf(out, "      ||B-A|| %.3e, bound %.3e, cos %.6f: %s\n", e->diff_norm, e->bound, e->cosine, e->bound_source);
    else if (e->bound_source)
        fprintf(out, "      %s\n", e->bound_source);
    if (!e->pass && e->nlist) {
        fprintf(out, "      first mismatches, largest error first:\n");
        for (int k = 0; k < e->nlist; k++)
            print_elem(out, e, &e->list[k]);
    }
}

/* What a partial comparison left out: --only's patterns with their hits,
 * --subset's entries of A not in B per file (every name when verbose, else
 * the first few). */
static void print_selection(const par_compare_report *r, FILE *out, int verbose)
{
    for (int k = 0; k < r->n_only; k++)
        fprintf(out, "--only %s: %lld entr%s\n", r->only[k], (long long)r->only_hits[k],
                r->only_hits[k] == 1 ? "y" : "ies");
    if (!r->n_left_out)
        return;
    fprintf(out, "left out (--subset): %d entr%s of A that B does not hold, not judged:\n", r->n_left_out,
            r->n_left_out == 1 ? "y" : "ies");
    for (int i = 0; i < r->n;) {
        if (!r->e[i].left_out) {
            i++;
            continue;
        }
        int j = i, cnt = 0;
        for (; j < r->n && !strcmp(r->e[j].file, r->e[i].file); j++)
            cnt += r->e[j].left_out;
        fprintf(out, "  %s: %d:", r->e[i].file, cnt);
        int shown = 0;
        for (int q = i; q < j; q++) {
            if (!r->e[q].left_out)
                continue;
            if (!verbose && shown == 4) {
                fprintf(out, " ...");
                break;
            }
            fprintf(out, " %s", r->e[q].tensor[0] ? r->e[q].tensor : "(file)");
            shown++;
        }
        fputc('\n', out);
        i = j;
    }
}

void par_compare_report_print(const par_compare_report *r, FILE *out, int verbose)
{
    double rt, at;
    par_policy_tolerance(r->policy, &rt, &at);
    fprintf(out, "compare A=%s B=%s\npolicy %s (%s)", r->a, r->b, par_policy_name(r->policy), r->policy_why);
    if (r->policy == PAR_POLICY_DERIVED)
        fprintf(out, ": per tensor, the bound derived in %s (docs/recipes.md \"Derived bounds\")", r->bounds_label);
    else if (r->policy != PAR_POLICY_BITWISE)
        fprintf(out, ": ||B-A||_2 <= %g ||A||_2 + %g sqrt(numel)", rt, at);
    fputc('\n', out);
    if (r->numerics[0][0] && strcmp(r->numerics[0], r->numerics[1]))
        fprintf(out, "note: A was made in the %s mode, B in the %s mode (docs/bitwise.md): only a tolerance policy "
                "can equate them\n", r->numerics[0], r->numerics[1]);
    if (r->recipe[0][0] && strcmp(r->recipe[0], r->recipe[1]))
        fprintf(out, "note: A was made under the recipe %s, B under %s (docs/recipes.md): their casts differ, so "
                "their numbers do; a layout run under a recipe is judged against that recipe's golden\n",
                r->recipe[0], r->recipe[1]);
    if (r->have_steps && r->steps_cmp[0] <= r->steps_cmp[1]) {
        const int64_t *c = r->steps_cmp;
        fprintf(out, "steps compared: %lld..%lld (params.%lld..params.%lld", (long long)c[0], (long long)c[1],
                (long long)c[0], (long long)c[1]);
        if (c[1] > c[0])
            fprintf(out, ", step.%lld..step.%lld", (long long)c[0], (long long)(c[1] - 1));
        fprintf(out, "); A holds steps %lld..%lld, B %lld..%lld", (long long)r->steps_a[0], (long long)r->steps_a[1],
                (long long)r->steps_b[0], (long long)r->steps_b[1]);
        if (r->skipped_a || r->skipped_b)
            fprintf(out, "; not compared: %d file%s of A, %d of B outside those steps", r->skipped_a,
                    r->skipped_a == 1 ? "" : "s", r->skipped_b);
        fputc('\n', out);
    }
    int npass = 0;
    for (int i = 0; i < r->n; i++) {
        npass += r->e[i].pass && !r->e[i].left_out;
        if ((verbose && !r->e[i].left_out) || !r->e[i].pass || r->e[i].tie_rows)
            print_entry(out, &r->e[i]);
    }
    print_selection(r, out, verbose);
    fprintf(out, "%s: %d file%s, %d entries: %d passed, %d failed", r->nfail ? "MISMATCH" : "EQUAL within policy",
            r->nfiles, r->nfiles == 1 ? "" : "s", r->n - r->n_left_out, npass, r->nfail);
    if (r->subset)
        fprintf(out, "; %d left out (in A, not in B: --subset)", r->n_left_out);
    if (r->n_only)
        fprintf(out, "; %d not selected (--only)", r->n_unselected);
    int nt = par_compare_report_tie_entries(r);
    if (nt)
        fprintf(out, "; %d entr%s with rows that differ only in the order of exact ties in A (TIE)", nt,
                nt == 1 ? "y" : "ies");
    fputc('\n', out);
}

static cJSON *num_or_str(double v)
{
    if (isfinite(v))
        return cJSON_CreateNumber(v);
    return cJSON_CreateString(isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
}

/* "steps": {"compared": [lo, hi], "a", "b", "in_common", "skipped_files_a", "skipped_files_b"}. */
static int steps_json(const par_compare_report *r, cJSON *root)
{
    cJSON *st = cJSON_AddObjectToObject(root, "steps");
    const int64_t *v[3] = {r->steps_cmp, r->steps_a, r->steps_b};
    static const char *const key[3] = {"compared", "a", "b"};
    int ok = st != NULL;
    for (int q = 0; q < 3 && ok; q++) {
        cJSON *pair = cJSON_AddArrayToObject(st, key[q]);
        ok = pair != NULL;
        for (int h = 0; h < 2 && ok; h++) {
            cJSON *n = cJSON_CreateNumber((double)v[q][h]);
            ok = n != NULL;
            if (ok)
                cJSON_AddItemToArray(pair, n);
        }
    }
    ok = ok && cJSON_AddBoolToObject(st, "in_common", r->steps_cmp[0] <= r->steps_cmp[1]);
    ok = ok && cJSON_AddNumberToObject(st, "skipped_files_a", r->skipped_a);
    return ok && cJSON_AddNumberToObject(st, "skipped_files_b", r->skipped_b);
}

static const char *const side_names[] = {"both", "a_only", "b_only", "selection"};

/* "subset", "left_out", "only": [{"pattern", "entries"}], "not_selected". */
static int selection_json(const par_compare_report *r, cJSON *root)
{
    int ok = cJSON_AddBoolToObject(root, "subset", r->subset) != NULL;
    ok = ok && cJSON_AddNumberToObject(root, "left_out", r->n_left_out);
    ok = ok && cJSON_AddNumberToObject(root, "not_selected", r->n_unselected);
    cJSON *arr = ok ? cJSON_AddArrayToObject(root, "only") : NULL;
    ok = arr != NULL;
    for (int k = 0; k < r->n_only && ok; k++) {
        cJSON *o = cJSON_CreateObject();
        ok = o != NULL;
        if (ok)
            cJSON_AddItemToArray(arr, o);
        ok = ok && cJSON_AddStringToObject(o, "pattern", r->only[k]);
        ok = ok && cJSON_AddNumberToObject(o, "entries", (double)r->only_hits[k]);
    }
    return ok;
}

/* The derived policy's fields of an entry: its bound's source, the cosine
 * (floats), the flips (router picks). */
static int derived_json(cJSON *o, const par_cmp_entry *e)
{
    int ok = cJSON_AddStringToObject(o, "bound_source", e->bound_source) != NULL;
    if (ok && par_dtype_is_float(e->dtype)) {
        cJSON *c = num_or_str(e->cosine);
        ok = c != NULL;
        if (ok)
            cJSON_AddItemToObject(o, "cosine", c);
    }
    if (ok && e->flips)
        ok = cJSON_AddNumberToObject(o, "flips", (double)e->flips) &&
             cJSON_AddNumberToObject(o, "flips_allowed", (double)e->flips_allowed);
    return ok;
}

/* An entry's numbers (every mode but "-"). */
static int stats_json(cJSON *o, const par_cmp_entry *e)
{
    int ok = 1;
        const char *k[] = {"max_abs", "max_rel", "rel_l2", "diff_norm", "bound", "rtol", "atol"};
        double v[] = {e->max_abs, e->max_rel, e->rel_l2, e->diff_norm, e->bound, e->rtol, e->atol};
        for (int q = 0; q < 7 && ok; q++) {
            cJSON *n = num_or_str(v[q]);
            ok = n != NULL;
            if (ok)
                cJSON_AddItemToObject(o, k[q], n);
        }
        ok = ok && cJSON_AddNumberToObject(o, "n_diff", (double)e->n_diff);
        ok = ok && cJSON_AddNumberToObject(o, "n_nonfinite_mismatch", (double)e->n_nonfinite);
        if (ok && e->rows_differ) /* attn.*.selected judged with A's ties.K */
            ok = cJSON_AddNumberToObject(o, "rows_differ", (double)e->rows_differ) &&
                 cJSON_AddNumberToObject(o, "tie_order_rows", (double)e->tie_rows);
        if (ok && e->override_reason)
            ok = cJSON_AddStringToObject(o, "override_reason", e->override_reason) != NULL;
        if (ok && e->bound_source)
            ok = derived_json(o, e);
    return ok;
}

par_status par_compare_report_write_json(const par_compare_report *r, const char *path)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    double rt, at;
    par_policy_tolerance(r->policy, &rt, &at);
    ok = ok && cJSON_AddStringToObject(root, "format", "parity-compare"); /* core/outfile.h */
    ok = ok && cJSON_AddStringToObject(root, "a", r->a) && cJSON_AddStringToObject(root, "b", r->b);
    ok = ok && cJSON_AddStringToObject(root, "policy", par_policy_name(r->policy));
    ok = ok && cJSON_AddStringToObject(root, "policy_source", r->policy_why);
    ok = ok && numerics_json(r, root);
    if (ok && r->policy == PAR_POLICY_DERIVED)
        ok = cJSON_AddStringToObject(root, "bounds", r->bounds_label) != NULL;
    ok = ok && cJSON_AddNumberToObject(root, "rtol", rt) && cJSON_AddNumberToObject(root, "atol", at);
    ok = ok && cJSON_AddBoolToObject(root, "pass", r->nfail == 0);
    ok = ok && cJSON_AddNumberToObject(root, "files", r->nfiles);
    if (ok && r->have_steps) /* directories: the steps compared (both sets hold them) and each set's */
        ok = steps_json(r, root);
    ok = ok && cJSON_AddNumberToObject(root, "entries", r->n);
    ok = ok && cJSON_AddNumberToObject(root, "failed", r->nfail);
    ok = ok && selection_json(r, root);
    cJSON *arr = ok ? cJSON_AddArrayToObject(root, "tensors") : NULL;
    ok = arr != NULL;
    for (int i = 0; i < r->n && ok; i++) {
        const par_cmp_entry *e = &r->e[i];
        cJSON *o = cJSON_CreateObject();
        ok = o != NULL;
        if (ok)
            cJSON_AddItemToArray(arr, o);
        ok = ok && cJSON_AddStringToObject(o, "file", e->file) && cJSON_AddStringToObject(o, "tensor", e->tensor);
        ok = ok && cJSON_AddBoolToObject(o, "pass", e->pass) && cJSON_AddStringToObject(o, "reason", e->reason);
        ok = ok && cJSON_AddStringToObject(o, "mode", e->mode);
        ok = ok && cJSON_AddStringToObject(o, "side", side_names[e->side]);
        if (ok && e->left_out)
            ok = cJSON_AddBoolToObject(o, "left_out", 1) != NULL;
        if (ok && e->tensor[0]) {
            cJSON *shape = cJSON_AddArrayToObject(o, "shape");
            ok = shape && cJSON_AddStringToObject(o, "dtype", par_dtype_name(e->dtype));
            for (int d = 0; d < e->ndim && ok; d++) {
                cJSON *n = cJSON_CreateNumber((double)e->shape[d]);
                ok = n != NULL;
                if (ok)
                    cJSON_AddItemToArray(shape, n);
            }
            ok = ok && cJSON_AddNumberToObject(o, "numel", (double)e->numel);
        }
        if (ok && strcmp(e->mode, "-"))
            ok = stats_json(o, e);
        if (ok && e->nlist) {
            cJSON *ml = cJSON_AddArrayToObject(o, "mismatches");
            ok = ml != NULL;
            for (int q = 0; q < e->nlist && ok; q++) {
                const par_cmp_elem *el = &e->list[q];
                cJSON *m = cJSON_CreateObject(), *co = cJSON_CreateArray();
                ok = m && co;
                if (!ok) {
                    cJSON_Delete(m);
                    cJSON_Delete(co);
                    break;
                }
                cJSON_AddItemToArray(ml, m);
                cJSON_AddItemToObject(m, "coord", co);
                for (int d = 0; d < e->ndim && ok; d++) {
                    cJSON *n = cJSON_CreateNumber((double)el->coord[d]);
                    ok = n != NULL;
                    if (ok)
                        cJSON_AddItemToArray(co, n);
                }
                ok = ok && cJSON_AddNumberToObject(m, "index", (double)el->index);
                if (par_dtype_is_float(e->dtype)) {
                    cJSON *x = num_or_str(el->a), *y = num_or_str(el->b), *z = num_or_str(el->err);
                    ok = ok && x && y && z;
                    if (ok) {
                        cJSON_AddItemToObject(m, "a", x);
                        cJSON_AddItemToObject(m, "b", y);
                        cJSON_AddItemToObject(m, "abs_err", z);
                    } else {
                        cJSON_Delete(x);
                        cJSON_Delete(y);
                        cJSON_Delete(z);
                    }
                } else {
                    ok = ok && cJSON_AddNumberToObject(m, "a", (double)el->ia) &&
                         cJSON_AddNumberToObject(m, "b", (double)el->ib);
                }
                ok = ok && cJSON_AddStringToObject(m, "where", el->where);
                if (ok && el->has_margin)
                    ok = cJSON_AddNumberToObject(m, "margin", el->margin) != NULL;
            }
        }
    }
    if (!ok) {
        cJSON_Delete(root);
        return par_err(PAR_ENOMEM, "%s: out of memory building the comparison report", path);
    }
    par_status st = par_json_write_file(path, root);
    cJSON_Delete(root);
    return st;
}
