/* parallel/plan/memmodel_act.c - the activation table (see parallel/plan/memmodel_act.h).
 * Every size mirrors the allocation it names; docs/planning.md explains the
 * entries.  AREAL / aalloc hand out exactly n bytes (the allocator's
 * "allocated" view); the kernels' saved structs round every piece up to 64
 * bytes (their *_saved_bytes), and so do we. */
#include "parallel/plan/memmodel_act.h"

#include "parallel/layout/layout.h"

/* One 64-byte aligned piece of `count` elements of `esz` bytes (mhc.c
 * piece, attention.c CARVE). */
static double pc(double count, double esz)
{
    double b = count * esz;
    double r = b / 64.0;
    double whole = (double)(int64_t)r;
    if (r > 9e15) /* absurd sizes: no rounding (and no overflow) */
        return b;
    return (whole < r ? whole + 1.0 : whole) * 64.0;
}

/* Compression ratio of block b. */
static int64_t ratio_of(const par_config *cfg, int b)
{
    return b < cfg->n_compress_ratios ? cfg->compress_ratios[b] : 0;
}

/* kernels/mhc.c par_hc_saved_bytes: proj, mixes, work [T, P]; rsq [T];
 * pre, post [T, n]; C [T, n, n]; P = (2 + n) n (the Sinkhorn iterates are
 * recomputed by the backward: one token's per thread, not modelled). */
double par_memmodel_act_hc_saved(const par_memmodel_act_ctx *c, int64_t Ti)
{
    double T = (double)Ti;
    double n = (double)c->cfg->hc_mult, P = (2 + n) * n;
    return 3 * pc(T * P, c->es) + pc(T, c->es) + 2 * pc(T * n, c->es) + pc(T * n * n, c->es);
}

/* kernels/attention.c saved_layout (par_attn_saved_bytes) of block b. */
double par_memmodel_act_attn_saved(const par_memmodel_act_ctx *c, int b, int64_t Ti)
{
    double T = (double)Ti;
    const par_config *g = c->cfg;
    double es = c->es, H = (double)g->n_heads, hd = (double)g->head_dim, ql = (double)g->q_lora_rank;
    int64_t m = ratio_of(g, b);
    double coff = m == 4 ? 2 : 1;
    double s = 2 * pc(T * ql, es) + pc(T, es) + 2 * pc(T * H * hd, es) + pc(T * H, es) + 2 * pc(T * hd, es) +
               pc(T, es);
    if (m > 0)
        s += 2 * pc(T * coff * hd, es) + 2 * pc(T * hd, es) + pc(T, es);
    if (m == 4) {
        double iH = (double)g->index_n_heads, ihd = (double)g->index_head_dim;
        s += pc(T * iH * ihd, es) + pc(T * iH, es) + 2 * pc(T * 2 * ihd, es) + 2 * pc(T * ihd, es) + pc(T, es) +
             pc(T * (double)g->index_topk, 4);
    }
    return s + pc(T * H * hd, es) + pc(T * H, es) + pc(T * (double)(g->o_groups * g->o_lora_rank), es);
}

/* cp.c's halo rows D of block b (par_cp_layer_halo = D_window of the block). */
static double cp_halo(const par_memmodel_act_ctx *c, int b)
{
    int64_t m = ratio_of(c->cfg, b);
    par_layout_model lm = {.window_size = c->cfg->window_size, .n_ratios = 1, .compress_ratios = &m};
    return (double)par_layout_d_window(&lm);
}

/* ---- tensor parallelism (tp_hook.c, tp_attn.c) ---------------------------- */

/* The tokens a TP layer works on: the rank's T, gathered over TP under SP. */
static double tp_tokens(const par_memmodel_act_ctx *c, double T)
{
    return c->sp > 1 ? T * (double)c->sp : T;
}

/* The config whose attention dims are one TP rank's shard (tp_attn.c
 * par_tp_attn_dims: heads, output groups and index heads over TP). */
static par_config tp_cfg(const par_memmodel_act_ctx *c)
{
    par_config g = *c->cfg;
    g.n_heads /= c->tp, g.o_groups /= c->tp, g.index_n_heads /= c->tp;
    return g;
}

/* Reals of one rank's shard of block b's 18 attention slots (tp_attn.c
 * slot_shape / shard_numel: wq_b, wo_a, attn_sink and the indexer's wq_b and
 * weights_proj rows, wo_b's columns split; the rest replicated). */
static double tp_shard(const par_memmodel_act_ctx *c, int b)
{
    const par_config *g = c->cfg;
    double P = (double)c->tp, d = (double)g->dim, ql = (double)g->q_lora_rank, hd = (double)g->head_dim;
    double HD = (double)g->n_heads * hd, GL = (double)(g->o_groups * g->o_lora_rank);
    double iH = (double)g->index_n_heads, ihd = (double)g->index_head_dim;
    int64_t m = ratio_of(g, b);
    double coff = m == 4 ? 2 : 1;
    double n = ql * d + ql + HD * ql / P + hd * d + hd + GL * HD / (double)g->o_groups / P + d * GL / P +
               (double)g->n_heads / P;
    if (m > 0)
        n += 2 * coff * hd * d + (double)m * coff * hd + hd;
    if (m == 4)
        n += iH * ihd * ql / P + iH * d / P + 2 * 2 * ihd * d + 4 * 2 * ihd + ihd;
    return n;
}

/* tp_hook.c's slot of (microbatch, block): par_tp_attn_saved (the shard's
 * saved struct on all T tokens, x [T, d], pos [T]) and the shard buffer
 * [shard]: the gradients alone (the weights are the held shards, read in
 * place, and their gradients added in place: no copy, no scratch). */
static double tp_attn_state(const par_memmodel_act_ctx *c, int b, double T)
{
    par_config g = tp_cfg(c);
    par_memmodel_act_ctx l = *c;
    l.cfg = &g, l.tp = 1;
    return par_memmodel_act_attn_saved(&l, b, (int64_t)T) + c->es * (T * (double)g.dim + 1) + 4 * (T + 1) +
           c->es * (tp_shard(c, b) + 1);
}

/* cp.c saved_alloc's saved struct: the window arrays of Tw working rows
 * (window_layout: the kernel's pieces without cmp, icmp) and the whole
 * rows' entries ebuf [Tt, hd (+ ihd with the indexer)], exact bytes. */
static double cp_saved(const par_memmodel_act_ctx *c, int b, double Tw, double Tt)
{
    const par_config *g = c->cfg;
    double es = c->es, hd = (double)g->head_dim, ihd = (double)g->index_head_dim;
    int64_t m = ratio_of(g, b);
    double s = par_memmodel_act_attn_saved(c, b, (int64_t)Tw);
    if (m > 0)
        s += es * Tt * hd - pc(Tw * hd, es);
    if (m == 4)
        s += es * Tt * ihd - pc(Tw * ihd, es);
    return s;
}

/* The attention sub-layer's state: serial kernel, or cp.c's state of each
 * row's working rows (par_cp_attn_forward: the saved struct of rows * (Dh +
 * L) rows and the rows' entries, xw [rows, Dh+L, d], pos [rows*S]) plus
 * block.c's sel [T, topk] in the arena. */
static double attn_state(const par_memmodel_act_ctx *c, int b, double T)
{
    if (c->tp > 1 && c->cp > 1) { /* cptp_hook.c: cp.c's state in the shard's dims + the shard buffer */
        par_config g = tp_cfg(c);
        par_memmodel_act_ctx l = *c;
        l.cfg = &g, l.tp = 1;
        return attn_state(&l, b, T) + c->es * (tp_shard(c, b) + 1);
    }
    if (c->tp > 1) /* the layer on the (SP: gathered) tokens, + block.c's sel [T, topk] in the arena */
        return tp_attn_state(c, b, tp_tokens(c, T)) +
               (ratio_of(c->cfg, b) == 4 ? 4 * T * (double)c->cfg->index_topk : 0);
    if (c->cp <= 1)
        return par_memmodel_act_attn_saved(c, b, (int64_t)T);
    const par_config *g = c->cfg;
    double rows = (double)c->rows, S = (double)g->seq_length, L = S / (double)c->cp;
    double Dh = c->cp_rank > 0 ? cp_halo(c, b) : 0, Tt = rows * S, Tw = rows * (Dh + L);
    double s = cp_saved(c, b, Tw, Tt) + c->es * (Tw * (double)g->dim + 1) + 4 * (Tt + 1);
    if (ratio_of(g, b) == 4)
        s += 4 * T * (double)g->index_topk;
    return s;
}

/* etp.c's rows layer (par_etp_rows_saved) on N gathered rows of nE experts
 * over an ETP group of P: counts [P], off [nE+1], order [N] (int64); xs
 * [N, d], rws [N], g/u/h [N, I/P]; and the nE held experts' slices (the
 * executors' w1/w2/w3 and gradient pointers, the w2 slices' gradients [nE,
 * d, I/P]: the slices are the held ETP shards, read in place; not with
 * `whole`: tp_moe_hook.c's experts are whole, used in place). */
static double etp_rows_state(const par_memmodel_act_ctx *c, double N, double nE, int whole)
{
    const par_config *g = c->cfg;
    double P = (double)c->etp, d = (double)g->dim, Il = (double)g->moe_inter_dim / P, es = c->es;
    return 8 * (P + nE + 1 + N) + es * (N * d + N + 3 * N * Il + 1) +
           (whole ? 0 : 8 * 5 * nE + es * (nE * d * Il + 1));
}

/* Rows the ETP group gathers per row of a rank: P, or 1 when its ranks hold
 * the same rows (TP = ETP without SP: etp.h's rows layer without sp). */
static double etp_gather(const par_memmodel_act_ctx *c)
{
    return c->etp > 1 && (c->tp <= 1 || c->sp > 1) ? (double)c->etp : 1;
}

/* The TP-split shared expert's state (c->tp_shared): tp_mlp.c's x [Tg, d]
 * and g / u / h [Tg, I/TP] of the layer's tokens, and the shard's w2
 * gradient (tp_mlp.c par_tp_mlp_shard; w2 itself is the held shard);
 * `whole` otherwise. */
static double shared_state(const par_memmodel_act_ctx *c, double T, double whole)
{
    if (!c->tp_shared || c->tp <= 1)
        return whole;
    double es = c->es, d = (double)c->cfg->dim, Il = (double)c->cfg->moe_inter_dim / (double)c->tp;
    double Tg = tp_tokens(c, T);
    return es * (Tg * d + 3 * Tg * Il + 1) + es * (d * Il + 1);
}

/* The TP-split shared expert's backward scratch (tp_mlp.c: the partial dx
 * [Tg, d], with SP the gathered dy too); 0 otherwise. */
static double shared_bwd_scratch(const par_memmodel_act_ctx *c, double T)
{
    if (!c->tp_shared || c->tp <= 1)
        return 0;
    return c->es * tp_tokens(c, T) * (double)c->cfg->dim * (c->sp > 1 ? 2 : 1);
}

/* The routed experts' state: moe.c par_moe_saved_alloc (serial), ep.c's
 * blk_state (scnt/rcnt, stk, rpos, eoff, xg, rwg, g/u/h of the received
 * rows, sg/su/sh of the shared expert), with ETP the rows layer instead of
 * g/u/h (ep_etp.c; etp_hook.c with EP 1: etp.c's rows of the serial
 * layer's gathering and the shared expert's tp_mlp state).  The ETP group
 * gathers P times the rows of one rank. */
static double moe_state(const par_memmodel_act_ctx *c, double T)
{
    const par_config *g = c->cfg;
    double es = c->es, E = (double)g->n_routed_experts, K = (double)g->n_activated_experts;
    double I = (double)g->moe_inter_dim, d = (double)g->dim, P = c->etp > 1 ? (double)c->etp : 1;
    if (c->ep <= 1 && P > 1) /* etp_moe_saved: next [E+1] i64, rw [NR], tok/slot/expert [NR]; rows; shared */
        return 8 * (E + 1) + es * (T * K + 1) + 4 * (3 * T * K + 1) + etp_rows_state(c, etp_gather(c) * T * K, E, 0) +
               shared_state(c, T, 3 * es * (T + 1) * I);
    if (c->tp_mlp) { /* tp_moe_hook.c: the same with a rows layer of one rank, the shared expert's
                      * tp_mlp state (x [Tg, d], g/u/h [Tg, I/TP]) and the held w2 shard's gradient */
        double Tg = tp_tokens(c, T), Il = I / (double)c->tp;
        return 8 * (E + 1) + es * (T * K + 1) + 4 * (3 * T * K + 1) + etp_rows_state(c, T * K, E, 1) +
               es * (Tg * d + 3 * Tg * Il + 1) + es * (d * Il + 1);
    }
    if (c->ep <= 1)
        return 8 * (E + 1) + 2 * 4 * (T * K + 1) + 3 * es * (T * K + 1) * I + 3 * es * (T + 1) * I;
    double NS = T * K, NR = NS * c->recv_factor, El = E / (double)c->ep;
    double base = 2 * 8 * (double)c->ep + 4 * NS + 4 * NR + 8 * (El + 1) + es * (NR * d + NR) +
                  shared_state(c, T, 3 * es * T * I);
    return base + (P > 1 ? etp_rows_state(c, etp_gather(c) * NR, El, 0) : es * 3 * NR * I);
}

double par_memmodel_act_block_saved(const par_memmodel_act_ctx *c, int b, int64_t Ti)
{
    const par_config *g = c->cfg;
    double T = (double)Ti, es = c->es, n = (double)g->hc_mult, d = (double)g->dim;
    double E = (double)g->n_routed_experts, K = (double)g->n_activated_experts;
    if (c->recompute)
        return es * T * n * d; /* the block's input only */
    /* block.c: hca; xa, xan, ya [T, d], rstda [T], Xmid [T, n, d] */
    double s = par_memmodel_act_hc_saved(c, Ti) + es * (3 * T * d + T + T * n * d) + attn_state(c, b, T);
    /* hcf; xf, xfn, yf, rstdf, Xout; gw [T, K]; idx int32 [T, K] (the logits and scores [T, E] are the
     * forward's only: the backward recomputes them from xfn) */
    s += par_memmodel_act_hc_saved(c, Ti) + es * (3 * T * d + T + T * n * d) + es * T * K + 4 * T * K;
    if (c->gate_logits)
        s += es * T * E;
    return s + moe_state(c, T);
}

double par_memmodel_act_block_exec_kept(const par_memmodel_act_ctx *c, int b, int64_t Ti)
{
    if (c->recompute)
        return 0;
    double T = (double)Ti, kept = (c->ep <= 1 && c->etp > 1) || c->tp_mlp ? moe_state(c, T) : 0; /* etp_hook.c, tp_moe_hook.c */
    if (c->tp > 1) /* tp_hook.c, cptp_hook.c */
        kept += attn_state(c, b, T) - (ratio_of(c->cfg, b) == 4 ? 4 * T * (double)c->cfg->index_topk : 0);
    return kept;
}

/* Scratch of the MoE backward: moe.c par_moe_backward's workspace, or
 * ep.c ep_bwd's rbuf, dyg, dxg, back, slots, dxs. */
static double moe_bwd_scratch(const par_memmodel_act_ctx *c, double T)
{
    const par_config *g = c->cfg;
    double es = c->es, K = (double)g->n_activated_experts, d = (double)g->dim, NS = T * K;
    double P = c->etp > 1 ? (double)c->etp : 1;
    /* etp.c par_etp_rows_backward: dyg, dys, dxs [N, d], drs [N], out [N, d+1], mine [n, d+1] */
    const double G = etp_gather(c);
    double rows = P > 1 ? es * (3 * G * NS * d + G * NS + G * NS * (d + 1)) : 0;
    if (c->ep <= 1 && P > 1) /* etp.c par_etp_moe_backward: dyr, dxr [NR, d], drw [NR], slots [NR, d], dxs [T, d] */
        return es * (3 * NS * d + NS + T * d) + rows + es * NS * (d + 1) + shared_bwd_scratch(c, T);
    if (c->tp_mlp) { /* the same with a rows layer of one rank; tp_mlp.c's dx [Tg, d] (+ SP: the gathered dy) */
        double Tg = tp_tokens(c, T);
        return es * (3 * NS * d + NS + T * d) + es * (3 * NS * d + NS + NS * (d + 1)) + es * NS * (d + 1) +
               es * Tg * d * (c->sp > 1 ? 2 : 1);
    }
    if (c->ep <= 1)
        return es * (3 * NS * d + 2 * NS + T * d);
    double NR = NS * c->recv_factor;
    return es * (NR * (d + 1) + NR * d + NR * (d + 1) + NS * (d + 1) + NS * d + T * d) +
           (P > 1 ? rows * c->recv_factor + es * NR * (d + 1) : 0) + shared_bwd_scratch(c, T);
}

/* attention.c's core scratch on one thread: the keys a query sees (max_keys:
 * window + topk with the indexer, + S/m compressed entries otherwise), pb
 * [mk, 2] reals + kb [mk] pointers (the backward's; the forward's zb, kb is
 * smaller), and ds [T, H]. */
static double attn_core_scratch(const par_memmodel_act_ctx *c, int b, double T)
{
    const par_config *g = c->cfg;
    int64_t m = ratio_of(g, b);
    double mk = (double)g->window_size +
                (m == 4 ? (double)g->index_topk : m > 0 ? (double)g->seq_length / (double)m : 0);
    return mk * (2 * c->es + 8) + c->es * (T * (double)g->n_heads + 1);
}

/* Scratch of the attention backward: attention.c par_attn_backward (dO,
 * dop, dq, Dd, dkv, dcmp, dca, dcz) with the nested proj_backward (dqb,
 * dqr, dqa, dkva), or cp.c's scratch (working rows; dcmp of the whole
 * rows) plus one row's proj_backward on Dh + L rows. */
static double attn_bwd_scratch(const par_memmodel_act_ctx *c, int b, double T)
{
    const par_config *g = c->cfg;
    double es = c->es, H = (double)g->n_heads, hd = (double)g->head_dim, HD = H * hd;
    double ql = (double)g->q_lora_rank, d = (double)g->dim;
    int64_t m = ratio_of(g, b);
    double nc = m > 0 ? (m == 4 ? 2 : 1) * hd : 0;
    if (c->tp > 1) { /* tp_attn.c's (cp.c's with CP) scratch in the shard's dims, + dx's TP share [T, d] */
        par_config l = tp_cfg(c);
        par_memmodel_act_ctx lc = *c;
        lc.cfg = &l, lc.tp = 1;
        if (c->sp > 1 && c->cp <= 1) /* on the gathered tokens; tp_hook.c sp_rows_backward: dy, dx [Tg, d], mine */
            return attn_bwd_scratch(&lc, b, tp_tokens(c, T)) + es * (3 * tp_tokens(c, T) * d + T * d + 1);
        if (c->sp > 1) /* cptp_hook.c sp_backward: dy of the CP slice (kept for W), dx [Tg, d] + mine */
            return attn_bwd_scratch(&lc, b, T) + es * (3 * tp_tokens(c, T) * d + T * d + 1);
        return attn_bwd_scratch(&lc, b, T) + es * (T * d + 1);
    }
    if (c->cp <= 1)
        return es * (3 * T * HD + T * H + 2 * T * hd + 2 * T * nc) + es * (T * HD + 2 * T * ql + T * hd) +
               attn_core_scratch(c, b, T);
    double rows = (double)c->rows, S = (double)g->seq_length, L = S / (double)c->cp, Tt = rows * S;
    double W = (c->cp_rank > 0 ? cp_halo(c, b) : 0) + L, Tw = rows * W;
    return es * (3 * Tw * HD + Tw * H + Tw * hd + (m > 0 ? Tt * hd : 0) + 2 * Tw * nc + Tw * d + 1) +
           es * (W * HD + 2 * W * ql + W * hd) + attn_core_scratch(c, b, L);
}

double par_memmodel_act_block_bwd_peak(const par_memmodel_act_ctx *c, int b, int64_t Ti)
{
    const par_config *g = c->cfg;
    double T = (double)Ti, es = c->es, n = (double)g->hc_mult, d = (double)g->dim;
    double E = (double)g->n_routed_experts, K = (double)g->n_activated_experts;
    /* block.c backward: dXmid [T, n, d], dyf [T, d], dpost [T, n], dC [T, n, n], dxfn [T, d], dw [T, K] */
    double base = es * (T * n * d + T * d + T * n + T * n * n + T * d + T * K);
    int score = b >= g->n_hash_layers && g->aux_alpha != 0.0;
    double ds = score ? es * T * E : 0; /* the aux-loss gradient [T, E] */
    double moe = base + moe_bwd_scratch(c, T);
    double attn = base + ds + es * 3 * T * d + attn_bwd_scratch(c, b, T); /* + dxf, dya, dxan */
    /* + dxa; hc_pre's backward recomputes one token's Sinkhorn iterates [2 iters, n, n] (one thread) */
    double tail = base + ds + es * 4 * T * d + es * 2 * (double)g->hc_sinkhorn_iters * n * n;
    /* the logits (parity) and scores recomputed + the gate backward's dlogits */
    double gate = base + ds + es * (c->gate_logits ? 2 : 3) * T * E;
    double peak = moe > attn ? moe : attn;
    if (tail > peak)
        peak = tail;
    if (gate > peak)
        peak = gate;
    if (c->recompute) { /* the block's forward runs again first */
        par_memmodel_act_ctx full = *c;
        full.recompute = 0;
        peak += par_memmodel_act_block_saved(&full, b, Ti);
    }
    return peak;
}

double par_memmodel_act_block_wkeep(const par_memmodel_act_ctx *c, int b, int64_t Ti)
{
    const par_config *g = c->cfg;
    double T = (double)Ti, es = c->es, n = (double)g->hc_mult, d = (double)g->dim;
    double E = (double)g->n_routed_experts, K = (double)g->n_activated_experts;
    double H = (double)g->n_heads, hd = (double)g->head_dim, HD = H * hd;
    int64_t m = ratio_of(g, b);
    double nc = m > 0 ? (m == 4 ? 2 : 1) * hd : 0;
    int score = b >= g->n_hash_layers && g->aux_alpha != 0.0;
    /* block.c: dyf, dxfn, dxf, dya, dxan, dxa [T, d]; dw [T, K]; ds [T, E]; dpf, dpa [T, n]; dCf, dCa [T, n, n] */
    double s = es * T * (6 * d + K + 2 * n + 2 * n * n) + (score ? es * T * E : 0);
    if (c->cp <= 1) { /* attention.c par_attn_keep: dq, dkv; dcmp, dca, dcz */
        s += es * T * (HD + hd + (m > 0 ? hd + 2 * nc : 0));
    } else { /* cp.c keep_alloc: [rows, Dh + L] working rows of dq, dkv, dcmp, dca, dcz (TP: the shard's dq) */
        double W = (c->cp_rank > 0 ? cp_halo(c, b) : 0) + (double)g->seq_length / (double)c->cp;
        s += es * (double)c->rows * W * (HD / (double)(c->tp > 1 ? c->tp : 1) + 2 * hd + 2 * nc) + 1;
    }
    if (c->ep > 1) /* ep.c: the dy rows of the held experts */
        s += es * T * K * c->recv_factor * d;
    return s;
}

double par_memmodel_act_head_wkeep(const par_memmodel_act_ctx *c, int64_t Ti)
{
    return c->es * 2 * (double)Ti * (double)c->cfg->dim; /* dxn, dx */
}

double par_memmodel_act_mtp_input_wkeep(const par_memmodel_act_ctx *c, int64_t Ti)
{
    const par_config *g = c->cfg;
    return c->es * (double)Ti * (3 * (double)g->dim + (double)(g->hc_mult * g->dim)); /* dep, den, demb, dhn */
}

double par_memmodel_act_head_saved(const par_memmodel_act_ctx *c, int64_t Ti)
{
    const par_config *g = c->cfg;
    double T = (double)Ti, es = c->es, n = (double)g->hc_mult, d = (double)g->dim, V = (double)g->vocab_size;
    /* head.c: hc_head saved (mhc.c: 4 pieces [T, n] + [T]); x, xn [T, d]; rstd, lse, ce [T]; logits [T, V]
     * (not with the vocab-parallel hook: it keeps [T, V/TP] of them itself, par_memmodel_act_head_hook_kept; a
     * dump's [T, V] is not modelled) */
    return 4 * pc(T * n, es) + pc(T, es) + es * (2 * T * d + 3 * T + (c->vocab ? 0 : T * V));
}

double par_memmodel_act_head_hook_kept(const par_memmodel_act_ctx *c, int64_t Ti)
{
    if (!c->vocab)
        return 0;
    /* tp_vocab.c head_setup: xn [Tg, d], logits [Tg, V/TP], lse [Tg]; target int32 [Tg] */
    double Tg = tp_tokens(c, (double)Ti), d = (double)c->cfg->dim, Vl = (double)c->cfg->vocab_size / (double)c->tp;
    return c->es * (Tg * d + Tg * Vl + Tg + 1) + 4 * (Tg + 1);
}

double par_memmodel_act_head_bwd_peak(const par_memmodel_act_ctx *c, int64_t Ti)
{
    const par_config *g = c->cfg;
    double T = (double)Ti, d = (double)g->dim;
    if (c->vocab) { /* tp_vocab.c par_tp_head_backward: dz [Tg, V/TP], dxs [Tg, d], mine [T, d]; dxn, dx */
        double Tg = tp_tokens(c, T), Vl = (double)g->vocab_size / (double)c->tp;
        return c->es * (Tg * Vl + Tg * d + T * d + 1) + c->es * 2 * T * d;
    }
    return c->es * (T * (double)g->vocab_size + 2 * T * d); /* dlogits, dxn, dx */
}

double par_memmodel_act_mtp_input_saved(const par_memmodel_act_ctx *c, int64_t Ti)
{
    const par_config *g = c->cfg;
    double T = (double)Ti, n = (double)g->hc_mult, d = (double)g->dim;
    /* head.c mtp input: emb, en, ep [T, d]; en_rstd [T]; hn, X0 [T, n, d]; hn_rstd [T, n] */
    return c->es * (3 * T * d + T + 2 * T * n * d + T * n);
}

double par_memmodel_act_mtp_input_bwd_peak(const par_memmodel_act_ctx *c, int64_t Ti)
{
    const par_config *g = c->cfg;
    double T = (double)Ti;
    return c->es * (3 * T * (double)g->dim + T * (double)(g->hc_mult * g->dim)); /* dep, den, demb, dhn */
}

double par_memmodel_act_stream(const par_memmodel_act_ctx *c, int64_t T)
{
    return c->es * (double)T * (double)c->cfg->hc_mult * (double)c->cfg->dim;
}

double par_memmodel_act_batch(int64_t T) { return 6.0 * 4.0 * (double)T; }

/* The blocks of the statistics and their rows (rows < 0: every block). */
static void stats_dims(const par_memmodel_act_ctx *c, int64_t rows, double *nb, double *nr)
{
    *nb = (double)(c->cfg->n_layers + c->cfg->n_mtp_layers);
    *nr = rows >= 0 && rows < *nb ? (double)rows : *nb;
}

double par_memmodel_act_stats_terms(const par_memmodel_act_ctx *c, int64_t Nsi, int64_t rows)
{
    double nb, nr, E = (double)c->cfg->n_routed_experts, Ns = (double)Nsi;
    stats_dims(c, rows, &nb, &nr);
    /* ce_main, ce_mtp [Ns] f64; loads [nb, E] i64, row [nb] i32 (nr < nb); aux [nb, Ns] */
    return 16 * Ns + 8 * nb * E + (nr < nb ? 4 * nb : 0) + c->es * nb * Ns;
}

double par_memmodel_act_stats_rows(const par_memmodel_act_ctx *c, int64_t Nsi, int64_t rows)
{
    double nb, nr, E = (double)c->cfg->n_routed_experts, Ns = (double)Nsi;
    stats_dims(c, rows, &nb, &nr);
    /* cnt [nr, Ns, E], ntok [nr, Ns] i64; psum [nr, Ns, E] */
    return 8 * nr * Ns * E + 8 * nr * Ns + c->es * nr * Ns * E;
}

double par_memmodel_act_stats(const par_memmodel_act_ctx *c, int64_t Nsi, int64_t rows)
{
    return par_memmodel_act_stats_terms(c, Nsi, rows) + par_memmodel_act_stats_rows(c, Nsi, rows);
}
