"""The recipes of docs/recipes.md (`parity golden --recipe bf16|fp8|v4`) in PyTorch.

Written from the docs (docs/recipes.md: where each cast is applied; docs/precisions.md:
what each cast is, after DeepSeek-V4's inference kernels), not from parity's C code, so that
parity_torch under a recipe is a second reading of the same contract.

Every cast works on float64 values and returns float64 values (the working precision
between casts stays the model's); torch 1.13 has no float8/float4 dtypes, so the grids are
written with frexp and round-half-even:

- ``bf16``: round to nearest even, once, from the exact value (subnormals kept);
- ``e4m3``: FP8 E4M3 (bias 7, max 448, subnormal quantum 2^-9), RNE, saturating at +-448;
- ``e2m1``: FP4 E2M1 (0, .5, 1, 1.5, 2, 3, 4, 6), RNE, saturating at +-6;
- scales: ``act_quant``'s fp32 amax with a floor, ``y = fl32(amax * fl32(1/qmax))``, and either
  y itself (``scale_fmt = None``, fp32 scale) or the power of two ``2^ceil(log2 y)`` (UE8M0).

A recipe GEMM ``y = x W^T`` casts its operands (x in 1xB tiles along K, W in tiles of
[out, in]) and multiplies the dequantized values in the working precision; its backward is
the straight-through estimator: ``dx = dy qW``, ``dW = dy^T qx``.
"""
import torch

RECIPES = ("none", "bf16", "fp8", "v4")

# weight classes (docs/recipes.md "The weight classes"), by the parameter's last names
FP8_NAMES = ("attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_b", "attn.indexer.wq_b",
             "ffn.shared_experts.w1", "ffn.shared_experts.w2", "ffn.shared_experts.w3", "e_proj", "h_proj")
BF16_NAMES = ("attn.wo_a", "attn.indexer.weights_proj")

F32_1_448 = float(torch.tensor(1.0 / 448.0, dtype=torch.float32))
F32_1_6 = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))
F32_1EM4 = float(torch.tensor(1e-4, dtype=torch.float32))
MX_FLOOR = 6.0 * 2.0 ** -126


def weight_class(module_name):
    """'FP8', 'FP4', 'BF16' or 'F32' for a Lin module's name (layers.3.attn.wq_a, mtp.0.e_proj ...)."""
    parts = module_name.split(".")
    if ".ffn.experts." in f".{module_name}." and parts[-1] in ("w1", "w2", "w3"):
        return "FP4"
    for n in FP8_NAMES:
        if module_name.endswith("." + n) or module_name == n:
            return "FP8"
    for n in BF16_NAMES:
        if module_name.endswith("." + n):
            return "BF16"
    return "F32"


# ----------------------------------------------------------------- grids --

def _grid_round(x, min_exp, mant_bits, vmax):
    """Round to nearest even on a binary grid with `mant_bits` fraction bits, smallest
    normal exponent `min_exp` (below it a fixed quantum: the subnormals), saturating
    at +-vmax.  x: float64; exact (a single rounding: x / quantum is exact)."""
    a = x.abs().clamp(max=vmax)
    _, e = torch.frexp(a)                       # a = m 2^e, m in [0.5, 1): floor(log2 a) = e - 1
    e = torch.clamp(e - 1, min=min_exp)
    q = torch.ldexp(torch.ones_like(a), e - mant_bits)
    r = torch.round(a / q) * q                  # torch.round: half to even
    r = torch.where(a == 0, a, r)
    return torch.copysign(r.clamp(max=vmax), x)


def bf16(x):
    """float64 -> the nearest BF16 value (ties to even), as float64; inf/nan pass through."""
    x = x.double()
    r = _grid_round(x, -126, 7, float("inf"))
    big = x.abs() >= 2.0 ** 128 * (1 - 2.0 ** -9)   # rounds past the largest finite BF16
    r = torch.where(big, torch.copysign(torch.full_like(x, float("inf")), x), r)
    return torch.where(torch.isfinite(x), r, x)


def e4m3(x):
    """float64 -> E4M3 value (RNE, satfinite 448)."""
    return _grid_round(x, -6, 3, 448.0)


def e2m1(x):
    """float64 -> E2M1 value (RNE, saturating at 6)."""
    return _grid_round(x, 0, 1, 6.0)


def f32(x):
    return x.float().double()


def _pow2_ceil(y):
    """2^ceil(log2 y) of positive fp32 values y (act_quant's fast_round_scale on y's bits)."""
    m, e = torch.frexp(y)                       # y = m 2^e, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(y), torch.where(m == 0.5, e - 1, e))


def _tile_scale(amax, qmax_inv, floor, ue8m0):
    """act_quant / fp4_quant scale of each tile from its amax (float64 holding fp32 values)."""
    amax = torch.clamp(f32(amax), min=floor)
    y = f32(amax * qmax_inv)
    return _pow2_ceil(y) if ue8m0 else y


# ------------------------------------------------------------ block casts --

def _tiles(x, tr, tc):
    """[R, C] -> [R/tr, C/tc, tr, tc] view of x zero-padded to whole tiles (a partial
    edge tile's amax is taken over what is there: padding with 0 leaves it)."""
    R, C = x.shape
    pr, pc = (-R) % tr, (-C) % tc
    xp = torch.nn.functional.pad(x, (0, pc, 0, pr))
    return xp.view((R + pr) // tr, tr, (C + pc) // tc, tc).permute(0, 2, 1, 3), (R, C)


def _untile(t, shape):
    nr, nc, tr, tc = t.shape
    return t.permute(0, 2, 1, 3).reshape(nr * tr, nc * tc)[:shape[0], :shape[1]]


def quant_sim(x, tile, fmt, ue8m0):
    """Quantize and dequantize a 2-D float64 tensor in tiles (tr, tc) of `fmt` ('e4m3' or
    'e2m1'): the QAT forward's value of x.  Every element: its tile's scale s, q = fmt(x/s)
    (x/s rounded first to fp32 where the scale is fp32, as the kernel divides in fp32), q s."""
    t, shape = _tiles(x, *tile)
    amax = t.abs().amax(dim=(-1, -2), keepdim=True)
    if fmt == "e4m3":
        s = _tile_scale(amax, F32_1_448, F32_1EM4, ue8m0)
        d = t / s if ue8m0 else f32(f32(t) / s)     # a power of two divides exactly
        v = e4m3(d) * s if ue8m0 else f32(e4m3(d) * s)
    else:
        s = _tile_scale(amax, F32_1_6, MX_FLOOR, True)
        v = e2m1(t / s) * s
    nan = ~torch.isfinite(amax)
    v = torch.where(nan, torch.full_like(v, float("nan")), v)
    return _untile(v, shape)


class Cast:
    """What one recipe does to a GEMM of a weight class: (cast of x [.., K], cast of W [N, K])."""

    def __init__(self, recipe, wclass):
        self.x = self.w = None
        if recipe == "none" or wclass == "F32":
            return
        if recipe == "bf16" or wclass == "BF16":
            self.x = self.w = bf16
            return
        ue = recipe == "v4"
        self.x = lambda x: quant_sim(bf16(x), (1, 128), "e4m3", ue)
        if recipe == "v4" and wclass == "FP4":
            self.w = lambda w: quant_sim(w, (1, 32), "e2m1", True)
        else:
            self.w = lambda w: quant_sim(w, (128, 128), "e4m3", ue)

    def active(self):
        return self.x is not None


class _STELinear(torch.autograd.Function):
    """y = qx qW^T; backward with the cast operands and no derivative of the casts."""

    @staticmethod
    def forward(ctx, x, w, qx, qw):
        ctx.save_for_backward(qx, qw)
        return qx @ qw.t()

    @staticmethod
    def backward(ctx, dy):
        qx, qw = ctx.saved_tensors
        d2 = dy.reshape(-1, dy.shape[-1])
        dx = (dy @ qw) if ctx.needs_input_grad[0] else None
        dw = (d2.t() @ qx.reshape(-1, qx.shape[-1])) if ctx.needs_input_grad[1] else None
        return dx, dw, None, None


def linear(x, w, cast):
    """x [.., K] @ w[N, K]^T under `cast` (a Cast); the plain product without one."""
    if cast is None or not cast.active():
        return x @ w.t()
    with torch.no_grad():
        dt = x.dtype
        qx = cast.x(x.detach().reshape(-1, x.shape[-1]).double()).to(dt).reshape(x.shape)
        qw = cast.w(w.detach().double()).to(dt)
    return _STELinear.apply(x, w, qx, qw)


# ---------------------------------------------------------- the indexer --

def hadamard(x):
    """Walsh-Hadamard transform of the last dim (a power of two) scaled by n^-1/2, in float64:
    model.py's rotate_activation (fast_hadamard_transform)."""
    n = x.shape[-1]
    y = x.double().clone()
    h = 1
    while h < n:
        v = y.view(*y.shape[:-1], n // (2 * h), 2, h)
        a, b = v[..., 0, :].clone(), v[..., 1, :].clone()
        v[..., 0, :], v[..., 1, :] = a + b, a - b
        h *= 2
    return y * n ** -0.5


def fp4_rows(x):
    """The indexer's q or k rows (last dim): BF16, rotation, BF16, MXFP4 1x32 (v4)."""
    shape = x.shape
    r = bf16(hadamard(bf16(x.double())))
    return quant_sim(r.reshape(-1, shape[-1]), (1, 32), "e2m1", True).reshape(shape).to(x.dtype)
