/* parallel/hook/mbstate.h - the per-microbatch state of a hook, written
 * once for every hook (tp/tp_attn_hook.c, cp/cp_hook.c, cp/cptp_hook.c,
 * moe/etp_hook.c, moe/ep.c, tp/tp_vocab_hook.c).  docs/parallel.md, "Hooks".
 *
 * A hook keeps what a model piece's forward hands to its backward and
 * weight pass: one state per (microbatch, block), the microbatch being the
 * call's par_mbctx.mb (model/model.h; a NULL context is microbatch 0) and
 * the block one the hook handles (the `held` blocks: a pipeline rank's
 * stages).  The table is one pointer per (microbatch, held block); a state
 * is allocated (zeroed) by the forward and freed by the last pass that
 * reads it (par_mbstate_drop), so a rank holds the states of the
 * microbatches in flight through its blocks, never one per microbatch of
 * the step.  Untemplated: a state is opaque bytes of `size`, freed through
 * the hook's `drop` (what the state holds; the state itself is freed here).
 */
#ifndef PAR_PARALLEL_HOOK_MBSTATE_H
#define PAR_PARALLEL_HOOK_MBSTATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "model/mbctx.h"

typedef struct {
    const char *who;      /* the hook's name, for messages ("tp attention") */
    int n_mb, nb, n_held; /* microbatches, blocks, held blocks */
    int *row;             /* [nb] block b's row of st, -1: not held */
    void **st;            /* [n_mb, n_held] the state of (microbatch, held block) in flight, or NULL */
    size_t size;          /* bytes of one state */
    void (*drop)(void *state); /* frees what a state holds (NULL: nothing) */
} par_mbstate;

/* A table for n_mb microbatches of nb blocks; held [nb] (NULL: every
 * block) marks the blocks that get state.  PAR_EINVAL naming `who` when
 * n_mb < 1.  *s is set only on success. */
par_status par_mbstate_init(par_mbstate *s, const char *who, int n_mb, int nb, const uint8_t *held, size_t size,
                            void (*drop)(void *state));
/* The state of (x's microbatch, b), NULL when it has none or the key is
 * out of range. */
void *par_mbstate_get(const par_mbstate *s, const par_mbctx *x, int b);
/* A new zeroed state for (x's microbatch, b) into *out, the old one (a
 * forward again without its weight pass: a failed step) dropped first.
 * PAR_EINVAL when the key is out of range, PAR_ENOMEM; messages name who. */
par_status par_mbstate_new(par_mbstate *s, const par_mbctx *x, int b, void **out);
/* Frees the state of (x's microbatch, b) (none: nothing). */
void par_mbstate_drop(par_mbstate *s, const par_mbctx *x, int b);
/* Frees every state (a change of the hook's mode drops the states in flight). */
void par_mbstate_drop_all(par_mbstate *s);
/* The table for n_mb microbatches, every state dropped (the held blocks
 * stay); PAR_EINVAL, PAR_ENOMEM (the old table kept). */
par_status par_mbstate_resize(par_mbstate *s, int n_mb);
/* Frees the states and the table (a zeroed or freed table is fine). */
void par_mbstate_free(par_mbstate *s);

/* A hook object of `size` bytes (zeroed) whose FIRST member is its
 * par_mbstate, the table made as par_mbstate_init; *out set only on
 * success.  par_mbstate_hook_free frees the states, the table and the
 * object (NULL is fine): a hook set's free (parallel/hook/hookset.h). */
par_status par_mbstate_hook_new(void **out, size_t size, const char *who, int n_mb, int nb, const uint8_t *held,
                                size_t state_size, void (*drop)(void *state));
void par_mbstate_hook_free(void *hook);

#endif
