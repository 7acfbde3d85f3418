/* cli/netgroups.c - emulated cost per group kind and tier (see netgroups.h). */
#include "cli/netgroups.h"

#include <string.h>

#include "core/alloc.h"

#define NG_MAX 32

typedef struct {
    char kind[40];
    double bytes[PAR_TIER_COUNT];   /* sent, all ranks */
    double t_sum[PAR_TIER_COUNT];   /* exposed comm seconds, all ranks */
    double t_rank[PAR_TIER_COUNT];  /* the current rank's */
    double t_max[PAR_TIER_COUNT];   /* the largest rank's */
} ng_row;

static int row_of(ng_row *rows, int *n, const char *group)
{
    char k[40];
    size_t len = strcspn(group, ":");
    if (len >= sizeof k)
        len = sizeof k - 1;
    memcpy(k, group, len);
    k[len] = 0;
    if (!k[0])
        strcpy(k, "world");
    for (int i = 0; i < *n; i++)
        if (!strcmp(rows[i].kind, k))
            return i;
    if (*n == NG_MAX)
        return -1;
    memset(&rows[*n], 0, sizeof rows[*n]);
    strcpy(rows[*n].kind, k);
    return (*n)++;
}

void par_net_group_summary(const par_netrun *r, FILE *f)
{
    ng_row *rows = par_calloc(NG_MAX, sizeof *rows, PAR_TAG_MISC);
    if (!rows)
        return;
    int n = 0, any = 0, N = par_netrun_nranks(r);
    for (int rank = 0; rank < N; rank++) {
        size_t ns = 0, lost = 0;
        const par_span *sp = par_netrun_spans(r, rank, &ns, &lost);
        for (int i = 0; i < n; i++)
            memset(rows[i].t_rank, 0, sizeof rows[i].t_rank);
        for (size_t i = 0; i < ns; i++) {
            const par_span *s = &sp[i];
            if (s->kind == PAR_SPAN_COMPUTE || s->kind == PAR_SPAN_IDLE || s->tier < 0 ||
                s->tier >= PAR_TIER_COUNT)
                continue;
            int k = row_of(rows, &n, s->group);
            if (k < 0)
                continue;
            any = 1;
            int p2p = !strcmp(s->op, "send") || !strcmp(s->op, "recv");
            if (s->kind == PAR_SPAN_XFER && !strcmp(s->op, "send"))
                rows[k].bytes[s->tier] += (double)s->bytes;
            if (s->kind == PAR_SPAN_COMM) {
                if (!p2p)
                    rows[k].bytes[s->tier] += (double)s->bytes;
                rows[k].t_sum[s->tier] += s->t1 - s->t0;
                rows[k].t_rank[s->tier] += s->t1 - s->t0;
            }
        }
        for (int i = 0; i < n; i++)
            for (int t = 0; t < PAR_TIER_COUNT; t++)
                if (rows[i].t_rank[t] > rows[i].t_max[t])
                    rows[i].t_max[t] = rows[i].t_rank[t];
    }
    if (any) {
        fprintf(f, "emulated communication by group and tier (bytes sent and exposed time, all ranks; "
                   "max = the busiest rank):\n");
        fprintf(f, "%-8s %-7s %14s %14s %14s\n", "group", "tier", "MB sent", "comm ms (sum)", "comm ms (max)");
        for (int i = 0; i < n; i++)
            for (int t = 0; t < PAR_TIER_COUNT; t++) {
                if (rows[i].bytes[t] == 0 && rows[i].t_sum[t] == 0)
                    continue;
                fprintf(f, "%-8s %-7s %14.3f %14.3f %14.3f\n", rows[i].kind, par_tier_name((par_tier)t),
                        rows[i].bytes[t] / 1e6, rows[i].t_sum[t] * 1e3, rows[i].t_max[t] * 1e3);
            }
    }
    par_free(rows);
}
