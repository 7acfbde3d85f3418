/* model/bounds.h - tolerances derived per tensor (issue 32; docs/recipes.md
 * "Derived bounds", the file's format in docs/formats.md "bounds.json").
 *
 * A recipe golden A (parity golden --recipe R) is the reference of a GPU
 * run under that recipe.  How far such a run may lie from A is measured,
 * not guessed: the same step computed by legal variants of A (the same
 * recipe in another working precision or summation order: --precision f32,
 * --bitwise, another BLAS...) gives, per tensor, a deviation ||V - A||_2;
 * the bound is factor * the largest of them, at least floor_rel * ||A||_2
 * (the f32 unit roundoff: a run in f32 cannot be closer).  The f64 golden
 * without the recipe (the "exact" set N) gives each tensor's recipe effect
 * ||N - A||_2, printed beside the bound: a bound near the recipe effect
 * cannot tell the recipe from none.
 *
 * Kinds of bound:
 *   norm    float tensors: ||B - A||_2 <= bound (non-finite positions equal);
 *   margin  router.<block>.idx of a score-routed block: bound = eps, the
 *           router scores' error bound (factor * the largest |score|
 *           difference of a variant, from the sets' scores.K files): a
 *           token whose K-th and (K+1)-th selection values in A's
 *           scores.K are closer than eps may pick other experts; any other
 *           token whose picks differ is an error;
 *   load    router.<block>.load: the loads the block's idx moves, exactly;
 *   rows    attn.<block>.selected: at most `bound` rows differ (besides
 *           rows that differ only among A's exact ties, ties.K);
 *   exact   other integer tensors (input.*, hash-routed idx): equal.
 *
 * Untemplated: depends on core only.
 */
#ifndef PAR_MODEL_BOUNDS_H
#define PAR_MODEL_BOUNDS_H

#include <stddef.h>
#include <stdint.h>

#include "core/manifest.h"
#include "core/status.h"

typedef enum {
    PAR_BOUND_NORM = 0,
    PAR_BOUND_MARGIN,
    PAR_BOUND_LOAD,
    PAR_BOUND_ROWS,
    PAR_BOUND_EXACT,
} par_bound_kind;

typedef struct {
    char *file, *tensor;    /* "step.0.safetensors", "act.layers.1" */
    par_bound_kind kind;
    double bound;           /* norm: on ||B-A||_2; margin: eps on the scores; rows: rows allowed */
    double norm;            /* norm: ||A||_2; margin: max |score of A|; else 0 */
    double deviation;       /* the deciding variant's ||V-A||_2, max |dscore| or rows (0 for the floor) */
    int variant;            /* index of that variant; -1: the floor decided */
    double recipe_effect;   /* ||N-A||_2 (norm), rows that differ from N (margin, rows); -1 unknown */
    char *source;           /* where the bound came from, in words */
} par_bound;

typedef struct par_bounds par_bounds;

/* Derives the bounds of golden set `golden` from the exact set `exact`
 * (NULL: no recipe effect) and nvar variant sets (>= 1) with factor > 0.
 * Every set must be the same run (model and train keys equal, the recipe
 * and mode aside); the variants under the golden's recipe, the exact set
 * under none.  Margins need scores.K (parity golden --router-scores) in
 * the golden and in at least one variant.  *out set only on success. */
par_status par_bounds_derive(const char *golden, const char *exact, const char *const *variants, int nvar,
                             double factor, par_bounds **out);
/* Reads and checks a bounds file (hostile input: every field checked,
 * one message naming the field); *out set only on success. */
par_status par_bounds_read(const char *path, par_bounds **out);
/* Writes b as JSON (atomically). */
par_status par_bounds_write(const par_bounds *b, const char *path);
void par_bounds_free(par_bounds *b); /* NULL is fine */

/* The bound of (file, tensor), or NULL. */
const par_bound *par_bounds_find(const par_bounds *b, const char *file, const char *tensor);
int par_bounds_count(const par_bounds *b);
const par_bound *par_bounds_at(const par_bounds *b, int i);
double par_bounds_factor(const par_bounds *b);
const char *par_bounds_label(const par_bounds *b); /* the path read, or the golden derived from */
/* PAR_OK when every file the bounds were derived from is in m (a golden
 * set's manifest) with the same sha256; PAR_EINVAL naming the first that
 * is not (the bounds belong to another golden). */
par_status par_bounds_check_golden(const par_bounds *b, const par_manifest *m, const char *dir);
const char *par_bound_kind_name(par_bound_kind k);
/* router.<block>.idx -> router.<block>.score in buf (the scores.K tensor a
 * margin is read from); 0 when name is no router idx or buf is too small. */
int par_bounds_score_name(const char *idx_name, char *buf, size_t n);

#endif
