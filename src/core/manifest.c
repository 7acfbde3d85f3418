#include "core/manifest.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"

void par_manifest_init(par_manifest *m)
{
    memset(m, 0, sizeof *m);
    m->version = PAR_MANIFEST_VERSION;
}

static void free_files(par_manifest *m)
{
    for (int i = 0; i < m->nfiles; i++)
        par_free(m->files[i].name);
    par_free(m->files);
    m->files = NULL;
    m->nfiles = 0;
}

void par_manifest_free(par_manifest *m)
{
    par_free(m->generator_name);
    par_free(m->generator_version);
    par_free(m->precision);
    cJSON_Delete(m->model);
    cJSON_Delete(m->train);
    cJSON_Delete(m->layout);
    cJSON_Delete(m->data);
    free_files(m);
    for (int i = 0; i < m->ntol; i++) {
        par_free(m->tol[i].tensor);
        par_free(m->tol[i].reason);
    }
    par_free(m->tol);
    memset(m, 0, sizeof *m);
}

static par_status replace_str(char **dst, const char *s)
{
    char *c = NULL;
    if (s && !(c = par_strdup(s, PAR_TAG_IO)))
        return par_err(PAR_ENOMEM, "manifest: out of memory");
    par_free(*dst);
    *dst = c;
    return PAR_OK;
}

par_status par_manifest_set_generator(par_manifest *m, const char *name, const char *version)
{
    par_status st = replace_str(&m->generator_name, name);
    return st ? st : replace_str(&m->generator_version, version);
}

par_status par_manifest_set_precision(par_manifest *m, const char *precision)
{
    return replace_str(&m->precision, precision);
}

par_status par_manifest_add_tolerance(par_manifest *m, const char *tensor, double rtol, double atol,
                                      const char *reason)
{
    if (!tensor || !*tensor)
        return par_err(PAR_EINVAL, "manifest tolerance: empty tensor name");
    if (!(rtol >= 0 && isfinite(rtol)) || !(atol >= 0 && isfinite(atol)))
        return par_err(PAR_EINVAL, "manifest tolerance for '%s': rtol %g / atol %g must be finite and >= 0", tensor,
                       rtol, atol);
    if (!reason || !*reason)
        return par_err(PAR_EINVAL, "manifest tolerance for '%s': a written reason is required", tensor);
    if (par_manifest_tolerance(m, tensor))
        return par_err(PAR_EINVAL, "manifest tolerance for '%s' given twice", tensor);
    par_tol_override *nt = par_realloc(m->tol, (size_t)(m->ntol + 1) * sizeof *nt, PAR_TAG_IO);
    if (!nt)
        return par_err(PAR_ENOMEM, "manifest: out of memory");
    m->tol = nt;
    par_tol_override *o = &m->tol[m->ntol];
    o->tensor = par_strdup(tensor, PAR_TAG_IO);
    o->reason = par_strdup(reason, PAR_TAG_IO);
    if (!o->tensor || !o->reason) {
        par_free(o->tensor);
        par_free(o->reason);
        return par_err(PAR_ENOMEM, "manifest: out of memory");
    }
    o->rtol = rtol;
    o->atol = atol;
    m->ntol++;
    return PAR_OK;
}

const par_tol_override *par_manifest_tolerance(const par_manifest *m, const char *tensor)
{
    for (int i = 0; i < m->ntol; i++)
        if (!strcmp(m->tol[i].tensor, tensor))
            return &m->tol[i];
    return NULL;
}

static int cmp_file(const void *a, const void *b)
{
    return strcmp(((const par_manifest_file *)a)->name, ((const par_manifest_file *)b)->name);
}

const char *par_manifest_file_sha(const par_manifest *m, const char *name)
{
    for (int i = 0; i < m->nfiles; i++)
        if (!strcmp(m->files[i].name, name))
            return m->files[i].sha256;
    return NULL;
}

/* A file name a manifest may list: no path separators, not "." or "..". */
static int plain_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

/* ---- parse ------------------------------------------------------------ */

static par_status take_object(const cJSON *root, const char *key, const char *label, cJSON **dst)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!j)
        return par_err(PAR_EFORMAT, "%s: key \"%s\" is missing", label, key);
    if (!cJSON_IsObject(j))
        return par_err(PAR_EFORMAT, "%s: \"%s\" is not an object", label, key);
    *dst = cJSON_Duplicate(j, 1);
    if (!*dst)
        return par_err(PAR_ENOMEM, "%s: out of memory", label);
    return PAR_OK;
}

/* "format", "version" and "generator" of a manifest object. */
static par_status parse_header(const cJSON *root, const char *label, par_manifest *m)
{
    const char *fmt = par_json_str(root, "format");
    if (!fmt || strcmp(fmt, PAR_MANIFEST_FORMAT))
        return par_err(PAR_EFORMAT, "%s: \"format\" is %s%s%s, expected \"" PAR_MANIFEST_FORMAT "\"", label,
                       fmt ? "\"" : "", fmt ? fmt : "missing or not a string", fmt ? "\"" : "");
    if (!par_json_int(root, "version", &m->version))
        return par_err(PAR_EFORMAT, "%s: \"version\" is missing or not an integer", label);
    if (m->version > PAR_MANIFEST_VERSION)
        return par_err(PAR_EUNSUPPORTED, "%s: version %lld is newer than this parity reads (%d)", label,
                       (long long)m->version, PAR_MANIFEST_VERSION);
    if (m->version < 1)
        return par_err(PAR_EFORMAT, "%s: version %lld is not valid (versions start at 1)", label,
                       (long long)m->version);
    const cJSON *gen = par_json_obj(root, "generator");
    const char *gn = gen ? par_json_str(gen, "name") : NULL;
    const char *gv = gen ? par_json_str(gen, "version") : NULL;
    if (!gn || !gv)
        return par_err(PAR_EFORMAT, "%s: \"generator\" must be an object with string \"name\" and \"version\"", label);
    return par_manifest_set_generator(m, gn, gv);
}

/* "model", "train", "layout", "data" (objects), "precision", "steps". */
static par_status parse_run(const cJSON *root, const char *label, par_manifest *m)
{
    par_status st;
    if ((st = take_object(root, "model", label, &m->model)) || (st = take_object(root, "train", label, &m->train)) ||
        (st = take_object(root, "layout", label, &m->layout)) || (st = take_object(root, "data", label, &m->data)))
        return st;
    const char *prec = par_json_str(root, "precision");
    if (!prec || !*prec)
        return par_err(PAR_EFORMAT, "%s: \"precision\" is missing or not a non-empty string", label);
    if ((st = par_manifest_set_precision(m, prec)))
        return st;
    if (!par_json_int(root, "steps", &m->steps) || m->steps < 0)
        return par_err(PAR_EFORMAT, "%s: \"steps\" is missing or not a non-negative integer", label);
    const cJSON *fs = cJSON_GetObjectItemCaseSensitive(root, "first_step");
    if (fs && (!par_json_int(root, "first_step", &m->first_step) || m->first_step < 0 || m->first_step > m->steps))
        return par_err(PAR_EFORMAT, "%s: \"first_step\" must be an integer in [0, steps = %lld]", label,
                       (long long)m->steps);
    return PAR_OK;
}

/* "files": plain names to 64-digit sha256s (kept lower case, sorted by
 * name, each name once). */
static par_status parse_files(const cJSON *root, const char *label, par_manifest *m)
{
    const cJSON *files = par_json_obj(root, "files");
    if (!files)
        return par_err(PAR_EFORMAT, "%s: \"files\" is missing or not an object", label);
    int nf = cJSON_GetArraySize(files);
    m->files = par_calloc(nf ? (size_t)nf : 1, sizeof *m->files, PAR_TAG_IO);
    if (!m->files)
        return par_err(PAR_ENOMEM, "%s: out of memory", label);
    const cJSON *it;
    cJSON_ArrayForEach(it, files)
    {
        if (!plain_name(it->string))
            return par_err(PAR_EFORMAT, "%s: \"files\" lists '%s', which is not a plain file name", label,
                           it->string);
        if (!cJSON_IsString(it) || !par_sha256_hex_valid(it->valuestring))
            return par_err(PAR_EFORMAT, "%s: \"files\" entry '%s' is not a 64-digit hex sha256", label, it->string);
        par_manifest_file *f = &m->files[m->nfiles];
        f->name = par_strdup(it->string, PAR_TAG_IO);
        if (!f->name)
            return par_err(PAR_ENOMEM, "%s: out of memory", label);
        for (int i = 0; i < 64; i++)
            f->sha256[i] = (char)tolower((unsigned char)it->valuestring[i]);
        f->sha256[64] = '\0';
        m->nfiles++;
    }
    qsort(m->files, (size_t)m->nfiles, sizeof *m->files, cmp_file);
    for (int i = 1; i < m->nfiles; i++)
        if (!strcmp(m->files[i - 1].name, m->files[i].name))
            return par_err(PAR_EFORMAT, "%s: \"files\" lists '%s' twice", label, m->files[i].name);
    return PAR_OK;
}

/* "tolerances" (optional): per tensor rtol, atol (finite, >= 0) and a
 * written reason, each tensor once. */
static par_status parse_tolerances(const cJSON *root, const char *label, par_manifest *m)
{
    const cJSON *tol = cJSON_GetObjectItemCaseSensitive(root, "tolerances"), *it;
    if (!tol)
        return PAR_OK;
    if (!cJSON_IsObject(tol))
        return par_err(PAR_EFORMAT, "%s: \"tolerances\" is not an object", label);
    cJSON_ArrayForEach(it, tol)
    {
        double rt, at;
        const char *why = cJSON_IsObject(it) ? par_json_str(it, "reason") : NULL;
        if (!cJSON_IsObject(it) || !par_json_num(it, "rtol", &rt) || !par_json_num(it, "atol", &at))
            return par_err(PAR_EFORMAT, "%s: tolerance for '%s' needs numbers \"rtol\" and \"atol\"", label,
                           it->string);
        if (!why || !*why)
            return par_err(PAR_EFORMAT, "%s: tolerance for '%s' has no written \"reason\"", label, it->string);
        if (!(rt >= 0 && isfinite(rt)) || !(at >= 0 && isfinite(at)))
            return par_err(PAR_EFORMAT, "%s: tolerance for '%s': rtol %g / atol %g must be finite and >= 0", label,
                           it->string, rt, at);
        if (par_manifest_tolerance(m, it->string))
            return par_err(PAR_EFORMAT, "%s: tolerance for '%s' given twice", label, it->string);
        par_status st = par_manifest_add_tolerance(m, it->string, rt, at, why);
        if (st)
            return st;
    }
    return PAR_OK;
}

par_status par_manifest_parse(const char *text, size_t len, const char *label, par_manifest *out)
{
    cJSON *root;
    par_status st = par_json_parse(text, len, label, &root);
    if (st)
        return st;
    par_manifest m;
    par_manifest_init(&m);
    if (!cJSON_IsObject(root))
        st = par_err(PAR_EFORMAT, "%s: not a JSON object", label);
    if (st || (st = parse_header(root, label, &m)) || (st = parse_run(root, label, &m)) ||
        (st = parse_files(root, label, &m)) || (st = parse_tolerances(root, label, &m)))
        goto fail_free;
    cJSON_Delete(root);
    *out = m;
    return PAR_OK;

fail_free:
    par_manifest_free(&m);
    cJSON_Delete(root);
    return st;
}

par_status par_manifest_verify(const par_manifest *m, const char *dir)
{
    for (int i = 0; i < m->nfiles; i++) {
        char *p = par_path_join(dir, m->files[i].name);
        if (!p)
            return par_err(PAR_ENOMEM, "%s: out of memory", dir);
        if (!par_path_exists(p)) {
            par_status st = par_err(PAR_ENOTFOUND, "%s: listed in %s/" PAR_MANIFEST_NAME " but missing", p, dir);
            par_free(p);
            return st;
        }
        char got[PAR_SHA256_HEX];
        par_status st = par_sha256_file(p, got);
        if (!st && strcmp(got, m->files[i].sha256))
            st = par_err(PAR_EMISMATCH, "%s: sha256 is %s but " PAR_MANIFEST_NAME " lists %s", p, got,
                         m->files[i].sha256);
        par_free(p);
        if (st)
            return st;
    }
    return PAR_OK;
}

static par_status manifest_read(const char *dir, int verify, par_manifest *out)
{
    char *path = par_path_join(dir, PAR_MANIFEST_NAME);
    if (!path)
        return par_err(PAR_ENOMEM, "%s: out of memory", dir);
    void *buf;
    size_t n;
    par_status st = par_file_read(path, PAR_TAG_IO, &buf, &n);
    if (st)
        goto done_free_path;
    par_manifest m;
    st = par_manifest_parse(buf, n, path, &m);
    par_free(buf);
    if (st)
        goto done_free_path;
    st = verify ? par_manifest_verify(&m, dir) : PAR_OK;
    if (st) {
        par_manifest_free(&m);
        goto done_free_path;
    }
    *out = m;
done_free_path:
    par_free(path);
    return st;
}

par_status par_manifest_read(const char *dir, par_manifest *out) { return manifest_read(dir, 1, out); }

par_status par_manifest_read_unverified(const char *dir, par_manifest *out) { return manifest_read(dir, 0, out); }

/* ---- write ------------------------------------------------------------ */

static cJSON *dup_or_empty(const cJSON *j) { return j ? cJSON_Duplicate(j, 1) : cJSON_CreateObject(); }

cJSON *par_manifest_to_json(const par_manifest *m)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    cJSON *gen = cJSON_CreateObject(), *files = cJSON_CreateObject();
    int ok = gen && files;
    ok = ok && cJSON_AddStringToObject(root, "format", PAR_MANIFEST_FORMAT);
    ok = ok && cJSON_AddNumberToObject(root, "version", (double)m->version);
    ok = ok && cJSON_AddStringToObject(gen, "name", m->generator_name ? m->generator_name : "parity");
    ok = ok && cJSON_AddStringToObject(gen, "version", m->generator_version ? m->generator_version : "");
    if (ok) {
        cJSON_AddItemToObject(root, "generator", gen);
        gen = NULL;
    }
    const char *keys[4] = {"model", "train", "layout", "data"};
    const cJSON *vals[4] = {m->model, m->train, m->layout, m->data};
    for (int i = 0; i < 4 && ok; i++) {
        cJSON *d = dup_or_empty(vals[i]);
        ok = d && cJSON_AddItemToObject(root, keys[i], d);
        if (!ok)
            cJSON_Delete(d);
        if (i == 1) { /* precision and steps between train and layout */
            ok = ok && cJSON_AddStringToObject(root, "precision", m->precision ? m->precision : "f64");
            ok = ok && cJSON_AddNumberToObject(root, "steps", (double)m->steps);
            ok = ok && cJSON_AddNumberToObject(root, "first_step", (double)m->first_step);
        }
    }
    for (int i = 0; i < m->nfiles && ok; i++)
        ok = cJSON_AddStringToObject(files, m->files[i].name, m->files[i].sha256) != NULL;
    if (ok) {
        cJSON_AddItemToObject(root, "files", files);
        files = NULL;
    }
    if (ok && m->ntol) {
        cJSON *tol = cJSON_AddObjectToObject(root, "tolerances");
        ok = tol != NULL;
        for (int i = 0; i < m->ntol && ok; i++) {
            cJSON *o = cJSON_AddObjectToObject(tol, m->tol[i].tensor);
            ok = o && cJSON_AddNumberToObject(o, "rtol", m->tol[i].rtol) &&
                 cJSON_AddNumberToObject(o, "atol", m->tol[i].atol) &&
                 cJSON_AddStringToObject(o, "reason", m->tol[i].reason);
        }
    }
    cJSON_Delete(gen);
    cJSON_Delete(files);
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

par_status par_manifest_write(par_manifest *m, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return par_err(PAR_EIO, "%s: cannot open directory to hash its files: %s", dir, strerror(errno));
    par_status st = PAR_OK;
    par_manifest_file *files = NULL;
    int nf = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, PAR_MANIFEST_NAME))
            continue;
        char *p = par_path_join(dir, e->d_name);
        if (!p) {
            st = par_err(PAR_ENOMEM, "%s: out of memory", dir);
            goto fail_free_files;
        }
        struct stat sb;
        if (lstat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            par_free(p);
            continue;
        }
        if (nf == cap) {
            int nc = cap ? 2 * cap : 16;
            par_manifest_file *nfp = par_realloc(files, (size_t)nc * sizeof *nfp, PAR_TAG_IO);
            if (!nfp) {
                par_free(p);
                st = par_err(PAR_ENOMEM, "%s: out of memory", dir);
                goto fail_free_files;
            }
            files = nfp;
            cap = nc;
        }
        st = par_sha256_file(p, files[nf].sha256);
        par_free(p);
        if (st)
            goto fail_free_files;
        files[nf].name = par_strdup(e->d_name, PAR_TAG_IO);
        if (!files[nf].name) {
            st = par_err(PAR_ENOMEM, "%s: out of memory", dir);
            goto fail_free_files;
        }
        nf++;
    }
    closedir(d);
    d = NULL;
    if (nf)
        qsort(files, (size_t)nf, sizeof *files, cmp_file);
    free_files(m);
    m->files = files;
    m->nfiles = nf;
    files = NULL;
    nf = 0;

    cJSON *root = par_manifest_to_json(m);
    if (!root)
        return par_err(PAR_ENOMEM, "%s: out of memory building " PAR_MANIFEST_NAME, dir);
    char *path = par_path_join(dir, PAR_MANIFEST_NAME);
    if (!path) {
        cJSON_Delete(root);
        return par_err(PAR_ENOMEM, "%s: out of memory", dir);
    }
    st = par_json_write_file(path, root);
    par_free(path);
    cJSON_Delete(root);
    return st;

fail_free_files:
    for (int i = 0; i < nf; i++)
        par_free(files[i].name);
    par_free(files);
    if (d)
        closedir(d);
    return st;
}
