/* core/outfile.c - which single files parity may write over (outfile.h). */
#define _GNU_SOURCE
#include "core/outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/json.h"

#define HEAD_MAX 4096                     /* bytes a prefix rule looks at         */
#define JSON_MAX ((int64_t)64 << 20)      /* a JSON output parsed whole up to     */
#define ST_HEADER_MAX ((uint64_t)100 << 20) /* a safetensors header read up to    */

typedef struct {
    char b[HEAD_MAX + 1];
    size_t n;       /* bytes in b (NUL-terminated)  */
    int64_t size;   /* of the whole file            */
    int fd;         /* open on the file             */
} head_t;

/* n bytes at offset off of the file into a par_malloc'd buffer, or NULL. */
static char *read_at(const head_t *h, uint64_t off, size_t n)
{
    char *p = par_malloc(n + 1, PAR_TAG_IO);
    size_t got = 0;
    while (p && got < n) {
        ssize_t r = pread(h->fd, p + got, n - got, (off_t)(off + got));
        if (r <= 0 && !(r < 0 && errno == EINTR))
            break;
        got += r > 0 ? (size_t)r : 0;
    }
    if (p && got < n) {
        par_free(p);
        return NULL;
    }
    if (p)
        p[n] = '\0';
    return p;
}

/* ---- the recognisers ---------------------------------------------------------- */

static const char *const json_formats[][2] = {
    {"parity-run-summary", "run summary"},
    {"parity-matrix", "matrix report (JSON)"},
    {"parity-compare", "compare report"},
    {"parity-plan", "plan report"},
};

static const char *json_doc(const head_t *h)
{
    size_t i = 0;
    while (i < h->n && (h->b[i] == ' ' || h->b[i] == '\n' || h->b[i] == '\t' || h->b[i] == '\r'))
        i++;
    if (i >= h->n || h->b[i] != '{' || h->size > JSON_MAX || !strncmp(h->b + i, "{\"displayTimeUnit\"", 18))
        return NULL;
    char *text = read_at(h, 0, (size_t)h->size);
    cJSON *j = text ? cJSON_ParseWithLength(text, (size_t)h->size) : NULL;
    par_free(text);
    const char *noun = NULL, *f = j ? par_json_str(j, "format") : NULL;
    for (size_t k = 0; f && !noun && k < sizeof json_formats / sizeof json_formats[0]; k++)
        if (!strcmp(f, json_formats[k][0]))
            noun = json_formats[k][1];
    static const char *const old_compare[] = {"a", "b", "policy", "policy_source", "tensors"};
    int all = j && !f;
    for (size_t k = 0; all && k < sizeof old_compare / sizeof old_compare[0]; k++)
        all = cJSON_GetObjectItemCaseSensitive(j, old_compare[k]) != NULL;
    if (all)
        noun = "compare report";
    cJSON_Delete(j);
    return noun;
}

static int starts(const head_t *h, const char *p) { return !strncmp(h->b, p, strlen(p)); }

static const char *chrome_trace(const head_t *h)
{
    if (!starts(h, "{\"displayTimeUnit\": "))
        return NULL;
    if (strstr(h->b, "\"otherData\": {\"generator\": \"parity\""))
        return "Chrome trace";
    if (starts(h, "{\"displayTimeUnit\": \"ns\",\n \"otherData\": {\"network\": \"")) /* run --trace, older */
        return "Chrome trace";
    if (starts(h, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n{\"name\": \"process_name\", \"ph\": \"M\", "
                  "\"pid\": 0, \"tid\": 0, \"args\": {\"name\": \"rank 0\"}}")) /* schedule --trace, older */
        return "Chrome trace";
    return NULL;
}

static const char *schedule_svg(const head_t *h)
{
    if (!starts(h, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\""))
        return NULL;
    if (strstr(h->b, "<!-- parity schedule -->"))
        return "schedule SVG";
    const char *old = "\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" "
                      "fill=\"white\"/>\n<text x=\"70\" y=\"20\" font-size=\"14\">";
    const char *p = strstr(h->b, old);
    return p && strstr(p, ": PP ") && strstr(p, "; makespan ") ? "schedule SVG" : NULL;
}

static const char *matrix_md(const head_t *h) { return starts(h, "# parity matrix\n") ? "matrix report (Markdown)" : NULL; }

static const char *matrix_junit(const head_t *h)
{
    return starts(h, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"parity matrix\" ")
               ? "matrix report (JUnit XML)"
               : NULL;
}

static const char *ckpt_export(const head_t *h)
{
    uint64_t hl = 0;
    if (h->n < 10 || h->b[8] != '{')
        return NULL;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | (unsigned char)h->b[i];
    if (hl < 2 || hl > ST_HEADER_MAX || hl > (uint64_t)h->size - 8)
        return NULL;
    char *text = read_at(h, 8, (size_t)hl);
    cJSON *j = text ? cJSON_ParseWithLength(text, hl) : NULL;
    par_free(text);
    const char *f = j ? par_json_str(par_json_obj(j, "__metadata__"), "format") : NULL;
    const char *noun = f && !strcmp(f, "parity-ckpt-export") ? "checkpoint export" : NULL;
    cJSON_Delete(j);
    return noun;
}

static const char *(*const recognisers[])(const head_t *) = {json_doc, chrome_trace, schedule_svg, matrix_md,
                                                              matrix_junit, ckpt_export};

const char *par_outfile_kind(const char *path)
{
    head_t h;
    struct stat sb;
    h.fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (h.fd < 0)
        return NULL;
    ssize_t r = fstat(h.fd, &sb) == 0 && S_ISREG(sb.st_mode) ? pread(h.fd, h.b, HEAD_MAX, 0) : -1;
    const char *noun = NULL;
    if (r > 0) {
        h.n = (size_t)r;
        h.b[h.n] = '\0';
        h.size = (int64_t)sb.st_size;
        for (size_t i = 0; !noun && i < sizeof recognisers / sizeof recognisers[0]; i++)
            noun = recognisers[i](&h);
    }
    close(h.fd);
    return noun;
}

/* ---- the rule ------------------------------------------------------------------- */

par_status par_outfile_replaceable(const char *path, int overwrite, const char *what)
{
    struct stat sb;
    if (!path || !*path)
        return par_err(PAR_EINVAL, "%s: the path is empty", what);
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? PAR_OK : par_err(PAR_EIO, "%s %s: cannot stat it: %s", what, path, strerror(errno));
    if (S_ISLNK(sb.st_mode))
        return par_err(PAR_EINVAL, "%s %s: is a symbolic link; parity does not write through or over links (give "
                                   "the real path or a new file)", what, path);
    if (!S_ISREG(sb.st_mode))
        return par_err(PAR_EINVAL, "%s %s: exists and is %s; not replacing it", what, path,
                       S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file");
    const char *noun = overwrite ? "file" : par_outfile_kind(path);
    if (noun || sb.st_size == 0)
        return PAR_OK;
    return par_err(PAR_EINVAL,
                   "%s %s: the file exists and was not written by parity (it is none of parity's outputs: no "
                   "parity \"format\" marker, trace, SVG or Markdown header); parity never overwrites what it did "
                   "not write: give a new path, or add --overwrite to replace it",
                   what, path);
}

/* ---- the recorded paths ------------------------------------------------------- */

#define GUARD_SLOTS 16

static struct {
    int used, overwrite;
    char path[PATH_MAX];
    char what[32];
} guards[GUARD_SLOTS];

par_status par_outfile_guard(const char *path, int overwrite, const char *what)
{
    par_status st = par_outfile_replaceable(path, overwrite, what);
    if (st || strlen(path) >= PATH_MAX)
        return st;
    for (int i = 0; i < GUARD_SLOTS; i++)
        if (guards[i].used && !strcmp(guards[i].path, path))
            return PAR_OK;
    for (int i = 0; i < GUARD_SLOTS; i++)
        if (!guards[i].used) {
            guards[i].used = 1;
            guards[i].overwrite = overwrite;
            snprintf(guards[i].path, sizeof guards[i].path, "%s", path);
            snprintf(guards[i].what, sizeof guards[i].what, "%s", what);
            return PAR_OK;
        }
    return par_err(PAR_EINVAL, "%s %s: more than %d file outputs", what, path, GUARD_SLOTS);
}

par_status par__outfile_commit_check(const char *path)
{
    for (int i = 0; i < GUARD_SLOTS; i++)
        if (guards[i].used && !strcmp(guards[i].path, path))
            return par_outfile_replaceable(path, guards[i].overwrite, guards[i].what);
    return PAR_OK;
}

void par__outfile_forget_all(void) { memset(guards, 0, sizeof guards); }
