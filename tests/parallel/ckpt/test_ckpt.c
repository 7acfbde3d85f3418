/* parallel: distributed checkpoints (issue 9) on the threads backend with
 * synthetic tensors: round trips, resharding 4 -> 3 -> 1 ranks bitwise,
 * reads across slice boundaries, zero-size shards, every fault of the issue
 * (truncated / flipped / missing shard, wrong version, gap, overlap, a
 * failing rank) and saves killed with SIGKILL at every phase and at random
 * moments of a large save. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/registry.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "core/status.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/ckpt/ckpt.h"
#include "parallel/ckpt/ckpt_owner.h"

static void quiet(void)
{
    par_err_set_quiet(1);
}

TestSuite(ckpt, .init = quiet);

/* ---- synthetic model ---------------------------------------------------- */

#define MAXT 64

typedef struct {
    par_ckpt_tensor t[MAXT];
    int nt;
    void *data[MAXT]; /* global tensors */
    uint64_t salt;
} model;

/* Adds a parameter (a plain one: no expert, no block; the caller sets
 * roles). */
static void add(model *m, const char *name, par_dtype dt, int ndim, int64_t d0, int64_t d1)
{
    cr_assert_lt(m->nt, MAXT);
    par_ckpt_tensor *t = &m->t[m->nt];
    const int64_t shape[2] = {d0, d1};
    par_ckpt_tensor_init(t, name, dt, ndim, shape);
    int64_t n = par_shape_numel(ndim, t->shape, 0);
    size_t es = par_dtype_size(dt);
    unsigned char *p = malloc((size_t)n * es + 1);
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(m->nt + 1) + m->salt;
    for (size_t i = 0; i < (size_t)n * es; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (unsigned char)(x >> 24);
    }
    m->data[m->nt++] = p;
}

/* Adds optimizer state `slot` of the last added parameter. */
static void add_state(model *m, par_ckpt_slot slot)
{
    int pi = m->nt - 1;
    while (pi > 0 && m->t[pi].slot != PAR_CKPT_PARAM)
        pi--;
    const par_ckpt_tensor p = m->t[pi];
    cr_assert_eq(p.slot, PAR_CKPT_PARAM);
    char nm[PAR_CKPT_NAME_MAX + 16];
    snprintf(nm, sizeof nm, "opt.%s.%s", p.name, par_ckpt_slot_name(slot));
    add(m, nm, p.dtype, p.ndim, p.shape[0], p.shape[1]);
    par_ckpt_tensor *x = &m->t[m->nt - 1];
    x->slot = slot;
    x->param = pi;
    x->expert = p.expert;
    x->layer = p.layer;
    x->mtp = p.mtp;
}

static int64_t numel(const par_ckpt_tensor *t)
{
    return par_shape_numel(t->ndim, t->shape, 0);
}

static void model_make(model *m, int n_experts, int64_t big, uint64_t salt)
{
    memset(m, 0, sizeof *m);
    m->salt = salt;
    add(m, "embed.weight", PAR_F64, 2, 7, 5);
    add_state(m, PAR_CKPT_EXP_AVG);
    add_state(m, PAR_CKPT_EXP_AVG_SQ);
    add(m, "norm.weight", PAR_F32, 1, 6, 1);
    add(m, "layers.0.ffn.gate.tid2eid", PAR_I32, 2, 5, 2);
    add(m, "layers.0.bf", PAR_BF16, 1, 9, 1);
    add(m, "layers.0.scalar", PAR_F64, 0, 0, 0);
    add(m, "layers.0.empty", PAR_F64, 2, 0, 3);
    add(m, "layers.0.count", PAR_I64, 1, 2, 1);
    for (int i = 4; i < m->nt; i++)
        m->t[i].layer = 0;
    for (int e = 0; e < n_experts; e++) {
        char nm[PAR_CKPT_NAME_MAX];
        snprintf(nm, sizeof nm, "layers.0.ffn.experts.%d.w1.weight", e);
        add(m, nm, PAR_F64, 2, 3, 4);
        m->t[m->nt - 1].expert = e;
        m->t[m->nt - 1].layer = 0;
        add_state(m, PAR_CKPT_MOMENTUM);
    }
    if (big > 0)
        add(m, "head.weight", PAR_F64, 2, big, 1024);
}

static void model_free(model *m)
{
    for (int i = 0; i < m->nt; i++)
        free(m->data[i]);
    memset(m, 0, sizeof *m);
}

static int tindex(const model *m, const char *name)
{
    for (int i = 0; i < m->nt; i++)
        if (!strcmp(m->t[i].name, name))
            return i;
    return -1;
}

/* ---- owners ------------------------------------------------------------------ */

/* ZeRO-like: every tensor split into nranks contiguous element ranges
 * (zero-size ranges where numel < nranks). */
static par_status owner_split(const par_layout *l, int n, int r, const par_ckpt_tensor *t, int nt,
                              par_ckpt_slice **out, int *k, void *ud)
{
    (void)l;
    (void)ud;
    par_ckpt_slice *s = par_calloc((size_t)nt + 1, sizeof *s, PAR_TAG_IO);
    for (int i = 0; i < nt; i++) {
        snprintf(s[i].name, sizeof s[i].name, "%s", t[i].name);
        s[i].begin = numel(&t[i]) * r / n;
        s[i].end = numel(&t[i]) * (r + 1) / n;
    }
    *out = s;
    *k = nt;
    return PAR_OK;
}

/* Whole tensors round robin. */
static par_status owner_rr(const par_layout *l, int n, int r, const par_ckpt_tensor *t, int nt,
                           par_ckpt_slice **out, int *k, void *ud)
{
    (void)l;
    (void)ud;
    par_ckpt_slice *s = par_calloc((size_t)nt + 1, sizeof *s, PAR_TAG_IO);
    int c = 0;
    for (int i = 0; i < nt; i++)
        if (i % n == r) {
            snprintf(s[c].name, sizeof s[c].name, "%s", t[i].name);
            s[c].begin = 0;
            s[c].end = numel(&t[i]);
            c++;
        }
    *out = s;
    *k = c;
    return PAR_OK;
}

/* Faults a save can be given: damage rank 1's or 2's first slice, or its tensor table. */
typedef enum { F_NONE, F_GAP, F_OVERLAP, F_BADNAME, F_TABLE, F_ROLE } fault;

/* ---- saving from a thread world ---------------------------------------------------- */

typedef struct {
    model *m;
    const char *dir;
    par_ckpt_owner_fn owner;
    fault f;
    int64_t step;
    const par_layout *layout;
    par_status rank_st[64];
    char rank_msg[64][400];
} save_job;

static par_status save_rank(par_comm *w, void *arg)
{
    save_job *j = arg;
    int r = par_comm_rank(w), n = par_comm_size(w);
    par_ckpt_slice *s = NULL;
    int k = 0;
    par_status st = j->owner(j->layout, n, r, j->m->t, j->m->nt, &s, &k, NULL);
    if (st)
        return st;
    par_ckpt_item *it = par_calloc((size_t)k + 2, sizeof *it, PAR_TAG_IO);
    for (int i = 0; i < k; i++) {
        it[i].s = s[i];
        int ti = tindex(j->m, s[i].name);
        it[i].data = (char *)j->m->data[ti] + (size_t)s[i].begin * par_dtype_size(j->m->t[ti].dtype);
    }
    int nk = k;
    if (j->f == F_GAP && r == 1 && k > 0 && it[0].s.end > it[0].s.begin)
        it[0].s.end--; /* element end-1 of tensor 0 saved by nobody */
    if (j->f == F_OVERLAP && r == 1 && k > 0)
        it[0].s.begin = 0, it[0].data = j->m->data[tindex(j->m, s[0].name)]; /* rank 0's range again */
    if (j->f == F_BADNAME && r == 2 && k > 0)
        snprintf(it[0].s.name, sizeof it[0].s.name, "no.such.tensor");
    par_ckpt_info info = {.tensors = j->m->t, .ntensors = j->m->nt, .layout = j->layout};
    info.state.step = j->step;
    info.state.cursor = 100 + j->step * 8;
    info.state.seed = 18446744073709551557ull; /* > 2^53: stored as a string */
    snprintf(info.state.precision, sizeof info.state.precision, "f64");
    model other;
    if ((j->f == F_TABLE || j->f == F_ROLE) && r == 1) {
        memcpy(&other, j->m, sizeof other);
        if (j->f == F_TABLE)
            other.t[3].shape[0]++; /* norm.weight */
        else
            other.t[3].expert = 7; /* norm.weight as a routed expert */
        info.tensors = other.t;
    }
    st = par_ckpt_save(w, j->dir, &info, it, nk);
    j->rank_st[r] = st;
    snprintf(j->rank_msg[r], sizeof j->rank_msg[r], "%s", st ? par_last_error() : "");
    par_free(it);
    par_free(s);
    return st;
}

static par_status run_save(model *m, const char *dir, int n, par_ckpt_owner_fn owner, fault f, int64_t step,
                           save_job *job)
{
    const par_backend *be;
    par_status st = par_backend_get("threads", &be);
    if (st)
        return st;
    save_job local;
    save_job *j = job ? job : &local;
    memset(j, 0, sizeof *j);
    j->m = m;
    j->dir = dir;
    j->owner = owner;
    j->f = f;
    j->step = step;
    par_world_opts o = {.timeout_s = 30};
    return par_world_run(be, n, save_rank, j, &o);
}

/* ---- helpers -------------------------------------------------------------------- */

static char g_root[256];

static void root_make(void)
{
    snprintf(g_root, sizeof g_root, "/tmp/par-ckpt-test-XXXXXX");
    cr_assert_not_null(mkdtemp(g_root));
}

static void root_remove(void)
{
    par_remove_tree(g_root);
}

static char *pth(char *buf, const char *a, const char *b)
{
    if (b)
        snprintf(buf, 512, "%s/%s/%s", g_root, a, b);
    else
        snprintf(buf, 512, "%s/%s", g_root, a);
    return buf;
}

/* Every tensor of ck equals the model bitwise. */
static void expect_model(const par_ckpt *ck, const model *m)
{
    cr_assert_eq(par_ckpt_ntensors(ck), m->nt);
    for (int i = 0; i < m->nt; i++) {
        par_tensor x;
        cr_assert_eq(par_ckpt_read_tensor(ck, m->t[i].name, PAR_TAG_TENSOR, &x), PAR_OK, "%s", par_last_error());
        cr_assert_eq(x.dtype, m->t[i].dtype, "%s", m->t[i].name);
        cr_assert_eq(x.ndim, m->t[i].ndim, "%s", m->t[i].name);
        cr_assert_eq(memcmp(x.data, m->data[i], par_tensor_nbytes(&x)), 0, "%s differs", m->t[i].name);
        par_tensor_free(&x);
    }
}

static void open_ok(const char *dir, par_ckpt **ck)
{
    par_status st = par_ckpt_open(dir, ck);
    cr_assert_eq(st, PAR_OK, "open %s: %s", dir, par_last_error());
}

static void expect_open_fails(const char *dir, par_status code, const char *needle1, const char *needle2)
{
    par_ckpt *ck = NULL;
    par_status st = par_ckpt_open(dir, &ck);
    cr_assert_eq(st, code, "expected %s, got %s: %s", par_status_str(code), par_status_str(st), par_last_error());
    cr_assert_null(ck);
    cr_assert_not_null(strstr(par_last_error(), needle1), "message '%s' lacks '%s'", par_last_error(), needle1);
    if (needle2)
        cr_assert_not_null(strstr(par_last_error(), needle2), "message '%s' lacks '%s'", par_last_error(), needle2);
}

static void file_bytes(const char *path, void **data, size_t *len)
{
    cr_assert_eq(par_file_read(path, PAR_TAG_IO, data, len), PAR_OK, "%s", par_last_error());
}

/* Rewrites SHA256SUMS of dir from the files' current contents. */
static void rehash(const char *dir)
{
    char p[512], line[600];
    static const char *names[] = {"metadata.json", "rank-00000.safetensors", "rank-00001.safetensors",
                                  "rank-00002.safetensors", "rank-00003.safetensors"};
    char txt[4096] = "";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (!par_path_exists(p))
            continue;
        char h[PAR_SHA256_HEX];
        cr_assert_eq(par_sha256_file(p, h), PAR_OK);
        snprintf(line, sizeof line, "%s  %s\n", h, names[i]);
        strcat(txt, line);
    }
    snprintf(p, sizeof p, "%s/SHA256SUMS", dir);
    cr_assert_eq(par_file_write_atomic(p, txt, strlen(txt)), PAR_OK);
}

/* Replaces the first occurrence of `from` by `to` in dir/metadata.json. */
static void edit_meta(const char *dir, const char *from, const char *to)
{
    char p[512];
    snprintf(p, sizeof p, "%s/metadata.json", dir);
    char *d;
    size_t n;
    file_bytes(p, (void **)&d, &n);
    char *at = strstr(d, from);
    cr_assert_not_null(at, "metadata lacks '%s'", from);
    size_t out_n = n - strlen(from) + strlen(to);
    char *o = malloc(out_n + 1);
    size_t pre = (size_t)(at - d);
    memcpy(o, d, pre);
    memcpy(o + pre, to, strlen(to));
    memcpy(o + pre + strlen(to), at + strlen(from), n - pre - strlen(from));
    cr_assert_eq(par_file_write_atomic(p, o, out_n), PAR_OK);
    free(o);
    par_free(d);
}

static void copy_dir(const char *src, const char *dst)
{
    char cmd[1800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst);
    cr_assert_eq(system(cmd), 0);
}

/* A saved 4-rank checkpoint "a" of model m (split owner, step 5). */
static void save_a(model *m)
{
    char p[512];
    model_make(m, 4, 0, 1);
    par_status st = run_save(m, pth(p, "a", NULL), 4, owner_split, F_NONE, 5, NULL);
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
}

/* ---- round trip, layout, state ------------------------------------------------------- */

Test(ckpt, roundtrip_state_and_files)
{
    root_make();
    model m;
    save_a(&m);
    char p[512];
    par_ckpt *ck;
    open_ok(pth(p, "a", NULL), &ck);
    expect_model(ck, &m);
    const par_ckpt_state *s = par_ckpt_state_of(ck);
    cr_assert_eq(s->step, 5);
    cr_assert_eq(s->cursor, 140);
    cr_assert_eq(s->seed, 18446744073709551557ull);
    cr_assert_str_eq(s->precision, "f64");
    cr_assert_eq(par_ckpt_nranks(ck), 4);
    cr_assert_null(par_ckpt_layout(ck));
    /* tiny tensors split 4 ways: some slices are empty and not stored */
    int stored = 0;
    for (int r = 0; r < 4; r++)
        stored += par_ckpt_rank_nslices(ck, r);
    cr_assert_gt(stored, m.nt);
    par_ckpt_close(ck);
    /* the files: 4 shards, metadata, sums; no temporary left */
    DIR *d = opendir(pth(p, "a", NULL));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(n, 6);
    d = opendir(g_root);
    n = 0;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(n, 1, "a temporary directory was left next to the checkpoint");
    /* sha256sum can check it */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cd '%s' && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1", pth(p, "a", NULL));
    if (system("command -v sha256sum >/dev/null 2>&1") == 0)
        cr_assert_eq(system(cmd), 0, "sha256sum -c SHA256SUMS failed");
    cr_assert_eq(par_alloc_live(PAR_TAG_IO), 0, "IO memory leaked: %lld", (long long)par_alloc_live(PAR_TAG_IO));
    model_free(&m);
    root_remove();
}

Test(ckpt, reads_across_slice_boundaries)
{
    root_make();
    model m;
    save_a(&m);
    char p[512];
    par_ckpt *ck;
    open_ok(pth(p, "a", NULL), &ck);
    int ti = tindex(&m, "embed.weight"); /* 35 elements in 4 slices [0,8) [8,17) [17,26) [26,35) */
    for (int64_t b = 0; b <= 35; b += 3)
        for (int64_t e = b; e <= 35; e += 5) {
            double buf[40];
            par_ckpt_item it = {.data = buf};
            snprintf(it.s.name, sizeof it.s.name, "embed.weight");
            it.s.begin = b;
            it.s.end = e;
            cr_assert_eq(par_ckpt_read(ck, &it, 1), PAR_OK, "%s", par_last_error());
            cr_assert_eq(memcmp(buf, (double *)m.data[ti] + b, (size_t)(e - b) * 8), 0, "[%lld, %lld)",
                         (long long)b, (long long)e);
        }
    par_ckpt_close(ck);
    model_free(&m);
    root_remove();
}

Test(ckpt, read_errors_touch_nothing)
{
    root_make();
    model m;
    save_a(&m);
    char p[512];
    par_ckpt *ck;
    open_ok(pth(p, "a", NULL), &ck);
    double good[35], bad[4];
    for (int i = 0; i < 35; i++)
        good[i] = -7.0;
    par_ckpt_item it[2] = {{.data = good}, {.data = bad}};
    snprintf(it[0].s.name, sizeof it[0].s.name, "embed.weight");
    it[0].s.end = 35;
    snprintf(it[1].s.name, sizeof it[1].s.name, "norm.weight");
    it[1].s.begin = 4;
    it[1].s.end = 7; /* numel 6 */
    cr_assert_eq(par_ckpt_read(ck, it, 2), PAR_ERANGE);
    cr_assert_not_null(strstr(par_last_error(), "norm.weight"));
    for (int i = 0; i < 35; i++)
        cr_assert_eq(good[i], -7.0, "a failed read wrote element %d", i);
    snprintf(it[1].s.name, sizeof it[1].s.name, "no.such");
    it[1].s.begin = 0;
    it[1].s.end = 1;
    cr_assert_eq(par_ckpt_read(ck, it, 2), PAR_ENOTFOUND);
    cr_assert_not_null(strstr(par_last_error(), "no.such"));
    par_ckpt_close(ck);
    model_free(&m);
    root_remove();
}

typedef struct {
    const par_ckpt *ck;
    const model *m;
} load_job;

static par_status load_rank(par_comm *w, void *arg)
{
    load_job *j = arg;
    int r = par_comm_rank(w), n = par_comm_size(w);
    par_ckpt_slice *s;
    int k;
    par_status st = owner_split(NULL, n, r, j->m->t, j->m->nt, &s, &k, NULL);
    if (st)
        return st;
    for (int i = 0; i < k && !st; i++) {
        int ti = tindex(j->m, s[i].name);
        size_t es = par_dtype_size(j->m->t[ti].dtype);
        size_t bytes = (size_t)(s[i].end - s[i].begin) * es;
        char *buf = malloc(bytes + 1);
        par_ckpt_item it = {.s = s[i], .data = buf};
        st = par_ckpt_read(j->ck, &it, 1);
        if (!st && memcmp(buf, (char *)j->m->data[ti] + (size_t)s[i].begin * es, bytes))
            st = par_err(PAR_ECHECK, "rank %d: %s [%lld, %lld) differs", r, s[i].name, (long long)s[i].begin,
                         (long long)s[i].end);
        free(buf);
    }
    par_free(s);
    return st;
}

Test(ckpt, thread_ranks_load_their_slices_from_one_handle)
{
    root_make();
    model m;
    save_a(&m);
    char p[512];
    par_ckpt *ck;
    open_ok(pth(p, "a", NULL), &ck);
    const par_backend *be;
    cr_assert_eq(par_backend_get("threads", &be), PAR_OK);
    load_job j = {ck, &m};
    for (int n = 1; n <= 7; n += 2) {
        par_status st = par_world_run(be, n, load_rank, &j, NULL);
        cr_assert_eq(st, PAR_OK, "load on %d ranks: %s", n, par_last_error());
    }
    par_ckpt_close(ck);
    model_free(&m);
    root_remove();
}

/* ---- resharding ------------------------------------------------------------------- */

Test(ckpt, reshard_4_3_1_bitwise_and_export)
{
    root_make();
    model m;
    save_a(&m);
    char a[512], b[512], c[512], ea[512], ec[512];
    pth(a, "a", NULL);
    pth(b, "b", NULL);
    pth(c, "c", NULL);
    par_layout l3, l1;
    par_layout_init(&l3);
    l3.world = 3;
    par_layout_init(&l1);
    par_status st = par_ckpt_reshard(a, b, &l3, owner_rr, NULL);
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
    st = par_ckpt_reshard(b, c, &l1, par_ckpt_owner_simple, NULL); /* 1 rank */
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
    par_ckpt *ck;
    open_ok(b, &ck);
    cr_assert_eq(par_ckpt_nranks(ck), 3);
    cr_assert_not_null(par_ckpt_layout(ck));
    cr_assert_eq(par_ckpt_layout(ck)->world, 3);
    expect_model(ck, &m);
    cr_assert_eq(par_ckpt_state_of(ck)->step, 5);
    par_ckpt_close(ck);
    open_ok(c, &ck);
    cr_assert_eq(par_ckpt_nranks(ck), 1);
    expect_model(ck, &m);
    par_ckpt_close(ck);
    /* A -> B -> C -> export equals A -> export, byte for byte */
    cr_assert_eq(par_ckpt_export(a, pth(ea, "a.safetensors", NULL)), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_ckpt_export(c, pth(ec, "c.safetensors", NULL)), PAR_OK, "%s", par_last_error());
    void *da, *dc;
    size_t na, nc;
    file_bytes(ea, &da, &na);
    file_bytes(ec, &dc, &nc);
    cr_assert_eq(na, nc);
    cr_assert_eq(memcmp(da, dc, na), 0, "exports differ");
    par_free(da);
    par_free(dc);
    /* the export holds every tensor whole under its name */
    par_st_file *f;
    cr_assert_eq(par_st_read(ea, &f), PAR_OK, "%s", par_last_error());
    cr_assert_eq(par_st_count(f), m.nt);
    for (int i = 0; i < m.nt; i++) {
        const par_tensor *x = par_st_find(f, m.t[i].name);
        cr_assert_not_null(x, "%s", m.t[i].name);
        cr_assert_eq(memcmp(x->data, m.data[i], par_tensor_nbytes(x)), 0, "%s", m.t[i].name);
    }
    cr_assert_str_eq(par_st_meta(f, "step"), "5");
    cr_assert_str_eq(par_st_meta(f, "seed"), "18446744073709551557");
    par_st_close(f);
    /* diff: equal across layouts */
    par_ckpt_diff_result r;
    cr_assert_eq(par_ckpt_diff(a, c, NULL, &r), PAR_OK, "%s", par_last_error());
    cr_assert(r.state_equal && r.tensors_equal, "%s", r.first);
    cr_assert_eq(par_alloc_live(PAR_TAG_IO), 0);
    model_free(&m);
    root_remove();
}

Test(ckpt, simple_owner_places_experts_by_ep)
{
    root_make();
    model m;
    save_a(&m);
    char a[512], b[512];
    par_layout l;
    par_layout_init(&l);
    l.ep = 2; /* world 2: experts 0,1 on rank 0, experts 2,3 on rank 1, dense on rank 0 */
    cr_assert_eq(par_ckpt_reshard(pth(a, "a", NULL), pth(b, "b", NULL), &l, par_ckpt_owner_simple, NULL), PAR_OK, "%s",
                 par_last_error());
    par_ckpt *ck;
    open_ok(b, &ck);
    cr_assert_eq(par_ckpt_nranks(ck), 2);
    for (int i = 0; i < par_ckpt_rank_nslices(ck, 1); i++) {
        const par_ckpt_slice *s = par_ckpt_rank_slice(ck, 1, i);
        cr_assert(strstr(s->name, ".experts.2.") || strstr(s->name, ".experts.3."), "%s on rank 1", s->name);
    }
    cr_assert_eq(par_ckpt_rank_nslices(ck, 1), 4);
    cr_assert_eq(par_ckpt_layout(ck)->ep, 2);
    expect_model(ck, &m);
    par_ckpt_close(ck);
    /* EP 3 does not divide 4 experts */
    l.ep = 3;
    cr_assert_eq(par_ckpt_reshard(a, b, &l, par_ckpt_owner_simple, NULL), PAR_EINVAL);
    cr_assert_not_null(strstr(par_last_error(), "EP 3"));
    /* the rule is explicit: none is an error, not a default */
    cr_assert_eq(par_ckpt_reshard(a, b, &l, NULL, NULL), PAR_EINVAL);
    cr_assert_not_null(strstr(par_last_error(), "needs an ownership rule"), "%s", par_last_error());
    open_ok(b, &ck); /* the previous b is intact */
    cr_assert_eq(par_ckpt_nranks(ck), 2);
    par_ckpt_close(ck);
    model_free(&m);
    root_remove();
}

Test(ckpt, zero_size_shards_and_empty_ranks)
{
    root_make();
    model m;
    model_make(&m, 2, 0, 3);
    char p[512];
    /* 9 ranks over tensors of 1..35 elements: many empty slices */
    par_status st = run_save(&m, pth(p, "z", NULL), 9, owner_split, F_NONE, 1, NULL);
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
    par_ckpt *ck;
    open_ok(p, &ck);
    expect_model(ck, &m);
    par_ckpt_close(ck);
    /* round robin over more ranks than tensors: some ranks hold nothing */
    st = run_save(&m, pth(p, "y", NULL), 24, owner_rr, F_NONE, 1, NULL);
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
    open_ok(p, &ck);
    cr_assert_eq(par_ckpt_rank_nslices(ck, 23), 0);
    expect_model(ck, &m);
    par_ckpt_close(ck);
    model_free(&m);
    root_remove();
}

/* ---- diff ------------------------------------------------------------------------- */

Test(ckpt, diff_finds_values_and_state)
{
    root_make();
    model m;
    save_a(&m);
    char a[512], b[512];
    pth(a, "a", NULL);
    int ti = tindex(&m, "layers.0.ffn.experts.1.w1.weight");
    ((unsigned char *)m.data[ti])[7 * 8 + 3] ^= 0x10; /* one element of the 12 */
    cr_assert_eq(run_save(&m, pth(b, "b", NULL), 2, owner_rr, F_NONE, 6, NULL), PAR_OK, "%s", par_last_error());
    par_ckpt_diff_result r;
    cr_assert_eq(par_ckpt_diff(a, b, NULL, &r), PAR_OK, "%s", par_last_error());
    cr_assert_eq(r.state_equal, 0);
    cr_assert_eq(r.tensors_equal, 0);
    cr_assert_eq(r.n_tensors_diff, 1);
    cr_assert_not_null(strstr(r.first, "step"), "%s", r.first);
    char tmpf[] = "/tmp/par-ckpt-diff-XXXXXX";
    int fd = mkstemp(tmpf);
    FILE *out = fdopen(fd, "w+");
    cr_assert_eq(par_ckpt_diff(a, b, out, &r), PAR_OK);
    rewind(out);
    char text[2048] = "";
    size_t got = fread(text, 1, sizeof text - 1, out);
    text[got] = 0;
    fclose(out);
    unlink(tmpf);
    cr_assert_not_null(strstr(text, "layers.0.ffn.experts.1.w1.weight: 1 of 12 elements differ (first at 7"), "%s",
                       text);
    model_free(&m);
    root_remove();
}

/* ---- faults at load ------------------------------------------------------------------ */

Test(ckpt, fault_truncated_shard)
{
    root_make();
    model m;
    save_a(&m);
    char p[512];
    struct stat sb;
    cr_assert_eq(stat(pth(p, "a", "rank-00002.safetensors"), &sb), 0);
    cr_assert_eq(truncate(p, sb.st_size - 5), 0);
    expect_open_fails(pth(p, "a", NULL), PAR_EMISMATCH, "rank-00002.safetensors", "truncated");
    model_free(&m);
    root_remove();
}

Test(ckpt, fault_flipped_byte_in_shard_and_metadata)
{
    root_make();
    model m;
    save_a(&m);
    char p[512], a[512];
    pth(a, "a", NULL);
    for (int which = 0; which < 3; which++) {
        const char *name = which == 0 ? "rank-00001.safetensors" : which == 1 ? "metadata.json" : "SHA256SUMS";
        char c[512];
        copy_dir(a, pth(c, "c", NULL));
        void *d;
        size_t n;
        file_bytes(pth(p, "c", name), &d, &n);
        ((unsigned char *)d)[n - 10] ^= 0x04;
        cr_assert_eq(par_file_write_atomic(p, d, n), PAR_OK);
        par_free(d);
        par_ckpt *ck = NULL;
        par_status st = par_ckpt_open(c, &ck);
        cr_assert_neq(st, PAR_OK, "a flipped byte in %s went unnoticed", name);
        cr_assert_null(ck);
        if (which < 2)
            cr_assert_not_null(strstr(par_last_error(), name), "%s: '%s'", name, par_last_error());
    }
    model_free(&m);
    root_remove();
}

Test(ckpt, fault_flipped_digit_in_metadata_value)
{
    root_make();
    model m;
    save_a(&m);
    char a[512];
    pth(a, "a", NULL);
    edit_meta(a, "\"data_cursor\":\t140", "\"data_cursor\":\t141"); /* still valid JSON */
    expect_open_fails(a, PAR_EMISMATCH, "metadata.json", "sha256");
    model_free(&m);
    root_remove();
}

Test(ckpt, fault_missing_shard)
{
    root_make();
    model m;
    save_a(&m);
    char p[512];
    cr_assert_eq(unlink(pth(p, "a", "rank-00003.safetensors")), 0);
    expect_open_fails(pth(p, "a", NULL), PAR_ENOTFOUND, "rank-00003.safetensors", "missing");
    /* also when SHA256SUMS no longer lists it */
    rehash(p);
    expect_open_fails(p, PAR_ENOTFOUND, "rank-00003.safetensors", "missing");
    model_free(&m);
    root_remove();
}

Test(ckpt, fault_wrong_version)
{
    root_make();
    model m;
    save_a(&m);
    char a[512];
    pth(a, "a", NULL);
    edit_meta(a, "\"version\":\t1", "\"version\":\t2");
    expect_open_fails(a, PAR_EUNSUPPORTED, "version 2", "reads version 1");
    rehash(a); /* the same when the hashes were made for it */
    expect_open_fails(a, PAR_EUNSUPPORTED, "version 2", NULL);
    edit_meta(a, "parity-ckpt", "parity-golden");
    expect_open_fails(a, PAR_EFORMAT, "format 'parity-golden'", NULL);
    model_free(&m);
    root_remove();
}

Test(ckpt, fault_gap_in_stored_metadata)
{
    root_make();
    model m;
    save_a(&m);
    char a[512];
    pth(a, "a", NULL);
    /* rank 1's slice of embed.weight is [8, 17): claim [8, 16) */
    edit_meta(a, "[\"embed.weight\", 8, 17]", "[\"embed.weight\", 8, 16]");
    rehash(a);
    expect_open_fails(a, PAR_EFORMAT, "'embed.weight'", "[16, 17) are in no shard (gap)");
    model_free(&m);
    root_remove();
}

/* Issue 13, item 1: a tensor listed twice in metadata.json (the first
 * "embed.weight" renamed to an existing name, hashes made for it) is a format
 * error naming the tensor, not a SIGSEGV (index_build's error path used to
 * free its index and then read it for the message). */
Test(ckpt, fault_duplicate_tensor_name_in_metadata)
{
    root_make();
    model m;
    save_a(&m);
    char a[512];
    pth(a, "a", NULL);
    edit_meta(a, "\"name\":\t\"embed.weight\"", "\"name\":\t\"norm.weight\"");
    rehash(a);
    expect_open_fails(a, PAR_EFORMAT, "tensor 'norm.weight' is listed twice", "tensors 0 and 3");
    cr_assert_eq(par_alloc_live(PAR_TAG_IO), 0, "IO memory leaked: %lld", (long long)par_alloc_live(PAR_TAG_IO));
    model_free(&m);
    root_remove();
}

Test(ckpt, fault_not_a_checkpoint)
{
    root_make();
    char p[512];
    expect_open_fails(pth(p, "nothing", NULL), PAR_ENOTFOUND, "no such directory", NULL);
    cr_assert_eq(mkdir(p, 0755), 0);
    expect_open_fails(p, PAR_ENOTFOUND, "metadata.json is missing", NULL);
    root_remove();
}

/* ---- faults at save ---------------------------------------------------------------- */

Test(ckpt, save_refuses_gap_overlap_and_keeps_previous)
{
    root_make();
    model m;
    save_a(&m);
    char a[512];
    pth(a, "a", NULL);
    par_status st = run_save(&m, a, 4, owner_split, F_GAP, 6, NULL);
    cr_assert_eq(st, PAR_EFORMAT, "%s", par_last_error());
    cr_assert_not_null(strstr(par_last_error(), "(gap)"), "%s", par_last_error());
    cr_assert_not_null(strstr(par_last_error(), "'embed.weight'"), "%s", par_last_error());
    cr_assert_not_null(strstr(par_last_error(), "[16, 17)"), "%s", par_last_error());
    save_job job;
    st = run_save(&m, a, 4, owner_split, F_OVERLAP, 6, &job);
    cr_assert_eq(st, PAR_EFORMAT, "%s", par_last_error());
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(job.rank_st[r], PAR_EFORMAT, "rank %d: %s", r, job.rank_msg[r]);
        cr_assert_not_null(strstr(job.rank_msg[r], "held by rank 0 and rank 1 (overlap"), "rank %d: %s", r,
                           job.rank_msg[r]);
        cr_assert_not_null(strstr(job.rank_msg[r], "[0, 8)"), "rank %d: %s", r, job.rank_msg[r]);
    }
    par_ckpt *ck;
    open_ok(a, &ck);
    cr_assert_eq(par_ckpt_state_of(ck)->step, 5);
    expect_model(ck, &m);
    par_ckpt_close(ck);
    DIR *d = opendir(g_root);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(n, 1, "a failed save left a temporary directory");
    model_free(&m);
    root_remove();
}

Test(ckpt, save_failing_rank_and_table_mismatch)
{
    root_make();
    model m;
    model_make(&m, 4, 0, 1);
    char a[512];
    pth(a, "a", NULL);
    save_job job;
    par_status st = run_save(&m, a, 4, owner_split, F_BADNAME, 1, &job);
    cr_assert_eq(st, PAR_ENOTFOUND, "%s", par_last_error());
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(job.rank_st[r], PAR_ENOTFOUND, "rank %d: %s", r, job.rank_msg[r]);
        cr_assert_not_null(strstr(job.rank_msg[r], "no.such.tensor"), "rank %d: %s", r, job.rank_msg[r]);
        cr_assert_not_null(strstr(job.rank_msg[r], "rank 2"), "rank %d: %s", r, job.rank_msg[r]);
    }
    cr_assert_eq(par_path_exists(a), 0);
    for (fault f = F_TABLE; f <= F_ROLE; f++) {
        st = run_save(&m, a, 4, owner_split, f, 1, &job);
        cr_assert_neq(st, PAR_OK);
        cr_assert_not_null(strstr(job.rank_msg[0], "rank 1 passed another tensor table"), "%s", job.rank_msg[0]);
        cr_assert_eq(par_path_exists(a), 0);
    }
    model_free(&m);
    root_remove();
}

Test(ckpt, save_refuses_a_tensor_listed_twice)
{
    root_make();
    model m;
    model_make(&m, 2, 0, 1);
    add(&m, "norm.weight", PAR_F32, 1, 6, 1); /* the same name as tensors[3] */
    char a[512];
    save_job job;
    par_status st = run_save(&m, pth(a, "a", NULL), 2, owner_rr, F_NONE, 1, &job);
    cr_assert_eq(st, PAR_EINVAL, "%s", par_last_error());
    for (int r = 0; r < 2; r++)
        cr_assert_not_null(strstr(job.rank_msg[r], "tensor 'norm.weight' is listed twice"), "rank %d: %s", r,
                           job.rank_msg[r]);
    cr_assert_eq(par_path_exists(a), 0);
    model_free(&m);
    root_remove();
}

/* ---- crashes during a save ---------------------------------------------------------- */

static const char *g_kill_phase;
static int g_kill_rank;

static void kill_hook(const char *phase, int rank)
{
    if (!strcmp(phase, g_kill_phase) && rank == g_kill_rank)
        raise(SIGKILL);
}

Test(ckpt, kill_at_every_phase_keeps_previous)
{
    root_make();
    model m;
    save_a(&m); /* step 5 (threads here; the children below use the self backend) */
    char a[512];
    pth(a, "a", NULL);
    static const char *phases[] = {"tmp", "shard", "gathered", "metadata", "sums", "commit", "done"};
    for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
        model m2;
        model_make(&m2, 4, 0, 99);
        fflush(NULL);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            g_kill_phase = phases[i];
            g_kill_rank = 0;
            par__ckpt_set_test_hook(kill_hook);
            /* the self backend in the child: no thread pool crosses fork */
            const par_backend *be;
            par_backend_get("self", &be);
            save_job j = {.m = &m2, .dir = a, .owner = owner_split, .step = 6};
            par_world_run(be, 1, save_rank, &j, NULL);
            _exit(3); /* not killed: the hook did not fire */
        }
        int ws;
        cr_assert_eq(waitpid(pid, &ws, 0), pid);
        cr_assert(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL, "phase %s: child was not killed (status %d)",
                  phases[i], ws);
        par_ckpt *ck;
        open_ok(a, &ck);
        int64_t step = par_ckpt_state_of(ck)->step;
        if (!strcmp(phases[i], "done")) {
            cr_assert_eq(step, 6, "killed after the commit: the new checkpoint should be there");
            expect_model(ck, &m2);
        } else {
            cr_assert_eq(step, 5, "phase %s: the previous checkpoint is gone (step %lld)", phases[i],
                         (long long)step);
            expect_model(ck, &m);
        }
        par_ckpt_close(ck);
        model_free(&m2);
    }
    model_free(&m);
    root_remove();
}

Test(ckpt, kill9_during_large_saves)
{
    root_make();
    char a[512];
    pth(a, "big", NULL);
    srand(12345);
    int saw_old = 0, saw_new = 0;
    for (int trial = 0; trial < 4; trial++) {
        int fds[2];
        cr_assert_eq(pipe(fds), 0);
        fflush(NULL);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            close(fds[0]);
            model m;
            model_make(&m, 8, 4096, (uint64_t)trial); /* ~32 MiB */
            const par_backend *be;
            par_backend_get("threads", &be);
            for (int64_t step = 1; step < 1000; step++) {
                save_job j = {.m = &m, .dir = a, .owner = owner_split, .step = step};
                char c = (char)step;
                if (write(fds[1], &c, 1) != 1)
                    _exit(4);
                if (par_world_run(be, 4, save_rank, &j, NULL)) {
                    fprintf(stderr, "saver: %s\n", par_last_error());
                    _exit(5);
                }
            }
            _exit(0);
        }
        close(fds[1]);
        char c;
        /* let step 1 finish (step 2 has started), then kill at a random moment of a later save */
        if (read(fds[0], &c, 1) != 1 || read(fds[0], &c, 1) != 1) {
            int ws;
            waitpid(pid, &ws, 0);
            cr_assert_fail("trial %d: the saver died before its second save (status %d)", trial, ws);
        }
        struct timespec ts = {0, (long)(rand() % 250) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int ws;
        cr_assert_eq(waitpid(pid, &ws, 0), pid);
        close(fds[0]);
        cr_assert(WIFSIGNALED(ws), "trial %d: the saver exited by itself (status %d)", trial, ws);
        par_ckpt *ck;
        open_ok(a, &ck);
        int64_t step = par_ckpt_state_of(ck)->step;
        cr_assert_geq(step, 1);
        model m;
        model_make(&m, 8, 4096, (uint64_t)trial);
        expect_model(ck, &m);
        model_free(&m);
        par_ckpt_close(ck);
        saw_old += step >= 1;
        saw_new += step >= 2;
        par_remove_tree(a); /* next trial starts fresh (stale temporaries stay: they are ignored) */
    }
    cr_log_info("kill -9 trials: %d loaded, %d of them past step 1", saw_old, saw_new);
    root_remove();
}

/* ---- the model's tensor list (v4-tiny) -------------------------------------------- */

typedef struct {
    const par_ckpt_tensor *t;
    int nt;
    unsigned char **data;
    const char *dir;
} big_job;

/* Saves with the simple owner at EP = world size. */
static par_status save_simple_rank(par_comm *w, void *arg)
{
    big_job *j = arg;
    int r = par_comm_rank(w), n = par_comm_size(w);
    par_layout l;
    par_layout_init(&l);
    l.ep = n;
    par_ckpt_slice *s;
    int k;
    par_status st = par_ckpt_owner_simple(&l, n, r, j->t, j->nt, &s, &k, NULL);
    if (st)
        return st;
    par_ckpt_item *it = par_calloc((size_t)k + 1, sizeof *it, PAR_TAG_IO);
    for (int i = 0; i < k; i++) {
        int ti = 0;
        while (strcmp(j->t[ti].name, s[i].name))
            ti++;
        it[i].s = s[i];
        it[i].data = j->data[ti];
    }
    par_ckpt_info info = {.tensors = j->t, .ntensors = j->nt, .layout = &l};
    info.state.step = 3;
    info.state.cursor = 24;
    info.state.seed = 1234;
    snprintf(info.state.precision, sizeof info.state.precision, "f32");
    st = par_ckpt_save(w, j->dir, &info, it, k);
    par_free(it);
    par_free(s);
    return st;
}

Test(ckpt, v4_tiny_tensor_list_simple_save_and_reshard)
{
    root_make();
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), PAR_OK);
    par_param_table pt;
    cr_assert_eq(par_param_table_build(&pt, &cfg), PAR_OK, "%s", par_last_error());
    par_ckpt_tensor *t;
    int nt;
    cr_assert_eq(par_ckpt_tensors_of_params(&pt, 32, &t, &nt), PAR_OK);
    /* params in table order, then the slots of GOLDEN.md in table order */
    int n_muon = 0, n_adamw = 0;
    for (int i = 0; i < pt.n; i++) {
        cr_assert_str_eq(t[i].name, pt.p[i].name);
        cr_assert_eq(t[i].dtype, pt.p[i].dtype == PAR_PDT_I32 ? PAR_I32 : PAR_F32, "%s", t[i].name);
        n_muon += pt.p[i].opt == PAR_OPT_MUON;
        n_adamw += pt.p[i].opt == PAR_OPT_ADAMW;
    }
    cr_assert_eq(nt, pt.n + n_muon + 2 * n_adamw);
    const par_param *emb = par_param_lookup(&pt, "embed.weight");
    cr_assert_eq(emb->opt, PAR_OPT_ADAMW);
    int found = 0;
    for (int i = pt.n; i < nt; i++) {
        found += !strcmp(t[i].name, "opt.embed.weight.exp_avg") || !strcmp(t[i].name, "opt.embed.weight.exp_avg_sq");
        cr_assert(strstr(t[i].name, "gate.bias") == NULL && strstr(t[i].name, "tid2eid") == NULL,
                  "optimizer state for %s", t[i].name);
        cr_assert_eq(t[i].dtype, PAR_F32);
    }
    cr_assert_eq(found, 2);
    /* save on 2 thread ranks with the simple owner (EP 2), load, reshard to 3 ranks split */
    unsigned char **data = calloc((size_t)nt, sizeof *data);
    for (int i = 0; i < nt; i++) {
        size_t bytes = (size_t)par_shape_numel(t[i].ndim, t[i].shape, 0) * par_dtype_size(t[i].dtype);
        data[i] = malloc(bytes + 1);
        for (size_t b = 0; b < bytes; b++)
            data[i][b] = (unsigned char)(b * 131 + (size_t)i * 7 + (b >> 8));
    }
    char a[512], b[512];
    big_job j = {t, nt, data, pth(a, "tiny", NULL)};
    const par_backend *be;
    cr_assert_eq(par_backend_get("threads", &be), PAR_OK);
    cr_assert_eq(par_world_run(be, 2, save_simple_rank, &j, NULL), PAR_OK, "%s", par_last_error());
    par_layout l3;
    par_layout_init(&l3);
    l3.world = 3;
    cr_assert_eq(par_ckpt_reshard(a, pth(b, "tiny3", NULL), &l3, owner_split, NULL), PAR_OK, "%s",
                 par_last_error());
    par_ckpt *ck;
    open_ok(b, &ck);
    cr_assert_eq(par_ckpt_ntensors(ck), nt);
    for (int i = 0; i < nt; i++) {
        par_tensor x;
        cr_assert_eq(par_ckpt_read_tensor(ck, t[i].name, PAR_TAG_TENSOR, &x), PAR_OK);
        cr_assert_eq(memcmp(x.data, data[i], par_tensor_nbytes(&x)), 0, "%s", t[i].name);
        par_tensor_free(&x);
    }
    par_ckpt_close(ck);
    open_ok(a, &ck);
    cr_assert_eq(par_ckpt_layout(ck)->ep, 2);
    cr_assert_eq(par_ckpt_layout(ck)->de, 1);
    par_ckpt_close(ck);
    for (int i = 0; i < nt; i++)
        free(data[i]);
    free(data);
    par_free(t);
    par_param_table_free(&pt);
    root_remove();
}

/* ---- roles ------------------------------------------------------------------------ */

/* Every tensor of ck has the role of t[i] (metadata order = list order). */
static void expect_roles(const par_ckpt *ck, const par_ckpt_tensor *t, int nt)
{
    cr_assert_eq(par_ckpt_ntensors(ck), nt);
    for (int i = 0; i < nt; i++) {
        const par_ckpt_tensor *x = par_ckpt_tensor_at(ck, i);
        cr_assert_str_eq(x->name, t[i].name);
        cr_assert(x->slot == t[i].slot && x->param == t[i].param && x->expert == t[i].expert &&
                      x->layer == t[i].layer && x->mtp == t[i].mtp,
                  "'%s': read slot %d param %d expert %d layer %d mtp %d, saved %d %d %d %d %d", x->name, x->slot,
                  x->param, x->expert, x->layer, x->mtp, t[i].slot, t[i].param, t[i].expert, t[i].layer, t[i].mtp);
    }
}

/* Rewrites dir/metadata.json through cJSON: tensors entries [from, to) lose
 * their role members (as a checkpoint written before they were recorded);
 * then SHA256SUMS is redone. */
static void strip_roles(const char *dir, int from, int to)
{
    char p[512];
    snprintf(p, sizeof p, "%s/metadata.json", dir);
    char *d;
    size_t n;
    file_bytes(p, (void **)&d, &n);
    cJSON *root = cJSON_ParseWithLength(d, n);
    par_free(d);
    cr_assert_not_null(root);
    cJSON *ts = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    static const char *keys[] = {"slot", "param", "expert", "layer", "mtp"};
    for (int i = from; i < to && i < cJSON_GetArraySize(ts); i++)
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetArrayItem(ts, i), keys[k]);
    char *txt = cJSON_Print(root);
    cr_assert_eq(par_file_write_atomic(p, txt, strlen(txt)), PAR_OK);
    cJSON_free(txt);
    cJSON_Delete(root);
    rehash(dir);
}

/* Roles (slot, parameter, expert, block) are fields of the tensor list:
 * set from the parameter table, written to metadata.json, read back; a
 * checkpoint written before they were recorded gets the same roles from the
 * contract's names; some entries with and some without is a format error. */
Test(ckpt, roles_round_trip_and_legacy_metadata)
{
    root_make();
    par_config cfg;
    cr_assert_eq(par_config_preset(&cfg, "v4-tiny"), PAR_OK);
    par_param_table pt;
    cr_assert_eq(par_param_table_build(&pt, &cfg), PAR_OK, "%s", par_last_error());
    par_ckpt_tensor *t;
    int nt;
    cr_assert_eq(par_ckpt_tensors_of_params(&pt, 32, &t, &nt), PAR_OK);
    int experts = 0, mtp = 0, states = 0;
    for (int i = 0; i < nt; i++) {
        const int idx = t[i].slot == PAR_CKPT_PARAM ? i : t[i].param;
        cr_assert_lt(idx, pt.n, "'%s' names parameter %d", t[i].name, idx);
        cr_assert_eq(t[i].expert, pt.p[idx].expert, "%s", t[i].name);
        cr_assert_eq(t[i].layer >= 0 ? t[i].layer : t[i].mtp >= 0 ? cfg.n_layers + t[i].mtp : -1,
                     pt.p[idx].layer, "%s", t[i].name);
        experts += t[i].expert >= 0;
        mtp += t[i].mtp >= 0;
        states += t[i].slot != PAR_CKPT_PARAM;
    }
    cr_assert(experts > 0 && mtp > 0 && states > 0, "%d expert, %d mtp, %d state tensors", experts, mtp, states);
    unsigned char **data = calloc((size_t)nt, sizeof *data);
    for (int i = 0; i < nt; i++)
        data[i] = calloc((size_t)par_shape_numel(t[i].ndim, t[i].shape, 0) * par_dtype_size(t[i].dtype) + 1, 1);
    char a[512];
    big_job j = {t, nt, data, pth(a, "r", NULL)};
    const par_backend *be;
    cr_assert_eq(par_backend_get("threads", &be), PAR_OK);
    cr_assert_eq(par_world_run(be, 2, save_simple_rank, &j, NULL), PAR_OK, "%s", par_last_error());
    par_ckpt *ck;
    open_ok(a, &ck);
    expect_roles(ck, t, nt);
    par_ckpt_close(ck);
    strip_roles(a, 0, nt);
    open_ok(a, &ck);
    expect_roles(ck, t, nt);
    par_ckpt_close(ck);
    cr_assert_eq(par_world_run(be, 2, save_simple_rank, &j, NULL), PAR_OK, "%s", par_last_error());
    strip_roles(a, 1, nt);
    expect_open_fails(a, PAR_EFORMAT, "tensors[1] ('layers.0.hc_attn_fn') lacks its role", NULL);
    for (int i = 0; i < nt; i++)
        free(data[i]);
    free(data);
    par_free(t);
    par_param_table_free(&pt);
    root_remove();
}

/* A save refuses a list whose roles break the rules (ckpt.h), naming the
 * tensor; nothing is written. */
Test(ckpt, save_refuses_broken_roles)
{
    root_make();
    static const struct {
        int tensor, field, value; /* field: 0 param, 1 expert, 2 mtp, 3 shape[0] */
        const char *needle;
    } cases[] = {
        {2, 0, 1, "names tensor 1 as its parameter, which is optimizer state"},
        {2, 0, 99, "names tensor 99 as its parameter, which is not in the list"},
        {0, 0, 3, "is a parameter but names parameter 3"},
        {3, 1, -2, "expert -2"},
        {4, 2, 0, "not both a layer and an MTP block"},
        {1, 3, 8, "has another shape, expert or block than its parameter"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        model m;
        model_make(&m, 2, 0, 1);
        par_ckpt_tensor *x = &m.t[cases[c].tensor];
        int *f[3] = {&x->param, &x->expert, &x->mtp};
        if (cases[c].field < 3)
            *f[cases[c].field] = cases[c].value;
        else
            x->shape[0] = cases[c].value;
        char a[512];
        save_job job;
        par_status st = run_save(&m, pth(a, "a", NULL), 2, owner_rr, F_NONE, 1, &job);
        cr_assert_eq(st, PAR_EINVAL, "case %zu: %s", c, par_last_error());
        cr_assert_not_null(strstr(job.rank_msg[0], cases[c].needle), "case %zu: '%s'", c, job.rank_msg[0]);
        cr_assert_not_null(strstr(job.rank_msg[0], x->name), "case %zu: '%s'", c, job.rank_msg[0]);
        cr_assert_eq(par_path_exists(a), 0);
        model_free(&m);
    }
    root_remove();
}
