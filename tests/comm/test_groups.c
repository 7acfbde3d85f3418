/* Groups: split by color and key, undefined colors, a 2D grid split into
 * rows and columns (both used), nested splits, names and world ranks. */
#include "comm_test.h"

static par_status split_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    /* two colors by parity; key reverses the order */
    par_comm *half = NULL;
    TRY(par_comm_split(c, r % 2, p - r, &half));
    CHECK(half, "rank %d got no group", r);
    int nh = (p + 1 - r % 2) / 2; /* members of my color */
    CHECK(par_comm_size(half) == nh, "size %d, want %d", par_comm_size(half), nh);
    /* reversed: the highest parent rank of my color is rank 0 */
    int want_rank = nh - 1 - r / 2;
    CHECK(par_comm_rank(half) == want_rank, "rank %d in half, want %d", par_comm_rank(half),
          want_rank);
    for (int i = 0; i < nh; i++)
        CHECK(par_comm_world_rank(half, i) == (r % 2) + 2 * (nh - 1 - i), "world rank of %d", i);
    CHECK(par_comm_world_rank(half, nh) == -1, "out of range");
    /* ties on key: ordered by parent rank */
    par_comm *same = NULL;
    TRY(par_comm_split(c, 0, 42, &same));
    CHECK(par_comm_rank(same) == r && par_comm_size(same) == p, "tie order");
    /* undefined color: no group, others still split */
    par_comm *some = NULL;
    TRY(par_comm_split(c, r == 0 ? PAR_UNDEFINED : 1, 0, &some));
    CHECK(r == 0 ? some == NULL : par_comm_size(some) == p - 1, "undefined color");
    /* use them */
    int64_t one = 1, sum = 0;
    TRY(par_allreduce(half, &one, &sum, 1, PAR_C_I64, PAR_OP_SUM));
    CHECK(sum == nh, "sum over half %lld", (long long)sum);
    if (some) {
        TRY(par_allreduce(some, &one, &sum, 1, PAR_C_I64, PAR_OP_SUM));
        CHECK(sum == p - 1, "sum over some");
    }
    CHECK(strcmp(par_comm_name(half), par_comm_name(same)) != 0, "names differ: %s",
          par_comm_name(half));
    par_comm_set_name(same, "everyone");
    CHECK(!strcmp(par_comm_name(same), "everyone"), "set name");
    par_comm_free(half);
    par_comm_free(some);
    /* `same` is left for par_world_run to release */
    par_comm_free(c); /* the world: ignored */
    TRY(par_barrier(c));
    return PAR_OK;
}

Test(groups, split_color_key_undefined)
{
    RUN_ALL_WORLDS(split_fn, NULL);
}

/* A rows x cols grid (row-major world ranks): all-reduce over rows, then
 * over columns, must equal the serial sum over everything; row and column
 * collectives interleave. */
static par_status grid_fn(par_comm *c, void *arg)
{
    (void)arg;
    int r = par_comm_rank(c), p = par_comm_size(c);
    int cols = p % 4 == 0 ? 4 : p % 2 == 0 ? 2 : 1, rows = p / cols;
    int row = r / cols, col = r % cols;
    par_comm *rowc = NULL, *colc = NULL;
    TRY(par_comm_split(c, row, col, &rowc));
    TRY(par_comm_split(c, col, row, &colc));
    CHECK(par_comm_size(rowc) == cols && par_comm_rank(rowc) == col, "row group");
    CHECK(par_comm_size(colc) == rows && par_comm_rank(colc) == row, "col group");
    double x[3] = {r, 1.0 / (r + 1), r * 0.5}, y[3], z[3];
    TRY(par_allreduce(rowc, x, y, 3, PAR_C_F64, PAR_OP_SUM));
    TRY(par_allreduce(colc, y, z, 3, PAR_C_F64, PAR_OP_SUM));
    /* reference: rows summed in column order, then over rows in order */
    double ref[3] = {0};
    for (int rr = 0; rr < rows; rr++) {
        double part[3] = {0};
        for (int cc = 0; cc < cols; cc++) {
            int q = rr * cols + cc;
            double v[3] = {q, 1.0 / (q + 1), q * 0.5};
            for (int k = 0; k < 3; k++)
                part[k] = cc ? part[k] + v[k] : v[k];
        }
        for (int k = 0; k < 3; k++)
            ref[k] = rr ? ref[k] + part[k] : part[k];
    }
    CHECK(!memcmp(z, ref, sizeof z), "grid sum %.17g vs %.17g", z[1], ref[1]);
    /* column all-gather of row ranks, row broadcast from the last column */
    int *ranks = malloc((size_t)rows * sizeof *ranks);
    int32_t me = r;
    TRY(par_allgather(colc, &me, ranks, 1, PAR_C_I32));
    for (int rr = 0; rr < rows; rr++)
        CHECK(ranks[rr] == rr * cols + col, "column gather");
    free(ranks);
    int32_t b = r;
    TRY(par_bcast(rowc, &b, 1, PAR_C_I32, cols - 1));
    CHECK(b == row * cols + cols - 1, "row bcast");
    /* nested: split the row again by even/odd column */
    par_comm *sub = NULL;
    TRY(par_comm_split(rowc, col % 2, 0, &sub));
    CHECK(par_comm_world_rank(sub, 0) == row * cols + col % 2, "nested world rank");
    TRY(par_barrier(sub));
    par_comm_free(sub);
    par_comm_free(rowc);
    par_comm_free(colc);
    return PAR_OK;
}

Test(groups, grid_rows_and_columns)
{
    RUN_ALL_WORLDS(grid_fn, NULL);
}
