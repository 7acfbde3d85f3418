/* tests/comm/test_clock.c - the virtual clock against closed forms. */
#include <math.h>

#include "comm/clock.h"
#include "comm_test.h"
#include "core/counters.h"

#define NEAR(a, b) (fabs((a) - (b)) <= 1e-12 * (fabs(a) + fabs(b)) + 1e-18)

/* A model with round numbers: 1 TFLOP/s, NVLink 100 GB/s (1 us), IB 10 GB/s (10 us). */
static par_netmodel model(int gpn, int nics)
{
    par_netmodel m = {.name = "test", .gpus_per_node = gpn, .nics_per_node = nics,
                      .bw = {0, 100e9, 10e9}, .alpha = {0, 1e-6, 10e-6},
                      .peak_flops = 1e12, .hbm_bw = 1e15};
    return m;
}

static par_netrun *run_net(const char *backend, int n, const par_netmodel *m, par_world_fn fn,
                           void *arg)
{
    const par_backend *be = NULL;
    cr_assert_eq(par_backend_get(backend, &be), PAR_OK);
    par_netrun *net = NULL;
    cr_assert_eq(par_netrun_create(m, n, 1, &net), PAR_OK);
    par_world_opts o = {.timeout_s = 20, .net = net};
    par_status st = par_world_run(be, n, fn, arg, &o);
    cr_assert_eq(st, PAR_OK, "%s x %d: %s", backend, n, par_last_error());
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0);
    return net;
}

/* compute + exposed comm + idle adds up to the clock on every rank */
static void check_sums(const par_netrun *net)
{
    for (int r = 0; r < par_netrun_nranks(net); r++) {
        const par_rankstats *s = par_netrun_stats(net, r);
        cr_assert(NEAR(s->compute_s + s->comm_s + s->idle_s, s->total_s),
                  "rank %d: %g + %g + %g != %g", r, s->compute_s, s->comm_s, s->idle_s,
                  s->total_s);
    }
}

/* ---- ring all-reduce ------------------------------------------------------ */

typedef struct {
    size_t count;
} ar_arg;

static par_status do_allreduce(par_comm *w, void *arg)
{
    size_t n = ((ar_arg *)arg)->count;
    double *v = par_malloc(n * sizeof *v, PAR_TAG_ACT);
    CHECK(v, "no memory");
    for (size_t i = 0; i < n; i++)
        v[i] = (double)par_comm_rank(w);
    par_status st = par_allreduce(w, v, v, n, PAR_C_F64, PAR_OP_SUM);
    par_free(v);
    return st;
}

static void ring_case(int p, int gpn, int expect_ib)
{
    par_netmodel m = model(gpn, 8);
    ar_arg a = {.count = 4096 * (size_t)p};
    par_netrun *net = run_net("threads", p, &m, do_allreduce, &a);
    double bytes = (double)a.count * 8;
    par_tier t = expect_ib ? PAR_TIER_IB : PAR_TIER_NVLINK;
    double want = 2.0 * (p - 1) / p * bytes / m.bw[t] + 2.0 * (p - 1) * m.alpha[t];
    for (int r = 0; r < p; r++) {
        const par_rankstats *s = par_netrun_stats(net, r);
        cr_assert(NEAR(s->total_s, want), "p=%d gpn=%d rank %d: %.15g s, closed form %.15g s", p,
                  gpn, r, s->total_s, want);
        cr_assert(NEAR(s->comm_s, want));
        cr_assert_eq(s->idle_s, 0.0);
        cr_assert_eq(s->steps, 2);
        /* the ring: 2 (p-1) blocks of n/p to the next rank */
        par_tier mine = par_net_tier(&m, r, (r + 1) % p);
        cr_assert_eq(s->bytes[mine], (uint64_t)(2 * (p - 1)) * (a.count / p) * 8);
    }
    check_sums(net);
    par_netrun_free(net);
}

Test(clock, ring_allreduce_closed_form)
{
    ring_case(4, 8, 0);  /* one node: NVLink */
    ring_case(8, 4, 1);  /* spans two nodes: the IB links set beta */
    ring_case(5, 1, 1);  /* one GPU per node */
    ring_case(2, 2, 0);
}

/* ---- all-to-all with k of p peers off-node --------------------------------- */

static par_status do_alltoall(par_comm *w, void *arg)
{
    size_t n = *(size_t *)arg, p = (size_t)par_comm_size(w);
    float *in = par_calloc(n * p, sizeof *in, PAR_TAG_ACT), *out = par_malloc(n * p * 4, PAR_TAG_ACT);
    par_status st = in && out ? par_alltoall(w, in, out, n, PAR_C_F32)
                              : par_err(PAR_ENOMEM, "no memory");
    par_free(in);
    par_free(out);
    return st;
}

Test(clock, alltoall_k_of_p_off_node)
{
    const int p = 8, gpn = 3, nics = 2; /* nodes {0,1,2} {3,4,5} {6,7} */
    par_netmodel m = model(gpn, nics);
    size_t n = 10000;
    double b = (double)n * 4, share = m.bw[PAR_TIER_IB] * nics / gpn, worst = 0;
    par_netrun *net = run_net("threads", p, &m, do_alltoall, &n);
    for (int r = 0; r < p; r++) {
        int node_size = r < 6 ? 3 : 2;
        int on = node_size - 1, k = p - node_size; /* k of the p-1 peers are off-node */
        double t = fmax(on * (m.alpha[PAR_TIER_NVLINK] + b / m.bw[PAR_TIER_NVLINK]),
                        k * m.alpha[PAR_TIER_IB] + k * b / share);
        /* the rank's own cost, straight from the model */
        int wr[8];
        size_t bt[8];
        for (int j = 0; j < p; j++)
            wr[j] = j, bt[j] = (size_t)b;
        par_netcost c = par_net_alltoall(&m, wr, p, r, bt, bt);
        cr_assert(NEAR(c.time, t), "rank %d: model %.15g, closed form %.15g", r, c.time, t);
        cr_assert_eq(c.bytes[PAR_TIER_IB], (uint64_t)(k * b));
        cr_assert_eq(c.msgs[PAR_TIER_IB], (uint64_t)k);
        worst = fmax(worst, t);
        const par_rankstats *s = par_netrun_stats(net, r);
        cr_assert_eq(s->bytes[PAR_TIER_NVLINK], (uint64_t)(on * b));
        cr_assert_eq(s->bytes[PAR_TIER_IB], (uint64_t)(k * b));
    }
    /* the collective ends on every member when the slowest member is done */
    for (int r = 0; r < p; r++)
        cr_assert(NEAR(par_netrun_stats(net, r)->total_s, worst), "rank %d: %.15g vs %.15g", r,
                  par_netrun_stats(net, r)->total_s, worst);
    check_sums(net);
    par_netrun_free(net);
}

/* ---- arrival skew: members wait for the last one ---------------------------- */

static par_status skewed_barrier(par_comm *w, void *arg)
{
    (void)arg;
    par_count_flops((uint64_t)par_comm_rank(w) * 1000000000u); /* rank r: r ms */
    TRY(par_barrier(w));
    return PAR_OK;
}

Test(clock, collective_waits_for_latest_arrival)
{
    const int p = 6;
    par_netmodel m = model(4, 4); /* spans 2 nodes: barrier rounds at IB alpha */
    par_netrun *net = run_net("threads", p, &m, skewed_barrier, NULL);
    double barrier = 3 * m.alpha[PAR_TIER_IB]; /* ceil(log2 6) rounds */
    for (int r = 0; r < p; r++) {
        const par_rankstats *s = par_netrun_stats(net, r);
        cr_assert(NEAR(s->compute_s, r * 1e-3));
        cr_assert(NEAR(s->idle_s, (p - 1 - r) * 1e-3), "rank %d idle %g", r, s->idle_s);
        cr_assert(NEAR(s->total_s, (p - 1) * 1e-3 + barrier));
    }
    check_sums(net);
    par_netrun_free(net);
}

/* ---- point to point ---------------------------------------------------------- */

#define MSG 250000 /* f64: 2 MB */

static par_status blocking_pair(par_comm *w, void *arg)
{
    (void)arg;
    double *buf = par_calloc(MSG, sizeof *buf, PAR_TAG_ACT);
    CHECK(buf, "no memory");
    par_status st;
    if (par_comm_rank(w) == 0) {
        par_count_flops(1000000000u); /* 1 ms, then send */
        st = par_send(w, buf, MSG, PAR_C_F64, 1, 3);
    } else {
        st = par_recv(w, buf, MSG, PAR_C_F64, 0, 3);
    }
    par_free(buf);
    return st;
}

Test(clock, p2p_blocking)
{
    par_netmodel m = model(1, 1); /* ranks on different nodes */
    par_netrun *net = run_net("threads", 2, &m, blocking_pair, NULL);
    double x = m.alpha[PAR_TIER_IB] + MSG * 8.0 / m.bw[PAR_TIER_IB];
    const par_rankstats *s0 = par_netrun_stats(net, 0), *s1 = par_netrun_stats(net, 1);
    cr_assert(NEAR(s0->total_s, 1e-3 + x));
    cr_assert(NEAR(s0->comm_s, x));
    cr_assert(NEAR(s1->total_s, 1e-3 + x), "recv done at %.15g", s1->total_s);
    cr_assert(NEAR(s1->idle_s, 1e-3)); /* waiting for the sender */
    cr_assert(NEAR(s1->comm_s, x));
    cr_assert_eq(s0->bytes[PAR_TIER_IB], MSG * 8);
    cr_assert_eq(s1->bytes[PAR_TIER_IB], 0);
    check_sums(net);
    par_netrun_free(net);
}

typedef struct {
    uint64_t work; /* flops between post and wait */
} async_arg;

static par_status async_pair(par_comm *w, void *arg)
{
    async_arg *a = arg;
    double *buf = par_calloc(MSG, sizeof *buf, PAR_TAG_ACT);
    CHECK(buf, "no memory");
    par_request *req = NULL;
    par_status st = par_comm_rank(w) == 0 ? par_isend(w, buf, MSG, PAR_C_F64, 1, 0, &req)
                                          : par_irecv(w, buf, MSG, PAR_C_F64, 0, 0, &req);
    par_count_flops(a->work);
    if (st == PAR_OK)
        st = par_wait(&req);
    par_free(buf);
    return st;
}

Test(clock, p2p_async_overlaps_compute)
{
    par_netmodel m = model(1, 1);
    double x = m.alpha[PAR_TIER_IB] + MSG * 8.0 / m.bw[PAR_TIER_IB]; /* 210 us */
    /* 5 ms of compute hides the transfer completely */
    async_arg a = {5000000000u};
    par_netrun *net = run_net("threads", 2, &m, async_pair, &a);
    for (int r = 0; r < 2; r++) {
        const par_rankstats *s = par_netrun_stats(net, r);
        cr_assert(NEAR(s->total_s, 5e-3), "rank %d: %g", r, s->total_s);
        cr_assert_eq(s->comm_s, 0.0);
        cr_assert_eq(s->idle_s, 0.0);
    }
    par_netrun_free(net);
    /* 100 us of compute hides part of it: the wait exposes the rest */
    a.work = 100000000u;
    net = run_net("threads", 2, &m, async_pair, &a);
    for (int r = 0; r < 2; r++) {
        const par_rankstats *s = par_netrun_stats(net, r);
        cr_assert(NEAR(s->total_s, x), "rank %d: %.15g vs %.15g", r, s->total_s, x);
        cr_assert(NEAR(s->comm_s, x - 1e-4));
    }
    check_sums(net);
    par_netrun_free(net);
}

/* par_test_due: a send that is complete (its receive was posted first) but
 * not by the sender's clock stays pending; the work counted since the last
 * event is not charged by the test; once due, releasing it leaves every
 * figure of the rank as the par_wait of async_pair would (bit for bit). */
typedef struct {
    uint64_t work;
    _Atomic int64_t posted;
    int due[3]; /* after the post, after the work, after the clock was read */
} due_arg;

static par_status due_send(par_comm *w, due_arg *a, double *buf, par_request **req)
{
    TRY(par_comm_wait_local(w, &a->posted, 1, "the receive's post"));
    TRY(par_isend(w, buf, MSG, PAR_C_F64, 1, 0, req)); /* matched at once */
    TRY(par_test_due(req, &a->due[0]));
    par_count_flops(a->work);
    TRY(par_test_due(req, &a->due[1]));
    (void)par_comm_vclock(w); /* charges the work */
    return par_test_due(req, &a->due[2]);
}

static par_status due_pair(par_comm *w, void *arg)
{
    due_arg *a = arg;
    double *buf = par_calloc(MSG, sizeof *buf, PAR_TAG_ACT);
    CHECK(buf, "no memory");
    par_request *req = NULL;
    par_status st;
    if (par_comm_rank(w) == 1) {
        st = par_irecv(w, buf, MSG, PAR_C_F64, 0, 0, &req);
        par_comm_store_local(&a->posted, 1);
        par_count_flops(a->work);
    } else {
        st = due_send(w, a, buf, &req);
    }
    if (st == PAR_OK)
        st = par_wait(&req); /* NULL once due: nothing to wait for */
    par_free(buf);
    return st;
}

static void due_case(uint64_t work, int due_at_end)
{
    par_netmodel m = model(1, 1);
    async_arg w = {work};
    due_arg d = {.work = work};
    par_netrun *a = run_net("threads", 2, &m, async_pair, &w);
    par_netrun *b = run_net("threads", 2, &m, due_pair, &d);
    cr_assert_eq(d.due[0], 0, "due at its post clock");
    cr_assert_eq(d.due[1], 0, "due by work the clock was not charged");
    cr_assert_eq(d.due[2], due_at_end);
    for (int r = 0; r < 2; r++) {
        const par_rankstats *s = par_netrun_stats(a, r), *t = par_netrun_stats(b, r);
        cr_assert_eq(memcmp(s, t, sizeof *s), 0, "rank %d: %.17g vs %.17g, comm %.17g vs %.17g", r,
                     s->total_s, t->total_s, s->comm_s, t->comm_s);
    }
    check_sums(b);
    par_netrun_free(a);
    par_netrun_free(b);
}

Test(clock, p2p_test_due_leaves_the_clock)
{
    due_case(5000000000u, 1); /* 5 ms of work: due, released early */
    due_case(100000000u, 0);  /* 100 us of 210: the wait exposes the rest */
}

/* ---- determinism ------------------------------------------------------------- */

static par_status mixed(par_comm *w, void *arg)
{
    (void)arg;
    int p = par_comm_size(w), me = par_comm_rank(w);
    double v[64];
    for (int i = 0; i < 64; i++)
        v[i] = me + i;
    for (int it = 0; it < 3; it++) {
        par_count_flops((uint64_t)(me + 1) * 7000000u * (uint64_t)(it + 1));
        par_count_bytes((uint64_t)(p - me) * 1000000u);
        TRY(par_allreduce(w, v, v, 64, PAR_C_F64, PAR_OP_SUM));
        TRY(par_bcast(w, v, 10, PAR_C_F64, it % p));
        par_comm *half = NULL;
        TRY(par_comm_split(w, me % 2, me, &half));
        TRY(par_allgather(half, v, v + 32, 1, PAR_C_F64));
        par_comm_free(half);
        if (p > 1) {
            double t = v[0];
            if (me == 0)
                TRY(par_send(w, &t, 1, PAR_C_F64, 1, it));
            else if (me == 1)
                TRY(par_recv(w, &t, 1, PAR_C_F64, 0, it));
        }
        TRY(par_barrier(w));
    }
    return PAR_OK;
}

Test(clock, deterministic_on_every_backend_and_run)
{
    par_netmodel m = model(2, 1);
    par_netrun *a = run_net("self", 1, &m, mixed, NULL);
    par_netrun *b = run_net("threads", 1, &m, mixed, NULL);
    cr_assert_eq(par_netrun_stats(a, 0)->total_s, par_netrun_stats(b, 0)->total_s);
    cr_assert_gt(par_netrun_stats(a, 0)->total_s, 0.0);
    par_netrun_free(a);
    par_netrun_free(b);
    par_netrun *x = run_net("threads", 8, &m, mixed, NULL);
    par_netrun *y = run_net("threads", 8, &m, mixed, NULL);
    for (int r = 0; r < 8; r++) {
        const par_rankstats *s = par_netrun_stats(x, r), *t = par_netrun_stats(y, r);
        cr_assert_eq(memcmp(s, t, sizeof *s), 0, "rank %d: %.17g vs %.17g", r, s->total_s,
                     t->total_s);
        size_t ns, nt;
        const par_span *ss = par_netrun_spans(x, r, &ns, NULL), *st = par_netrun_spans(y, r, &nt, NULL);
        cr_assert_eq(ns, nt);
        for (size_t i = 0; i < ns; i++)
            cr_assert(ss[i].t0 == st[i].t0 && ss[i].t1 == st[i].t1 && ss[i].op == st[i].op);
    }
    check_sums(x);
    par_netrun_free(x);
    par_netrun_free(y);
}

/* fiber: ranks share worker threads and switch at every comm call; the
 * clocks (compute counted per rank, collectives, p2p) are bitwise those of
 * threads, whatever the number of workers. */
Test(clock, fiber_equals_threads)
{
    par_netmodel m = model(2, 1);
    const par_backend *fb = par_backend_find("fiber");
    cr_assert_not_null(fb);
    for (int n = 8; n <= 64; n *= 8) {
        par_netrun *x = run_net("threads", n, &m, mixed, NULL);
        for (int workers = 1; workers <= 3; workers++) {
            par_netrun *y = NULL;
            cr_assert_eq(par_netrun_create(&m, n, 1, &y), PAR_OK);
            par_world_opts o = {.timeout_s = 20, .net = y, .workers = workers};
            cr_assert_eq(par_world_run(fb, n, mixed, NULL, &o), PAR_OK, "%s", par_last_error());
            for (int r = 0; r < n; r++) {
                const par_rankstats *s = par_netrun_stats(x, r), *t = par_netrun_stats(y, r);
                cr_assert_eq(memcmp(s, t, sizeof *s), 0, "n=%d workers=%d rank %d: %.17g vs %.17g",
                             n, workers, r, s->total_s, t->total_s);
                size_t ns, nt;
                const par_span *ss = par_netrun_spans(x, r, &ns, NULL),
                               *st = par_netrun_spans(y, r, &nt, NULL);
                cr_assert_eq(ns, nt);
                for (size_t i = 0; i < ns; i++)
                    cr_assert(ss[i].t0 == st[i].t0 && ss[i].t1 == st[i].t1 &&
                              ss[i].op == st[i].op && ss[i].flops == st[i].flops);
            }
            par_netrun_free(y);
        }
        par_netrun_free(x);
    }
    cr_assert_eq(par_alloc_live(PAR_TAG_COMM), 0);
}

/* ---- without a network, and misuse -------------------------------------------- */

static par_status no_clock(par_comm *w, void *arg)
{
    (void)arg;
    par_count_flops(1000000000u);
    TRY(par_barrier(w));
    CHECK(par_comm_vclock(w) == 0.0, "clock %g without a network", par_comm_vclock(w));
    return PAR_OK;
}

Test(clock, off_without_network)
{
    cr_assert_eq(run_world("threads", 3, no_clock, NULL, 20), PAR_OK);
}

Test(clock, collector_size_must_match)
{
    par_netmodel m = model(8, 8);
    par_netrun *net = NULL;
    cr_assert_eq(par_netrun_create(&m, 4, 0, &net), PAR_OK);
    const par_backend *be = par_backend_find("threads");
    par_world_opts o = {.net = net};
    par_err_set_quiet(1);
    cr_assert_eq(par_world_run(be, 3, no_clock, NULL, &o), PAR_EINVAL);
    par_err_set_quiet(0);
    cr_assert(strstr(par_last_error(), "4 ranks"));
    par_netrun_free(net);
}

/* ---- presets and topology files ------------------------------------------------ */

Test(clock, presets_and_files)
{
    par_netmodel m;
    cr_assert_eq(par_netmodel_preset("reference", &m), PAR_OK);
    cr_assert_eq(m.bw[PAR_TIER_NVLINK], 900e9);
    cr_assert_eq(m.bw[PAR_TIER_IB], 50e9);
    cr_assert_eq(m.gpus_per_node, 8);
    cr_assert_eq(m.nics_per_node, 8);
    cr_assert_eq(par_netmodel_preset("h800", &m), PAR_OK);
    cr_assert_eq(par_netmodel_preset("h100", &m), PAR_OK);
    par_err_set_quiet(1);
    cr_assert_eq(par_netmodel_preset("tpu", &m), PAR_ENOTFOUND);
    const char *good = "{\"preset\": \"h800\", \"gpus_per_node\": 4, \"ib_gbps\": 25, "
                       "\"ib_latency_us\": 3, \"name\": \"mine\"}";
    cr_assert_eq(par_netmodel_parse(good, strlen(good), "t.json", &m), PAR_OK);
    cr_assert_eq(m.gpus_per_node, 4);
    cr_assert_eq(m.bw[PAR_TIER_IB], 25e9);
    cr_assert(NEAR(m.alpha[PAR_TIER_IB], 3e-6));
    cr_assert_eq(m.bw[PAR_TIER_NVLINK], 160e9); /* from the preset */
    cr_assert_str_eq(m.name, "mine");
    const char *typo = "{\"ib_gbs\": 25}";
    cr_assert_eq(par_netmodel_parse(typo, strlen(typo), "t.json", &m), PAR_EFORMAT);
    cr_assert(strstr(par_last_error(), "ib_gbs"));
    const char *bad = "{\"nvlink_gbps\": -1}";
    cr_assert_eq(par_netmodel_parse(bad, strlen(bad), "t.json", &m), PAR_EFORMAT);
    const char *zero = "{\"gpus_per_node\": 0}";
    cr_assert_eq(par_netmodel_parse(zero, strlen(zero), "t.json", &m), PAR_EFORMAT);
    par_err_set_quiet(0);
    /* tiers */
    par_netmodel r = model(8, 8);
    cr_assert_eq(par_net_tier(&r, 3, 3), PAR_TIER_SELF);
    cr_assert_eq(par_net_tier(&r, 0, 7), PAR_TIER_NVLINK);
    cr_assert_eq(par_net_tier(&r, 7, 8), PAR_TIER_IB);
}

/* ---- the binding rule of `parity topo` / --bind ---------------------------------- */

#include "comm/topology.h"

Test(clock, binding_rule)
{
    /* spread while ranks <= cores */
    cr_assert_eq(par_topo_core_of(0, 2, 16), 0);
    cr_assert_eq(par_topo_core_of(1, 2, 16), 8);
    cr_assert_eq(par_topo_core_of(3, 4, 16), 12);
    /* round-robin beyond */
    cr_assert_eq(par_topo_core_of(5, 6, 2), 1);
    cr_assert_eq(par_topo_core_of(1023, 1024, 2), 1);
    cr_assert_eq(par_topo_core_of(4, 4, 2), -1);
    cr_assert_geq(par_topo_ncores(), 1);
    par_err_set_quiet(1);
    par_status st = par_topo_bind_thread(0, 1); /* this test runs in its own process */
    par_err_set_quiet(0);
    cr_assert_eq(st, PAR_OK, "%s", par_last_error());
}
