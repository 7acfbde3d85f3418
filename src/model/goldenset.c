/* model/goldenset.c - golden-set file names and whole-set edits (see
 * model/goldenset.h). */
#include "model/goldenset.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/manifest.h"
#include "core/safetensors.h"
#include "core/tensor.h"

#define PATH_CAP 1024

static const char *const kind_prefix[2] = {"params.", "step."};

int par_setfile_name(par_setfile_kind kind, int64_t k, char *buf, size_t n)
{
    return snprintf(buf, n, "%s%lld.safetensors", kind_prefix[kind == PAR_SETFILE_STEP], (long long)k);
}

int par_setfile_parse(const char *name, par_setfile_kind *kind, int64_t *k)
{
    for (int w = 0; w < 2; w++) {
        size_t pl = strlen(kind_prefix[w]);
        if (strncmp(name, kind_prefix[w], pl))
            continue;
        const char *p = name + pl;
        if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
            return 0;
        int64_t v = 0;
        while (*p >= '0' && *p <= '9') {
            if (v > (INT64_MAX - 9) / 10)
                return 0;
            v = v * 10 + (*p++ - '0');
        }
        if (strcmp(p, ".safetensors"))
            return 0;
        *kind = (par_setfile_kind)w;
        *k = v;
        return 1;
    }
    return 0;
}

int par_setfile_order(par_setfile_kind ka, int64_t a, par_setfile_kind kb, int64_t b)
{
    if (a != b)
        return a < b ? -1 : 1;
    return (int)ka - (int)kb;
}

/* Hard-links (or copies) src_dir/from to dst_dir/to. */
static par_status link_file(const char *src_dir, const char *from, const char *dst_dir, const char *to)
{
    char a[PATH_CAP], b[PATH_CAP];
    if (snprintf(a, sizeof a, "%s/%s", src_dir, from) >= (int)sizeof a ||
        snprintf(b, sizeof b, "%s/%s", dst_dir, to) >= (int)sizeof b)
        return par_err(PAR_ERANGE, "golden set: path too long under %s", dst_dir);
    if (link(a, b) == 0)
        return PAR_OK;
    void *data = NULL;
    size_t len = 0;
    par_status s = par_file_read(a, PAR_TAG_IO, &data, &len);
    if (!s)
        s = par_file_write_atomic(b, data, len);
    par_free(data);
    return s;
}

static par_status make_dir(const char *dst)
{
    if (mkdir(dst, 0777) != 0)
        return par_err(PAR_EIO, "golden set: cannot create %s: %s", dst, strerror(errno));
    return PAR_OK;
}

par_status par_goldenset_select(const char *src, const char *dst, par_setfile_pick pick, void *ud)
{
    char mp[PATH_CAP];
    snprintf(mp, sizeof mp, "%s/%s", src, PAR_MANIFEST_NAME);
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
    s = make_dir(dst);
    int kept = 0;
    for (int i = 0; i < man.nfiles; i++) {
        const char *nm = man.files[i].name;
        par_setfile_kind kind;
        int64_t k;
        if (s || !par_setfile_parse(nm, &kind, &k) || !pick(kind, k, ud)) {
            par_free(man.files[i].name);
            continue;
        }
        s = link_file(src, nm, dst, nm);
        man.files[kept++] = man.files[i];
    }
    man.nfiles = kept;
    if (!s) {
        cJSON *j = par_manifest_to_json(&man);
        snprintf(mp, sizeof mp, "%s/%s", dst, PAR_MANIFEST_NAME);
        s = j ? par_json_write_file(mp, j) : par_err(PAR_ENOMEM, "golden set: out of memory");
        cJSON_Delete(j);
    }
    par_manifest_free(&man);
    return s;
}

par_status par_goldenset_merge(const char *first, const char *resumed, int64_t split, const char *dst)
{
    par_manifest a, b;
    par_status s = par_manifest_read(first, &a);
    if (s)
        return s;
    if ((s = par_manifest_read(resumed, &b))) {
        par_manifest_free(&a);
        return s;
    }
    if (b.first_step != split || a.steps != split) /* the resumed run's files carry global step numbers */
        s = par_err(PAR_EINVAL, "golden set: merging %s (steps 0..%lld) and %s (first_step %lld) at step %lld: the "
                    "resumed set must start where the first one ends", first, (long long)a.steps, resumed,
                    (long long)b.first_step, (long long)split);
    if (!s)
        s = make_dir(dst);
    for (int i = 0; !s && i < a.nfiles; i++) {
        par_setfile_kind kind;
        int64_t k;
        if (par_setfile_parse(a.files[i].name, &kind, &k) && k <= split)
            s = link_file(first, a.files[i].name, dst, a.files[i].name);
    }
    for (int i = 0; !s && i < b.nfiles; i++) {
        par_setfile_kind kind;
        int64_t k;
        if (!par_setfile_parse(b.files[i].name, &kind, &k) || (kind == PAR_SETFILE_PARAMS && k == split))
            continue;
        s = link_file(resumed, b.files[i].name, dst, b.files[i].name);
    }
    if (!s && a.layout && b.layout) { /* the files from step split on were computed under b's layout */
        cJSON *after = cJSON_Duplicate(b.layout, 1);
        if (!after || !cJSON_AddNumberToObject(after, "from_step", (double)split))
            s = par_err(PAR_ENOMEM, "golden set: out of memory");
        else
        {
            cJSON *host = a.layout, *next; /* a chain of checkpoints: the last one's layout */
            while ((next = cJSON_GetObjectItemCaseSensitive(host, "after_checkpoint")) && cJSON_IsObject(next))
                host = next;
            cJSON_AddItemToObject(host, "after_checkpoint", after), after = NULL;
        }
        cJSON_Delete(after);
    }
    if (!s) {
        a.steps = b.steps;
        s = par_manifest_write(&a, dst); /* lists (and hashes) the merged files */
    }
    par_manifest_free(&a);
    par_manifest_free(&b);
    return s;
}

/* One file of par_goldenset_widen. */
static par_status widen_file(const char *in, const char *outp)
{
    par_st_file *f = NULL;
    par_status s = par_st_read(in, &f);
    if (s)
        return s;
    int nt = par_st_count(f);
    par_tensor *wide = par_calloc((size_t)(nt ? nt : 1), sizeof *wide, PAR_TAG_TENSOR);
    par_st_writer *w = NULL;
    if (!wide) {
        s = par_err(PAR_ENOMEM, "golden set: out of memory");
        goto done_close;
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
    par_st_writer_free(w);
    for (int i = 0; i < nt; i++)
        par_tensor_free(&wide[i]);
    par_free(wide);
done_close:
    par_st_close(f);
    return s;
}

par_status par_goldenset_widen(const char *src, const char *dst)
{
    par_manifest man;
    par_status s = par_manifest_read(src, &man);
    if (s)
        return s;
    s = make_dir(dst);
    for (int i = 0; !s && i < man.nfiles; i++) {
        char in[PATH_CAP], outp[PATH_CAP];
        snprintf(in, sizeof in, "%s/%s", src, man.files[i].name);
        snprintf(outp, sizeof outp, "%s/%s", dst, man.files[i].name);
        s = widen_file(in, outp);
    }
    if (!s)
        s = par_manifest_write(&man, dst);
    par_manifest_free(&man);
    return s;
}

/* Appends step k's [B,S] tensor `name` of file f into all (allocated at k =
 * 0 as [steps*B, S]). */
static par_status stack_batch(const par_st_file *f, const char *path, const char *name, int64_t k, int64_t steps,
                              par_tensor *all)
{
    const par_tensor *t = par_st_find(f, name);
    if (!t || t->dtype != PAR_I32 || t->ndim != 2)
        return par_err(PAR_EFORMAT, "golden set: %s has no I32 [B,S] '%s'", path, name);
    if (k == 0) {
        int64_t shape[2] = {steps * t->shape[0], t->shape[1]};
        par_status s = par_tensor_alloc(all, PAR_I32, 2, shape, PAR_TAG_TENSOR);
        if (s)
            return s;
    }
    int64_t B = all->shape[0] / steps, S = all->shape[1];
    if (t->shape[0] != B || t->shape[1] != S)
        return par_err(PAR_EMISMATCH, "golden set: %s: '%s' is [%lld,%lld], step 0 had [%lld,%lld]", path, name,
                       (long long)t->shape[0], (long long)t->shape[1], (long long)B, (long long)S);
    memcpy((int32_t *)all->data + k * B * S, t->data, (size_t)(B * S) * sizeof(int32_t));
    return PAR_OK;
}

par_status par_goldenset_write_batches(const char *src, int64_t steps, const char *path)
{
    static const char *const names[2] = {"input.tokens", "input.segments"};
    par_tensor all[2];
    memset(all, 0, sizeof all);
    par_status s = PAR_OK;
    for (int64_t k = 0; !s && k < steps; k++) {
        char fn[64], fp[PATH_CAP];
        par_setfile_name(PAR_SETFILE_STEP, k, fn, sizeof fn);
        snprintf(fp, sizeof fp, "%s/%s", src, fn);
        par_st_file *f = NULL;
        s = par_st_read(fp, &f);
        for (int j = 0; !s && j < 2; j++)
            s = stack_batch(f, fp, names[j], k, steps, &all[j]);
        par_st_close(f);
    }
    par_st_writer *w = NULL;
    if (!s)
        s = par_st_writer_new(&w);
    for (int j = 0; !s && j < 2; j++)
        s = par_st_writer_add(w, names[j], &all[j]);
    if (!s)
        s = par_st_writer_meta(w, "source", src);
    if (!s)
        s = par_st_writer_write(w, path);
    par_st_writer_free(w);
    par_tensor_free(&all[0]);
    par_tensor_free(&all[1]);
    return s;
}
