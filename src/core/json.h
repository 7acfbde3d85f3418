/* core/json.h - small helpers over cJSON: exact integers, typed getters,
 * whole-file read and atomic write.  cJSON trees use cJSON's own allocator
 * (free with cJSON_Delete); strings returned here point into the tree. */
#ifndef PAR_CORE_JSON_H
#define PAR_CORE_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Largest integer a JSON number is trusted to hold exactly (2^53). */
#define PAR_JSON_INT_MAX 9007199254740992.0

/* 1 and *out set when j is a number holding an integer in (-2^53, 2^53);
 * else 0. */
int par_json_as_int(const cJSON *j, int64_t *out);

/* Parses len bytes (need not be NUL-terminated).  Trailing bytes other than
 * JSON whitespace are an error.  `label` (a file name) starts the message.
 * PAR_EFORMAT with the byte offset of the fault. */
par_status par_json_parse(const char *text, size_t len, const char *label, cJSON **out);
/* Reads and parses a whole file. */
par_status par_json_read_file(const char *path, cJSON **out);
/* Writes root pretty-printed plus a newline, atomically. */
par_status par_json_write_file(const char *path, const cJSON *root);

/* Typed member lookups (case-sensitive).  Return NULL / 0 when the key is
 * absent or has another type. */
const cJSON *par_json_obj(const cJSON *obj, const char *key);   /* object member */
const char *par_json_str(const cJSON *obj, const char *key);    /* string member */
int par_json_int(const cJSON *obj, const char *key, int64_t *out);
int par_json_num(const cJSON *obj, const char *key, double *out);

#endif
