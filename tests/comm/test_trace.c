/* tests/comm/test_trace.c - Chrome trace JSON and the per-rank summary. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "comm/clock.h"
#include "comm/trace.h"
#include "comm_test.h"
#include "core/counters.h"
#include "core/fileio.h"
#include "core/json.h"

static par_status program(par_comm *w, void *arg)
{
    (void)arg;
    int me = par_comm_rank(w), p = par_comm_size(w);
    double v[256] = {0};
    par_count_flops(1000000000u * (uint64_t)(me + 1));
    TRY(par_allreduce(w, v, v, 256, PAR_C_F64, PAR_OP_SUM));
    par_comm *g = NULL;
    TRY(par_comm_split(w, 0, me, &g));
    par_comm_set_name(g, "ep \"quoted\"");
    TRY(par_alltoall(g, v, v + 128, 128 / p, PAR_C_F64));
    par_comm_free(g);
    if (me < 2 && p > 1) {
        par_request *rq = NULL;
        if (me == 0)
            TRY(par_isend(w, v, 100, PAR_C_F64, 1, 9, &rq));
        else
            TRY(par_irecv(w, v, 100, PAR_C_F64, 0, 9, &rq));
        par_count_flops(500000000u);
        TRY(par_wait(&rq));
    }
    return par_barrier(w);
}

static par_netrun *run(int p, int record)
{
    par_netmodel m;
    cr_assert_eq(par_netmodel_preset("reference", &m), PAR_OK);
    m.gpus_per_node = 2;
    par_netrun *net = NULL;
    cr_assert_eq(par_netrun_create(&m, p, record, &net), PAR_OK);
    par_world_opts o = {.timeout_s = 20, .net = net};
    cr_assert_eq(par_world_run(par_backend_find("threads"), p, program, NULL, &o), PAR_OK, "%s",
                 par_last_error());
    return net;
}

Test(trace, chrome_json_parses_and_holds_the_spans)
{
    const int p = 4;
    par_netrun *net = run(p, 1);
    char path[] = "/tmp/parity-trace-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(par_trace_write_chrome(net, path), PAR_OK, "%s", par_last_error());

    cJSON *root = NULL;
    cr_assert_eq(par_json_read_file(path, &root), PAR_OK, "%s", par_last_error());
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    cr_assert(cJSON_IsArray(ev));
    int names = 0, allreduce = 0, compute = 0, xfer = 0, quoted = 0, ib = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ev)
    {
        const char *ph = par_json_str(e, "ph"), *name = par_json_str(e, "name");
        cr_assert(ph && name);
        int64_t pid;
        cr_assert(par_json_int(e, "pid", &pid) && pid >= 0 && pid < p);
        if (!strcmp(ph, "M")) {
            names += !strcmp(name, "process_name");
            continue;
        }
        cr_assert_str_eq(ph, "X");
        double ts, dur;
        cr_assert(par_json_num(e, "ts", &ts) && par_json_num(e, "dur", &dur));
        cr_assert(ts >= 0 && dur > 0, "%s: ts %g dur %g", name, ts, dur);
        const cJSON *args = par_json_obj(e, "args");
        cr_assert(args);
        if (!strcmp(name, "compute"))
            compute++;
        if (!strcmp(name, "allreduce")) {
            allreduce++;
            cr_assert_str_eq(par_json_str(args, "group"), "world");
            ib += !strcmp(par_json_str(args, "tier"), "ib");
        }
        if (!strcmp(name, "alltoall"))
            quoted += !strcmp(par_json_str(args, "group"), "ep \"quoted\"");
        if (!strcmp(par_json_str(e, "cat"), "p2p"))
            xfer++;
    }
    cr_assert_eq(names, p);
    cr_assert_eq(allreduce, 2 * p, "two ring phases per rank");
    cr_assert_eq(ib, 2 * p, "2 GPUs per node: the ring crosses nodes");
    cr_assert_geq(compute, p);
    cr_assert_eq(quoted, p);
    cr_assert_eq(xfer, 2);
    cJSON_Delete(root);
    unlink(path);
    par_netrun_free(net);
}

Test(trace, summary_per_rank)
{
    const int p = 8;
    par_netrun *net = run(p, 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert(f);
    par_trace_summary(net, f, 4);
    fclose(f);
    cr_assert(strstr(text, "emulated network reference"), "%s", text);
    cr_assert(strstr(text, "compute ms"));
    cr_assert(strstr(text, "(4 ranks not shown)"), "%s", text);
    cr_assert(strstr(text, "\nmax "));
    /* rank 7 computed 8 ms: its line starts with 7 and shows 8.000 ms of compute */
    char *r7 = strstr(text, "\n7 ");
    cr_assert(r7, "%s", text);
    double total, comp;
    cr_assert_eq(sscanf(r7 + 1, "7 %lf %lf", &total, &comp), 2);
    cr_assert_gt(total, 0.0);
    free(text);
    cr_assert(fabs(par_netrun_stats(net, 7)->compute_s - 8e9 / 989e12) < 1e-18);
    /* the stats behind it */
    for (int r = 0; r < p; r++) {
        const par_rankstats *s = par_netrun_stats(net, r);
        cr_assert_gt(s->total_s, 0.0);
        cr_assert(fabs(s->compute_s + s->comm_s + s->idle_s - s->total_s) < 1e-12);
        cr_assert_gt(s->bytes[PAR_TIER_IB], 0);
    }
    size_t n;
    cr_assert_null(par_netrun_spans(net, 0, &n, NULL), "spans not recorded");
    cr_assert_eq(n, 0);
    par_netrun_free(net);
}
