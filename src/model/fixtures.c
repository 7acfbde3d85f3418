/* model/fixtures.c - named packing fixtures (fixtures/<name>.json). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/datadir.h"
#include "core/fileio.h"
#include "core/json.h"
#include "model/data.h"

static par_status read_text(const char *path, char **out)
{
    void *data;
    size_t n;
    par_status st = par_file_read(path, PAR_TAG_IO, &data, &n); /* regular files only (a FIFO never blocks) */
    if (!st)
        *out = data;
    return st;
}

static par_status get_int(const cJSON *o, const char *key, const char *path, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!par_json_as_int(v, out)) /* exact below 2^53: no float-to-int overflow (fuzz_fixture) */
        return par_err(PAR_EFORMAT, "%s: fixture key '%s' missing or not an integer", path, key);
    return PAR_OK;
}

static void copy_str(char *dst, size_t n, const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    dst[0] = '\0';
    if (cJSON_IsString(v))
        snprintf(dst, n, "%s", v->valuestring);
}

par_status par_fixture_load(par_fixture *fx, const char *path)
{
    char *text = NULL;
    par_status st = read_text(path, &text);
    if (st)
        return st;
    par_fixture f;
    memset(&f, 0, sizeof f);
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        st = par_err(PAR_EFORMAT, "%s: not valid JSON", path);
        goto fail_free_text;
    }
    if (!cJSON_IsObject(root)) {
        st = par_err(PAR_EFORMAT, "%s: fixture is not a JSON object", path);
        goto fail_delete;
    }
    copy_str(f.name, sizeof f.name, root, "name");
    copy_str(f.description, sizeof f.description, root, "description");
    if (!f.name[0]) {
        st = par_err(PAR_EFORMAT, "%s: fixture has no \"name\" string", path);
        goto fail_delete;
    }
    if ((st = get_int(root, "seq_length", path, &f.seq_length)) || (st = get_int(root, "window_size", path, &f.window_size)))
        goto fail_delete;
    if (f.seq_length < 1 || f.seq_length > ((int64_t)1 << 24)) { /* the config's range of seq_length */
        st = par_err(PAR_EFORMAT, "%s: seq_length = %lld must be in [1, 16777216]", path, (long long)f.seq_length);
        goto fail_delete;
    }
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "rows");
    if (!cJSON_IsArray(rows) || cJSON_GetArraySize(rows) < 1) {
        st = par_err(PAR_EFORMAT, "%s: \"rows\" must be a non-empty array of arrays of lengths", path);
        goto fail_delete;
    }
    f.n_rows = cJSON_GetArraySize(rows);
    int64_t total = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows)
    {
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) < 1) {
            st = par_err(PAR_EFORMAT, "%s: every row must be a non-empty array of lengths", path);
            goto fail_delete;
        }
        total += cJSON_GetArraySize(row);
    }
    f.row_off = par_calloc((size_t)(f.n_rows + 1), sizeof(int64_t), PAR_TAG_IO);
    f.lengths = par_calloc((size_t)total, sizeof(int64_t), PAR_TAG_IO);
    if (!f.row_off || !f.lengths) {
        st = par_err(PAR_ENOMEM, "%s: no memory for %lld lengths", path, (long long)total);
        goto fail_free_fx;
    }
    int64_t r = 0, k = 0;
    cJSON_ArrayForEach(row, rows)
    {
        f.row_off[r] = k;
        int64_t sum = 0;
        const cJSON *len;
        cJSON_ArrayForEach(len, row)
        {
            int64_t v = 0;
            if (!par_json_as_int(len, &v) || v < 1 || v > f.seq_length) {
                st = par_err(PAR_EFORMAT, "%s: row %lld sample %lld: length must be an integer in [1, seq_length = %lld]",
                             path, (long long)r, (long long)(k - f.row_off[r]), (long long)f.seq_length);
                goto fail_free_fx;
            }
            f.lengths[k++] = v;
            sum += v; /* at most 2^31 entries of at most 2^24 each: no overflow */
        }
        if (sum != f.seq_length) {
            st = par_err(PAR_EFORMAT, "%s: row %lld lengths sum to %lld, must be seq_length = %lld", path,
                         (long long)r, (long long)sum, (long long)f.seq_length);
            goto fail_free_fx;
        }
        r++;
    }
    f.row_off[r] = k;
    cJSON_Delete(root);
    par_free(text);
    *fx = f;
    return PAR_OK;
fail_free_fx:
    par_fixture_free(&f);
fail_delete:
    cJSON_Delete(root);
fail_free_text:
    par_free(text);
    return st;
}

par_status par_fixture_load_named(par_fixture *fx, const char *name, const char *dir)
{
    char path[4096], found[4096];
    const char *d = dir;
    if (!d)
        d = getenv("PARITY_FIXTURES_DIR");
    if (!d || !*d) {
        par_status st = par_data_dir("fixtures", found, sizeof found); /* any working directory (core/datadir.h) */
        if (st)
            return st;
        d = found;
    }
    int n = snprintf(path, sizeof path, "%s/%s.json", d, name);
    if (n < 0 || (size_t)n >= sizeof path)
        return par_err(PAR_EINVAL, "fixture '%s': the path under %s is longer than %zu bytes", name, d, sizeof path - 1);
    return par_fixture_load(fx, path);
}

void par_fixture_free(par_fixture *fx)
{
    if (!fx)
        return;
    par_free(fx->row_off);
    par_free(fx->lengths);
    memset(fx, 0, sizeof *fx);
}

par_status par_fixture_plan(const par_fixture *fx, int64_t B, int64_t S, par_pack_plan *plan)
{
    if (S != fx->seq_length)
        return par_err(PAR_EMISMATCH, "fixture '%s' is for seq_length = %lld, the run has seq_length = %lld", fx->name,
                       (long long)fx->seq_length, (long long)S);
    if (B < 1)
        return par_err(PAR_EINVAL, "fixture '%s': B = %lld must be >= 1", fx->name, (long long)B);
    const int64_t **rows = par_malloc((size_t)B * sizeof *rows, PAR_TAG_IO);
    int64_t *counts = par_malloc((size_t)B * sizeof *counts, PAR_TAG_IO);
    par_status st;
    if (!rows || !counts) {
        st = par_err(PAR_ENOMEM, "fixture '%s': no memory for %lld rows", fx->name, (long long)B);
        goto fail_free;
    }
    for (int64_t r = 0; r < B; r++) {
        int64_t fr = r % fx->n_rows;
        rows[r] = fx->lengths + fx->row_off[fr];
        counts[r] = fx->row_off[fr + 1] - fx->row_off[fr];
    }
    st = par_pack_plan_from_rows(plan, B, S, (const int64_t *const *)rows, counts);
fail_free:
    par_free(rows);
    par_free(counts);
    return st;
}
