"""The DeepSeek-V4 training step of MODEL.md, in PyTorch: a second implementation
of parity's serial reference, written from the contract (/work/shared/spec/MODEL.md
sections cited below; where the contract is silent it follows the readings
parity documents in docs/golden.md, docs/kernels.md and docs/model.md).

Parameters are registered so that ``named_parameters()`` / ``state_dict()`` give
parity's (= the release's) names: ``layers.3.attn.wq_a.weight``, ``hc_head_fn``,
``mtp.0.ffn.experts.17.w1.weight`` ...  Everything works on [B, S, ...] tensors
of one global batch; masks are dense per row (fine for v4-tiny / v4-mini).

    model = V4(cfg).to(torch.float64)
    model.load_parity_state(params)              # {name: ndarray} (parity_bridge.hf.load)
    out = model(batch)                           # batch: tokens, segments, position_ids, labels, ...
    out.loss.backward()
    opt = MuonAdamW(model, cfg); grad_norm = opt.step(out)
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from parity_torch import recipe as qr_recipe

NEG_INF = float("-inf")


# --------------------------------------------------------------- helpers --

class Lin(nn.Module):
    """Linear without bias, weight [out, in]: y = x W^T; under a recipe (V4.set_recipe)
    with its weight class's casts and the straight-through backward (parity_torch.recipe)."""

    def __init__(self, out_f, in_f):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(out_f, in_f))
        self.cast = None

    def forward(self, x):
        return qr_recipe.linear(x, self.weight, self.cast)


class Norm(nn.Module):
    """RMSNorm_w(x) = w * x / sqrt(mean(x^2) + eps) over the last dim."""

    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def softplus(x):
    """max(x, 0) + log1p(exp(-|x|)): exact everywhere (F.softplus returns x above 20)."""
    return x.clamp_min(0) + torch.log1p(torch.exp(-x.abs()))


def rope_freqs(rd, base, cfg, yarn):
    """f_i = base^(-2i/rd), with YaRN for compressed layers (MODEL.md 3)."""
    i = torch.arange(rd // 2, dtype=torch.float64)
    f = 1.0 / base ** (2 * i / rd)
    L = cfg["original_seq_len"]
    if yarn and L > 0:
        def corr(r):
            return rd * math.log(L / (2 * math.pi * r)) / (2 * math.log(base))
        low = max(math.floor(corr(cfg["beta_fast"])), 0)
        high = min(math.ceil(corr(cfg["beta_slow"])), rd - 1)
        if low == high:
            high += 0.001
        smooth = 1 - ((i - low) / (high - low)).clamp(0, 1)
        f = f / cfg["rope_factor"] * (1 - smooth) + f * smooth
    return f


def rope(x, pos, f, sign=1.0):
    """Rotates the last rd = 2 len(f) dims of x as interleaved pairs (2i, 2i+1) by
    angle sign * pos * f_i; pos broadcasts against x.shape[:-1]."""
    rd = 2 * f.numel()
    ang = sign * (pos.to(torch.float64).unsqueeze(-1) * f.to(pos.device))
    c, s = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    head, tail = x[..., :-rd], x[..., -rd:]
    a, b = tail[..., 0::2], tail[..., 1::2]
    rot = torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)
    return torch.cat([head, rot], -1)


class Batch:
    """One global batch and the masks every layer shares (MODEL.md 1).
    tokens, segments: [B, S] integer tensors; derives positions, targets and,
    per ratio m, which rows end a compression block."""

    def __init__(self, tokens, segments, device=None):
        self.tokens = tokens.long().to(device)
        self.segments = segments.long().to(device)
        B, S = self.tokens.shape
        self.B, self.S = B, S
        seg = self.segments
        start = torch.ones_like(seg, dtype=torch.bool)
        start[:, 1:] = seg[:, 1:] != seg[:, :-1]
        t = torch.arange(S, device=seg.device).expand(B, S)
        first = torch.cummax(torch.where(start, t, torch.zeros_like(t)), 1).values
        self.pos = t - first                                     # position in the sample
        self.first = first                                       # row index of the sample start
        same1 = torch.zeros_like(start)
        same1[:, :-1] = seg[:, 1:] == seg[:, :-1]
        same2 = torch.zeros_like(start)
        same2[:, :-2] = (seg[:, 2:] == seg[:, :-2])
        nxt = torch.roll(self.tokens, -1, 1)
        nxt2 = torch.roll(self.tokens, -2, 1)
        self.labels = torch.where(same1, nxt, torch.full_like(nxt, -1))
        self.mtp_inputs = torch.where(same1, nxt, torch.zeros_like(nxt))
        self.mtp_labels = torch.where(same2, nxt2, torch.full_like(nxt, -1))
        self.sample = torch.cumsum(start.reshape(-1).long(), 0) - 1   # global sample index [T]
        self.n_samples = int(self.sample[-1]) + 1 if self.sample.numel() else 0
        self.forced = {}  # {block name: {"idx": [B,S,K], "selected": [B,S,topk]}} (force_decisions)
        j = torch.arange(S, device=seg.device)
        # causal within the sample: key row j visible from query row t
        self.causal = (j.view(1, 1, S) <= t.unsqueeze(-1)) & (j.view(1, 1, S) >= first.unsqueeze(-1))

    def force_decisions(self, step):
        """Takes every discrete decision (router.<block>.idx, attn.<block>.selected)
        from a golden step file instead of computing it: a low-precision run then
        differs from the golden only continuously (docs/gpu-rollout.md, bf16)."""
        for name, a in step.items():
            parts = name.split(".")
            if name.startswith("router.") and name.endswith(".idx"):
                self.forced.setdefault(".".join(parts[1:-1]), {})["idx"] = torch.as_tensor(a).long().to(self.tokens.device)
            if name.startswith("attn.") and name.endswith(".selected"):
                self.forced.setdefault(".".join(parts[1:-1]), {})["selected"] = torch.as_tensor(a).long().to(self.tokens.device)

    def selected_mask(self, ids, m):
        """[B, S, S(entry row)] from entry indices within the sample (-1 = none)."""
        B, S = self.B, self.S
        rows = self.first.unsqueeze(-1) + (ids + 1) * m - 1
        keep = ids >= 0
        mask = torch.zeros(B, S, S, dtype=torch.bool, device=ids.device)
        return mask.scatter_(-1, torch.where(keep, rows, torch.zeros_like(rows)), keep)

    def window(self, w):
        t = torch.arange(self.S, device=self.tokens.device)
        return self.causal & ((t.view(1, -1, 1) - t.view(1, 1, -1)) < w)

    def entry_rows(self, m):
        """[B, S]: rows that end a compression block of ratio m (entry i at (i+1)m-1)."""
        return (self.pos + 1) % m == 0

    def visible(self, m):
        """[B, S(query), S(entry row)]: entries i < floor((p+1)/m) of the query's sample."""
        return self.causal & self.entry_rows(m).unsqueeze(1)


# ------------------------------------------------------------- attention --

class Compressor(nn.Module):
    """MODEL.md 3 compressor: softmax-pooled blocks of m tokens (overlapping halves
    when m == 4), RMSNorm, RoPE at the block's first position."""

    def __init__(self, d, c, m, eps):
        super().__init__()
        self.m, self.c, self.coff = m, c, (2 if m == 4 else 1)
        self.wkv = Lin(self.coff * c, d)
        self.wgate = Lin(self.coff * c, d)
        self.ape = nn.Parameter(torch.zeros(m, self.coff * c))
        self.norm = Norm(c, eps)

    def forward(self, x, bt, f):
        """[B, S, c]: entry i of a sample at the row of its block's last token
        (other rows hold values no query sees)."""
        m, c = self.m, self.c
        B, S, _ = x.shape
        a = self.wkv(x)
        z = self.wgate(x) + self.ape[bt.pos % m]
        pad = m * self.coff
        a_p = F.pad(a, (0, 0, pad, 0))
        z_p = F.pad(z, (0, 0, pad, 0), value=NEG_INF)
        cur = (torch.arange(S, device=x.device).view(S, 1) - (m - 1) + torch.arange(m, device=x.device).view(1, m)
               + pad)                                           # rows of the block ending at each row
        ca, cz = a_p[:, cur], z_p[:, cur]                       # [B, S, m, coff*c]
        if self.coff == 2:
            pa, pz = a_p[:, cur - m][..., :c], z_p[:, cur - m][..., :c]  # block i-1, first half
            has_prev = (bt.pos >= 2 * m - 1).view(B, S, 1, 1)
            pz = torch.where(has_prev, pz, torch.full_like(pz, NEG_INF))
            sa = torch.cat([pa, ca[..., c:]], 2)
            sz = torch.cat([pz, cz[..., c:]], 2)
        else:
            sa, sz = ca, cz
        pooled = (torch.softmax(sz, 2) * sa).sum(2)
        return rope(self.norm(pooled), bt.pos - (m - 1), f)


class Indexer(nn.Module):
    """MODEL.md 3 lightning indexer (m == 4): picks index_topk entries per query.
    Not differentiated: its weights get no gradient."""

    def __init__(self, cfg):
        super().__init__()
        d, q, self.iH, self.ihd = cfg["dim"], cfg["q_lora_rank"], cfg["index_n_heads"], cfg["index_head_dim"]
        self.topk = cfg["index_topk"]
        self.wq_b = Lin(self.iH * self.ihd, q)
        self.weights_proj = Lin(self.iH, d)
        self.compressor = Compressor(d, self.ihd, 4, cfg["norm_eps"])
        self.fp4 = False  # v4: q, k rotated and MXFP4, scores in BF16 (docs/recipes.md)

    @torch.no_grad()
    def forward(self, x, qr, bt, f):
        """(selected mask [B, S, S(entry row)], selected entry indices [B, S, topk] ascending, -1 pad)."""
        B, S, _ = x.shape
        qi = rope(self.wq_b(qr).view(B, S, self.iH, self.ihd), bt.pos.unsqueeze(-1), f)
        ki = self.compressor(x, bt, f)
        w = self.weights_proj(x) * (self.ihd ** -0.5 * self.iH ** -0.5)
        if self.fp4:
            qi, ki = qr_recipe.fp4_rows(qi), qr_recipe.fp4_rows(ki)
            dots = qr_recipe.bf16(torch.einsum("bshd,bjd->bshj", qi, ki)).to(x.dtype).clamp_min(0)
            score = qr_recipe.bf16(torch.einsum("bsh,bshj->bsj", w, dots)).to(x.dtype)
        else:
            score = torch.einsum("bsh,bshj->bsj", w, torch.einsum("bshd,bjd->bshj", qi, ki).clamp_min(0))
        vis = bt.visible(4)
        score = score.masked_fill(~vis, NEG_INF).double()
        k = min(self.topk, S)
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :k]  # ties: lower entry
        keep = torch.arange(k, device=x.device).view(1, 1, k) < vis.sum(-1, keepdim=True)
        mask = torch.zeros(B, S, S, dtype=torch.bool, device=x.device)
        mask.scatter_(-1, torch.where(keep, order, torch.zeros_like(order)), keep)
        entry = (bt.pos + 1) // 4 - 1                                 # entry index of each row
        ids = torch.where(keep, torch.gather(entry.unsqueeze(1).expand(B, S, S), -1, order), torch.full_like(order, -1))
        ids = torch.where(ids < 0, torch.full_like(ids, 1 << 30), ids).sort(-1).values
        ids = torch.where(ids == 1 << 30, torch.full_like(ids, -1), ids)
        if k < self.topk:
            ids = F.pad(ids, (0, self.topk - k), value=-1)
        return mask, ids


class Attention(nn.Module):
    def __init__(self, cfg, m):
        super().__init__()
        d, H, hd = cfg["dim"], cfg["n_heads"], cfg["head_dim"]
        self.H, self.hd, self.m, self.eps = H, hd, m, cfg["norm_eps"]
        self.G, self.R, self.W = cfg["o_groups"], cfg["o_lora_rank"], cfg["window_size"]
        self.attn_sink = nn.Parameter(torch.zeros(H))
        self.wq_a = Lin(cfg["q_lora_rank"], d)
        self.q_norm = Norm(cfg["q_lora_rank"], self.eps)
        self.wq_b = Lin(H * hd, cfg["q_lora_rank"])
        self.wkv = Lin(hd, d)
        self.kv_norm = Norm(hd, self.eps)
        if m > 0:
            self.compressor = Compressor(d, hd, m, self.eps)
        if m == 4:
            self.indexer = Indexer(cfg)
        self.wo_a = Lin(self.G * self.R, H * hd // self.G)
        self.wo_b = Lin(d, self.G * self.R)
        base = cfg["compress_rope_theta"] if m > 0 else cfg["rope_theta"]
        # a plain attribute, not a buffer: the angles stay float64 whatever the model's dtype
        self.freqs = rope_freqs(cfg["rope_head_dim"], base, cfg, yarn=m > 0)

    def forward(self, x, bt, rec):
        B, S, _ = x.shape
        H, hd, f = self.H, self.hd, self.freqs
        qr = self.q_norm(self.wq_a(x))
        q = self.wq_b(qr).view(B, S, H, hd)
        q = rope(q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + self.eps), bt.pos.unsqueeze(-1), f)
        kv = rope(self.kv_norm(self.wkv(x)), bt.pos, f)
        scale = hd ** -0.5
        z = [torch.einsum("bshd,bjd->bhsj", q, kv).mul(scale).masked_fill(~bt.window(self.W).unsqueeze(1), NEG_INF)]
        keys = [kv]
        if self.m > 0:
            cmp = self.compressor(x, bt, f)
            if self.m == 4:
                vis, sel = self.indexer(x, qr, bt, f)
                forced = bt.forced.get(self.tag, {}).get("selected")
                if forced is not None:
                    vis, sel = bt.selected_mask(forced, 4), forced
                rec["selected"] = sel
            else:
                vis = bt.visible(self.m)
            z.append(torch.einsum("bshd,bjd->bhsj", q, cmp).mul(scale).masked_fill(~vis.unsqueeze(1), NEG_INF))
            keys.append(cmp)
        z.append(self.attn_sink.view(1, H, 1, 1).expand(B, H, S, 1))
        p = torch.softmax(torch.cat(z, -1), -1)
        o = sum(torch.einsum("bhsj,bjd->bshd", p[..., k * S:(k + 1) * S], keys[k]) for k in range(len(keys)))
        o = rope(o, bt.pos.unsqueeze(-1), f, sign=-1.0)
        og = o.reshape(B, S, self.G, H * hd // self.G)
        r = torch.einsum("bsgi,gri->bsgr", og, self.wo_a.weight.view(self.G, self.R, H * hd // self.G))
        return self.wo_b(r.reshape(B, S, self.G * self.R))


# ------------------------------------------------------------------- MoE --

class Expert(nn.Module):
    def __init__(self, d, inter, limit):
        super().__init__()
        self.w1, self.w2, self.w3 = Lin(inter, d), Lin(d, inter), Lin(inter, d)
        self.limit = limit

    def forward(self, x, w=None):
        g, u = self.w1(x), self.w3(x)
        if self.limit > 0:
            g, u = g.clamp(max=self.limit), u.clamp(-self.limit, self.limit)
        h = F.silu(g) * u
        return self.w2(h if w is None else w.unsqueeze(-1) * h)


class Gate(nn.Module):
    def __init__(self, cfg, hash_layer):
        super().__init__()
        E, K = cfg["n_routed_experts"], cfg["n_activated_experts"]
        self.weight = nn.Parameter(torch.zeros(E, cfg["dim"]))
        self.hash = hash_layer
        if hash_layer:
            self.register_buffer("tid2eid", torch.zeros(cfg["vocab_size"], K, dtype=torch.long))
        else:
            self.bias = nn.Parameter(torch.zeros(E), requires_grad=False)


class MoE(nn.Module):
    def __init__(self, cfg, hash_layer):
        super().__init__()
        self.E, self.K = cfg["n_routed_experts"], cfg["n_activated_experts"]
        self.route_scale = cfg["route_scale"]
        self.gate = Gate(cfg, hash_layer)
        lim = cfg["swiglu_limit"]
        self.experts = nn.ModuleList(Expert(cfg["dim"], cfg["moe_inter_dim"], lim) for _ in range(self.E))
        self.shared_experts = Expert(cfg["dim"], cfg["moe_inter_dim"], lim)

    def forward(self, x, tokens, bt, rec):
        B, S, d = x.shape
        s = torch.sqrt(softplus(x @ self.gate.weight.t()))
        forced = bt.forced.get(self.tag, {}).get("idx")
        if forced is not None:
            idx = forced
        elif self.gate.hash:
            idx = self.gate.tid2eid[tokens].sort(-1).values
        else:
            biased = s.detach().double() + self.gate.bias.double()
            idx = torch.sort(biased, dim=-1, descending=True, stable=True).indices[..., :self.K].sort(-1).values
        sel = torch.gather(s, -1, idx)
        w = sel / sel.sum(-1, keepdim=True) * self.route_scale
        xf, wf, idf = x.reshape(-1, d), w.reshape(-1, self.K), idx.reshape(-1, self.K)
        y = self.shared_experts(xf)
        for e in torch.unique(idf).tolist():
            rows, ks = torch.nonzero(idf == e, as_tuple=True)
            y = y.index_add(0, rows, self.experts[e](xf[rows], wf[rows, ks]))
        rec["idx"] = idx
        rec["load"] = torch.bincount(idf.reshape(-1), minlength=self.E)
        if not self.gate.hash:
            rec["aux"] = self.aux_loss(s, idf, bt)
        return y.view(B, S, d)

    def aux_loss(self, s, idf, bt):
        """MODEL.md 6: mean over the samples of sum_e f_e P_e (f_e without gradient)."""
        E, K, Ns = self.E, self.K, bt.n_samples
        q = bt.sample
        sn = (s / s.sum(-1, keepdim=True)).reshape(-1, E)
        P = torch.zeros(Ns, E, dtype=s.dtype, device=s.device).index_add(0, q, sn)
        cnt = torch.zeros(Ns, E, dtype=s.dtype, device=s.device).index_add(
            0, q, F.one_hot(idf, E).sum(1).to(s.dtype))
        Tq = torch.bincount(q, minlength=Ns).to(s.dtype).unsqueeze(-1)
        return ((E / (K * Tq)) * cnt * (P / Tq)).sum() / Ns


# ------------------------------------------------------------ mHC blocks --

def hc_mix(X, fn, eps):
    """mixes = (fn v) / sqrt(mean(v^2) + eps), v = the n streams concatenated."""
    v = X.flatten(-2)
    return (v @ fn.t()) * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)


class Block(nn.Module):
    """A layer (attention, then MoE), each sub-layer wrapped by mHC (MODEL.md 2)."""

    def __init__(self, cfg, b):
        super().__init__()
        n, d = cfg["hc_mult"], cfg["dim"]
        self.n, self.iters, self.hc_eps, self.eps = n, cfg["hc_sinkhorn_iters"], cfg["hc_eps"], cfg["norm_eps"]
        P = (2 + n) * n
        for s in ("attn", "ffn"):
            setattr(self, f"hc_{s}_fn", nn.Parameter(torch.zeros(P, n * d)))
            setattr(self, f"hc_{s}_base", nn.Parameter(torch.zeros(P)))
            setattr(self, f"hc_{s}_scale", nn.Parameter(torch.zeros(3)))
        self.attn_norm = Norm(d, self.eps)
        self.ffn_norm = Norm(d, self.eps)
        self.attn = Attention(cfg, cfg["compress_ratios"][b])
        self.ffn = MoE(cfg, b < cfg["n_hash_layers"])
        L = cfg["n_layers"]
        self.attn.tag = self.ffn.tag = f"layers.{b}" if b < L else f"mtp.{b - L}"

    def hc_pre(self, X, which):
        n, e = self.n, self.hc_eps
        fn, base, sc = (getattr(self, f"hc_{which}_{k}") for k in ("fn", "base", "scale"))
        mix = hc_mix(X, fn, self.eps)
        pre = torch.sigmoid(mix[..., :n] * sc[0] + base[:n]) + e
        post = 2 * torch.sigmoid(mix[..., n:2 * n] * sc[1] + base[n:2 * n])
        C = (mix[..., 2 * n:] * sc[2] + base[2 * n:]).unflatten(-1, (n, n))
        C = torch.softmax(C, -1) + e
        C = C / (C.sum(-2, keepdim=True) + e)
        for _ in range(self.iters - 1):
            C = C / (C.sum(-1, keepdim=True) + e)
            C = C / (C.sum(-2, keepdim=True) + e)
        x = (pre.unsqueeze(-1) * X).sum(-2)
        return x, post, C

    @staticmethod
    def hc_post(f, X, post, C):
        return post.unsqueeze(-1) * f.unsqueeze(-2) + torch.einsum("...jk,...jd->...kd", C, X)

    def forward(self, X, tokens, bt, rec):
        x, post, C = self.hc_pre(X, "attn")
        X = self.hc_post(self.attn(self.attn_norm(x), bt, rec), X, post, C)
        x, post, C = self.hc_pre(X, "ffn")
        return self.hc_post(self.ffn(self.ffn_norm(x), tokens, bt, rec), X, post, C)


class MTPBlock(Block):
    """MODEL.md 5: e_proj / h_proj input, a block, its own hc_head and norm."""

    def __init__(self, cfg, b):
        super().__init__(cfg, b)
        n, d = cfg["hc_mult"], cfg["dim"]
        self.enorm, self.hnorm, self.norm = Norm(d, self.eps), Norm(d, self.eps), Norm(d, self.eps)
        self.e_proj, self.h_proj = Lin(d, d), Lin(d, d)
        self.hc_head_fn = nn.Parameter(torch.zeros(n, n * d))
        self.hc_head_base = nn.Parameter(torch.zeros(n))
        self.hc_head_scale = nn.Parameter(torch.zeros(1))


class Tap(nn.Module):
    """Identity, so a recorder can hook a named point of the forward."""

    def forward(self, x):
        return x


class V4(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        n, d, V = cfg["hc_mult"], cfg["dim"], cfg["vocab_size"]
        self.n, self.eps, self.hc_eps = n, cfg["norm_eps"], cfg["hc_eps"]
        self.embed = nn.Module()
        self.embed.weight = nn.Parameter(torch.zeros(V, d))
        self.layers = nn.ModuleList(Block(cfg, b) for b in range(cfg["n_layers"]))
        self.norm = Norm(d, self.eps)
        self.head = nn.Module()
        self.head.weight = nn.Parameter(torch.zeros(V, d))
        self.hc_head_fn = nn.Parameter(torch.zeros(n, n * d))
        self.hc_head_base = nn.Parameter(torch.zeros(n))
        self.hc_head_scale = nn.Parameter(torch.zeros(1))
        L = cfg["n_layers"]
        self.mtp = nn.ModuleList(MTPBlock(cfg, L + i) for i in range(cfg["n_mtp_layers"]))
        self.logits_tap, self.mtp_logits_tap = Tap(), Tap()

    def set_recipe(self, name):
        """Applies a recipe of docs/recipes.md ('none', 'bf16', 'fp8', 'v4'): each Lin gets its
        weight class's casts, and under v4 the indexers their FP4 QK path."""
        if name not in qr_recipe.RECIPES:
            raise ValueError(f"unknown recipe {name!r} (known: {', '.join(qr_recipe.RECIPES)})")
        self.recipe = name
        for mname, m in self.named_modules():
            if isinstance(m, Lin):
                m.cast = qr_recipe.Cast(name, qr_recipe.weight_class(mname))
            if isinstance(m, Indexer):
                m.fp4 = name == "v4"

    def load_parity_state(self, params):
        """Loads {parity name: array or tensor} (every parameter and tid2eid),
        strictly: a missing or extra name or a wrong shape is an error."""
        sd = self.state_dict()
        missing = sorted(set(sd) - set(params))
        extra = sorted(set(params) - set(sd))
        if missing or extra:
            raise KeyError(f"parameters missing {missing[:5]} ({len(missing)}), not in the model {extra[:5]} ({len(extra)})")
        new = {}
        for n, ref in sd.items():
            t = torch.as_tensor(params[n])
            if tuple(t.shape) != tuple(ref.shape):
                raise ValueError(f"{n}: shape {tuple(t.shape)}, the model has {tuple(ref.shape)}")
            new[n] = t.to(dtype=ref.dtype, device=ref.device)
        self.load_state_dict(new, strict=True)

    def parity_state(self):
        """{parity name: tensor} of every parameter and tid2eid (int32, as parity stores it)."""
        return {n: (t.to(torch.int32) if n.endswith("tid2eid") else t).detach()
                for n, t in self.state_dict().items()}

    def block_names(self):
        L = self.cfg["n_layers"]
        return [f"layers.{b}" for b in range(L)] + [f"mtp.{i}" for i in range(len(self.mtp))]

    def head_logits(self, X, fn, base, scale, norm):
        pre = torch.sigmoid(hc_mix(X, fn, self.eps) * scale[0] + base) + self.hc_eps
        return norm((pre.unsqueeze(-1) * X).sum(-2)) @ self.head.weight.t()

    def forward(self, bt):
        """Returns a StepOutput with losses, logits, per-block records (act,
        routing, selections) of MODEL.md 1-6."""
        cfg, n = self.cfg, self.n
        recs = []
        X = self.embed.weight[bt.tokens].unsqueeze(-2).expand(bt.B, bt.S, n, cfg["dim"])
        acts = []
        for blk in self.layers:
            rec = {}
            X = blk(X, bt.tokens, bt, rec)
            recs.append(rec)
            acts.append(X)
        logits = self.logits_tap(self.head_logits(X, self.hc_head_fn, self.hc_head_base, self.hc_head_scale, self.norm))
        mtp_logits = None
        for m in self.mtp:
            e = m.enorm(self.embed.weight[bt.mtp_inputs])
            Xm = m.e_proj(e).unsqueeze(-2) + m.h_proj(m.hnorm(X))
            rec = {}
            Xm = m(Xm, bt.mtp_inputs, bt, rec)
            recs.append(rec)
            acts.append(Xm)
            mtp_logits = self.mtp_logits_tap(self.head_logits(Xm, m.hc_head_fn, m.hc_head_base, m.hc_head_scale, m.norm))
        return StepOutput(self, bt, logits, mtp_logits, acts, recs)

    @torch.no_grad()
    def blockwise(self, bt, golden_act):
        """Each block fed the golden's input instead of the previous block's output
        (block 0 the embedding, the MTP block the golden's last main residual):
        {"act.<block>": output}, so a comparison bounds one block's error, not the
        sum over the depth.  golden_act: {"act.<block>": [B, S, n, d] array}."""
        cfg, n = self.cfg, self.n
        w = self.embed.weight
        def gold(name):
            return torch.as_tensor(golden_act[f"act.{name}"]).to(device=w.device, dtype=w.dtype)
        out = {}
        X = w[bt.tokens].unsqueeze(-2).expand(bt.B, bt.S, n, cfg["dim"])
        names = self.block_names()
        for b, blk in enumerate(self.layers):
            Xin = X if b == 0 else gold(names[b - 1])
            out[f"act.{names[b]}"] = blk(Xin, bt.tokens, bt, {})
        for i, m in enumerate(self.mtp):
            h = gold(names[len(self.layers) - 1])
            Xm = m.e_proj(m.enorm(w[bt.mtp_inputs])).unsqueeze(-2) + m.h_proj(m.hnorm(h))
            out[f"act.{names[len(self.layers) + i]}"] = m(Xm, bt.mtp_inputs, bt, {})
        return out


def cross_entropy_sum(logits, targets):
    """(sum over tokens with a target of logsumexp - logit[target], count)."""
    lg = logits.reshape(-1, logits.shape[-1])
    t = targets.reshape(-1)
    keep = t >= 0
    lse = torch.logsumexp(lg[keep], -1)
    return (lse - lg[keep].gather(-1, t[keep].unsqueeze(-1)).squeeze(-1)).sum(), int(keep.sum())


class StepOutput:
    """The loss of MODEL.md 6 and everything a golden step file holds."""

    def __init__(self, model, bt, logits, mtp_logits, acts, recs):
        cfg = model.cfg
        self.bt, self.logits, self.mtp_logits, self.acts, self.recs = bt, logits, mtp_logits, acts, recs
        self.names = model.block_names()
        ce, self.n_main = cross_entropy_sum(logits, bt.labels)
        zero = logits.new_zeros(())
        self.loss_main = ce / self.n_main if self.n_main else zero
        self.n_mtp = 0
        self.loss_mtp = zero
        if mtp_logits is not None:
            ce_t, self.n_mtp = cross_entropy_sum(mtp_logits, bt.mtp_labels)
            self.loss_mtp = ce_t / self.n_mtp if self.n_mtp else zero
        aux = [r["aux"] for r in recs if "aux" in r]
        self.loss_aux = sum(aux) if aux else zero
        self.loss = self.loss_main + cfg["aux_alpha"] * self.loss_aux
        if self.n_mtp:
            self.loss = self.loss + cfg["mtp_lambda"] * self.loss_mtp
        self.loads = [r["load"] for r in recs]


# ------------------------------------------------------------- optimizer --

def opt_kind(name, p, model):
    """MODEL.md 7: Muon for 2-D weights but embed, head, *.ape; AdamW for the rest;
    none for gate.bias (balance) and buffers."""
    if not p.requires_grad:
        return "none"
    if p.dim() == 2 and name not in ("embed.weight", "head.weight") and not name.endswith(".ape"):
        return "muon"
    return "adamw"


def newton_schulz(U):
    """X = U/(||U||_F + 1e-7), transposed when rows > cols, 8 steps of
    (3.4445, -4.7750, 2.0315) and 2 of (2, -1.5, 0.5), transposed back."""
    X = U / (torch.linalg.norm(U.double()).to(U.dtype) + 1e-7)
    tr = X.shape[0] > X.shape[1]
    if tr:
        X = X.t()
    for k in range(10):
        a, b, c = (3.4445, -4.7750, 2.0315) if k < 8 else (2.0, -1.5, 0.5)
        A = X @ X.t()
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.t() if tr else X


class MuonAdamW:
    """MODEL.md 7, one update per global batch: clip, Muon, AdamW, balance."""

    def __init__(self, model, cfg):
        self.model, self.cfg, self.t = model, cfg, 0
        self.state = {}
        self.kinds = {n: opt_kind(n, p, model) for n, p in model.named_parameters()}

    @torch.no_grad()
    def grad_norm(self):
        s = 0.0
        for n, p in self.model.named_parameters():
            if self.kinds[n] != "none" and p.grad is not None:
                s += float(p.grad.double().pow(2).sum())
        return math.sqrt(s)

    @torch.no_grad()
    def step(self, out):
        cfg, lr, wd, mu = self.cfg, self.cfg["lr"], self.cfg["wd"], self.cfg["mu"]
        norm = self.grad_norm()
        f = min(1.0, cfg["clip_grad"] / (norm + 1e-6))
        self.t += 1
        b1, b2, eps = 0.9, 0.95, 1e-8
        for n, p in self.model.named_parameters():
            kind = self.kinds[n]
            if kind == "none":
                continue
            G = (p.grad if p.grad is not None else torch.zeros_like(p)) * f
            st = self.state.setdefault(n, {})
            if kind == "muon":
                M = st.setdefault("momentum", torch.zeros_like(p))
                M.mul_(mu).add_(G)
                X = newton_schulz(mu * M + G)
                p.mul_(1 - lr * wd).sub_(lr * 0.18 * math.sqrt(max(p.shape)) * X)
            else:
                m = st.setdefault("exp_avg", torch.zeros_like(p))
                v = st.setdefault("exp_avg_sq", torch.zeros_like(p))
                m.mul_(b1).add_((1 - b1) * G)
                v.mul_(b2).add_((1 - b2) * G * G)
                wdp = wd if n in ("embed.weight", "head.weight") else 0.0
                upd = (m / (1 - b1 ** self.t)) / (torch.sqrt(v / (1 - b2 ** self.t)) + eps)
                p.mul_(1 - lr * wdp).sub_(lr * upd)
        self.balance(out)
        return norm

    @torch.no_grad()
    def balance(self, out):
        """gate.bias[e] += rate * sign(K T_total / E - load_e) for score-routed blocks."""
        cfg = self.cfg
        E, K, T = cfg["n_routed_experts"], cfg["n_activated_experts"], out.bt.B * out.bt.S
        blocks = list(self.model.layers) + list(self.model.mtp)
        for blk, load in zip(blocks, out.loads):
            if not blk.ffn.gate.hash:
                target = K * T / E
                blk.ffn.gate.bias.add_(cfg["bias_update_rate"] * torch.sign(target - load.to(torch.float64)).to(
                    blk.ffn.gate.bias.dtype))

    def state_arrays(self):
        """{parameter name: {slot: tensor}} (GOLDEN.md optimizer names)."""
        return self.state
