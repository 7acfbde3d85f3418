/* matrix/matrix.c - the conformance matrix: construction, cells from
 * rows, references (see matrix/matrix.h and docs/matrix.md). */
#include "kernels/recipe.h"
#include "matrix/matrix-impl.h"

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

#include "core/alloc.h"
#include "core/datadir.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/sha256.h"
#include "model/facade.h"
#include "model/goldenset.h"
#include "parallel/plan/memcheck.h"

/* ---- small helpers ---------------------------------------------------- */

/* snprintf without GCC's truncation warnings: names and paths here are cut
 * to their buffers on purpose (they are labels; paths are bounded by
 * PAR_MX_PATH and a cut one fails to open with a message). */
int par__matrix_fmt(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf, n, fmt, ap);
    va_end(ap);
    return k;
}

double par__matrix_now(void)
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

par_status par__matrix_mkdir_p(const char *path)
{
    char buf[PAR_MX_PATH];
    if (par__matrix_fmt(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
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

int par__matrix_dir_is_empty(const char *dir)
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

void par__matrix_remove_quiet(const char *path)
{
    if (par_remove_tree(path) != PAR_OK)
        par_log(PAR_LOG_WARN, "matrix: could not remove %s: %s", path, par_last_error());
}

void par__matrix_last_error(char *buf, size_t n, const char *prefix)
{
    par__matrix_fmt(buf, n, "%s%s", prefix ? prefix : "", par_last_error());
    for (char *p = buf; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

/* ---- options, construction -------------------------------------------- */

void par_matrix_opts_init(par_matrix_opts *o)
{
    memset(o, 0, sizeof *o);
    o->preset = "v4-tiny";
    o->tier = PAR_CELL_TIER_DEFAULT;
    o->backend = "threads";
    o->seed = 1234;
    o->progress = stderr;
}

static int cmp_str(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

/* The fixture name prefix of a preset: "v4-tiny" -> "tiny-". */
static void fixture_prefix(const char *preset, char *buf, size_t n)
{
    const char *p = has_prefix(preset, "v4-") ? preset + 3 : preset;
    par__matrix_fmt(buf, n, "%s-", p);
}

static par_status resolve_fixtures_dir(par_matrix *m, const char *given)
{
    const char *env = getenv("PARITY_FIXTURES_DIR"), *root = getenv("PARITY_SOURCE_ROOT");
    if (given)
        par__matrix_fmt(m->fixtures_dir, sizeof m->fixtures_dir, "%s", given);
    else if (env && *env)
        par__matrix_fmt(m->fixtures_dir, sizeof m->fixtures_dir, "%s", env);
    else if (par_data_dir("fixtures", m->fixtures_dir, sizeof m->fixtures_dir) != PAR_OK) /* core/datadir.h */
        par__matrix_fmt(m->fixtures_dir, sizeof m->fixtures_dir, "%s/fixtures", root && *root ? root : ".");
    if (!par_path_is_dir(m->fixtures_dir))
        return par_err(PAR_ENOTFOUND,
                       "matrix: fixtures directory '%s' not found (run from the repository root, or give "
                       "--fixtures-dir / PARITY_SOURCE_ROOT)",
                       m->fixtures_dir);
    return PAR_OK;
}

/* Every fixture NAME.json of the directory into m->fixtures (sorted). */
static par_status read_fixture_names(par_matrix *m)
{
    DIR *d = opendir(m->fixtures_dir);
    if (!d)
        return par_err(PAR_EIO, "matrix: cannot read %s: %s", m->fixtures_dir, strerror(errno));
    struct dirent *de;
    m->nfix = 0;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        size_t len = strlen(nm);
        if (nm[0] == '.' || !has_suffix(nm, ".json") || len - 5 >= sizeof m->fixtures[0])
            continue;
        if (m->nfix == PAR_MX_MAX_FIXTURES) {
            closedir(d);
            return par_err(PAR_ERANGE, "matrix: more than %d fixtures in %s", PAR_MX_MAX_FIXTURES, m->fixtures_dir);
        }
        memcpy(m->fixtures[m->nfix], nm, len - 5);
        m->fixtures[m->nfix][len - 5] = 0;
        m->nfix++;
    }
    closedir(d);
    qsort(m->fixtures, (size_t)m->nfix, sizeof m->fixtures[0], cmp_str);
    return PAR_OK;
}

static int fixture_index(const par_matrix *m, const char *name)
{
    for (int i = 0; i < m->nfix; i++)
        if (!strcmp(m->fixtures[i], name))
            return i;
    return -1;
}

/* Keeps only the fixtures --fixture names (each must exist). */
static par_status select_fixtures(par_matrix *m, const par_matrix_opts *o)
{
    if (o->n_only_fixtures <= 0)
        return PAR_OK;
    char keep[PAR_MX_MAX_FIXTURES][64];
    int nk = 0;
    for (int i = 0; i < o->n_only_fixtures; i++) {
        const char *want = o->only_fixtures[i];
        if (fixture_index(m, want) < 0) {
            char pre[40] = "";
            if (m->preset[0])
                fixture_prefix(m->preset, pre, sizeof pre);
            return par_err(PAR_ENOTFOUND, "matrix: fixture '%s' is not one of the %s fixtures in %s (%s*.json)",
                           want, m->preset[0] ? m->preset : "", m->fixtures_dir, pre);
        }
        int dup = 0;
        for (int j = 0; j < nk; j++)
            dup |= !strcmp(keep[j], want);
        if (!dup)
            par__matrix_fmt(keep[nk++], sizeof keep[0], "%s", want);
    }
    qsort(keep, (size_t)nk, sizeof keep[0], cmp_str);
    memcpy(m->fixtures, keep, sizeof keep[0] * (size_t)nk);
    m->nfix = nk;
    return PAR_OK;
}

/* Reads one candidate golden directory's manifest into g. */
static void read_golden(par__matrix_golden *g)
{
    char *mp = par_path_join(g->dir, PAR_MANIFEST_NAME);
    cJSON *man = NULL;
    par_status s = mp ? par_json_read_file(mp, &man) : par_err(PAR_ENOMEM, "matrix: out of memory");
    par_free(mp);
    if (s) {
        par__matrix_last_error(g->error, sizeof g->error, "");
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
        par__matrix_fmt(g->error, sizeof g->error, "skip");
    } else {
        par__matrix_fmt(g->fixture, sizeof g->fixture, "%s", fx);
        g->steps = steps;
        g->seed = (uint64_t)seed;
        par__matrix_fmt(g->blas_core, sizeof g->blas_core, "%s", core ? core : "");
    }
    cJSON_Delete(man);
}

/* The preset a golden directory name belongs to ("v4-tiny", "v4-tiny-x"). */
static int golden_preset(const char *name, char *buf, size_t n)
{
    for (const char *const *p = par_config_preset_names(); *p; p++) {
        size_t pl = strlen(*p);
        if (!strncmp(name, *p, pl) && (!name[pl] || name[pl] == '-'))
            return par__matrix_fmt(buf, n, "%s", *p), 1;
    }
    return 0;
}

static par_status add_golden(par_matrix *m, const char *name)
{
    char dir[PAR_MX_PATH], preset[16];
    par__matrix_fmt(dir, sizeof dir, "%s/%s", m->golden_root, name);
    if (!golden_preset(name, preset, sizeof preset) || !par_path_is_dir(dir))
        return PAR_OK;
    par__matrix_golden *ng = par_realloc(m->gold, sizeof *ng * (size_t)(m->ngold + 1), PAR_TAG_MISC);
    if (!ng)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
    m->gold = ng;
    par__matrix_golden *g = &m->gold[m->ngold++];
    memset(g, 0, sizeof *g);
    par__matrix_fmt(g->dir, sizeof g->dir, "%s", dir);
    par__matrix_fmt(g->preset, sizeof g->preset, "%s", preset);
    read_golden(g);
    return PAR_OK;
}

static par_status list_goldens(par_matrix *m, const char *given)
{
    const char *root = getenv("PARITY_SOURCE_ROOT");
    if (given)
        par__matrix_fmt(m->golden_root, sizeof m->golden_root, "%s", given);
    else if (par_data_dir("golden", m->golden_root, sizeof m->golden_root) != PAR_OK) /* core/datadir.h */
        par__matrix_fmt(m->golden_root, sizeof m->golden_root, "%s/golden", root && *root ? root : ".");
    if (!par_path_is_dir(m->golden_root)) {
        if (given)
            return par_err(PAR_ENOTFOUND, "matrix: golden directory '%s' not found", given);
        return PAR_OK; /* no checked-in sets: serial cells run their checks only */
    }
    DIR *d = opendir(m->golden_root);
    if (!d)
        return par_err(PAR_EIO, "matrix: cannot read %s: %s", m->golden_root, strerror(errno));
    char names[PAR_MX_MAX_FIXTURES][128];
    int nn = 0;
    struct dirent *de;
    while ((de = readdir(d)) && nn < PAR_MX_MAX_FIXTURES)
        if (de->d_name[0] != '.' && strlen(de->d_name) < sizeof names[0])
            par__matrix_fmt(names[nn++], sizeof names[0], "%s", de->d_name);
    closedir(d);
    qsort(names, (size_t)nn, sizeof names[0], cmp_str);
    par_status s = PAR_OK;
    for (int i = 0; !s && i < nn; i++)
        s = add_golden(m, names[i]);
    return s;
}

/* Chooses the results directory and checks it may be used (new, empty,
 * or an earlier matrix's); nothing is written before par_matrix_run. */
static par_status choose_out_dir(par_matrix *m, const char *given)
{
    if (given) {
        par__matrix_fmt(m->out_dir, sizeof m->out_dir, "%s", given);
    } else {
        char stamp[32];
        time_t t = time(NULL);
        struct tm tmv;
        localtime_r(&t, &tmv);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tmv);
        par__matrix_fmt(m->out_dir, sizeof m->out_dir, "out/matrix-%s", stamp);
        for (int k = 2; par_path_exists(m->out_dir) && k < 100; k++)
            par__matrix_fmt(m->out_dir, sizeof m->out_dir, "out/matrix-%s-%d", stamp, k);
    }
    char marker[PAR_MX_PATH + 32];
    par__matrix_fmt(marker, sizeof marker, "%s/%s", m->out_dir, PAR_MX_MARKER);
    if (!par_path_exists(m->out_dir) || par_path_exists(marker))
        return PAR_OK;
    if (!par_path_is_dir(m->out_dir))
        return par_err(PAR_EINVAL, "matrix: --out %s exists and is not a directory", m->out_dir);
    if (!par__matrix_dir_is_empty(m->out_dir))
        return par_err(PAR_EINVAL,
                       "matrix: --out %s exists, is not empty and is not an earlier matrix's results directory (no "
                       "%s in it); give a new or empty directory",
                       m->out_dir, PAR_MX_MARKER);
    return PAR_OK;
}

par_status par__matrix_prepare_out_dir(par_matrix *m)
{
    char marker[PAR_MX_PATH + 32];
    par__matrix_fmt(marker, sizeof marker, "%s/%s", m->out_dir, PAR_MX_MARKER);
    if (par_path_exists(marker)) { /* an earlier matrix's: replaced */
        par_status s = par_remove_tree(m->out_dir);
        if (s)
            return s;
    }
    par_status s = par__matrix_mkdir_p(m->out_dir);
    if (s)
        return s;
    static const char text[] = "results of `parity matrix`; a later matrix with the same --out replaces this directory\n";
    return par_file_write_atomic(marker, text, sizeof text - 1);
}

static par_status copy_only_cells(par_matrix *m, const par_matrix_opts *o)
{
    if (o->n_only_cells <= 0)
        return PAR_OK;
    m->only_cells = par_calloc((size_t)o->n_only_cells, sizeof *m->only_cells, PAR_TAG_MISC);
    if (!m->only_cells)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
    for (int i = 0; i < o->n_only_cells; i++) {
        m->only_cells[i] = par_strdup(o->only_cells[i], PAR_TAG_MISC);
        if (!m->only_cells[i])
            return par_err(PAR_ENOMEM, "matrix: out of memory");
        m->n_only_cells = i + 1;
    }
    return PAR_OK;
}

par_status par_matrix_new(const par_matrix_opts *o, par_matrix **out)
{
    if (!o || !o->backend)
        return par_err(PAR_EINVAL, "matrix: options need a backend");
    if (o->steps < 0)
        return par_err(PAR_EINVAL, "matrix: steps must be >= 1 (got %lld)", (long long)o->steps);
    par_matrix *m = par_calloc(1, sizeof *m, PAR_TAG_MISC);
    if (!m)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
    m->o = *o;
    m->o.only_cells = NULL;
    m->o.only_fixtures = NULL;
    m->o.fixtures_dir = m->o.golden_root = m->o.out_dir = NULL;
    par__matrix_fmt(m->preset, sizeof m->preset, "%s", o->preset ? o->preset : "");
    par__matrix_fmt(m->backend, sizeof m->backend, "%s", o->backend);
    par__matrix_fmt(m->blas_core, sizeof m->blas_core, "%s", par_blas_core_name());
    par_config probe;
    par_status s = m->preset[0] ? par_config_preset(&probe, m->preset) : PAR_OK;
    if (!s)
        s = copy_only_cells(m, o);
    if (!s)
        s = resolve_fixtures_dir(m, o->fixtures_dir);
    if (!s)
        s = read_fixture_names(m);
    if (!s)
        s = select_fixtures(m, o);
    if (!s)
        s = list_goldens(m, o->golden_root);
    if (!s)
        s = par__matrix_pins_load(m);
    if (!s && !o->no_out)
        s = choose_out_dir(m, o->out_dir);
    if (s) {
        par_matrix_free(m);
        return s;
    }
    *out = m;
    return PAR_OK;
}

par_status par__matrix_pins_load(par_matrix *m)
{
    const char *env = getenv("PARITY_EMULATED_PINS");
    if (env && !strcmp(env, "none"))
        return PAR_OK;
    if (env && env[0])
        par__matrix_fmt(m->pins_path, sizeof m->pins_path, "%s", env);
    else
        par__matrix_fmt(m->pins_path, sizeof m->pins_path, "%s/emulated-clock.json", m->golden_root);
    if (!par_path_exists(m->pins_path)) {
        m->pins_path[0] = 0;
        return PAR_OK; /* no pins: the emulated figures are reported, not checked */
    }
    cJSON *doc = NULL;
    par_status s = par_json_read_file(m->pins_path, &doc);
    if (s)
        return par_err(s, "matrix: emulated-clock pins: %s", par_last_error());
    const char *fmt = par_json_str(doc, "format");
    if (!fmt || strcmp(fmt, "parity-emulated-pins") || !cJSON_IsObject(par_json_obj(doc, "cells"))) {
        cJSON_Delete(doc);
        return par_err(PAR_EFORMAT, "matrix: %s: not a parity-emulated-pins file (\"format\", \"cells\")",
                       m->pins_path);
    }
    m->pins = doc;
    return PAR_OK;
}

void par_matrix_free(par_matrix *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_only_cells; i++)
        par_free(m->only_cells[i]);
    for (int i = 0; i < m->n; i++) {
        cJSON_Delete(m->res[i].run);
        cJSON_Delete(m->res[i].ref_run);
    }
    cJSON_Delete(m->pins);
    cJSON_Delete(m->baseline_old);
    cJSON_Delete(m->baseline_diff);
    par_free(m->only_cells);
    par_free(m->gold);
    par_free(m->cells);
    par_free(m->res);
    par_free(m->refs);
    par_free(m);
}

int par_matrix_count(const par_matrix *m) { return m->n; }
const char *par_matrix_out_dir(const par_matrix *m) { return m->out_dir; }

/* ---- cells from rows -------------------------------------------------- */

/* Whether the options select a row: by name (any tier), else by tier; by
 * preset when the matrix has one. */
static int row_selected(const par_matrix *m, const par_cell_spec *r)
{
    if (m->preset[0] && strcmp(m->preset, r->preset))
        return 0;
    if (m->n_only_cells > 0) {
        for (int i = 0; i < m->n_only_cells; i++)
            if (!strcmp(m->only_cells[i], r->name))
                return 1;
        return 0;
    }
    return r->tier <= m->o.tier;
}

/* The preset's primary fixture among the selected ones: <p>-boundary-mix,
 * else the first; "" when none is selected. */
static const char *primary_fixture(const par_matrix *m, const char *preset)
{
    char want[80], pre[40];
    fixture_prefix(preset, pre, sizeof pre);
    par__matrix_fmt(want, sizeof want, "%sboundary-mix", pre);
    const char *first = "";
    for (int i = 0; i < m->nfix; i++) {
        if (!strcmp(m->fixtures[i], want))
            return m->fixtures[i];
        if (!first[0] && has_prefix(m->fixtures[i], pre))
            first = m->fixtures[i];
    }
    return first;
}

/* "preset;set1;set2;gbs=N": the cells sharing it share references. */
static void config_key(const par_cell_spec *r, char *buf, size_t n)
{
    size_t o = (size_t)par__matrix_fmt(buf, n, "%s", r->preset);
    for (int i = 0; i < PAR_CELL_MAX_SETS && r->sets[i][0] && o < n; i++)
        o += (size_t)par__matrix_fmt(buf + o, n - o, ";%s", r->sets[i]);
    if (r->layout.global_batch_size > 0 && o < n)
        par__matrix_fmt(buf + o, n - o, ";global_batch_size=%lld", (long long)r->layout.global_batch_size);
}

static par_status resolve_layout(const par__matrix_cell *c, const par_cell_layout *cl, par_layout *l)
{
    return par_cell_layout_resolve(cl, &c->cfg, l);
}

/* One line describing a cell layout ("EP=4 De=2 ZeRO-1 (world 8)", ...). */
static void describe_layout(const par__matrix_cell *c, const par_cell_layout *cl, char *buf, size_t n)
{
    par_layout l;
    buf[0] = 0;
    if (resolve_layout(c, cl, &l) != PAR_OK)
        return;
    size_t o = 0;
#define ADD(...) (o += (o < n ? (size_t)par__matrix_fmt(buf + o, n - o, __VA_ARGS__) : 0))
    if (l.pp > 1) {
        char str[256];
        par_pplayout_format(&l.pipe, str, (int)sizeof str);
        ADD("PP=%lld %s '%s' ", (long long)l.pp, l.schedule, str);
        if (cl->micro_batch_size > 1)
            ADD("mbs=%lld ", (long long)cl->micro_batch_size);
    }
    if (l.tp > 1)
        ADD("TP=%lld%s ", (long long)l.tp, l.sequence_parallel ? "+SP" : "");
    if (l.cp > 1)
        ADD("CP=%lld ", (long long)l.cp);
    if (l.da > 1)
        ADD("DP=%lld ", (long long)l.da);
    if (l.ep > 1)
        ADD("EP=%lld ", (long long)l.ep);
    if (l.etp > 1)
        ADD("ETP=%lld ", (long long)l.etp);
    if (l.ep > 1 && l.de > 1)
        ADD("De=%lld ", (long long)l.de);
    if (l.distributed_optimizer)
        ADD("ZeRO-1 ");
    if (!strcmp(cl->moe_dispatch, "hierarchical"))
        ADD("hier/%lld-rank nodes ", (long long)(cl->gpus_per_node ? cl->gpus_per_node : 8));
    if (cl->global_batch_size > 0)
        ADD("B=%lld ", (long long)cl->global_batch_size);
    ADD("(world %lld)", (long long)l.world);
#undef ADD
}

/* The checked-in set of (preset, fixture), or NULL. */
static const par__matrix_golden *checked_in(const par_matrix *m, const char *preset, const char *fixture)
{
    for (int g = 0; g < m->ngold; g++)
        if (!strcmp(m->gold[g].preset, preset) && m->gold[g].fixture[0] && !strcmp(m->gold[g].fixture, fixture))
            return &m->gold[g];
    return NULL;
}

/* golden: against the checked-in set where one exists (its steps and
 * seed; bitwise on the same BLAS core), else the run's own checks. */
static void golden_cell(const par_matrix *m, par__matrix_cell *c)
{
    const par__matrix_golden *g = c->fixture[0] && !strcmp(c->cfgkey, c->row.preset)
                                 ? checked_in(m, c->row.preset, c->fixture)
                                 : NULL;
    c->ref = PAR_REF_NONE;
    par__matrix_fmt(c->layout, sizeof c->layout, "serial f64, world 1");
    par__matrix_fmt(c->note, sizeof c->note,
               "no checked-in set for %s/%s: the run's own checks (every value finite, loss = main + lambda mtp + "
               "alpha aux)",
               c->row.preset, c->data_label);
    if (!g)
        return;
    const int64_t rb = m->o.rows_per_block;
    int blocked = rb > 0 && rb < c->cfg.global_batch_size; /* another summation order than the set's */
    /* blas_core is information only: the GEMM and libm of parity's own give
     * the same bits on every CPU (issue 29) */
    int same = !blocked;
    c->ref = PAR_REF_DIR;
    par__matrix_fmt(c->ref_dir, sizeof c->ref_dir, "%s", g->dir);
    c->steps = g->steps;
    c->seed = g->seed;
    c->policy = same ? PAR_POLICY_BITWISE : PAR_POLICY_F64;
    par__matrix_fmt(c->layout, sizeof c->layout, "serial f64, world 1, vs checked-in");
    par__matrix_fmt(c->note, sizeof c->note, "vs %s: %s (BLAS core %s, set made on %s)", g->dir,
                    same ? "bitwise" : "f64 policy, row-blocked golden", m->blas_core,
                    g->blas_core[0] ? g->blas_core : "?");
}

/* Reference, policy, layout line and ranks by kind. */
static par_status kind_fields(const par_matrix *m, par__matrix_cell *c)
{
    const par_cell_spec *r = &c->row;
    int prec = r->precision ? r->precision : 64;
    c->ref = PAR_REF_SERIAL;
    c->ranks = 1;
    c->policy = r->policy ? r->policy : prec == 32 ? PAR_POLICY_F32 : PAR_POLICY_F64;
    switch (r->kind) {
    case PAR_KIND_GOLDEN: golden_cell(m, c); break;
    case PAR_KIND_REPEAT:
        c->policy = r->policy ? r->policy : r->rows_per_block ? PAR_POLICY_F64 : PAR_POLICY_BITWISE;
        if (r->rows_per_block)
            par__matrix_fmt(c->layout, sizeof c->layout, "serial f64 in row blocks of %lld vs one shot, world 1",
                            (long long)r->rows_per_block);
        else
            par__matrix_fmt(c->layout, sizeof c->layout, "serial f64 twice, world 1");
        break;
    case PAR_KIND_SERIAL:
        par__matrix_fmt(c->layout, sizeof c->layout, "serial f%d vs f64: %s", prec,
                   r->files == PAR_FILES_STEPS_AND_INIT ? "step.*, params.0"
                   : r->files == PAR_FILES_UPDATED      ? "params.1..K"
                                                        : "every file");
        break;
    case PAR_KIND_DATA_FILE:
        c->policy = r->policy ? r->policy : PAR_POLICY_BITWISE;
        par__matrix_fmt(c->layout, sizeof c->layout, "serial f64 from --data, world 1");
        break;
    default: {
        par_layout l;
        par_status s = resolve_layout(c, &r->layout, &l);
        if (s)
            return s;
        c->ranks = l.world;
        char a[200], b[200];
        describe_layout(c, &r->layout, a, sizeof a);
        if (r->kind == PAR_KIND_RESUME && !par_cell_layout_empty(&r->chain_layout)) {
            char d[200];
            describe_layout(c, &r->load_layout, b, sizeof b);
            describe_layout(c, &r->chain_layout, d, sizeof d);
            par__matrix_fmt(c->layout, sizeof c->layout, "%s -> ckpt@%lld -> %s -> ckpt@%lld -> %s", a, (long long)c->split,
                       b, (long long)(c->split + (c->steps - c->split) / 2), d);
        } else if (r->kind == PAR_KIND_RESUME) {
            describe_layout(c, &r->load_layout, b, sizeof b);
            par__matrix_fmt(c->layout, sizeof c->layout, "%s -> ckpt@%lld -> %s", a, (long long)c->split, b);
        } else if (r->kind == PAR_KIND_CKPT_RESHARD) {
            describe_layout(c, &r->load_layout, b, sizeof b);
            par__matrix_fmt(c->layout, sizeof c->layout, "%s -> ckpt@%lld resharded -> %s", a, (long long)c->steps, b);
            c->ref = PAR_REF_NONE;
        } else {
            par__matrix_fmt(c->layout, sizeof c->layout, "%s%s", prec == 32 ? "f32 " : "", a);
        }
        for (int i = 0; i < PAR_CELL_MAX_SETS && r->sets[i][0]; i++) {
            size_t o = strlen(c->layout);
            par__matrix_fmt(c->layout + o, sizeof c->layout - o, " %s", r->sets[i]);
        }
        if (r->backend[0] && !m->o.runner) { /* the cell's own backend (cells.h) */
            size_t o = strlen(c->layout);
            par__matrix_fmt(c->layout + o, sizeof c->layout - o, " on %s", r->backend);
        }
        if (r->vs_backend[0] && r->kind == PAR_KIND_LAYOUT) { /* the same layout on another backend */
            size_t o = strlen(c->layout);
            par__matrix_fmt(c->layout + o, sizeof c->layout - o, " vs %s", r->vs_backend);
            c->ref = PAR_REF_BACKEND;
            c->policy = r->policy ? r->policy : PAR_POLICY_BITWISE;
        }
    }
    }
    return PAR_OK;
}

static int64_t default_steps(const par_matrix *m, const char *preset)
{
    if (m->o.steps > 0)
        return m->o.steps;
    return !strcmp(preset, "v4-tiny") ? 3 : 1;
}

static int same_cell(const par__matrix_cell *a, const par__matrix_cell *b)
{
    return !strcmp(a->row.name, b->row.name) && !strcmp(a->row.preset, b->row.preset) &&
           !strcmp(a->fixture, b->fixture) && !strcmp(a->data_path, b->data_path) && a->seed == b->seed;
}

static par_status append_cell(par_matrix *m, const par__matrix_cell *c)
{
    for (int i = 0; i < m->n; i++)
        if (same_cell(&m->cells[i], c))
            return PAR_OK; /* a row of a wider tier listed it already */
    if (m->n == m->cap) {
        int nc = m->cap ? 2 * m->cap : 32;
        par__matrix_cell *cells = par_realloc(m->cells, sizeof *cells * (size_t)nc, PAR_TAG_MISC);
        if (!cells)
            return par_err(PAR_ENOMEM, "matrix: out of memory");
        m->cells = cells;
        par__matrix_result *res = par_realloc(m->res, sizeof *res * (size_t)nc, PAR_TAG_MISC);
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

/* The cell of row r on data (fixture name, "" + data_path, or "" for the
 * generator). */
static par_status add_cell(par_matrix *m, const par_cell_spec *r, const par_config *cfg, const char *fixture,
                           const char *data_path)
{
    par__matrix_cell c;
    memset(&c, 0, sizeof c);
    c.row = *r;
    c.cfg = *cfg;
    config_key(r, c.cfgkey, sizeof c.cfgkey);
    par__matrix_fmt(c.fixture, sizeof c.fixture, "%s", fixture);
    par__matrix_fmt(c.data_path, sizeof c.data_path, "%s", data_path);
    const char *base = strrchr(data_path, '/');
    par__matrix_fmt(c.data_label, sizeof c.data_label, "%s", fixture[0] ? fixture : data_path[0] ? (base ? base + 1 : data_path)
                                                                                              : "(generator)");
    c.steps = r->steps ? r->steps : default_steps(m, r->preset);
    if (r->kind == PAR_KIND_RESUME && c.steps < 2)
        c.steps = 2;
    c.split = r->split ? r->split : c.steps / 2;
    if (r->kind == PAR_KIND_RESUME && !par_cell_layout_empty(&r->chain_layout) && c.steps - c.split < 2)
        return par_err(PAR_EINVAL, "cell '%s': a chain needs two steps after split (%lld of %lld)", r->name,
                       (long long)c.split, (long long)c.steps);
    if (r->kind == PAR_KIND_RESUME && (c.split < 1 || c.split >= c.steps))
        return par_err(PAR_EINVAL, "cell '%s': a resume cell needs 1 <= split (%lld) < steps (%lld)", r->name,
                       (long long)c.split, (long long)c.steps);
    c.seed = r->has_seed ? (uint64_t)r->seed : m->o.seed;
    par__matrix_fmt(c.note, sizeof c.note, "%s", r->note);
    par_status s = kind_fields(m, &c);
    if (s) {
        char last[600];
        par__matrix_fmt(last, sizeof last, "%s", par_last_error());
        return par_err(s, "cell '%s': \"layout\": %s", r->name, last);
    }
    if (m->o.bitwise && (r->kind == PAR_KIND_LAYOUT || r->kind == PAR_KIND_RESUME ||
                         (r->kind == PAR_KIND_REPEAT && r->rows_per_block))) {
        /* the bitwise mode: the cell and its reference (a key of their own); a row-blocked
         * golden then equals the one-shot golden bit for bit */
        c.cfg.bitwise = 1;
        c.policy = PAR_POLICY_BITWISE;
        size_t o = strlen(c.cfgkey);
        par__matrix_fmt(c.cfgkey + o, sizeof c.cfgkey - o, ";bitwise");
    }
    if (m->o.recipe && (r->kind == PAR_KIND_LAYOUT || r->kind == PAR_KIND_RESUME)) {
        c.cfg.recipe = m->o.recipe; /* the cell and its reference: a key of their own */
        size_t o = strlen(c.cfgkey);
        par__matrix_fmt(c.cfgkey + o, sizeof c.cfgkey - o, ";recipe=%s", par_recipe_name((par_recipe)m->o.recipe));
    }
    return append_cell(m, &c);
}

/* ERROR cells for the checked-in sets of the preset that cannot be read. */
static par_status add_unreadable_goldens(par_matrix *m, const par_cell_spec *r, const par_config *cfg)
{
    par_status s = PAR_OK;
    for (int g = 0; !s && g < m->ngold; g++) {
        const par__matrix_golden *ge = &m->gold[g];
        if (strcmp(ge->preset, r->preset) || !ge->error[0] || !strcmp(ge->error, "skip"))
            continue;
        par__matrix_cell c;
        memset(&c, 0, sizeof c);
        c.row = *r;
        c.cfg = *cfg;
        c.ranks = 1;
        c.steps = 1;
        c.ref = PAR_REF_DIR;
        par__matrix_fmt(c.data_label, sizeof c.data_label, "(generator)");
        par__matrix_fmt(c.ref_dir, sizeof c.ref_dir, "%s", ge->dir);
        par__matrix_fmt(c.layout, sizeof c.layout, "checked-in set unreadable");
        par__matrix_fmt(c.note, sizeof c.note, "%s", ge->dir);
        par__matrix_fmt(c.error, sizeof c.error, "checked-in golden set %s: %s", ge->dir, ge->error);
        par__matrix_fmt(c.data_path, sizeof c.data_path, "%s", ge->dir); /* distinct per set */
        s = append_cell(m, &c);
    }
    return s;
}

/* The row's data as cells: every selected fixture of the preset, the
 * primary one, the generator, a data file, or a named fixture. */
static par_status expand_row(par_matrix *m, const par_cell_spec *r, const par_config *cfg)
{
    const char *d = r->data;
    char pre[40];
    fixture_prefix(r->preset, pre, sizeof pre);
    if (!strcmp(d, "*")) {
        par_status s = PAR_OK;
        for (int i = 0; !s && i < m->nfix; i++)
            if (has_prefix(m->fixtures[i], pre))
                s = add_cell(m, r, cfg, m->fixtures[i], "");
        return s;
    }
    if (!d[0] || !strcmp(d, "primary")) {
        const char *p = primary_fixture(m, r->preset);
        return p[0] ? add_cell(m, r, cfg, p, "") : PAR_OK;
    }
    if (!strcmp(d, "generator"))
        return add_cell(m, r, cfg, "", "");
    if (has_suffix(d, ".safetensors")) {
        if (!par_path_exists(d))
            return par_err(PAR_ENOTFOUND, "cell '%s': \"data\": no data file %s", r->name, d);
        return add_cell(m, r, cfg, "", d);
    }
    char fpath[PAR_MX_PATH];
    par__matrix_fmt(fpath, sizeof fpath, "%s/%s.json", m->fixtures_dir, d);
    if (!par_path_exists(fpath))
        return par_err(PAR_ENOTFOUND, "cell '%s': \"data\": '%s' is no fixture in %s (data: primary, *, generator, "
                       "a fixture name or a .safetensors file)", r->name, d, m->fixtures_dir);
    return fixture_index(m, d) >= 0 ? add_cell(m, r, cfg, d, "") : PAR_OK; /* excluded by --fixture */
}

par_status par_matrix_add_rows(par_matrix *m, const par_cell_spec *rows, int n)
{
    for (int i = 0; i < n; i++) {
        const par_cell_spec *r = &rows[i];
        if (!row_selected(m, r))
            continue;
        par_config cfg;
        par_status s = par_cell_check(r);
        if (!s)
            s = par_cell_config(r, &cfg);
        if (!s)
            s = expand_row(m, r, &cfg);
        if (!s && r->kind == PAR_KIND_GOLDEN)
            s = add_unreadable_goldens(m, r, &cfg);
        if (s)
            return s;
    }
    return PAR_OK;
}

par_status par_matrix_add_builtin_cells(par_matrix *m)
{
    int n;
    const par_cell_spec *rows = par_cells_builtin(&n);
    return par_matrix_add_rows(m, rows, n);
}

/* ---- references and golden runs --------------------------------------- */

par_status par__matrix_mem_check(const par_matrix *m, const par_config *cfg, const par_layout *l, int precision,
                            int64_t steps)
{
    const double lim = m->o.max_memory;
    if (lim <= 0)
        return PAR_OK;
    par_memest e;
    par_status s = l ? par_memcheck_run(cfg, l, precision, steps, 0, lim, &e)
                     : par_memcheck_golden(cfg, precision, steps, lim, &e);
    if (s) { /* no estimate: the run reports its own error */
        par_clear_error();
        return PAR_OK;
    }
    return par_memcheck_fits(&e, lim, m->o.max_memory_what ? m->o.max_memory_what : "the matrix's memory limit");
}

/* The serial golden's row blocks: --rows-per-block, else the automatic rule
 * (parallel/plan/memcheck.h) against the matrix's limit (this machine's memory
 * when none); then the limit check of what will run (the blocked estimate
 * when blocked, the one-shot one otherwise). */
static par_status golden_rows(const par_matrix *m, const par_config *cfg, int precision, int64_t steps,
                              int64_t *rows)
{
    *rows = m->o.rows_per_block;
    if (*rows)
        return PAR_OK;
    const double lim = m->o.max_memory > 0 ? m->o.max_memory : par_memcheck_machine();
    par_memest e;
    int64_t r = 0;
    if (par_memcheck_golden_rows(cfg, precision, steps, lim, &r, &e)) {
        par_clear_error(); /* no estimate: one shot, the run reports its own error */
        return PAR_OK;
    }
    if (r > 0) {
        par_status s = par_memcheck_fits(&e, lim, m->o.max_memory_what ? m->o.max_memory_what
                                                                        : "the matrix's memory limit");
        if (s)
            return s;
        if (m->o.progress)
            fprintf(m->o.progress, "       serial golden of %lld rows: one shot would not fit the memory limit; "
                    "row blocks of %lld rows (estimated %.3g GB)\n", (long long)cfg->global_batch_size,
                    (long long)r, e.total / 1e9);
    }
    *rows = r;
    return PAR_OK;
}

par_status par__matrix_golden_run(par_matrix *m, const par_config *cfg, int precision, const char *fixture,
                             const char *data_path, int64_t steps, uint64_t seed, const char *out_dir)
{
    int64_t rows = 0;
    par_status s = golden_rows(m, cfg, precision, steps, &rows);
    if (!s && !rows)
        s = par__matrix_mem_check(m, cfg, NULL, precision, steps);
    if (s)
        return s;
    return par__matrix_golden_run_rows(m, cfg, precision, fixture, data_path, steps, seed, out_dir, rows);
}

par_status par__matrix_golden_run_rows(par_matrix *m, const par_config *cfg, int precision, const char *fixture,
                                       const char *data_path, int64_t steps, uint64_t seed, const char *out_dir,
                                       int64_t rows)
{
    par_golden_opts o;
    par_golden_opts_init(&o);
    o.cfg = *cfg;
    o.precision = precision;
    o.steps = steps;
    o.seed = seed;
    o.out_dir = out_dir;
    o.data_path = data_path && data_path[0] ? data_path : NULL;
    o.fixture = (o.data_path || !fixture || !fixture[0]) ? NULL : fixture;
    o.fixtures_dir = m->fixtures_dir;
    o.progress = 0;
    o.rows_per_block = rows;
    return par_golden_run(&o, NULL);
}

static par__matrix_ref *ref_find(par_matrix *m, const par__matrix_cell *c, int precision)
{
    for (int i = 0; i < m->nref; i++) {
        par__matrix_ref *r = &m->refs[i];
        if (r->precision == precision && !strcmp(r->cfgkey, c->cfgkey) && !strcmp(r->fixture, c->fixture) &&
            !strcmp(r->data_path, c->data_path) && r->steps == c->steps && r->seed == c->seed)
            return r;
    }
    return NULL;
}

/* OUT/ref/f<P>-<data>-s<K>-seed<N>, plus -<preset> for data that is not a
 * preset's fixture and -c<hash> for a config with overrides or a data file
 * (two files of one base name get two references). */
static void ref_dir_name(const par_matrix *m, const par__matrix_cell *c, int precision, char *buf, size_t n)
{
    char data[96];
    par__matrix_fmt(data, sizeof data, "%s", c->fixture[0] ? c->fixture : c->data_path[0] ? c->data_label : "generator");
    char *dot = strstr(data, ".safetensors");
    if (dot)
        *dot = 0;
    size_t o = (size_t)par__matrix_fmt(buf, n, "%s/ref/f%d-%s-s%lld-seed%llu", m->out_dir, precision, data,
                                  (long long)c->steps, (unsigned long long)c->seed);
    if (!c->fixture[0] && o < n)
        o += (size_t)par__matrix_fmt(buf + o, n - o, "-%s", c->row.preset);
    if ((strcmp(c->cfgkey, c->row.preset) || c->data_path[0]) && o < n) { /* overrides, or a file's path */
        char key[sizeof c->cfgkey + sizeof c->data_path + 2];
        uint8_t h[32];
        int k = par__matrix_fmt(key, sizeof key, "%s|%s", c->cfgkey, c->data_path);
        par_sha256(key, (size_t)k, h);
        par__matrix_fmt(buf + o, n - o, "-c%02x%02x%02x%02x", h[0], h[1], h[2], h[3]);
    }
}

par__matrix_ref *par__matrix_ref_get(par_matrix *m, const par__matrix_cell *c, int precision)
{
    par__matrix_ref *r = ref_find(m, c, precision);
    if (r)
        return r;
    if (m->nref == m->refcap) {
        int nc = m->refcap ? 2 * m->refcap : 16;
        par__matrix_ref *nr = par_realloc(m->refs, sizeof *nr * (size_t)nc, PAR_TAG_MISC);
        if (!nr)
            return NULL;
        m->refs = nr;
        m->refcap = nc;
    }
    r = &m->refs[m->nref++];
    memset(r, 0, sizeof *r);
    r->precision = precision;
    par__matrix_fmt(r->cfgkey, sizeof r->cfgkey, "%s", c->cfgkey);
    r->cfg = c->cfg;
    par__matrix_fmt(r->fixture, sizeof r->fixture, "%s", c->fixture);
    par__matrix_fmt(r->data_path, sizeof r->data_path, "%s", c->data_path);
    r->steps = c->steps;
    r->seed = c->seed;
    r->last_use = -1;
    ref_dir_name(m, c, precision, r->dir, sizeof r->dir);
    par__matrix_fmt(r->raw, sizeof r->raw, "%s.raw", r->dir);
    return r;
}

static void produce_ref(par_matrix *m, par__matrix_ref *r)
{
    char parent[PAR_MX_PATH + 8];
    par__matrix_fmt(parent, sizeof parent, "%s/ref", m->out_dir);
    r->produced = 1;
    r->status = par__matrix_mkdir_p(parent);
    if (!r->status && r->precision == 64) {
        r->status = par__matrix_golden_run(m, &r->cfg, 64, r->fixture, r->data_path, r->steps, r->seed, r->dir);
    } else if (!r->status) {
        r->status = par__matrix_golden_run(m, &r->cfg, 32, r->fixture, r->data_path, r->steps, r->seed, r->raw);
        if (!r->status)
            r->status = par_goldenset_widen(r->raw, r->dir);
    }
    if (r->status)
        par__matrix_last_error(r->error, sizeof r->error,
                          r->precision == 64 ? "serial f64 reference: " : "serial f32 run: ");
}

par_status par__matrix_serial(par_matrix *m, const par__matrix_cell *c, int precision, int raw, const char **dir)
{
    if (precision != 64 && precision != 32)
        return par_err(PAR_EINVAL, "matrix: precision must be 64 or 32 (got %d)", precision);
    par__matrix_ref *r = par__matrix_ref_get(m, c, precision);
    if (!r)
        return par_err(PAR_ENOMEM, "matrix: out of memory");
    if (r->removed)
        return par_err(PAR_EINTERNAL, "matrix: reference %s was removed before a cell asked for it", r->dir);
    if (!r->produced)
        produce_ref(m, r);
    if (r->status)
        return par_err(r->status, "%s", r->error);
    *dir = raw && precision == 32 ? r->raw : r->dir;
    return PAR_OK;
}
