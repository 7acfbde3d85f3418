/* tests/comm/comm_test.h - worlds to run every comm test on. */
#ifndef PAR_TESTS_COMM_TEST_H
#define PAR_TESTS_COMM_TEST_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "backends/registry.h"
#include "comm/comm.h"
#include "core/alloc.h"

typedef struct {
    const char *backend;
    int n;
} world_case;

/* self has one rank; threads runs the sizes of the brief; fiber the same
 * sizes and one world of more ranks than threads would want. */
static const world_case WORLDS[] = {
    {"self", 1},    {"threads", 1},  {"threads", 2},  {"threads", 3},
    {"threads", 5}, {"threads", 8},  {"threads", 16}, {"threads", 64},
    {"fiber", 1},   {"fiber", 2},    {"fiber", 3},    {"fiber", 5},
    {"fiber", 8},   {"fiber", 16},   {"fiber", 64},   {"fiber", 256},
};
#define NWORLDS (sizeof WORLDS / sizeof WORLDS[0])

/* Runs fn on the world and returns its status. */
static inline par_status run_world(const char *backend, int n, par_world_fn fn, void *arg,
                                   double timeout_s)
{
    const par_backend *be = NULL;
    par_status st = par_backend_get(backend, &be);
    if (st != PAR_OK)
        return st;
    par_world_opts o = {.timeout_s = timeout_s};
    return par_world_run(be, n, fn, arg, &o);
}

/* Runs fn on every world of WORLDS, asserting success. */
#define RUN_ALL_WORLDS(fn, arg)                                                              \
    do {                                                                                     \
        for (size_t wi_ = 0; wi_ < NWORLDS; wi_++) {                                         \
            par_status st_ = run_world(WORLDS[wi_].backend, WORLDS[wi_].n, fn, arg, 20.0);   \
            cr_assert_eq(st_, PAR_OK, "%s on %s x %d: %s (%s)", #fn, WORLDS[wi_].backend,     \
                         WORLDS[wi_].n, par_status_str(st_), par_last_error());              \
            cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0, "%s on %s x %d leaks comm memory", \
                         #fn, WORLDS[wi_].backend, WORLDS[wi_].n);                           \
        }                                                                                    \
    } while (0)

/* In rank functions (not the test thread): fail the rank with a message. */
#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            char m_[400];                                                                    \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                            \
            return par_err(PAR_ECHECK, "%s:%d: check failed: %s: %s", __FILE__, __LINE__,    \
                           #cond, m_);                                                       \
        }                                                                                    \
    } while (0)

#define TRY(call)                                                                            \
    do {                                                                                     \
        par_status s_ = (call);                                                              \
        if (s_ != PAR_OK)                                                                    \
            return s_;                                                                       \
    } while (0)

#endif
