/* tests/parallel/reduce/test_reduce.c - the one cross-rank sum (parallel/
 * reduce_sum.h): fields of several types and zero padding packed and
 * summed in rank order, the reduce-scatter form, a group of one, and the
 * rules it refuses; on the threads backend. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "backends/registry.h"
#include "core/alloc.h"
#include "core/status.h"
#include "parallel/reduce/reduce_sum.h"

#define N 3

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            char m_[200];                                                                          \
            snprintf(m_, sizeof m_, __VA_ARGS__);                                                  \
            return par_err(PAR_ECHECK, "%s:%d: %s: %s", __FILE__, __LINE__, #cond, m_);            \
        }                                                                                          \
    } while (0)

/* Per rank: a value whose rank-order sum ((a0 + a1) + a2) differs from
 * other orders in double, so the test sees the order. */
static double big(int r) { return r == 0 ? 1e16 : r == 1 ? 1.0 : -1e16; }

static par_status all_reduce_rank(par_comm *w, void *arg)
{
    (void)arg;
    int r = par_comm_rank(w);
    int64_t cnt[3] = {r, 10 * r, 100 + r};
    double d[2] = {big(r), 0.5 * r};
    float f[1] = {(float)r + 0.25f};
    par_field fl[5] = {PAR_FIELD(cnt, 2, PAR_C_I64), PAR_FIELD(d, 2, PAR_C_F64), PAR_FIELD(NULL, 4, PAR_C_F64),
                       PAR_FIELD(f, 1, PAR_C_F32), PAR_FIELD(cnt + 2, 1, PAR_C_I64)};
    CHECK(par_fields_pack(NULL, fl, 5, PAR_C_F64, 0) == 6, "two doubles and four of padding");
    CHECK(par_fields_pack(NULL, fl, 5, PAR_C_I64, 0) == 3, "three int64 in two fields");
    par_status s = par_reduce_fields(w, fl, 5, NULL);
    if (s)
        return s;
    volatile double want = (big(0) + big(1)) + big(2); /* rank order: 0, not 1 */
    CHECK(cnt[0] == 0 + 1 + 2 && cnt[1] == 30 && cnt[2] == 303, "int64 sums %lld %lld %lld", (long long)cnt[0],
          (long long)cnt[1], (long long)cnt[2]);
    CHECK(!memcmp(&d[0], (const void *)&want, sizeof want), "rank-order sum %.17g, want %.17g", d[0], want);
    CHECK(d[1] == 1.5 && f[0] == 3.75f, "f64 %g f32 %g", d[1], (double)f[0]);
    return PAR_OK;
}

Test(reduce, fields_of_every_type_sum_in_rank_order)
{
    par_world_opts o = {.timeout_s = 30.0};
    cr_assert_eq(par_world_run(par_backend_find("threads"), N, all_reduce_rank, NULL, &o), PAR_OK, "%s",
                 par_last_error());
    cr_expect_eq(par_alloc_live(PAR_TAG_COMM), 0);
}

static par_status scatter_rank(par_comm *w, void *arg)
{
    (void)arg;
    int r = par_comm_rank(w);
    double a[4], out[2] = {-1, -1};
    for (int i = 0; i < 4; i++)
        a[i] = 100.0 * r + i;
    /* 4 + 2 zeros = 6 elements, blocks of 2: rank q gets elements 2q, 2q+1 */
    par_field fl[2] = {PAR_FIELD(a, 4, PAR_C_F64), PAR_FIELD(NULL, 2, PAR_C_F64)};
    par_status s = par_reduce_fields(w, fl, 2, out);
    if (s)
        return s;
    double want[6] = {300, 303, 306, 309, 0, 0};
    CHECK(out[0] == want[2 * r] && out[1] == want[2 * r + 1], "rank %d got %g %g", r, out[0], out[1]);
    CHECK(a[0] == 100.0 * r, "the fields stay as they were");
    par_field mixed[2] = {PAR_FIELD(a, 3, PAR_C_F64), PAR_FIELD(a, 3, PAR_C_I64)};
    CHECK(par_reduce_fields(w, mixed, 2, out) == PAR_EINVAL, "a scatter of two types");
    CHECK(par_reduce_fields(w, fl, 1, out) == PAR_EINVAL, "4 elements in 3 blocks");
    return PAR_OK;
}

Test(reduce, scatter_hands_each_member_its_block)
{
    par_err_set_quiet(1);
    par_world_opts o = {.timeout_s = 30.0};
    par_status s = par_world_run(par_backend_find("threads"), N, scatter_rank, NULL, &o);
    par_err_set_quiet(0);
    cr_assert_eq(s, PAR_OK, "%s", par_last_error());
}

Test(reduce, one_rank_sums_nothing)
{
    int64_t v[2] = {7, 8}, out[2] = {0, 0};
    par_field f = PAR_FIELD(v, 2, PAR_C_I64);
    cr_expect_eq(par_reduce_fields(NULL, &f, 1, NULL), PAR_OK);
    cr_expect(v[0] == 7 && v[1] == 8);
    cr_expect_eq(par_reduce_fields(NULL, &f, 1, out), PAR_OK);
    cr_expect(out[0] == 7 && out[1] == 8, "the one block is the fields");
}

Test(reduce, pack_and_unpack_round_trip)
{
    int64_t a[2] = {1, 2}, b[3] = {3, 4, 5}, buf[7];
    par_field f[3] = {PAR_FIELD(a, 2, PAR_C_I64), PAR_FIELD(NULL, 2, PAR_C_I64), PAR_FIELD(b, 3, PAR_C_I64)};
    cr_assert_eq(par_fields_pack(buf, f, 3, PAR_C_I64, 0), 7);
    const int64_t want[7] = {1, 2, 0, 0, 3, 4, 5};
    cr_expect_eq(memcmp(buf, want, sizeof want), 0);
    for (int i = 0; i < 7; i++)
        buf[i] += 10;
    cr_assert_eq(par_fields_pack(buf, f, 3, PAR_C_I64, 1), 7);
    cr_expect(a[0] == 11 && a[1] == 12 && b[0] == 13 && b[2] == 15, "unpacked into the fields, padding skipped");
    cr_expect_eq(par_fields_pack(NULL, f, 3, PAR_C_F64, 0), 0, "no field of another type");
}
