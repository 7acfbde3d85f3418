/* parallel/matrix.c - the conformance matrix (see parallel/matrix.h and
 * docs/matrix.md). */
#include "parallel/matrix.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/wait.h>

#include "core/alloc.h"
#include "core/datadir.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/safetensors.h"
#include "core/tensor.h"
#include "model/facade.h"
#include "parallel/driver.h"
#include "parallel/schedule.h"

#define MARKER_NAME ".parity-matrix"
#define MAX_FIXTURES 64
#define PATH_CAP 1024

/* A checked-in golden set found under the golden root. */
typedef struct {
    char dir[PATH_CAP];
    char fixture[64];     /* "" when unreadable */
    int64_t steps;
    uint64_t seed;
    char blas_core[64];
    char error[400];      /* why it could not be used ("" when fine) */
} golden_entry;

/* A serial f64 reference produced by the matrix. */
typedef struct {
    int precision;        /* 64 or 32 (stored widened to F64) */
    char fixture[64];
    int64_t steps;
    uint64_t seed;
    char dir[PATH_CAP];
    par_status status;    /* of the run that produced it */
    char error[600];
    int produced;         /* 1 once attempted */
    int last_use;         /* last cell index that uses it (-1: none declared) */
    int pinned;           /* a failing cell used it: keep */
    int removed;
} ref_entry;

struct par_matrix {
    par_config cfg;
    char preset[32];
    int quick;
    char backend[16];
    const par_backend *backend_impl; /* parallel cells (NULL: they are ERROR) */
    int64_t steps;
    uint64_t seed;
    char out_dir[PATH_CAP];
    char fixtures_dir[PATH_CAP];
    char golden_root[PATH_CAP];
    int keep;
    int full;
    int mpi_procs;
    char mpiexec[PATH_CAP];
    char self_exe[PATH_CAP];
    FILE *progress;
    char **only_cells;
    int n_only_cells;
    int nfix;
    char fixtures[MAX_FIXTURES][64];
    int ngold;
    golden_entry *gold;
    int n, cap;
    par_matrix_cell *cells;
    par_cell_result *res;
    int nref, refcap;
    ref_entry *refs;
    double wall_s;
    char blas_core[64];
    int ran;
};

/* ---- small helpers ---------------------------------------------------- */

/* snprintf without GCC's truncation warnings: names and paths here are cut
 * to their buffers on purpose (they are labels; paths are bounded by
 * PATH_CAP and a cut one fails to open with a message). */
static int sfmt(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int sfmt(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return k;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

static int has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

static par_status mkdir_p(const char *path)
{
    char buf[PATH_CAP];
    if (sfmt(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return par_err(PAR_ERANGE, "matrix: path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0777) && errno != EEXIST)
            return par_err(PAR_EIO, "matrix: cannot create %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) && errno != EEXIST)
        return par_err(PAR_EIO, "matrix: cannot create %s: %s", buf, strerror(errno));
    if (!par_path_is_dir(buf))
        return par_err(PAR_EIO, "matrix: %s exists and is not a directory", buf);
    return PAR_OK;
}

/* 1 if dir has no entries but . and .. */
static int dir_is_empty(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *de;
    int empty = 1;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            empty = 0;
            break;
        }
    }
    closedir(d);
    return empty;
}

static void remove_quiet(const char *path)
{
    if (par_remove_tree(path) != PAR_OK)
        par_log(PAR_LOG_WARN, "matrix: could not remove %s: %s", path, par_last_error());
}

/* Message of the last error, one line (newlines flattened). */
static void last_error_line(char *buf, size_t n, const char *prefix)
{
    sfmt(buf, n, "%s%s", prefix ? prefix : "", par_last_error());
    for (char *p = buf; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

const char *par_cell_verdict_name(par_cell_verdict v)
{
    switch (v) {
    case PAR_CELL_PASS: return "PASS";
    case PAR_CELL_FAIL: return "FAIL";
    case PAR_CELL_ERROR: return "ERROR";
    case PAR_CELL_WARN: return "WARN";
    default: return "-";
    }
}

/* ---- options, construction -------------------------------------------- */

void par_matrix_opts_init(par_matrix_opts *o)
{
    memset(o, 0, sizeof *o);
    o->preset = "v4-tiny";
    o->backend = "threads";
    o->seed = 1234;
    o->progress = stderr;
}

static int cmp_str(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

/* The fixture name prefix of a preset: "v4-tiny" -> "tiny-". */
static void fixture_prefix(const char *preset, char *buf, size_t n)
{
    const char *p = has_prefix(preset, "v4-") ? preset + 3 : preset;
    sfmt(buf, n, "%s-", p);
}

static par_status resolve_fixtures_dir(par_matrix *m, const char *given)
{
    const char *env = getenv("PARITY_FIXTURES_DIR"), *root = getenv("PARITY_SOURCE_ROOT");
    if (given)
        sfmt(m->fixtures_dir, sizeof m->fixtures_dir, "%s", given);
    else if (env && *env)
        sfmt(m->fixtures_dir, sizeof m->fixtures_dir, "%s", env);
    else if (par_data_dir("fixtures", m->fixtures_dir, sizeof m->fixtures_dir) != PAR_OK) /* core/datadir.h */
        sfmt(m->fixtures_dir, sizeof m->fixtures_dir, "%s/fixtures", root && *root ? root : ".");
    if (!par_path_is_dir(m->fixtures_dir))
        return par_err(PAR_ENOTFOUND,
                       "matrix: fixtures directory '%s' not found (run from the repository root, or give "
                       "--fixtures-dir / PARITY_SOURCE_ROOT)",
                       m->fixtures_dir);
    return PAR_OK;
}

static par_status list_fixtures(par_matrix *m, const par_matrix_opts *o)
{
    char pre[40];
    fixture_prefix(m->preset, pre, sizeof pre);
    DIR *d = opendir(m->fixtures_dir);
    if (!d)
        return par_err(PAR_EIO, "matrix: cannot read %s: %s", m->fixtures_dir, strerror(errno));
    struct dirent *de;
    m->nfix = 0;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        size_t len = strlen(nm);
        if (!has_prefix(nm, pre) || !has_suffix(nm, ".json") || len - 5 >= sizeof m->fixtures[0])
            continue;
        if (m->nfix == MAX_FIXTURES) {
            closedir(d);
            return par_err(PAR_ERANGE, "matrix: more than %d fixtures %s*.json in %s", MAX_FIXTURES, pre,
                           m->fixtures_dir);
        }
        memcpy(m->fixtures[m->nfix], nm, len - 5);
        m->fixtures[m->nfix][len - 5] = 0;
        m->nfix++;
    }
    closedir(d);
    qsort(m->fixtures, (size_t)m->nfix, sizeof m->fixtures[0], cmp_str);
    if (o->n_only_fixtures > 0) {
        char keep[MAX_FIXTURES][64];
        int nk = 0;
        for (int i = 0; i < o->n_only_fixtures; i++) {
            const char *want = o->only_fixtures[i];
            int found = -1;
            for (int j = 0; j < m->nfix; j++)
                if (!strcmp(m->fixtures[j], want))
                    found = j;
            if (found < 0)
                return par_err(PAR_ENOTFOUND, "matrix: fixture '%s' is not one of the %s fixtures in %s (%s*.json)",
                               want, m->preset, m->fixtures_dir, pre);
            int dup = 0;
            for (int j = 0; j < nk; j++)
                dup |= !strcmp(keep[j], want);
            if (!dup)
                sfmt(keep[nk++], sizeof keep[0], "%s", want);
        }
        qsort(keep, (size_t)nk, sizeof keep[0], cmp_str);
        memcpy(m->fixtures, keep, sizeof keep[0] * (size_t)nk);
        m->nfix = nk;
    }
    if (m->nfix == 0)
        return par_err(PAR_ENOTFOUND, "matrix: no fixtures %s*.json in %s", pre, m->fixtures_dir);
    return PAR_OK;
}

/* Reads one candidate golden directory's manifest into g. */
static void read_golden(golden_entry *g)
{
    char *mp = par_path_join(g->dir, PAR_MANIFEST_NAME);
    cJSON *man = NULL;
    par_status s = mp ? par_json_read_file(mp, &man) : par_err(PAR_ENOMEM, "matrix: out of memory");
    par_free(mp);
    if (s) {
        last_error_line(g->error, sizeof g->error, "");
        return;
    }
    const cJSON *data = par_json_obj(man, "data");
    const char *prec = par_json_str(man, "precision");
    const char *src = data ? par_json_str(data, "source") : NULL;
    const char *fx = data ? par_json_str(data, "fixture") : NULL;
    const char *core = par_json_str(par_json_obj(man, "layout"), "blas_core");
    int64_t steps = 0, seed = -1;
    if (!prec || strcmp(prec, "f64") || !src || strcmp(src, "fixture") || !fx || !par_json_int(man, "steps", &steps) ||
        !par_json_int(data, "seed", &seed) || steps < 1 || seed < 0) {
        /* Not a set the matrix knows how to reproduce (another precision or data source). */
        g->fixture[0] = 0;
        sfmt(g->error, sizeof g->error, "skip");
    } else {
        sfmt(g->fixture, sizeof g->fixture, "%s", fx);
        g->steps = steps;
        g->seed = (uint64_t)seed;
        sfmt(g->blas_core, sizeof g->blas_core, "%s", core ? core : "");
    }
    cJSON_Delete(man);
}

static par_status list_goldens(par_matrix *m, const char *given)
{
    const char *root = getenv("PARITY_SOURCE_ROOT");
    if (given)
        sfmt(m->golden_root, sizeof m->golden_root, "%s", given);
    else if (par_data_dir("golden", m->golden_root, sizeof m->golden_root) != PAR_OK) /* core/datadir.h */
        sfmt(m->golden_root, sizeof m->golden_root, "%s/golden", root && *root ? root : ".");
    if (!par_path_is_dir(m->golden_root)) {
        if (given)
            return par_err(PAR_ENOTFOUND, "matrix: golden directory '%s' not found", given);
        return PAR_OK; /* no checked-in sets: serial cells run their checks only */
    }
    DIR *d = opendir(m->golden_root);
    if (!d)
        return par_err(PAR_EIO, "matrix: cannot read %s: %s", m->golden_root, strerror(errno));
    char names[MAX_FIXTURES][128];
    int nn = 0;
    struct dirent *de;
    size_t pl = strlen(m->preset);
    while ((de = readdir(d)) && nn < MAX_FIXTURES) {
        const char *nm = de->d_name;
        if (strncmp(nm, m->preset, pl) || (nm[pl] && nm[pl] != '-') || strlen(nm) >= sizeof names[0])
            continue;
        sfmt(names[nn++], sizeof names[0], "%s", nm);
    }
    closedir(d);
    qsort(names, (size_t)nn, sizeof names[0], cmp_str);
    for (int i = 0; i < nn; i++) {
        char dir[PATH_CAP];
        sfmt(dir, sizeof dir, "%s/%s", m->golden_root, names[i]);
        if (!par_path_is_dir(dir))
            continue;
        golden_entry *ng = par_realloc(m->gold, sizeof *ng * (size_t)(m->ngold + 1), PAR_TAG_MISC);
        if (!ng)
            return par_err(PAR_ENOMEM, "matrix: out of memory");
        m->gold = ng;
        golden_entry *g = &m->gold[m->ngold++];
        memset(g, 0, sizeof *g);
        sfmt(g->dir, sizeof g->dir, "%s", dir);
        read_golden(g);
    }
    return PAR_OK;
}

static par_status prepare_out_dir(par_matrix *m, const char *given)
{
    if (given) {
        sfmt(m->out_dir, sizeof m->out_dir, "%s", given);
    } else {
        char stamp[32];
        time_t t = time(NULL);
        struct tm tmv;
        localtime_r(&t, &tmv);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tmv);
        sfmt(m->out_dir, sizeof m->out_dir, "out/matrix-%s", stamp);
        for (int k = 2; par_path_exists(m->out_dir) && k < 100; k++)
            sfmt(m->out_dir, sizeof m->out_dir, "out/matrix-%s-%d", stamp, k);
    }
    if (par_path_exists(m->out_dir)) {
        if (!par_path_is_dir(m->out_dir))
            return par_err(PAR_EINVAL, "matrix: --out %s exists and is not a directory", m->out_dir);
        char marker[PATH_CAP + 32];
        sfmt(marker, sizeof marker, "%s/%s", m->out_dir, MARKER_NAME);
        if (par_path_exists(marker)) {
            par_status s = par_remove_tree(m->out_dir);
            if (s)
                return s;
        } else if (!dir_is_empty(m->out_dir)) {
            return par_err(PAR_EINVAL,
                           "matrix: --out %s exists, is not empty and is not an earlier matrix's results "
                           "directory (no %s in it); give a new or empty directory",
                           m->out_dir, MARKER_NAME);
        }
    }
    par_status s = mkdir_p(m->out_dir);
    if (s)
        return s;
    char marker[PATH_CAP + 32];
    sfmt(marker, sizeof marker, "%s/%s", m->out_dir, MARKER_NAME);
    static const char text[] = "results of `parity matrix`; a later matrix with the same --out replaces this directory\n";
    return par_file_write_atomic(marker, text, sizeof text - 1);
}

par_status par_matrix_new(const par_matrix_opts *o, par_matrix **out)
{
    if (!o || !o->preset || !o->backend)
        return par_err(PAR_EINVAL, "matrix: options need a preset and a backend");
    if (o->steps < 0)
        return par_err(PAR_EINVAL, "matrix: steps must be >= 1 (got %lld)", (long long)o->steps);
    par_matrix *m = par_calloc(1, sizeof *m, PAR_TAG_MISC);
    if (!m)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
    par_status s = par_config_preset(&m->cfg, o->preset);
    if (!s)
        s = par_config_validate(&m->cfg);
    if (!s)
        s = par_config_check_runnable(&m->cfg);
    if (s)
        goto fail_free_matrix;
    sfmt(m->preset, sizeof m->preset, "%s", o->preset);
    sfmt(m->backend, sizeof m->backend, "%s", o->backend);
    m->backend_impl = o->backend_impl;
    m->quick = o->quick;
    m->seed = o->seed;
    m->steps = o->steps ? o->steps : (!strcmp(o->preset, "v4-tiny") ? 3 : 1);
    m->keep = o->keep;
    m->full = o->full;
    m->mpi_procs = o->mpi_procs;
    sfmt(m->mpiexec, sizeof m->mpiexec, "%s", o->mpiexec ? o->mpiexec : "mpiexec");
    if (o->self_exe) {
        sfmt(m->self_exe, sizeof m->self_exe, "%s", o->self_exe);
    } else {
        ssize_t k = readlink("/proc/self/exe", m->self_exe, sizeof m->self_exe - 1);
        m->self_exe[k > 0 ? k : 0] = 0;
    }
    m->progress = o->progress;
    sfmt(m->blas_core, sizeof m->blas_core, "%s", par_blas_core_name());
    if (o->n_only_cells > 0) {
        m->only_cells = par_calloc((size_t)o->n_only_cells, sizeof *m->only_cells, PAR_TAG_MISC);
        if (!m->only_cells) {
            s = par_err(PAR_ENOMEM, "matrix: out of memory");
            goto fail_free_matrix;
        }
        for (int i = 0; i < o->n_only_cells; i++) {
            m->only_cells[i] = par_strdup(o->only_cells[i], PAR_TAG_MISC);
            if (!m->only_cells[i]) {
                s = par_err(PAR_ENOMEM, "matrix: out of memory");
                goto fail_free_matrix;
            }
            m->n_only_cells = i + 1;
        }
    }
    s = resolve_fixtures_dir(m, o->fixtures_dir);
    if (!s)
        s = list_fixtures(m, o);
    if (!s)
        s = list_goldens(m, o->golden_root);
    if (!s && !o->no_out)
        s = prepare_out_dir(m, o->out_dir);
    if (s)
        goto fail_free_matrix;
    *out = m;
    return PAR_OK;

fail_free_matrix:
    par_matrix_free(m);
    return s;
}

void par_matrix_free(par_matrix *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_only_cells; i++)
        par_free(m->only_cells[i]);
    par_free(m->only_cells);
    par_free(m->gold);
    par_free(m->cells);
    par_free(m->res);
    par_free(m->refs);
    par_free(m);
}

/* ---- cells ------------------------------------------------------------ */

void par_matrix_cell_init(const par_matrix *m, par_matrix_cell *c, const char *name, const char *fixture)
{
    memset(c, 0, sizeof *c);
    sfmt(c->name, sizeof c->name, "%s", name);
    sfmt(c->fixture, sizeof c->fixture, "%s", fixture ? fixture : "");
    c->ranks = 1;
    c->steps = m->steps;
    c->seed = m->seed;
    c->ref = PAR_REF_SERIAL;
    c->policy = PAR_POLICY_AUTO;
}

par_status par_matrix_add(par_matrix *m, const par_matrix_cell *c)
{
    if (!c->produce)
        return par_err(PAR_EINVAL, "matrix: cell '%s' has no producer", c->name);
    if (c->steps < 1)
        return par_err(PAR_EINVAL, "matrix: cell '%s' needs steps >= 1 (got %lld)", c->name, (long long)c->steps);
    if (c->ref == PAR_REF_DIR && !c->ref_dir[0])
        return par_err(PAR_EINVAL, "matrix: cell '%s' compares with a directory but names none", c->name);
    if (m->n_only_cells > 0) {
        int want = 0;
        for (int i = 0; i < m->n_only_cells; i++)
            want |= !strcmp(m->only_cells[i], c->name);
        if (!want)
            return PAR_OK;
    }
    if (c->fixture[0]) {
        int known = 0;
        for (int i = 0; i < m->nfix; i++)
            known |= !strcmp(m->fixtures[i], c->fixture);
        if (!known)
            return PAR_OK; /* a fixture excluded by the selection */
    }
    if (m->n == m->cap) {
        int nc = m->cap ? 2 * m->cap : 16;
        par_matrix_cell *cells = par_realloc(m->cells, sizeof *cells * (size_t)nc, PAR_TAG_MISC);
        if (!cells)
            return par_err(PAR_ENOMEM, "matrix: out of memory");
        m->cells = cells;
        par_cell_result *res = par_realloc(m->res, sizeof *res * (size_t)nc, PAR_TAG_MISC);
        if (!res)
            return par_err(PAR_ENOMEM, "matrix: out of memory");
        m->res = res;
        m->cap = nc;
    }
    m->cells[m->n] = *c;
    memset(&m->res[m->n], 0, sizeof m->res[m->n]);
    m->n++;
    return PAR_OK;
}

/* ---- references and golden runs --------------------------------------- */

par_status par_matrix_golden(par_matrix *m, int precision, const char *fixture, const char *data_path,
                             int64_t steps, uint64_t seed, const char *out_dir)
{
    par_golden_opts o;
    par_golden_opts_init(&o);
    o.cfg = m->cfg;
    o.precision = precision;
    o.steps = steps;
    o.seed = seed;
    o.out_dir = out_dir;
    o.data_path = data_path;
    o.fixture = (data_path || !fixture || !fixture[0]) ? NULL : fixture;
    o.fixtures_dir = m->fixtures_dir;
    o.progress = 0;
    return par_golden_run(&o, NULL);
}

static ref_entry *ref_find(par_matrix *m, int precision, const char *fixture, int64_t steps, uint64_t seed)
{
    for (int i = 0; i < m->nref; i++) {
        ref_entry *r = &m->refs[i];
        if (r->precision == precision && !strcmp(r->fixture, fixture) && r->steps == steps && r->seed == seed)
            return r;
    }
    return NULL;
}

static ref_entry *ref_get(par_matrix *m, int precision, const char *fixture, int64_t steps, uint64_t seed)
{
    ref_entry *r = ref_find(m, precision, fixture, steps, seed);
    if (r)
        return r;
    if (m->nref == m->refcap) {
        int nc = m->refcap ? 2 * m->refcap : 16;
        ref_entry *nr = par_realloc(m->refs, sizeof *nr * (size_t)nc, PAR_TAG_MISC);
        if (!nr)
            return NULL;
        m->refs = nr;
        m->refcap = nc;
    }
    r = &m->refs[m->nref++];
    memset(r, 0, sizeof *r);
    r->precision = precision;
    sfmt(r->fixture, sizeof r->fixture, "%s", fixture);
    r->steps = steps;
    r->seed = seed;
    r->last_use = -1;
    sfmt(r->dir, sizeof r->dir, "%s/ref/f%d-%s-s%lld-seed%llu", m->out_dir, precision, fixture[0] ? fixture : "generator",
             (long long)steps, (unsigned long long)seed);
    return r;
}

static par_status widen_set(const char *src, const char *dst);

par_status par_matrix_reference(par_matrix *m, const char *fixture, int64_t steps, uint64_t seed, const char **dir)
{
    return par_matrix_serial(m, 64, fixture, steps, seed, dir);
}

par_status par_matrix_serial(par_matrix *m, int precision, const char *fixture, int64_t steps, uint64_t seed,
                             const char **dir)
{
    fixture = fixture ? fixture : "";
    if (precision != 64 && precision != 32)
        return par_err(PAR_EINVAL, "matrix: precision must be 64 or 32 (got %d)", precision);
    ref_entry *r = ref_get(m, precision, fixture, steps, seed);
    if (!r)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
    if (r->removed)
        return par_err(PAR_EINTERNAL, "matrix: reference %s was removed before a cell asked for it", r->dir);
    if (!r->produced) {
        r->produced = 1;
        char parent[PATH_CAP + 8];
        sfmt(parent, sizeof parent, "%s/ref", m->out_dir);
        r->status = mkdir_p(parent);
        if (!r->status && precision == 64) {
            r->status = par_matrix_golden(m, 64, fixture, NULL, steps, seed, r->dir);
        } else if (!r->status) {
            char raw[PATH_CAP + 8];
            sfmt(raw, sizeof raw, "%s.raw", r->dir);
            r->status = par_matrix_golden(m, 32, fixture, NULL, steps, seed, raw);
            if (!r->status)
                r->status = widen_set(raw, r->dir);
            if (!m->keep)
                remove_quiet(raw);
        }
        if (r->status)
            last_error_line(r->error, sizeof r->error, precision == 64 ? "serial f64 reference: " : "serial f32 run: ");
    }
    if (r->status)
        return par_err(r->status, "%s", r->error);
    *dir = r->dir;
    return PAR_OK;
}

/* ---- producers and checks of the built-in cells ------------------------ */

/* serial-f64: the cell's set is the serial reference itself. */
static par_status prod_reference(par_matrix *m, const par_matrix_cell *c, const char *work_dir, const char *set_dir,
                                 const char **cand, par_cell_metrics *met)
{
    return par_matrix_reference(m, c->fixture, c->steps, c->seed, cand);
}

/* repeat-bitwise: the same serial f64 run again. */
static par_status prod_repeat(par_matrix *m, const par_matrix_cell *c, const char *work_dir, const char *set_dir,
                              const char **cand, par_cell_metrics *met)
{
    return par_matrix_golden(m, 64, c->fixture, NULL, c->steps, c->seed, set_dir);
}

/* A PP layout string of `segs` segments for n_layers main layers and n_mtp
 * MTP blocks: the layers split as evenly as possible, E on the first
 * segment, the MTP blocks and L on the last. */
static void pp_layout_string(char *buf, size_t n, int64_t n_layers, int64_t n_mtp, int segs)
{
    size_t o = 0;
    for (int i = 0; i < segs && o < n; i++) {
        int64_t k = n_layers / segs + (i >= segs - n_layers % segs ? 1 : 0);
        o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? "|" : "", i == 0 ? "E" : "");
        if (k > 0 && o < n)
            o += (size_t)snprintf(buf + o, n - o, "t*%lld", (long long)k);
        if (i == segs - 1 && o < n)
            snprintf(buf + o, n - o, "%sL", n_mtp > 0 ? "m" : "");
    }
}

static int64_t size_or_1(int64_t v) { return v > 0 ? v : 1; }

static int lay_segs(const par_cell_layout *L) { return L->segs > 0 ? L->segs : (int)size_or_1(L->pp); }

/* The driver's layout of a cell layout. */
static par_status cell_layout(const par_matrix *m, const par_cell_layout *L, par_layout *out)
{
    par_layout_init(out);
    out->world = L->world;
    out->cp = size_or_1(L->cp);
    out->ep = size_or_1(L->ep);
    out->pp = size_or_1(L->pp);
    out->distributed_optimizer = L->zero;
    if (out->pp > 1) {
        char str[256];
        pp_layout_string(str, sizeof str, m->cfg.n_layers, m->cfg.n_mtp_layers, lay_segs(L));
        par_status s = par_layout_set_pp_layout(out, str);
        if (!s && L->sched >= 0)
            s = par_layout_set_schedule(out, par_schedule_kind_name((par_sched_kind)L->sched));
        if (s)
            return s;
    }
    return PAR_OK;
}

/* One line describing a cell layout ("EP=4 De=2 (world 8)", ...). */
static void describe_layout(const par_matrix *m, const par_cell_layout *L, char *buf, size_t n)
{
    int64_t world = L->world ? L->world : size_or_1(L->pp) * size_or_1(L->cp) * size_or_1(L->ep);
    int64_t cp = size_or_1(L->cp), ep = size_or_1(L->ep), pp = size_or_1(L->pp);
    int64_t da = world / (pp * cp), de = world / (pp * ep);
    size_t o = 0;
#define ADD(...) (o += (o < n ? (size_t)sfmt(buf + o, n - o, __VA_ARGS__) : 0))
    buf[0] = 0;
    if (pp > 1) {
        char str[256];
        pp_layout_string(str, sizeof str, m->cfg.n_layers, m->cfg.n_mtp_layers, lay_segs(L));
        ADD("PP=%lld %s '%s' ", (long long)pp, L->sched >= 0 ? par_schedule_kind_name((par_sched_kind)L->sched) : "",
            str);
    }
    if (cp > 1)
        ADD("CP=%lld ", (long long)cp);
    if (da > 1)
        ADD("DP=%lld ", (long long)da);
    if (ep > 1)
        ADD("EP=%lld ", (long long)ep);
    if (ep > 1 && de > 1)
        ADD("De=%lld ", (long long)de);
    if (L->zero)
        ADD("ZeRO-1 ");
    ADD("(world %lld)", (long long)world);
#undef ADD
}

/* The emulated network's metrics of a run, per step. */
static void metrics_of(const par_run_summary *sum, int64_t world, int64_t steps, par_cell_metrics *met)
{
    if (!sum->net)
        return;
    double tmax = 0, cmax = 0;
    for (int r = 0; r < (int)world; r++) {
        const par_rankstats *st = par_netrun_stats(sum->net, r);
        if (st && st->total_s > tmax)
            tmax = st->total_s;
        if (st && st->comm_s > cmax)
            cmax = st->comm_s;
    }
    met->step_time_s = tmax / (double)steps;
    met->exposed_comm_s = cmax / (double)steps;
    if (sum->pp_net_bubble >= 0)
        met->bubble = sum->pp_net_bubble;
}

/* Reads the metrics `parity run` printed (the emulated network's "max" row:
 * total ms, compute ms, comm ms; the pipeline's "emulated bubble X %"). */
static void metrics_of_log(const char *log, int64_t steps, par_cell_metrics *met)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        double tot, comp, comm;
        const char *b = strstr(line, "emulated bubble ");
        double bub;
        if (!strncmp(line, "max ", 4) && sscanf(line + 4, "%lf %lf %lf", &tot, &comp, &comm) == 3) {
            met->step_time_s = tot * 1e-3 / (double)steps;
            met->exposed_comm_s = comm * 1e-3 / (double)steps;
        } else if (b && sscanf(b, "emulated bubble %lf", &bub) == 1) {
            met->bubble = bub / 100.0;
        }
    }
    fclose(f);
}

/* The last lines of a log, flattened into one line (a failing run's reason). */
static void log_tail(const char *log, char *buf, size_t n)
{
    buf[0] = 0;
    FILE *f = fopen(log, "r");
    if (!f)
        return;
    char lines[3][400] = {{0}};
    char line[400];
    int k = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0])
            sfmt(lines[k++ % 3], sizeof lines[0], "%s", line);
    }
    fclose(f);
    for (int i = k > 3 ? k - 3 : 0; i < k; i++) {
        size_t o = strlen(buf);
        sfmt(buf + o, n - o, "%s%s", o ? " / " : "", lines[i % 3]);
    }
}

/* Runs `mpiexec -n P parity run --backend mpi ...` (P <= mpi_procs, a
 * divisor of the world; each process hosts world / P thread ranks), output
 * into log.  Fixture, steps, seed and layout as the in-process run. */
static par_status run_layout_mpi(par_matrix *m, const par_matrix_cell *c, const par_cell_layout *L, int64_t steps,
                                 const char *dump, const char *save, const char *load, const char *log,
                                 par_cell_metrics *met)
{
    par_layout lay;
    par_status s = cell_layout(m, L, &lay);
    if (s)
        return s;
    int64_t world = L->world ? L->world : size_or_1(L->pp) * size_or_1(L->cp) * size_or_1(L->ep);
    int64_t p = m->mpi_procs > 0 ? m->mpi_procs : 8;
    while (p > 1 && world % p)
        p--;
    if (p > world)
        p = world;
    char a[40][PATH_CAP];
    char *argv[41];
    int n = 0;
#define ARG(...) sfmt(a[n++], sizeof a[0], __VA_ARGS__)
    ARG("%s", m->mpiexec[0] ? m->mpiexec : "mpiexec");
    ARG("-n");
    ARG("%lld", (long long)p);
    ARG("%s", m->self_exe);
    ARG("run");
    ARG("--preset");
    ARG("%s", m->preset);
    ARG("--backend");
    ARG("mpi");
    ARG("--ranks-per-process");
    ARG("%lld", (long long)(world / p));
    ARG("--world-size");
    ARG("%lld", (long long)world);
    ARG("--steps");
    ARG("%lld", (long long)steps);
    ARG("--seed");
    ARG("%llu", (unsigned long long)c->seed);
    if (c->fixture[0]) { /* the fixtures directory through PARITY_FIXTURES_DIR (below) */
        ARG("--fixture");
        ARG("%s", c->fixture);
    }
    ARG("--context-parallel-size");
    ARG("%lld", (long long)lay.cp);
    ARG("--expert-model-parallel-size");
    ARG("%lld", (long long)lay.ep);
    if (lay.pp > 1) {
        ARG("--pipeline-model-parallel-size");
        ARG("%lld", (long long)lay.pp);
        ARG("--pipeline-model-parallel-layout");
        ARG("%s", lay.pp_layout);
        if (L->sched >= 0) {
            ARG("--pipeline-schedule");
            ARG("%s", par_schedule_kind_name((par_sched_kind)L->sched));
        }
    }
    if (L->zero)
        ARG("--use-distributed-optimizer");
    ARG("--topology");
    ARG("reference");
    ARG("--quiet");
    if (dump) {
        ARG("--dump");
        ARG("%s", dump);
    }
    if (save) {
        ARG("--save");
        ARG("%s", save);
    }
    if (load) {
        ARG("--load");
        ARG("%s", load);
    }
#undef ARG
    for (int i = 0; i < n; i++)
        argv[i] = a[i];
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return par_err(PAR_EIO, "matrix: fork for %s: %s", argv[0], strerror(errno));
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        setenv("PARITY_FIXTURES_DIR", m->fixtures_dir, 1);
        execvp(argv[0], argv);
        fprintf(stderr, "matrix: cannot start %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char tail[600];
        log_tail(log, tail, sizeof tail);
        return par_err(PAR_EIO, "matrix: `%s -n %lld parity run --backend mpi` (world %lld) %s %d (log %s): %s",
                       argv[0], (long long)p, (long long)world, WIFEXITED(st) ? "exited" : "killed by signal",
                       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), log, tail);
    }
    metrics_of_log(log, steps, met);
    return PAR_OK;
}

/* Runs `steps` steps of the cell's data under L on the matrix's backend
 * (in process, or under mpiexec with --backend mpi), with the emulated
 * network (reference preset) attached: dump / save / load as `parity run`. */
static par_status run_layout(par_matrix *m, const par_matrix_cell *c, const par_cell_layout *L, int64_t steps,
                             const char *dump, const char *save, const char *load, const char *work_dir,
                             par_cell_metrics *met)
{
    if (!strcmp(m->backend, "mpi")) {
        char log[PATH_CAP];
        sfmt(log, sizeof log, "%s/run-%s.log", work_dir, load ? "resumed" : "first");
        return run_layout_mpi(m, c, L, steps, dump, save, load, log, met);
    }
    if (!m->backend_impl)
        return par_err(PAR_EUNSUPPORTED, "matrix: cell %s needs a backend for its %lld ranks (backend '%s' not "
                       "available)", c->name, (long long)c->ranks, m->backend);
    par_netmodel net;
    par_status s = par_netmodel_preset("reference", &net);
    if (s)
        return s;
    par_run_opts o;
    par_run_opts_init(&o);
    o.cfg = m->cfg;
    o.steps = steps;
    o.seed = c->seed;
    o.fixture = c->fixture[0] ? c->fixture : NULL;
    o.fixtures_dir = m->fixtures_dir;
    o.backend = m->backend_impl;
    if ((s = cell_layout(m, L, &o.layout)))
        return s;
    o.dump_dir = dump;
    o.save_dir = save;
    o.netmodel = &net;
    par_ckpt *ck = NULL;
    if (load && (s = par_ckpt_open(load, &ck)))
        return s;
    o.load = ck;
    par_run_summary sum;
    s = par_run(&o, &sum);
    par_ckpt_close(ck);
    if (s)
        return s;
    metrics_of(&sum, sum.layout.world, steps, met);
    par_run_summary_free(&sum);
    return PAR_OK;
}

/* Layout cells (cp*, ep*, dp*, pp*, ...): `parity run` under c->lay on the
 * cell's data, dumped; the emulated network gives the metrics. */
static par_status prod_layout(par_matrix *m, const par_matrix_cell *c, const char *work_dir, const char *set_dir,
                              const char **cand, par_cell_metrics *met)
{
    (void)cand;
    return run_layout(m, c, &c->lay, c->steps, set_dir, NULL, NULL, work_dir, met);
}

/* Renames "params.K.safetensors" / "step.K.safetensors" to index K + off;
 * 0 when the name is neither. */
static int shifted_name(const char *nm, int64_t off, char *buf, size_t n)
{
    long long k;
    char tail[32];
    if (sscanf(nm, "params.%lld.%31s", &k, tail) == 2 && !strcmp(tail, "safetensors"))
        return sfmt(buf, n, "params.%lld.safetensors", k + (long long)off), 1;
    if (sscanf(nm, "step.%lld.%31s", &k, tail) == 2 && !strcmp(tail, "safetensors"))
        return sfmt(buf, n, "step.%lld.safetensors", k + (long long)off), 1;
    return 0;
}

/* dst = the files of first (params.K with K <= split, step.K with K <
 * split) and of resumed (its step.J and params.J, J >= 1, as split + J),
 * hard-linked, with a manifest of the merged set (first's, over every
 * step).  The resumed run's params.0 (the loaded parameters, written like an
 * initial state: without optimizer state) is not used: the loaded state,
 * moments included, is checked by every later file. */
static par_status merge_sets(const char *first, const char *resumed, int64_t split, const char *dst)
{
    par_manifest a, b;
    par_status s = par_manifest_read(first, &a);
    if (s)
        return s;
    if ((s = par_manifest_read(resumed, &b))) {
        par_manifest_free(&a);
        return s;
    }
    s = mkdir_p(dst);
    for (int i = 0; !s && i < a.nfiles; i++) {
        const char *nm = a.files[i].name;
        long long k = -1;
        char tail[32], from[PATH_CAP], to[PATH_CAP];
        if (!((sscanf(nm, "params.%lld.%31s", &k, tail) == 2 || sscanf(nm, "step.%lld.%31s", &k, tail) == 2) &&
              k <= split))
            continue;
        sfmt(from, sizeof from, "%s/%s", first, nm);
        sfmt(to, sizeof to, "%s/%s", dst, nm);
        if (link(from, to) != 0)
            s = par_err(PAR_EIO, "matrix: cannot link %s to %s: %s", from, to, strerror(errno));
    }
    for (int i = 0; !s && i < b.nfiles; i++) {
        char nn[128], from[PATH_CAP], to[PATH_CAP];
        if (!shifted_name(b.files[i].name, split, nn, sizeof nn) || !strcmp(b.files[i].name, "params.0.safetensors"))
            continue;
        sfmt(from, sizeof from, "%s/%s", resumed, b.files[i].name);
        sfmt(to, sizeof to, "%s/%s", dst, nn);
        if (link(from, to) != 0)
            s = par_err(PAR_EIO, "matrix: cannot link %s to %s: %s", from, to, strerror(errno));
    }
    if (!s) {
        a.steps = split + b.steps;
        s = par_manifest_write(&a, dst); /* lists (and hashes) the merged files */
    }
    par_manifest_free(&a);
    par_manifest_free(&b);
    return s;
}

/* resume / reshard pairs: c->split steps under c->lay saved to a
 * checkpoint, the rest loaded under c->lay2 (the same layout: resume; another
 * one: reshard on load), both dumped; the cell's set is the first run's
 * steps before the checkpoint and the resumed run's after it, compared with
 * the serial reference of all steps. */
static par_status prod_pair(par_matrix *m, const par_matrix_cell *c, const char *work_dir, const char *set_dir,
                            const char **cand, par_cell_metrics *met)
{
    (void)cand;
    if (c->split < 1 || c->split >= c->steps)
        return par_err(PAR_EINVAL, "matrix: cell %s needs 1 <= split (%lld) < steps (%lld)", c->name,
                       (long long)c->split, (long long)c->steps);
    char d1[PATH_CAP], d2[PATH_CAP], ck[PATH_CAP];
    sfmt(d1, sizeof d1, "%s/first", work_dir);
    sfmt(d2, sizeof d2, "%s/resumed", work_dir);
    sfmt(ck, sizeof ck, "%s/ckpt", work_dir);
    par_cell_metrics m1 = *met;
    par_status s = run_layout(m, c, &c->lay, c->split, d1, ck, NULL, work_dir, &m1);
    if (!s)
        s = run_layout(m, c, &c->lay2, c->steps - c->split, d2, NULL, ck, work_dir, met);
    if (!s)
        s = merge_sets(d1, d2, c->split, set_dir);
    return s;
}

/* Copies the golden set src into dst with every F32 tensor widened to F64
 * (exactly), metadata kept plus "widened_from": "F32", and a manifest with
 * the new hashes. */
static par_status widen_set(const char *src, const char *dst)
{
    par_status s = mkdir_p(dst);
    if (s)
        return s;
    DIR *d = opendir(src);
    if (!d)
        return par_err(PAR_EIO, "matrix: cannot read %s: %s", src, strerror(errno));
    struct dirent *de;
    while (!s && (de = readdir(d))) {
        if (!has_suffix(de->d_name, ".safetensors"))
            continue;
        char in[PATH_CAP], outp[PATH_CAP];
        sfmt(in, sizeof in, "%s/%s", src, de->d_name);
        sfmt(outp, sizeof outp, "%s/%s", dst, de->d_name);
        par_st_file *f = NULL;
        s = par_st_read(in, &f);
        if (s)
            break;
        int nt = par_st_count(f);
        par_tensor *wide = par_calloc((size_t)(nt ? nt : 1), sizeof *wide, PAR_TAG_TENSOR);
        par_st_writer *w = NULL;
        if (!wide) {
            s = par_err(PAR_ENOMEM, "matrix: out of memory");
            goto next_file;
        }
        s = par_st_writer_new(&w);
        for (int i = 0; !s && i < nt; i++) {
            const par_tensor *t = par_st_tensor(f, i);
            if (t->dtype != PAR_F32) {
                s = par_st_writer_add(w, par_st_name(f, i), t);
                continue;
            }
            s = par_tensor_alloc(&wide[i], PAR_F64, t->ndim, t->shape, PAR_TAG_TENSOR);
            if (s)
                break;
            int64_t n = par_tensor_numel(t);
            const float *x = t->data;
            double *y = wide[i].data;
            for (int64_t k = 0; k < n; k++)
                y[k] = (double)x[k];
            s = par_st_writer_add(w, par_st_name(f, i), &wide[i]);
        }
        for (int i = 0; !s && i < par_st_meta_count(f); i++)
            s = par_st_writer_meta(w, par_st_meta_key(f, i), par_st_meta_value(f, i));
        if (!s)
            s = par_st_writer_meta(w, "widened_from", "F32");
        if (!s)
            s = par_st_writer_write(w, outp);
    next_file:
        par_st_writer_free(w);
        if (wide)
            for (int i = 0; i < nt; i++)
                par_tensor_free(&wide[i]);
        par_free(wide);
        par_st_close(f);
    }
    closedir(d);
    if (s)
        return s;
    par_manifest man;
    s = par_manifest_read(src, &man);
    if (s)
        return s;
    s = par_manifest_write(&man, dst);
    par_manifest_free(&man);
    return s;
}

/* f32-vs-f64, f32-vs-f64-params: the f32 run (widened to F64 so the
 * comparator, which wants equal dtypes, sees the f32 values exactly),
 * shared by both cells. */
static par_status prod_f32(par_matrix *m, const par_matrix_cell *c, const char *work_dir, const char *set_dir,
                           const char **cand, par_cell_metrics *met)
{
    return par_matrix_serial(m, 32, c->fixture, c->steps, c->seed, cand);
}

/* File selectors of the f32 cells: each step's computation and the init;
 * the parameters after updates. */
static int select_steps_and_init(const char *f) { return has_prefix(f, "step.") || !strcmp(f, "params.0.safetensors"); }
static int select_updated_params(const char *f) { return has_prefix(f, "params.") && strcmp(f, "params.0.safetensors"); }

/* data-file: the reference's batches written to a safetensors file (I32
 * [steps*B, S]) and read back through --data. */
static par_status prod_data_file(par_matrix *m, const par_matrix_cell *c, const char *work_dir, const char *set_dir,
                                 const char **cand, par_cell_metrics *met)
{
    const char *ref;
    par_status s = par_matrix_reference(m, c->fixture, c->steps, c->seed, &ref);
    if (s)
        return s;
    static const char *names[2] = {"input.tokens", "input.segments"};
    par_tensor all[2];
    memset(all, 0, sizeof all);
    int64_t B = 0, S = 0;
    for (int64_t k = 0; !s && k < c->steps; k++) {
        char path[PATH_CAP];
        sfmt(path, sizeof path, "%s/step.%lld.safetensors", ref, (long long)k);
        par_st_file *f = NULL;
        s = par_st_read(path, &f);
        for (int j = 0; !s && j < 2; j++) {
            const par_tensor *t = par_st_find(f, names[j]);
            if (!t || t->dtype != PAR_I32 || t->ndim != 2) {
                s = par_err(PAR_EFORMAT, "matrix: %s has no I32 [B,S] '%s'", path, names[j]);
                break;
            }
            if (k == 0 && j == 0) {
                B = t->shape[0];
                S = t->shape[1];
            }
            if (t->shape[0] != B || t->shape[1] != S) {
                s = par_err(PAR_EMISMATCH, "matrix: %s: '%s' is [%lld,%lld], step 0 had [%lld,%lld]", path, names[j],
                            (long long)t->shape[0], (long long)t->shape[1], (long long)B, (long long)S);
                break;
            }
            if (k == 0) {
                int64_t shape[2] = {c->steps * B, S};
                s = par_tensor_alloc(&all[j], PAR_I32, 2, shape, PAR_TAG_TENSOR);
                if (s)
                    break;
            }
            memcpy((int32_t *)all[j].data + k * B * S, t->data, (size_t)(B * S) * sizeof(int32_t));
        }
        par_st_close(f);
    }
    char data[PATH_CAP];
    sfmt(data, sizeof data, "%s/data.safetensors", work_dir);
    par_st_writer *w = NULL;
    if (!s)
        s = par_st_writer_new(&w);
    for (int j = 0; !s && j < 2; j++)
        s = par_st_writer_add(w, names[j], &all[j]);
    if (!s)
        s = par_st_writer_meta(w, "source", ref);
    if (!s)
        s = par_st_writer_write(w, data);
    par_st_writer_free(w);
    par_tensor_free(&all[0]);
    par_tensor_free(&all[1]);
    if (!s)
        s = par_matrix_golden(m, 64, NULL, data, c->steps, c->seed, set_dir);
    return s;
}

/* The checked-in set could not be read: the cell reports why. */
static par_status prod_unreadable_golden(par_matrix *m, const par_matrix_cell *c, const char *work_dir,
                                         const char *set_dir, const char **cand, par_cell_metrics *met)
{
    for (int i = 0; i < m->ngold; i++)
        if (!strcmp(m->gold[i].dir, c->ref_dir))
            return par_err(PAR_EFORMAT, "checked-in golden set %s: %s", c->ref_dir, m->gold[i].error);
    return par_err(PAR_EINTERNAL, "matrix: no golden entry for %s", c->ref_dir);
}

/* serial-f64's own check: every float tensor finite, and each step's
 * out.loss = loss_main + mtp_lambda loss_mtp + aux_alpha loss_aux. */
static par_status check_sane(par_matrix *m, const par_matrix_cell *c, const char *cand_dir)
{
    for (int64_t k = 0; k <= c->steps; k++) {
        for (int kind = 0; kind < 2; kind++) {
            if (kind == 1 && k == c->steps)
                continue;
            char path[PATH_CAP];
            sfmt(path, sizeof path, "%s/%s.%lld.safetensors", cand_dir, kind ? "step" : "params", (long long)k);
            par_st_file *f = NULL;
            par_status s = par_st_read(path, &f);
            if (s)
                return s;
            for (int i = 0; i < par_st_count(f); i++) {
                const par_tensor *t = par_st_tensor(f, i);
                if (!par_dtype_is_float(t->dtype))
                    continue;
                int64_t n = par_tensor_numel(t);
                for (int64_t j = 0; j < n; j++) {
                    double v = par_tensor_get_f64(t, j);
                    if (!isfinite(v)) {
                        s = par_err(PAR_ECHECK, "%s: '%s' element %lld is %g (every value must be finite)", path,
                                    par_st_name(f, i), (long long)j, v);
                        par_st_close(f);
                        return s;
                    }
                }
            }
            if (kind == 1) {
                static const char *nm[4] = {"out.loss", "out.loss_main", "out.loss_mtp", "out.loss_aux"};
                double v[4];
                for (int q = 0; q < 4; q++) {
                    const par_tensor *t = par_st_find(f, nm[q]);
                    if (!t || par_tensor_numel(t) != 1 || !par_dtype_is_float(t->dtype)) {
                        s = par_err(PAR_ECHECK, "%s: no scalar '%s'", path, nm[q]);
                        par_st_close(f);
                        return s;
                    }
                    v[q] = par_tensor_get_f64(t, 0);
                }
                double sum = v[1] + m->cfg.mtp_lambda * v[2] + m->cfg.aux_alpha * v[3];
                double tol = (par_st_find(f, nm[0])->dtype == PAR_F64 ? 1e-12 : 1e-5) * fmax(1.0, fabs(v[0]));
                if (!(fabs(v[0] - sum) <= tol)) {
                    s = par_err(PAR_ECHECK,
                                "%s: out.loss %.17g != loss_main + %g loss_mtp + %g loss_aux = %.17g (|diff| %.3e > "
                                "%.1e)",
                                path, v[0], m->cfg.mtp_lambda, m->cfg.aux_alpha, sum, fabs(v[0] - sum), tol);
                    par_st_close(f);
                    return s;
                }
            }
            par_st_close(f);
        }
    }
    return PAR_OK;
}

int par_matrix_fixture_count(const par_matrix *m) { return m->nfix; }
const char *par_matrix_fixture(const par_matrix *m, int i) { return (i >= 0 && i < m->nfix) ? m->fixtures[i] : NULL; }
int64_t par_matrix_steps(const par_matrix *m) { return m->steps; }
uint64_t par_matrix_seed(const par_matrix *m) { return m->seed; }

const char *par_matrix_primary_fixture(const par_matrix *m)
{
    char want[80], pre[40];
    fixture_prefix(m->preset, pre, sizeof pre);
    sfmt(want, sizeof want, "%sboundary-mix", pre);
    for (int i = 0; i < m->nfix; i++)
        if (!strcmp(m->fixtures[i], want))
            return m->fixtures[i];
    return m->nfix ? m->fixtures[0] : "";
}

/* v4-mini without --full: the layout cells that matter most within ~5
 * minutes on 2 cores (docs/matrix.md, "Measured"); cp2 and cp4 on the
 * primary fixture only. */
static int mini_default_cell(const char *name)
{
    static const char *const names[] = {"cp2", "cp4", "ep32", "dp4", "dp4-zero1", "pp2-1f1b", "pp2-dualpipev"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(names[i], name))
            return 1;
    return 0;
}

par_status par_matrix_add_builtin_cells(par_matrix *m)
{
    par_matrix_cell c;
    par_status s = PAR_OK;
    /* 1. serial-f64 on every fixture: the reference run, checked; against the
     *    checked-in set where one exists for (preset, fixture). */
    for (int i = 0; !s && i < m->nfix; i++) {
        const char *fx = m->fixtures[i];
        /* v4-mini without --full: only the primary fixture (the others have
         * no checked-in set and no default cell using their reference) */
        if (strcmp(m->preset, "v4-tiny") && !m->full && strcmp(fx, par_matrix_primary_fixture(m)))
            continue;
        par_matrix_cell_init(m, &c, "serial-f64", fx);
        c.produce = prod_reference;
        c.check = check_sane;
        c.ref = PAR_REF_NONE;
        sfmt(c.layout, sizeof c.layout, "serial f64, world 1");
        sfmt(c.note, sizeof c.note,
                 "no checked-in set for %s/%s: the run's own checks (every value finite, loss = main + lambda mtp + "
                 "alpha aux)",
                 m->preset, fx);
        for (int g = 0; g < m->ngold; g++) {
            const golden_entry *ge = &m->gold[g];
            if (strcmp(ge->fixture, fx))
                continue;
            c.ref = PAR_REF_DIR;
            sfmt(c.ref_dir, sizeof c.ref_dir, "%s", ge->dir);
            c.steps = ge->steps;
            c.seed = ge->seed;
            int same = !strcmp(ge->blas_core, m->blas_core);
            c.policy = same ? PAR_POLICY_BITWISE : PAR_POLICY_F64;
            sfmt(c.layout, sizeof c.layout, "serial f64, world 1, vs checked-in");
            sfmt(c.note, sizeof c.note, "vs %s: %s (BLAS core %s, set made on %s)", ge->dir,
                     same ? "bitwise, same BLAS core" : "f64 policy, other BLAS core", m->blas_core,
                     ge->blas_core[0] ? ge->blas_core : "?");
            break;
        }
        s = par_matrix_add(m, &c);
    }
    /* Checked-in sets of this preset whose manifest could not be read. */
    for (int g = 0; !s && g < m->ngold; g++) {
        if (!m->gold[g].error[0] || !strcmp(m->gold[g].error, "skip"))
            continue;
        par_matrix_cell_init(m, &c, "serial-f64", "");
        c.produce = prod_unreadable_golden;
        c.ref = PAR_REF_DIR;
        sfmt(c.ref_dir, sizeof c.ref_dir, "%s", m->gold[g].dir);
        sfmt(c.layout, sizeof c.layout, "checked-in set unreadable");
        sfmt(c.note, sizeof c.note, "%s", m->gold[g].dir);
        s = par_matrix_add(m, &c);
    }
    const char *fx = par_matrix_primary_fixture(m);
    /* 2. repeat-bitwise: the same run twice is bitwise equal (GOLDEN.md). */
    if (!s) {
        par_matrix_cell_init(m, &c, "repeat-bitwise", fx);
        c.produce = prod_repeat;
        c.policy = PAR_POLICY_BITWISE;
        sfmt(c.layout, sizeof c.layout, "serial f64 twice, world 1");
        sfmt(c.note, sizeof c.note, "same layout, backend and precision run twice: bitwise (GOLDEN.md)");
        s = par_matrix_add(m, &c);
    }
    /* 3. f32-vs-f64: the f32 run against the f64 reference under the f32
     *    policy: each step's computation and the init (gating); the
     *    parameters after updates are measured by an informational cell
     *    (docs/matrix.md, "Reading: f32 against f64"). */
    if (!s) {
        par_matrix_cell_init(m, &c, "f32-vs-f64", fx);
        c.produce = prod_f32;
        c.policy = PAR_POLICY_F32;
        c.select = select_steps_and_init;
        sfmt(c.layout, sizeof c.layout, "serial f32 vs f64: step.*, params.0");
        sfmt(c.note, sizeof c.note,
                 "f32 values widened exactly to F64; GOLDEN.md's f32 policy on every step file and params.0 "
                 "(docs/matrix.md)");
        s = par_matrix_add(m, &c);
    }
    if (!s) {
        par_matrix_cell_init(m, &c, "f32-vs-f64-params", fx);
        c.produce = prod_f32;
        c.policy = PAR_POLICY_F32;
        c.select = select_updated_params;
        c.informational = 1;
        sfmt(c.layout, sizeof c.layout, "serial f32 vs f64: params.1..K");
        sfmt(c.note, sizeof c.note,
                 "informational: parameters after AdamW/Muon updates under the f32 policy; AdamW amplifies "
                 "near-zero gradients' rounding (docs/matrix.md)");
        s = par_matrix_add(m, &c);
    }
    /* 4. Layout cells: the parallel driver (`parity run --dump`) against the
     *    serial f64 reference of the same data (docs/matrix.md lists them
     *    and which are behind --full on v4-mini). */
    int mini = strcmp(m->preset, "v4-tiny") != 0;
    int all = !mini || m->full; /* v4-tiny (--quick) runs every layout cell */
#define SKIP_HEAVY(nm) (!all && !mini_default_cell(nm))
    static const char cp_note[] = "f64 policy: CE/aux partial sums and weight gradients of split rows add in rank "
                                  "order; routing, loads and attn selections exactly equal";
    /* 4a. cp2, cp4 on every boundary fixture (S/CP must reach D_window, which
     *     the layout checks).  v4-mini default: cp4 on every fixture, cp2 on
     *     the primary one; --full: cp2 on every fixture too. */
    for (int64_t cp = 2; cp <= 4 && !s; cp *= 2)
        for (int i = 0; !s && i < m->nfix; i++) {
            if (!all && strcmp(m->fixtures[i], fx))
                continue;
            par_matrix_cell_init(m, &c, cp == 2 ? "cp2" : "cp4", m->fixtures[i]);
            c.produce = prod_layout;
            c.lay = (par_cell_layout){.world = cp, .cp = cp, .sched = -1};
            c.ranks = cp;
            c.policy = PAR_POLICY_F64;
            describe_layout(m, &c.lay, c.layout, sizeof c.layout);
            sfmt(c.note, sizeof c.note, "%s", cp_note);
            s = par_matrix_add(m, &c);
        }
    /* 4b. expert parallelism: v4-tiny EP2, EP4, EP8, EP4 x De2; v4-mini EP32,
     *     and with --full EP64 (CP2 folding) and EP128 (CP4 folding) so that
     *     the global batch stays the preset's (Da = N / CP divides B). */
    static const struct {
        const char *name;
        int64_t world, ep, cp;
        int preset_mini; /* 0 tiny, 1 mini default, 2 mini --full */
    } eps[] = {{"ep2", 2, 2, 1, 0},     {"ep4", 4, 4, 1, 0},       {"ep8", 8, 8, 1, 0},
               {"ep4-de2", 8, 4, 1, 0}, {"ep32", 32, 32, 1, 1},    {"ep64-cp2", 64, 64, 2, 2},
               {"ep128-cp4", 128, 128, 4, 2}};
    for (size_t i = 0; i < sizeof eps / sizeof eps[0] && !s; i++) {
        int want = mini ? eps[i].preset_mini == 1 || (eps[i].preset_mini == 2 && m->full) : eps[i].preset_mini == 0;
        if (!want || SKIP_HEAVY(eps[i].name))
            continue;
        par_matrix_cell_init(m, &c, eps[i].name, fx);
        c.produce = prod_layout;
        c.lay = (par_cell_layout){.world = eps[i].world, .ep = eps[i].ep, .cp = eps[i].cp, .sched = -1};
        c.ranks = eps[i].world;
        c.policy = PAR_POLICY_F64;
        describe_layout(m, &c.lay, c.layout, sizeof c.layout);
        sfmt(c.note, sizeof c.note,
             "f64 policy: experts' rows dispatched and combined by all-to-all in a fixed order; expert gradients "
             "reduced over De in rank order; routing and loads exactly equal");
        s = par_matrix_add(m, &c);
    }
    /* 4c. data parallelism with and without ZeRO-1 (the dumps carry the
     *     optimizer state gathered from the shards after every step). */
    static const struct {
        const char *name;
        int64_t world, ep;
        int zero;
    } dps[] = {{"dp2", 2, 1, 0}, {"dp4", 4, 1, 0}, {"dp2-zero1", 2, 1, 1}, {"dp4-zero1", 4, 1, 1}, {"ep4-zero1", 8, 4, 1}};
    for (size_t i = 0; i < sizeof dps / sizeof dps[0] && !s; i++) {
        if (SKIP_HEAVY(dps[i].name))
            continue;
        par_matrix_cell_init(m, &c, dps[i].name, fx);
        c.produce = prod_layout;
        c.lay = (par_cell_layout){.world = dps[i].world, .ep = dps[i].ep, .zero = dps[i].zero, .sched = -1};
        c.ranks = dps[i].world;
        c.policy = PAR_POLICY_F64;
        describe_layout(m, &c.lay, c.layout, sizeof c.layout);
        sfmt(c.note, sizeof c.note,
             "f64 policy: gradients reduced in rank order over DP (x CP) and EDP%s",
             dps[i].zero ? "; optimizer state (opt.*) gathered from the ZeRO shards and compared after every step"
                         : "; optimizer replicated");
        s = par_matrix_add(m, &c);
    }
    /* 4d. pipeline parallelism: PP 2 with every schedule (interleaved and
     *     dualpipev on 4 segments, VPP 2), and PP 4 layouts (v4-mini --full). */
    static const struct {
        par_sched_kind k;
        const char *name;
        int64_t pp;
        int segs;
    } pps[] = {{PAR_SCHED_GPIPE, "pp2-gpipe", 2, 2},        {PAR_SCHED_1F1B, "pp2-1f1b", 2, 2},
               {PAR_SCHED_INTERLEAVED, "pp2-interleaved", 2, 4}, {PAR_SCHED_ZBH1, "pp2-zbh1", 2, 2},
               {PAR_SCHED_DUALPIPE, "pp2-dualpipe", 2, 2},  {PAR_SCHED_DUALPIPEV, "pp2-dualpipev", 2, 4},
               {PAR_SCHED_1F1B, "pp4-1f1b", 4, 4},          {PAR_SCHED_INTERLEAVED, "pp4-interleaved", 4, 8},
               {PAR_SCHED_ZBH1, "pp4-zbh1", 4, 4},          {PAR_SCHED_DUALPIPEV, "pp4-dualpipev", 4, 8}};
    for (size_t i = 0; i < sizeof pps / sizeof pps[0] && !s; i++) {
        if ((pps[i].pp > 2 && !(mini && m->full)) || SKIP_HEAVY(pps[i].name))
            continue;
        par_matrix_cell_init(m, &c, pps[i].name, fx);
        c.produce = prod_layout;
        c.lay = (par_cell_layout){.world = pps[i].pp, .pp = pps[i].pp, .sched = (int)pps[i].k, .segs = pps[i].segs};
        c.ranks = pps[i].pp;
        c.policy = PAR_POLICY_F64;
        describe_layout(m, &c.lay, c.layout, sizeof c.layout);
        sfmt(c.note, sizeof c.note,
             "f64 policy: forward bitwise (whole rows per microbatch); weight gradients accumulate over "
             "microbatches, embed/head over stages");
        s = par_matrix_add(m, &c);
    }
    /* 4e. resume and reshard pairs through a distributed checkpoint: the
     *     first split steps under A saved, the rest loaded under A (resume)
     *     or B (reshard on load); at least 2 steps (v4-mini: 2 steps, its own
     *     2-step reference). */
    static const struct {
        const char *name;
        par_cell_layout a, b;
    } prs[] = {{"resume", {.world = 4, .ep = 2, .zero = 1, .sched = -1}, {.world = 4, .ep = 2, .zero = 1, .sched = -1}},
               {"reshard", {.world = 4, .ep = 2, .zero = 1, .sched = -1}, {.world = 4, .cp = 2, .sched = -1}}};
    for (size_t i = 0; i < sizeof prs / sizeof prs[0] && !s; i++) {
        if (SKIP_HEAVY(prs[i].name))
            continue;
        par_matrix_cell_init(m, &c, prs[i].name, fx);
        c.produce = prod_pair;
        c.lay = prs[i].a;
        c.lay2 = prs[i].b;
        c.steps = c.steps < 2 ? 2 : c.steps;
        c.split = c.steps / 2;
        c.ranks = 4;
        c.policy = PAR_POLICY_F64;
        char a[128], b[128];
        describe_layout(m, &c.lay, a, sizeof a);
        describe_layout(m, &c.lay2, b, sizeof b);
        sfmt(c.layout, sizeof c.layout, "%s -> ckpt@%lld -> %s", a, (long long)c.split, b);
        sfmt(c.note, sizeof c.note,
             "f64 policy: params.0..%lld and step.0..%lld from the first run, every later file from the run that "
             "loaded its checkpoint (%s)",
             (long long)c.split, (long long)c.split - 1, i ? "resharded on load to another layout" : "the same layout");
        s = par_matrix_add(m, &c);
    }
#undef SKIP_HEAVY
    /* 5. data-file: the batches through --data give the same set. */
    if (!s) {
        par_matrix_cell_init(m, &c, "data-file", fx);
        c.produce = prod_data_file;
        c.policy = PAR_POLICY_BITWISE;
        sfmt(c.layout, sizeof c.layout, "serial f64 from --data, world 1");
        sfmt(c.note, sizeof c.note, "the reference's input.* written to a safetensors file and read back: bitwise");
        s = par_matrix_add(m, &c);
    }
    return s;
}

/* ---- running ---------------------------------------------------------- */

static double entry_frac(const par_cmp_entry *e)
{
    if (!strcmp(e->mode, "f64") || !strcmp(e->mode, "f32") || !strcmp(e->mode, "bf16") ||
        !strcmp(e->mode, "override")) {
        if (e->bound > 0)
            return e->diff_norm / e->bound;
        return e->diff_norm > 0 ? INFINITY : 0;
    }
    return NAN;
}

/* 1 if e is worse than w. */
static int entry_worse(const par_cmp_entry *e, const par_cmp_entry *w)
{
    if (!w)
        return 1;
    if (!e->pass != !w->pass)
        return !e->pass;
    double fe = entry_frac(e), fw = entry_frac(w);
    fe = isnan(fe) ? (e->n_diff ? INFINITY : 0) : fe;
    fw = isnan(fw) ? (w->n_diff ? INFINITY : 0) : fw;
    if (fe != fw)
        return fe > fw;
    if (e->n_diff != w->n_diff)
        return e->n_diff > w->n_diff;
    return e->rel_l2 > w->rel_l2;
}

/* Base name of a file label ("dir/step.1.safetensors" -> "step.1"). */
static void short_file(const char *file, char *buf, size_t n)
{
    const char *b = strrchr(file, '/');
    b = b ? b + 1 : file;
    sfmt(buf, n, "%s", b);
    char *dot = strstr(buf, ".safetensors");
    if (dot)
        *dot = 0;
}

static void fill_from_report(par_cell_result *res, const par_compare_report *r)
{
    res->n_entries = par_compare_report_count(r);
    res->n_failed = par_compare_report_failed(r);
    sfmt(res->policy, sizeof res->policy, "%s", par_policy_name(par_compare_report_policy(r)));
    const par_cmp_entry *w = NULL;
    for (int i = 0; i < res->n_entries; i++) {
        const par_cmp_entry *e = par_compare_report_entry(r, i);
        if (entry_worse(e, w))
            w = e;
    }
    res->worst_frac = NAN;
    if (!w)
        return;
    /* A clean comparison with nothing differing has no worst tensor. */
    if (w->pass && w->n_diff == 0 && w->diff_norm == 0)
        return;
    short_file(w->file, res->worst_file, sizeof res->worst_file);
    sfmt(res->worst_tensor, sizeof res->worst_tensor, "%s", w->tensor[0] ? w->tensor : "(file)");
    sfmt(res->worst_mode, sizeof res->worst_mode, "%s", w->mode);
    res->worst_rel_l2 = w->rel_l2;
    res->worst_max_abs = w->max_abs;
    res->worst_frac = entry_frac(w);
    res->worst_ndiff = w->n_diff;
    if (w->pass)
        return;
    int n = sfmt(res->diagnosis, sizeof res->diagnosis, "%d of %d entries fail (%s policy); worst %s %s: %s",
                     res->n_failed, res->n_entries, res->policy, res->worst_file, res->worst_tensor, w->reason);
    if (w->nlist > 0 && n > 0 && (size_t)n < sizeof res->diagnosis) {
        const par_cmp_elem *el = &w->list[0];
        char c[160];
        par_shape_str(w->ndim, el->coord, c, sizeof c);
        if (par_dtype_is_float(w->dtype))
            sfmt(res->diagnosis + n, sizeof res->diagnosis - (size_t)n, "; largest at %s A=%.17g B=%.17g%s%s", c,
                     el->a, el->b, el->where[0] ? " " : "", el->where);
        else
            sfmt(res->diagnosis + n, sizeof res->diagnosis - (size_t)n, "; first at %s A=%lld B=%lld%s%s", c,
                     (long long)el->ia, (long long)el->ib, el->where[0] ? " " : "", el->where);
    }
}

/* dst = the files of golden set src that sel picks, hard-linked (copied
 * when linking fails), with a manifest of their own listing the same
 * sha256 (the comparison verifies them). */
static par_status select_set(const char *src, const char *dst, par_cell_select_fn sel)
{
    char mp[PATH_CAP];
    sfmt(mp, sizeof mp, "%s/%s", src, PAR_MANIFEST_NAME);
    void *text = NULL;
    size_t tlen = 0;
    par_status s = par_file_read(mp, PAR_TAG_IO, &text, &tlen);
    if (s)
        return s;
    par_manifest man;
    s = par_manifest_parse(text, tlen, mp, &man);
    par_free(text);
    if (s)
        return s;
    s = mkdir_p(dst);
    int kept = 0;
    for (int i = 0; i < man.nfiles; i++) {
        const char *nm = man.files[i].name;
        if (s || !sel(nm)) {
            par_free(man.files[i].name);
            continue;
        }
        char a[PATH_CAP], b[PATH_CAP];
        sfmt(a, sizeof a, "%s/%s", src, nm);
        sfmt(b, sizeof b, "%s/%s", dst, nm);
        if (link(a, b) != 0) {
            void *data = NULL;
            size_t len = 0;
            s = par_file_read(a, PAR_TAG_IO, &data, &len);
            if (!s)
                s = par_file_write_atomic(b, data, len);
            par_free(data);
        }
        man.files[kept++] = man.files[i];
    }
    man.nfiles = kept;
    if (!s) {
        cJSON *j = par_manifest_to_json(&man);
        sfmt(mp, sizeof mp, "%s/%s", dst, PAR_MANIFEST_NAME);
        s = j ? par_json_write_file(mp, j) : par_err(PAR_ENOMEM, "matrix: out of memory");
        cJSON_Delete(j);
    }
    par_manifest_free(&man);
    return s;
}

static void cell_label(const par_matrix_cell *c, char *buf, size_t n)
{
    sfmt(buf, n, "%s %s", c->name, c->fixture[0] ? c->fixture : "(generator)");
}

static void run_cell(par_matrix *m, int idx)
{
    const par_matrix_cell *c = &m->cells[idx];
    par_cell_result *res = &m->res[idx];
    memset(res, 0, sizeof *res);
    res->met.step_time_s = res->met.bubble = res->met.exposed_comm_s = NAN;
    res->worst_frac = NAN;
    double t0 = now_s();
    char label[160];
    cell_label(c, label, sizeof label);
    if (m->progress) {
        fprintf(m->progress, "[%2d/%d] %-44s running\n", idx + 1, m->n, label);
        fflush(m->progress);
    }
    sfmt(res->dir, sizeof res->dir, "%s/cells/%02d-%s-%s", m->out_dir, idx + 1, c->name,
             c->fixture[0] ? c->fixture : "generator");
    char set_dir[PATH_CAP + 8];
    sfmt(set_dir, sizeof set_dir, "%s/set", res->dir);
    const char *cand = set_dir, *ref = NULL;
    par_compare_report *r = NULL;
    par_status s = mkdir_p(res->dir);
    if (!s && c->ref == PAR_REF_SERIAL)
        s = par_matrix_reference(m, c->fixture, c->steps, c->seed, &ref);
    else if (c->ref == PAR_REF_DIR)
        ref = c->ref_dir;
    if (!s)
        s = c->produce(m, c, res->dir, set_dir, &cand, &res->met);
    if (s) {
        res->verdict = PAR_CELL_ERROR;
        last_error_line(res->diagnosis, sizeof res->diagnosis, "");
        goto done;
    }
    if (c->check) {
        s = c->check(m, c, cand);
        if (s) {
            res->verdict = s == PAR_ECHECK ? PAR_CELL_FAIL : PAR_CELL_ERROR;
            last_error_line(res->diagnosis, sizeof res->diagnosis, "check: ");
            sfmt(res->policy, sizeof res->policy, "checks");
            goto done;
        }
    }
    if (c->ref == PAR_REF_NONE) {
        sfmt(res->policy, sizeof res->policy, "checks");
        res->verdict = PAR_CELL_PASS;
        goto done;
    }
    char sel_a[PATH_CAP + 8], sel_b[PATH_CAP + 8];
    if (c->select) {
        sfmt(sel_a, sizeof sel_a, "%s/cmp-ref", res->dir);
        sfmt(sel_b, sizeof sel_b, "%s/cmp-cand", res->dir);
        s = select_set(ref, sel_a, c->select);
        if (!s)
            s = select_set(cand, sel_b, c->select);
        if (s) {
            res->verdict = PAR_CELL_ERROR;
            last_error_line(res->diagnosis, sizeof res->diagnosis, "selecting files: ");
            goto done;
        }
        ref = sel_a;
        cand = sel_b;
    }
    par_compare_opts co;
    par_compare_opts_init(&co);
    co.policy = c->policy;
    s = par_compare_paths(ref, cand, &co, &r);
    if (s) {
        res->verdict = PAR_CELL_ERROR;
        last_error_line(res->diagnosis, sizeof res->diagnosis, "compare: ");
        goto done;
    }
    fill_from_report(res, r);
    res->verdict = par_compare_report_ok(r) ? PAR_CELL_PASS : c->informational ? PAR_CELL_WARN : PAR_CELL_FAIL;
    if (res->verdict != PAR_CELL_PASS) {
        sfmt(res->report_json, sizeof res->report_json, "%s/compare.json", res->dir);
        if (par_compare_report_write_json(r, res->report_json) != PAR_OK) {
            par_log(PAR_LOG_WARN, "matrix: %s", par_last_error());
            res->report_json[0] = 0;
        }
        char txt[PATH_CAP];
        sfmt(txt, sizeof txt, "%s/compare.txt", res->dir);
        FILE *f = fopen(txt, "w");
        if (f) {
            par_compare_report_print(r, f, 0);
            fclose(f);
        }
    }

done:
    par_compare_report_free(r);
    res->wall_s = now_s() - t0;
    if (res->verdict == PAR_CELL_FAIL || res->verdict == PAR_CELL_ERROR) {
        /* keep what the failing cell used */
        for (int k = 0; k < m->nref; k++) {
            ref_entry *re = &m->refs[k];
            if (!strcmp(re->fixture, c->fixture) && re->steps == c->steps && re->seed == c->seed)
                re->pinned = 1;
        }
    } else if (!m->keep && res->verdict == PAR_CELL_PASS) {
        remove_quiet(res->dir);
        res->dir[0] = 0;
    }
    if (m->progress) {
        fprintf(m->progress, "[%2d/%d] %-44s %s (%.2f s)\n", idx + 1, m->n, label, par_cell_verdict_name(res->verdict),
                res->wall_s);
        if (res->verdict != PAR_CELL_PASS)
            fprintf(m->progress, "        %s\n", res->diagnosis);
        fflush(m->progress);
    }
}

par_status par_matrix_run(par_matrix *m, int *n_failed)
{
    double t0 = now_s();
    /* Every cell is taken to use the serial reference of its data, steps and
     * seed; a reference is removed after its last such cell. */
    for (int i = 0; i < m->n; i++) {
        const par_matrix_cell *c = &m->cells[i];
        ref_entry *r = ref_get(m, 64, c->fixture, c->steps, c->seed);
        if (!r)
            return par_err(PAR_ENOMEM, "matrix: out of memory");
        r->last_use = i;
    }
    int nf = 0;
    for (int i = 0; i < m->n; i++) {
        run_cell(m, i);
        nf += m->res[i].verdict == PAR_CELL_FAIL || m->res[i].verdict == PAR_CELL_ERROR;
        for (int k = 0; k < m->nref; k++) {
            ref_entry *r = &m->refs[k];
            /* f64 references after their last cell; other runs at the end */
            int last = r->precision == 64 ? r->last_use : m->n - 1;
            if (last == i && r->produced && !r->pinned && !m->keep && !r->removed) {
                remove_quiet(r->dir);
                r->removed = 1;
            }
        }
    }
    if (!m->keep) {
        char d[PATH_CAP + 8];
        sfmt(d, sizeof d, "%s/ref", m->out_dir);
        if (par_path_is_dir(d) && dir_is_empty(d))
            remove_quiet(d);
        sfmt(d, sizeof d, "%s/cells", m->out_dir);
        if (par_path_is_dir(d) && dir_is_empty(d))
            remove_quiet(d);
    }
    m->wall_s = now_s() - t0;
    m->ran = 1;
    *n_failed = nf;
    return PAR_OK;
}

/* ---- accessors -------------------------------------------------------- */

int par_matrix_count(const par_matrix *m) { return m->n; }
const par_matrix_cell *par_matrix_cell_at(const par_matrix *m, int i) { return (i >= 0 && i < m->n) ? &m->cells[i] : NULL; }
const par_cell_result *par_matrix_result(const par_matrix *m, int i) { return (i >= 0 && i < m->n) ? &m->res[i] : NULL; }
const par_config *par_matrix_config(const par_matrix *m) { return &m->cfg; }
const char *par_matrix_out_dir(const par_matrix *m) { return m->out_dir; }

/* ---- output ----------------------------------------------------------- */

static void fmt_num(char *buf, size_t n, double v, const char *fmt)
{
    if (isnan(v))
        sfmt(buf, n, "-");
    else
        sfmt(buf, n, fmt, v);
}

static void fmt_error(const par_cell_result *r, char *buf, size_t n)
{
    if (r->verdict == PAR_CELL_ERROR || !strcmp(r->policy, "checks") || r->verdict == PAR_CELL_PENDING) {
        sfmt(buf, n, "-");
    } else if (!r->worst_tensor[0]) {
        sfmt(buf, n, "%s", !strcmp(r->policy, "bitwise") ? "bitwise equal" : "exact");
    } else if (!isnan(r->worst_frac)) {
        sfmt(buf, n, "rel_l2 %.2e (%.3g x tol)", r->worst_rel_l2, r->worst_frac);
    } else if (r->worst_ndiff > 0) {
        sfmt(buf, n, "%lld differ, max_abs %.2e", (long long)r->worst_ndiff, r->worst_max_abs);
    } else {
        sfmt(buf, n, "missing/shape");
    }
}

static void fmt_worst(const par_cell_result *r, char *buf, size_t n)
{
    if (r->worst_tensor[0])
        sfmt(buf, n, "%s %s", r->worst_file, r->worst_tensor);
    else
        sfmt(buf, n, "-");
}

static void fmt_ref(const par_matrix *m, const par_matrix_cell *c, char *buf, size_t n)
{
    switch (c->ref) {
    case PAR_REF_SERIAL:
        sfmt(buf, n, "serial f64 (%lld steps, seed %llu)", (long long)c->steps, (unsigned long long)c->seed);
        break;
    case PAR_REF_DIR: sfmt(buf, n, "%s", c->ref_dir); break;
    default: sfmt(buf, n, "none (own checks)"); break;
    }
}

void par_matrix_print_cells(const par_matrix *m, FILE *out)
{
    fprintf(out, "%d cells (preset %s, steps %lld, seed %llu):\n", m->n, m->preset, (long long)m->steps,
            (unsigned long long)m->seed);
    for (int i = 0; i < m->n; i++) {
        const par_matrix_cell *c = &m->cells[i];
        char ref[PATH_CAP];
        fmt_ref(m, c, ref, sizeof ref);
        fprintf(out, "  %2d %-16s %-24s %-38s ranks %lld, %lld steps; vs %s, policy %s\n", i + 1, c->name,
                c->fixture[0] ? c->fixture : "(generator)", c->layout, (long long)c->ranks, (long long)c->steps, ref,
                c->ref == PAR_REF_NONE ? "checks" : par_policy_name(c->policy));
    }
}

static int count_verdict(const par_matrix *m, par_cell_verdict v)
{
    int k = 0;
    for (int i = 0; i < m->n; i++)
        k += m->res[i].verdict == v;
    return k;
}

void par_matrix_print_table(const par_matrix *m, FILE *out)
{
    fprintf(out, "\nparity matrix: preset %s, backend %s, %lld steps, seed %llu, BLAS core %s\n", m->preset, m->backend,
            (long long)m->steps, (unsigned long long)m->seed, m->blas_core);
    fprintf(out, "%-18s %-22s %-36s %5s %-6s %-8s %-52s %-28s %9s %6s %8s %8s\n", "cell", "data", "layout", "ranks",
            "result", "policy", "worst tensor", "error", "step(emu)", "bubble", "exp.comm", "wall");
    for (int i = 0; i < m->n; i++) {
        const par_matrix_cell *c = &m->cells[i];
        const par_cell_result *r = &m->res[i];
        char err[96], worst[260], st[32], bu[32], ec[32];
        fmt_error(r, err, sizeof err);
        fmt_worst(r, worst, sizeof worst);
        fmt_num(st, sizeof st, r->met.step_time_s, "%.4f s");
        fmt_num(bu, sizeof bu, r->met.bubble, "%.3f");
        fmt_num(ec, sizeof ec, r->met.exposed_comm_s, "%.4f s");
        fprintf(out, "%-18s %-22s %-36s %5lld %-6s %-8s %-52s %-28s %9s %6s %8s %6.2f s\n", c->name,
                c->fixture[0] ? c->fixture : "(generator)", c->layout, (long long)c->ranks,
                par_cell_verdict_name(r->verdict), r->policy[0] ? r->policy : "-", worst, err, st, bu, ec, r->wall_s);
    }
    int np = count_verdict(m, PAR_CELL_PASS), nw = count_verdict(m, PAR_CELL_WARN);
    fprintf(out, "%d cells: %d passed, %d failed", m->n, np, m->n - np - nw);
    if (nw)
        fprintf(out, ", %d informational over policy", nw);
    fprintf(out, " (%.1f s); results in %s\n", m->wall_s, m->out_dir);
    for (int i = 0; i < m->n; i++) {
        const par_cell_result *r = &m->res[i];
        if (r->verdict == PAR_CELL_PASS)
            continue;
        fprintf(out, "%s %s %s: %s\n", par_cell_verdict_name(r->verdict), m->cells[i].name,
                m->cells[i].fixture[0] ? m->cells[i].fixture : "(generator)", r->diagnosis);
        if (r->report_json[0])
            fprintf(out, "    compare report: %s\n", r->report_json);
        else if (r->dir[0])
            fprintf(out, "    kept: %s\n", r->dir);
    }
}

/* Markdown table cells must not contain '|'. */
static void md_safe(char *s)
{
    for (; *s; s++)
        if (*s == '|')
            *s = '/';
}

static par_status write_md(const par_matrix *m, const char *path)
{
    size_t cap = 4096 + (size_t)m->n * 2048, len = 0;
    char *buf = par_malloc(cap, PAR_TAG_IO);
    if (!buf)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
#define EMIT(...)                                                                                   \
    do {                                                                                            \
        int k_ = sfmt(buf + len, cap - len, __VA_ARGS__);                                       \
        if (k_ > 0)                                                                                 \
            len += (size_t)k_ < cap - len ? (size_t)k_ : cap - len - 1;                             \
    } while (0)
    int np = count_verdict(m, PAR_CELL_PASS), nw = count_verdict(m, PAR_CELL_WARN);
    EMIT("# parity matrix\n\n");
    EMIT("preset `%s`%s, backend `%s`, %lld steps, seed %llu, BLAS core `%s`; results in `%s`.\n\n", m->preset,
         m->quick ? " (--quick)" : "", m->backend, (long long)m->steps, (unsigned long long)m->seed, m->blas_core,
         m->out_dir);
    EMIT("**%d cells: %d passed, %d failed", m->n, np, m->n - np - nw);
    if (nw)
        EMIT(", %d informational over policy", nw);
    EMIT("** (%.1f s)\n\n", m->wall_s);
    EMIT("| cell | data | layout | ranks | result | policy | worst tensor | error | emulated step | bubble | exposed "
         "comm | wall |\n");
    EMIT("|---|---|---|---:|---|---|---|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < m->n; i++) {
        const par_matrix_cell *c = &m->cells[i];
        const par_cell_result *r = &m->res[i];
        char err[96], worst[260], st[32], bu[32], ec[32];
        fmt_error(r, err, sizeof err);
        fmt_worst(r, worst, sizeof worst);
        md_safe(worst);
        fmt_num(st, sizeof st, r->met.step_time_s, "%.4f s");
        fmt_num(bu, sizeof bu, r->met.bubble, "%.3f");
        fmt_num(ec, sizeof ec, r->met.exposed_comm_s, "%.4f s");
        EMIT("| %s | %s | %s | %lld | %s | %s | `%s` | %s | %s | %s | %s | %.2f s |\n", c->name,
             c->fixture[0] ? c->fixture : "(generator)", c->layout, (long long)c->ranks,
             par_cell_verdict_name(r->verdict), r->policy[0] ? r->policy : "-", worst, err, st, bu, ec, r->wall_s);
    }
    if (np < m->n) {
        EMIT("\n## Failing and informational cells\n\n");
        for (int i = 0; i < m->n; i++) {
            const par_cell_result *r = &m->res[i];
            if (r->verdict == PAR_CELL_PASS)
                continue;
            char diag[sizeof r->diagnosis];
            sfmt(diag, sizeof diag, "%s", r->diagnosis);
            EMIT("- **%s %s** (%s): %s", m->cells[i].name, m->cells[i].fixture, par_cell_verdict_name(r->verdict), diag);
            if (r->report_json[0])
                EMIT(" Compare report: `%s`.", r->report_json);
            EMIT("\n");
        }
    }
    EMIT("\n## Cells\n\n");
    for (int i = 0; i < m->n; i++) {
        const par_matrix_cell *c = &m->cells[i];
        char ref[PATH_CAP];
        fmt_ref(m, c, ref, sizeof ref);
        EMIT("- `%s` on `%s`: %lld steps, seed %llu, vs %s; %s\n", c->name, c->fixture[0] ? c->fixture : "(generator)",
             (long long)c->steps, (unsigned long long)c->seed, ref, c->note);
    }
#undef EMIT
    par_status s = par_file_write_atomic(path, buf, len);
    par_free(buf);
    return s;
}

static cJSON *num_or_null(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static par_status write_json(const par_matrix *m, const char *path)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
    int np = count_verdict(m, PAR_CELL_PASS), nw = count_verdict(m, PAR_CELL_WARN);
    cJSON_AddStringToObject(root, "format", "parity-matrix");
    cJSON_AddNumberToObject(root, "version", 1);
    cJSON_AddStringToObject(root, "preset", m->preset);
    cJSON_AddBoolToObject(root, "quick", m->quick);
    cJSON_AddStringToObject(root, "backend", m->backend);
    cJSON_AddNumberToObject(root, "steps", (double)m->steps);
    cJSON_AddNumberToObject(root, "seed", (double)m->seed);
    cJSON_AddStringToObject(root, "blas_core", m->blas_core);
    cJSON_AddStringToObject(root, "out_dir", m->out_dir);
    cJSON_AddNumberToObject(root, "wall_s", m->wall_s);
    cJSON_AddNumberToObject(root, "cells_total", m->n);
    cJSON_AddNumberToObject(root, "passed", np);
    cJSON_AddNumberToObject(root, "failed", m->n - np - nw);
    cJSON_AddNumberToObject(root, "informational_over_policy", nw);
    cJSON_AddBoolToObject(root, "ok", np + nw == m->n && m->ran);
    cJSON *cells = cJSON_AddArrayToObject(root, "cells");
    for (int i = 0; cells && i < m->n; i++) {
        const par_matrix_cell *c = &m->cells[i];
        const par_cell_result *r = &m->res[i];
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddItemToArray(cells, o);
        cJSON_AddStringToObject(o, "cell", c->name);
        cJSON_AddStringToObject(o, "fixture", c->fixture);
        cJSON_AddStringToObject(o, "layout", c->layout);
        cJSON_AddNumberToObject(o, "ranks", (double)c->ranks);
        cJSON_AddNumberToObject(o, "steps", (double)c->steps);
        cJSON_AddNumberToObject(o, "seed", (double)c->seed);
        cJSON_AddStringToObject(o, "reference",
                                c->ref == PAR_REF_SERIAL ? "serial-f64" : c->ref == PAR_REF_DIR ? c->ref_dir : "none");
        cJSON_AddStringToObject(o, "policy", r->policy[0] ? r->policy : "-");
        cJSON_AddStringToObject(o, "note", c->note);
        cJSON_AddStringToObject(o, "result", par_cell_verdict_name(r->verdict));
        cJSON_AddBoolToObject(o, "informational", c->informational);
        cJSON_AddNumberToObject(o, "entries", r->n_entries);
        cJSON_AddNumberToObject(o, "failed_entries", r->n_failed);
        if (r->worst_tensor[0]) {
            cJSON *w = cJSON_AddObjectToObject(o, "worst");
            if (w) {
                cJSON_AddStringToObject(w, "file", r->worst_file);
                cJSON_AddStringToObject(w, "tensor", r->worst_tensor);
                cJSON_AddStringToObject(w, "mode", r->worst_mode);
                cJSON_AddItemToObject(w, "rel_l2", num_or_null(r->worst_rel_l2));
                cJSON_AddItemToObject(w, "max_abs", num_or_null(r->worst_max_abs));
                cJSON_AddItemToObject(w, "fraction_of_tolerance", num_or_null(r->worst_frac));
                cJSON_AddNumberToObject(w, "n_diff", (double)r->worst_ndiff);
            }
        } else {
            cJSON_AddNullToObject(o, "worst");
        }
        cJSON_AddStringToObject(o, "diagnosis", r->diagnosis);
        cJSON_AddItemToObject(o, "emulated_step_s", num_or_null(r->met.step_time_s));
        cJSON_AddItemToObject(o, "bubble", num_or_null(r->met.bubble));
        cJSON_AddItemToObject(o, "exposed_comm_s", num_or_null(r->met.exposed_comm_s));
        cJSON_AddNumberToObject(o, "wall_s", r->wall_s);
        if (r->report_json[0])
            cJSON_AddStringToObject(o, "compare_report", r->report_json);
        else
            cJSON_AddNullToObject(o, "compare_report");
        if (r->dir[0])
            cJSON_AddStringToObject(o, "kept", r->dir);
    }
    par_status s = par_json_write_file(path, root);
    cJSON_Delete(root);
    return s;
}

par_status par_matrix_write_report(const par_matrix *m, const char *path)
{
    if (has_suffix(path, ".json"))
        return write_json(m, path);
    if (has_suffix(path, ".md"))
        return write_md(m, path);
    return par_err(PAR_EINVAL, "matrix: report '%s' must end in .md (Markdown) or .json", path);
}
