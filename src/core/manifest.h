/* core/manifest.h - manifest.json of a golden set (GOLDEN.md).
 *
 * Keys: "format": "parity-golden", "version": 1, "generator": {name,
 * version}, "model", "train", "layout", "data" (objects the caller fills;
 * kept here as cJSON subtrees), "precision" (string), "steps" (integer:
 * the run's total step count, Megatron's --train-iters), "first_step"
 * (integer, 0 <= first_step <= steps; absent reads as 0: the step a
 * resumed run started at, so its files are params.first_step ..
 * params.steps and step.first_step .. step.steps-1, GOLDEN.md),
 * "files": {file name: sha256 hex}, and optionally "tolerances":
 * {tensor name: {"rtol", "atol", "reason"}} (per-tensor overrides of the
 * comparison policy; "reason" is a required non-empty string).
 *
 * par_manifest_read validates the structure and the sha256 of every listed
 * file.  par_manifest_write hashes the regular files of the directory and
 * writes manifest.json atomically.
 */
#ifndef PAR_CORE_MANIFEST_H
#define PAR_CORE_MANIFEST_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "core/sha256.h"
#include "core/status.h"

#define PAR_MANIFEST_FORMAT "parity-golden"
#define PAR_MANIFEST_VERSION 1
#define PAR_MANIFEST_NAME "manifest.json"

typedef struct {
    char *tensor; /* tensor name the override applies to (in every file) */
    double rtol, atol;
    char *reason;
} par_tol_override;

typedef struct {
    char *name;
    char sha256[PAR_SHA256_HEX]; /* lowercase hex */
} par_manifest_file;

typedef struct {
    int64_t version;
    char *generator_name;      /* par_malloc'd (tag IO) */
    char *generator_version;
    cJSON *model, *train, *layout, *data; /* owned; NULL is written as {} */
    char *precision;           /* "f64", "f32", "bf16", ... */
    int64_t steps;
    int64_t first_step;        /* 0 unless the set is a resumed run's */
    int nfiles;
    par_manifest_file *files;  /* sorted by name */
    int ntol;
    par_tol_override *tol;     /* in the order read/added */
} par_manifest;

/* Zeroes m and sets version = PAR_MANIFEST_VERSION. */
void par_manifest_init(par_manifest *m);
/* Frees everything m owns (cJSON subtrees included) and zeroes it. */
void par_manifest_free(par_manifest *m);

par_status par_manifest_set_generator(par_manifest *m, const char *name, const char *version);
par_status par_manifest_set_precision(par_manifest *m, const char *precision);
/* Adds a per-tensor override; PAR_EINVAL for a negative/non-finite
 * tolerance or an empty reason, or a tensor named twice. */
par_status par_manifest_add_tolerance(par_manifest *m, const char *tensor, double rtol, double atol,
                                      const char *reason);
/* The override for a tensor name, or NULL. */
const par_tol_override *par_manifest_tolerance(const par_manifest *m, const char *tensor);
/* The sha256 listed for a file, or NULL. */
const char *par_manifest_file_sha(const par_manifest *m, const char *name);

/* Parses and validates manifest text (no file hashing).  `label` names it in
 * messages.  PAR_EFORMAT for a wrong structure, PAR_EUNSUPPORTED for a
 * version newer than this build reads.  *out set only on success. */
par_status par_manifest_parse(const char *text, size_t len, const char *label, par_manifest *out);
/* Reads DIR/manifest.json, parses it and checks every listed file's sha256
 * (par_manifest_verify). */
par_status par_manifest_read(const char *dir, par_manifest *out);
/* par_manifest_read without the hashing: the structure is checked, the files'
 * sha256 are not (a set this process has just written itself and hashed: the
 * matrix's references and cells, src/matrix). */
par_status par_manifest_read_unverified(const char *dir, par_manifest *out);
/* Checks the sha256 of every file m lists, inside dir.  PAR_EMISMATCH with
 * both hashes named, PAR_ENOTFOUND for a missing file. */
par_status par_manifest_verify(const par_manifest *m, const char *dir);
/* Replaces m's file list with the sha256 of every regular file of dir (but
 * manifest.json and names starting with '.'), then writes dir/manifest.json
 * atomically. */
par_status par_manifest_write(par_manifest *m, const char *dir);
/* The manifest as a new cJSON tree (the caller deletes it). */
cJSON *par_manifest_to_json(const par_manifest *m);

#endif
