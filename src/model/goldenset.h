/* model/goldenset.h - the files of a golden set (GOLDEN.md) by name, and the
 * edits `parity matrix` makes to whole sets.  This module owns the
 * params.K / step.K naming: everything that builds, parses or renumbers
 * those names calls it.
 *
 *   params.K.safetensors   every parameter before update K (K >= 1: with
 *                          the optimizer state)
 *   step.K.safetensors     what step K computed (inputs, outputs,
 *                          activations, routing, gradients)
 *
 * The edits write a new set directory (it must not exist; its parent must)
 * whose files are hard links of the source files (copies where linking
 * fails) or rewritten tensors, with a manifest of their own.
 *
 * Untemplated: depends on core only.
 */
#ifndef PAR_MODEL_GOLDENSET_H
#define PAR_MODEL_GOLDENSET_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum {
    PAR_SETFILE_PARAMS = 0, /* params.K.safetensors */
    PAR_SETFILE_STEP = 1,   /* step.K.safetensors */
} par_setfile_kind;

/* "params.K.safetensors" or "step.K.safetensors" into buf[n]; returns the
 * length snprintf would write (>= n: cut). */
int par_setfile_name(par_setfile_kind kind, int64_t k, char *buf, size_t n);
/* 1 and (*kind, *k) when name is a set file's name (K decimal, no leading
 * zeros); 0 otherwise (outputs untouched). */
int par_setfile_parse(const char *name, par_setfile_kind *kind, int64_t *k);
/* Dataflow order of two set files: params.K, then step.K, then params.K+1
 * (what step K read, what it computed, what its update wrote). */
int par_setfile_order(par_setfile_kind ka, int64_t a, par_setfile_kind kb, int64_t b);

/* Which set files an edit keeps (1: keep). */
typedef int (*par_setfile_pick)(par_setfile_kind kind, int64_t k, void *ud);

/* dst = the files of src that pick keeps (hard links), with src's manifest
 * restricted to them (the same sha256: a comparison verifies them). */
par_status par_goldenset_select(const char *src, const char *dst, par_setfile_pick pick, void *ud);

/* dst = first's params.0..split and step.0..split-1, then resumed's
 * step.split.. and params.split+1.. (a resumed run's files carry global
 * step numbers, its manifest "first_step": split; its params.split, the
 * loaded state, is left out), with first's manifest over resumed's
 * "steps"; its "layout" gets resumed's as "after_checkpoint" (with
 * "from_step": split).  PAR_EINVAL when first does not end at split or
 * resumed does not start there. */
par_status par_goldenset_merge(const char *first, const char *resumed, int64_t split, const char *dst);

/* dst = src with every F32 tensor widened exactly to F64, metadata kept
 * plus "widened_from": "F32", and src's manifest with the new hashes. */
par_status par_goldenset_widen(const char *src, const char *dst);

/* Writes the batches of src's step.0..steps-1 (input.tokens and
 * input.segments, I32 [B,S] each) stacked into a data file (I32 [steps*B,
 * S] each, `parity run --data`'s format) at path; metadata "source" = src. */
par_status par_goldenset_write_batches(const char *src, int64_t steps, const char *path);

#endif
