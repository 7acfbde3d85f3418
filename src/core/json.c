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

/* Length of the UTF-8 sequence at p (at most n bytes), or 0 when it is not
 * valid UTF-8 (overlong forms, surrogates and code points above U+10FFFF
 * are invalid). */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    unsigned c = p[0];
    size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    if (!k || k > n)
        return 0;
    uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
    for (size_t i = 1; i < k; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return k;
}

static int hex4(const char *s, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return 0;
        *v = *v * 16 + (unsigned)d;
    }
    return 1;
}

/* Every string of the JSON text (keys included) is valid UTF-8 and holds no
 * NUL (a "\u0000" escape would cut a C string short) nor a lone surrogate
 * escape.  cJSON checks neither. */
static par_status check_strings(const char *text, size_t len, const char *label)
{
    const unsigned char *t = (const unsigned char *)text;
    int in = 0;
    for (size_t i = 0; i < len;) {
        if (!in) {
            in = t[i++] == '"';
            continue;
        }
        if (t[i] == '"') {
            in = 0;
            i++;
        } else if (t[i] == '\\' && i + 1 < len && t[i + 1] == 'u') {
            unsigned v, w;
            if (i + 6 > len || !hex4(text + i + 2, &v))
                return PAR_OK; /* malformed: cJSON reports it */
            if (v == 0)
                return par_err(PAR_EFORMAT, "%s: a string holds \\u0000 (NUL) at byte %zu; names and values "
                               "cannot carry NUL", label, i);
            if (v >= 0xdc00 && v <= 0xdfff)
                return par_err(PAR_EFORMAT, "%s: a string holds a lone low surrogate \\u%04x at byte %zu", label, v, i);
            if (v >= 0xd800 && v <= 0xdbff &&
                !(i + 12 <= len && t[i + 6] == '\\' && t[i + 7] == 'u' && hex4(text + i + 8, &w) && w >= 0xdc00 &&
                  w <= 0xdfff))
                return par_err(PAR_EFORMAT, "%s: a string holds a lone high surrogate \\u%04x at byte %zu", label, v,
                               i);
            i += v >= 0xd800 && v <= 0xdbff ? 12 : 6;
        } else if (t[i] == '\\') {
            i += 2;
        } else {
            size_t k = utf8_len(t + i, len - i);
            if (!k)
                return par_err(PAR_EFORMAT, "%s: a string is not valid UTF-8 at byte %zu (0x%02x)", label, i, t[i]);
            i += k;
        }
    }
    return PAR_OK;
}

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
    par_status st = check_strings(text, used, label);
    if (st) {
        cJSON_Delete(root);
        return st;
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
