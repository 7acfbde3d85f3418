/* parallel/hook/mbstate.c - the per-microbatch state of a hook (see
 * parallel/hook/mbstate.h). */
#include "parallel/hook/mbstate.h"

#include <string.h>

#include "core/alloc.h"

par_status par_mbstate_init(par_mbstate *s, const char *who, int n_mb, int nb, const uint8_t *held, size_t size,
                            void (*drop)(void *state))
{
    if (n_mb < 1 || nb < 0)
        return par_err(PAR_EINVAL, "%s: a hook needs at least one microbatch (got %d) and blocks (got %d)", who,
                       n_mb, nb);
    par_mbstate t = {.who = who, .n_mb = n_mb, .nb = nb, .size = size, .drop = drop};
    t.row = par_malloc((size_t)(nb > 0 ? nb : 1) * sizeof *t.row, PAR_TAG_MODEL);
    for (int b = 0; t.row && b < nb; b++) /* rows for the held blocks only */
        t.row[b] = !held || held[b] ? t.n_held++ : -1;
    t.st = t.row ? par_calloc((size_t)n_mb * (size_t)(t.n_held > 0 ? t.n_held : 1), sizeof *t.st, PAR_TAG_MODEL)
                 : NULL;
    if (!t.st) {
        par_free(t.row);
        return par_err(PAR_ENOMEM, "%s: out of memory for %d x %d state pointers", who, n_mb, nb);
    }
    *s = t;
    return PAR_OK;
}

/* Where the state of (x's microbatch, b) lives, NULL out of range. */
static void **cell(const par_mbstate *s, const par_mbctx *x, int b)
{
    const int mb = x ? x->mb : 0;
    if (!s->st || mb < 0 || mb >= s->n_mb || b < 0 || b >= s->nb || s->row[b] < 0)
        return NULL;
    return &s->st[(size_t)mb * (size_t)s->n_held + (size_t)s->row[b]];
}

static void cell_drop(const par_mbstate *s, void **c)
{
    if (*c && s->drop)
        s->drop(*c);
    par_free(*c);
    *c = NULL;
}

void *par_mbstate_get(const par_mbstate *s, const par_mbctx *x, int b)
{
    void **c = cell(s, x, b);
    return c ? *c : NULL;
}

par_status par_mbstate_new(par_mbstate *s, const par_mbctx *x, int b, void **out)
{
    void **c = cell(s, x, b);
    if (!c)
        return par_err(PAR_EINVAL, "%s: block %d of microbatch %d does not fit the hook (%d microbatches, %d held "
                       "blocks of %d)", s->who, b, x ? x->mb : 0, s->n_mb, s->n_held, s->nb);
    cell_drop(s, c);
    if (!(*c = par_calloc(1, s->size, PAR_TAG_ACT)))
        return par_err(PAR_ENOMEM, "%s: block %d: out of memory for its state", s->who, b);
    *out = *c;
    return PAR_OK;
}

void par_mbstate_drop(par_mbstate *s, const par_mbctx *x, int b)
{
    void **c = cell(s, x, b);
    if (c)
        cell_drop(s, c);
}

void par_mbstate_drop_all(par_mbstate *s)
{
    for (size_t i = 0; s->st && i < (size_t)s->n_mb * (size_t)s->n_held; i++)
        cell_drop(s, &s->st[i]);
}

par_status par_mbstate_resize(par_mbstate *s, int n_mb)
{
    if (n_mb < 1)
        return par_err(PAR_EINVAL, "%s: a hook needs at least one microbatch (got %d)", s->who, n_mb);
    void **st = par_calloc((size_t)n_mb * (size_t)(s->n_held > 0 ? s->n_held : 1), sizeof *st, PAR_TAG_MODEL);
    if (!st)
        return par_err(PAR_ENOMEM, "%s: out of memory for %d x %d state pointers", s->who, n_mb, s->nb);
    par_mbstate_drop_all(s);
    par_free(s->st);
    s->st = st;
    s->n_mb = n_mb;
    return PAR_OK;
}

void par_mbstate_free(par_mbstate *s)
{
    par_mbstate_drop_all(s);
    par_free(s->st);
    par_free(s->row);
    memset(s, 0, sizeof *s);
}

par_status par_mbstate_hook_new(void **out, size_t size, const char *who, int n_mb, int nb, const uint8_t *held,
                                size_t state_size, void (*drop)(void *state))
{
    par_mbstate *h = size >= sizeof *h ? par_calloc(1, size, PAR_TAG_MODEL) : NULL;
    if (!h)
        return par_err(PAR_ENOMEM, "%s: out of memory", who);
    par_status s = par_mbstate_init(h, who, n_mb, nb, held, state_size, drop);
    if (s) {
        par_free(h);
        return s;
    }
    *out = h;
    return PAR_OK;
}

void par_mbstate_hook_free(void *hook)
{
    if (!hook)
        return;
    par_mbstate_free(hook);
    par_free(hook);
}
