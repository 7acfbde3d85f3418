/* model/model-impl.h - helpers shared by the model's templated sources
 * (block.c, head.c); not part of the model's interface. */
#ifndef PAR_MODEL_MODEL_IMPL_H
#define PAR_MODEL_MODEL_IMPL_H

#include "core/alloc.h"
#include "model/model.h"

/* Parameter / gradient pointer of table entry idx (NULL when not held);
 * expects a model `M` in scope. */
#define P(idx) PAR_FN(par_model_ptr)(M, M->params, (idx))
#define G(idx) PAR_FN(par_model_ptr)(M, M->grads, (idx))

/* Arena memory of n bytes (64-aligned; at least 64), zeroed when asked. */
static inline void *aalloc(par_arena *ar, size_t n, int zero)
{
    if (n == 0)
        n = 64;
    return zero ? par_arena_calloc(ar, n, 64) : par_arena_alloc(ar, n, 64);
}

/* `count` reals from the arena `ar` in scope, or `goto fail_oom`. */
#define AREAL(ptr, count, zero)                                                                    \
    do {                                                                                           \
        (ptr) = aalloc(ar, (size_t)(count) * sizeof(par_real), (zero));                            \
        if (!(ptr))                                                                                \
            goto fail_oom;                                                                         \
    } while (0)

#endif
