/* comm/netmodel.c - presets, topology files and the cost formulas. */
#include "comm/netmodel.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "core/json.h"

static const char *const tier_names[PAR_TIER_COUNT] = {"self", "nvlink", "ib"};

const char *par_tier_name(par_tier t)
{
    return (unsigned)t < PAR_TIER_COUNT ? tier_names[t] : "invalid-tier";
}

/* ---- presets (sources: docs/network.md) ----------------------------------- */

#define GB 1e9
#define US 1e-6

static const par_netmodel presets[] = {
    /* The design notes (000, 001): 8-GPU nodes, NVLink 900 GB/s inside, IB 50 GB/s
     * between; compute of an H800. */
#if PAR_FAULT_NET_NVLINK_BW
    /* Deliberate fault (meson -Dfault=net_nvlink_bw; tools/cells-fault-demo.sh): NVLink at
     * 800 GB/s instead of 900 in the preset every matrix cell runs with. */
    {"reference", 8, 8, {0, 800 * GB, 50 * GB}, {0, 2 * US, 5 * US}, 989e12, 3.35e12},
#else
    {"reference", 8, 8, {0, 900 * GB, 50 * GB}, {0, 2 * US, 5 * US}, 989e12, 3.35e12},
#endif
    /* DeepSeek-V3 report: NVLink 160 GB/s achievable, IB 50 GB/s (400 Gb/s CX7) per
     * GPU, 8 GPUs and 8 NICs per node; H800 SXM: 989 TFLOP/s BF16 dense, 3.35 TB/s. */
    {"h800", 8, 8, {0, 160 * GB, 50 * GB}, {0, 2 * US, 5 * US}, 989e12, 3.35e12},
    /* H100 SXM5 datasheet: NVLink 900 GB/s bidirectional = 450 GB/s one way,
     * 989 TFLOP/s BF16 dense, 3.35 TB/s HBM3; DGX H100: 8 GPUs, 8 x 400 Gb/s NICs. */
    {"h100", 8, 8, {0, 450 * GB, 50 * GB}, {0, 2 * US, 5 * US}, 989e12, 3.35e12},
};
#define NPRESETS (sizeof presets / sizeof presets[0])

const char *par_netmodel_preset_name(int i)
{
    return i >= 0 && (size_t)i < NPRESETS ? presets[i].name : NULL;
}

par_status par_netmodel_preset(const char *name, par_netmodel *out)
{
    for (size_t i = 0; name && i < NPRESETS; i++) {
        if (!strcmp(presets[i].name, name)) {
            *out = presets[i];
            return PAR_OK;
        }
    }
    return par_err(PAR_ENOTFOUND, "network preset '%s' is unknown (presets: reference, h800, h100)",
                   name ? name : "(null)");
}

static int finite_pos(double x) { return isfinite(x) && x > 0; }

par_status par_netmodel_validate(const par_netmodel *m)
{
    if (m->gpus_per_node < 1 || m->nics_per_node < 1)
        return par_err(PAR_EINVAL, "network %s: gpus_per_node (%d) and nics_per_node (%d) must "
                                   "be at least 1", m->name, m->gpus_per_node, m->nics_per_node);
    if (!finite_pos(m->bw[PAR_TIER_NVLINK]) || !finite_pos(m->bw[PAR_TIER_IB]))
        return par_err(PAR_EINVAL, "network %s: bandwidths must be positive (NVLink %g B/s, "
                                   "IB %g B/s)", m->name, m->bw[PAR_TIER_NVLINK],
                       m->bw[PAR_TIER_IB]);
    for (int t = 0; t < PAR_TIER_COUNT; t++)
        if (!isfinite(m->alpha[t]) || m->alpha[t] < 0)
            return par_err(PAR_EINVAL, "network %s: latency of %s is %g s; must be >= 0",
                           m->name, par_tier_name((par_tier)t), m->alpha[t]);
    if (!finite_pos(m->peak_flops) || !finite_pos(m->hbm_bw))
        return par_err(PAR_EINVAL, "network %s: peak FLOP/s (%g) and HBM bandwidth (%g B/s) "
                                   "must be positive", m->name, m->peak_flops, m->hbm_bw);
    return PAR_OK;
}

/* ---- topology files ------------------------------------------------------- */

typedef struct {
    const char *key;
    int kind;        /* 0: int, 1: number scaled by `scale` */
    size_t off;
    double scale;
} jkey;

static const jkey jkeys[] = {
    {"gpus_per_node", 0, offsetof(par_netmodel, gpus_per_node), 1},
    {"nics_per_node", 0, offsetof(par_netmodel, nics_per_node), 1},
    {"nvlink_gbps", 1, offsetof(par_netmodel, bw) + PAR_TIER_NVLINK * sizeof(double), GB},
    {"ib_gbps", 1, offsetof(par_netmodel, bw) + PAR_TIER_IB * sizeof(double), GB},
    {"nvlink_latency_us", 1, offsetof(par_netmodel, alpha) + PAR_TIER_NVLINK * sizeof(double), US},
    {"ib_latency_us", 1, offsetof(par_netmodel, alpha) + PAR_TIER_IB * sizeof(double), US},
    {"peak_tflops", 1, offsetof(par_netmodel, peak_flops), 1e12},
    {"hbm_gbps", 1, offsetof(par_netmodel, hbm_bw), GB},
};

par_status par_netmodel_parse(const char *text, size_t len, const char *label, par_netmodel *out)
{
    cJSON *root = NULL;
    par_status st = par_json_parse(text, len, label, &root);
    if (st != PAR_OK)
        return st;
    par_netmodel m;
    if (!cJSON_IsObject(root)) {
        st = par_err(PAR_EFORMAT, "%s: a topology file is a JSON object", label);
        goto fail_free_root;
    }
    const cJSON *pj = cJSON_GetObjectItemCaseSensitive(root, "preset");
    if (pj && !cJSON_IsString(pj)) {
        st = par_err(PAR_EFORMAT, "%s: \"preset\" must be a string", label);
        goto fail_free_root;
    }
    st = par_netmodel_preset(pj ? pj->valuestring : "reference", &m);
    if (st != PAR_OK) {
        st = par_err(PAR_EFORMAT, "%s: %s", label, par_last_error());
        goto fail_free_root;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, root)
    {
        const char *k = it->string;
        if (!strcmp(k, "preset"))
            continue;
        if (!strcmp(k, "name")) {
            if (!cJSON_IsString(it)) {
                st = par_err(PAR_EFORMAT, "%s: \"name\" must be a string", label);
                goto fail_free_root;
            }
            snprintf(m.name, sizeof m.name, "%s", it->valuestring);
            continue;
        }
        size_t i = 0;
        while (i < sizeof jkeys / sizeof jkeys[0] && strcmp(jkeys[i].key, k))
            i++;
        if (i == sizeof jkeys / sizeof jkeys[0]) {
            st = par_err(PAR_EFORMAT, "%s: unknown key \"%s\" (keys: preset, name, gpus_per_node, "
                                      "nics_per_node, nvlink_gbps, ib_gbps, nvlink_latency_us, "
                                      "ib_latency_us, peak_tflops, hbm_gbps)", label, k);
            goto fail_free_root;
        }
        if (jkeys[i].kind == 0) {
            int64_t v;
            if (!par_json_as_int(it, &v) || v < 1 || v > 1 << 20) {
                st = par_err(PAR_EFORMAT, "%s: \"%s\" must be an integer in 1..%d", label, k,
                             1 << 20);
                goto fail_free_root;
            }
            *(int *)((char *)&m + jkeys[i].off) = (int)v;
        } else {
            if (!cJSON_IsNumber(it)) {
                st = par_err(PAR_EFORMAT, "%s: \"%s\" must be a number", label, k);
                goto fail_free_root;
            }
            *(double *)((char *)&m + jkeys[i].off) = it->valuedouble * jkeys[i].scale;
        }
    }
    st = par_netmodel_validate(&m);
    if (st != PAR_OK) {
        st = par_err(PAR_EFORMAT, "%s: %s", label, par_last_error());
        goto fail_free_root;
    }
    *out = m;

fail_free_root:
    cJSON_Delete(root);
    return st;
}

par_status par_netmodel_load(const char *path, par_netmodel *out)
{
    void *data;
    size_t len;
    par_status st = par_file_read(path, PAR_TAG_IO, &data, &len);
    if (st != PAR_OK)
        return st;
    st = par_netmodel_parse(data, len, path, out);
    par_free(data);
    return st;
}

void par_netmodel_describe(const par_netmodel *m, char *buf, size_t n)
{
    snprintf(buf, n,
             "%s: %d GPUs/node, NVLink %g GB/s (%g us), IB %d NICs/node x %g GB/s (%g us), "
             "GPU %g TFLOP/s, HBM %g GB/s",
             m->name, m->gpus_per_node, m->bw[PAR_TIER_NVLINK] / GB,
             m->alpha[PAR_TIER_NVLINK] / US, m->nics_per_node, m->bw[PAR_TIER_IB] / GB,
             m->alpha[PAR_TIER_IB] / US, m->peak_flops / 1e12, m->hbm_bw / GB);
}

/* ---- tiers ---------------------------------------------------------------- */

int par_net_node(const par_netmodel *m, int wrank) { return wrank / m->gpus_per_node; }

par_tier par_net_tier(const par_netmodel *m, int wa, int wb)
{
    if (wa == wb)
        return PAR_TIER_SELF;
    return par_net_node(m, wa) == par_net_node(m, wb) ? PAR_TIER_NVLINK : PAR_TIER_IB;
}

double par_net_nic_share(const par_netmodel *m)
{
    return m->bw[PAR_TIER_IB] * (double)m->nics_per_node / (double)m->gpus_per_node;
}

/* ---- costs ---------------------------------------------------------------- */

double par_net_compute_time(const par_netmodel *m, uint64_t flops, uint64_t bytes)
{
    double tf = (double)flops / m->peak_flops, tb = (double)bytes / m->hbm_bw;
    return tf > tb ? tf : tb;
}

static par_tier slower(par_tier a, par_tier b) { return a > b ? a : b; }

par_netcost par_net_p2p(const par_netmodel *m, int wa, int wb, size_t bytes)
{
    par_netcost c = {0};
    c.tier = par_net_tier(m, wa, wb);
    if (c.tier == PAR_TIER_SELF)
        return c;
    c.time = m->alpha[c.tier] + (double)bytes / m->bw[c.tier];
    c.bytes[c.tier] = bytes;
    c.msgs[c.tier] = 1;
    return c;
}

par_netcost par_net_ring(const par_netmodel *m, const int *wranks, int p, int me, int steps,
                         size_t step_bytes)
{
    par_netcost c = {0};
    if (p < 2 || steps < 1)
        return c;
    par_tier slow = PAR_TIER_SELF;
    for (int i = 0; i < p; i++)
        slow = slower(slow, par_net_tier(m, wranks[i], wranks[(i + 1) % p]));
    if (slow == PAR_TIER_SELF) /* a group listing one world rank twice: nothing to model */
        return c;
    c.tier = slow;
    c.time = (double)steps * (m->alpha[slow] + (double)step_bytes / m->bw[slow]);
    par_tier mine = par_net_tier(m, wranks[me], wranks[(me + 1) % p]);
    c.bytes[mine] = (uint64_t)steps * step_bytes;
    c.msgs[mine] = (uint64_t)steps;
    return c;
}

/* One side (sending or receiving) of a direct all-to-all: b(ctx, j) bytes
 * with group rank j (b NULL: none). */
static double a2a_side(const par_netmodel *m, const int *wranks, int p, int me, par_net_bytes_fn b,
                       const void *ctx, par_netcost *acc)
{
    uint64_t bytes[PAR_TIER_COUNT] = {0}, msgs[PAR_TIER_COUNT] = {0};
    for (int j = 0; b && j < p; j++) {
        size_t bj = j == me ? 0 : b(ctx, j);
        if (!bj)
            continue;
        par_tier t = par_net_tier(m, wranks[me], wranks[j]);
        if (t == PAR_TIER_SELF)
            continue;
        bytes[t] += bj;
        msgs[t]++;
    }
    if (acc) {
        for (int t = 0; t < PAR_TIER_COUNT; t++) {
            acc->bytes[t] = bytes[t];
            acc->msgs[t] = msgs[t];
        }
    }
    double tn = (double)msgs[PAR_TIER_NVLINK] * m->alpha[PAR_TIER_NVLINK] +
                (double)bytes[PAR_TIER_NVLINK] / m->bw[PAR_TIER_NVLINK];
    double ti = (double)msgs[PAR_TIER_IB] * m->alpha[PAR_TIER_IB] +
                (double)bytes[PAR_TIER_IB] / par_net_nic_share(m);
    return tn > ti ? tn : ti;
}

par_netcost par_net_alltoall_by(const par_netmodel *m, const int *wranks, int p, int me,
                                par_net_bytes_fn to, const void *to_ctx, par_net_bytes_fn from,
                                const void *from_ctx)
{
    par_netcost c = {0}, rc = {0};
    double ts = a2a_side(m, wranks, p, me, to, to_ctx, &c);
    double tr = a2a_side(m, wranks, p, me, from, from_ctx, &rc);
    c.time = ts > tr ? ts : tr;
    c.tier = PAR_TIER_SELF;
    for (int t = 0; t < PAR_TIER_COUNT; t++)
        if (c.msgs[t] || rc.msgs[t])
            c.tier = slower(c.tier, (par_tier)t);
    return c;
}

static size_t array_at(const void *ctx, int j) { return ((const size_t *)ctx)[j]; }

par_netcost par_net_alltoall(const par_netmodel *m, const int *wranks, int p, int me,
                             const size_t *bytes_to, const size_t *bytes_from)
{
    return par_net_alltoall_by(m, wranks, p, me, bytes_to ? array_at : NULL, bytes_to,
                               bytes_from ? array_at : NULL, bytes_from);
}

par_netcost par_net_chain(const par_netmodel *m, const int *wranks, int p, int me, int root,
                          size_t bytes)
{
    par_netcost c = {0};
    if (p < 2)
        return c;
    par_tier slow = PAR_TIER_SELF;
    for (int i = 0; i + 1 < p; i++)
        slow = slower(slow, par_net_tier(m, wranks[(root + i) % p], wranks[(root + i + 1) % p]));
    if (slow == PAR_TIER_SELF)
        return c;
    c.tier = slow;
    c.time = (double)(p - 1) * m->alpha[slow] + (double)bytes / m->bw[slow];
    int pos = ((me - root) % p + p) % p; /* place in the chain */
    if (pos + 1 < p) {
        par_tier mine = par_net_tier(m, wranks[me], wranks[(me + 1) % p]);
        c.bytes[mine] = bytes;
        c.msgs[mine] = 1;
    }
    return c;
}

par_netcost par_net_barrier(const par_netmodel *m, const int *wranks, int p)
{
    par_netcost c = {0};
    if (p < 2)
        return c;
    par_tier slow = PAR_TIER_SELF;
    for (int i = 1; i < p; i++)
        slow = slower(slow, par_net_tier(m, wranks[0], wranks[i]));
    if (slow == PAR_TIER_SELF)
        return c;
    int rounds = 0;
    while ((1 << rounds) < p)
        rounds++;
    c.tier = slow;
    c.time = (double)rounds * m->alpha[slow];
    return c;
}
