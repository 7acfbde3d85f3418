#include "core/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"

int par_json_as_int(const cJSON *j, int64_t *out)
{
    if (!j || !cJSON_IsNumber(j))
        return 0;
    double v = j->valuedouble;
    if (!(fabs(v) < PAR_JSON_INT_MAX) || v != floor(v))
        return 0;
    *out = (int64_t)v;
    return 1;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

par_status par_json_parse(const char *text, size_t len, const char *label, cJSON **out)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = (at && at >= text && at <= text + len) ? (size_t)(at - text) : 0;
        return par_err(PAR_EFORMAT, "%s: JSON is not well formed (near byte %zu of %zu)", label, off, len);
    }
    size_t used = (end && end >= text && end <= text + len) ? (size_t)(end - text) : len;
    for (size_t i = used; i < len; i++) {
        if (!is_ws(text[i])) {
            cJSON_Delete(root);
            return par_err(PAR_EFORMAT, "%s: unexpected bytes after the JSON value (byte %zu of %zu)", label, i,
                           len);
        }
    }
    *out = root;
    return PAR_OK;
}

par_status par_json_read_file(const char *path, cJSON **out)
{
    void *buf;
    size_t n;
    par_status st = par_file_read(path, PAR_TAG_IO, &buf, &n);
    if (st)
        return st;
    st = par_json_parse(buf, n, path, out);
    par_free(buf);
    return st;
}

par_status par_json_write_file(const char *path, const cJSON *root)
{
    char *s = cJSON_Print(root);
    if (!s)
        return par_err(PAR_ENOMEM, "%s: cannot print JSON (out of memory)", path);
    size_t n = strlen(s);
    par_afile *f;
    par_status st = par_afile_open(path, &f);
    if (st)
        goto done_free_s;
    st = par_afile_write(f, s, n);
    if (!st)
        st = par_afile_write(f, "\n", 1);
    if (st) {
        par_afile_abort(f);
        goto done_free_s;
    }
    st = par_afile_commit(f);
done_free_s:
    cJSON_free(s);
    return st;
}

const cJSON *par_json_obj(const cJSON *obj, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsObject(j) ? j : NULL;
}

const char *par_json_str(const cJSON *obj, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

int par_json_int(const cJSON *obj, const char *key, int64_t *out)
{
    return par_json_as_int(cJSON_GetObjectItemCaseSensitive(obj, key), out);
}

int par_json_num(const cJSON *obj, const char *key, double *out)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(j))
        return 0;
    *out = j->valuedouble;
    return 1;
}
