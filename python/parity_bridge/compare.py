"""GOLDEN.md's comparison policy in numpy, for reports a script builds itself
(the authoritative judge stays `parity compare`; docs/formats.md):

    float:   ||b - a||_2 <= rtol ||a||_2 + atol sqrt(numel)   (a = the reference)
    integer: equal element for element
"""
import numpy as np

POLICIES = {"f64": (1e-10, 1e-14), "f32": (1e-4, 1e-7), "bf16": (2e-2, 1e-4)}


def judge(a, b, policy="f64"):
    """Dict with pass, max_abs, rel_l2, diff_norm, bound (and n_diff for integers)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return {"pass": False, "reason": f"shape {b.shape} != {a.shape}"}
    if not np.issubdtype(a.dtype, np.floating):
        nd = int(np.count_nonzero(a != b))
        return {"pass": nd == 0, "n_diff": nd, "max_abs": float(np.max(np.abs(a.astype(np.int64) - b.astype(np.int64)), initial=0))}
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)
    same_nonfinite = (fa == fb) & (fa | (np.isnan(a64) & np.isnan(b64)) | (a64 == b64))
    ok = fa & fb
    d = (b64 - a64)[ok]
    na = float(np.sqrt(np.sum(a64[ok] ** 2, dtype=np.longdouble)))
    dn = float(np.sqrt(np.sum(d.astype(np.longdouble) ** 2)))
    rtol, atol = POLICIES[policy]
    bound = rtol * na + atol * np.sqrt(a.size)
    return {"pass": bool(same_nonfinite.all() and dn <= bound), "max_abs": float(np.max(np.abs(d), initial=0.0)),
            "rel_l2": dn / na if na else (0.0 if dn == 0 else float("inf")), "diff_norm": dn, "bound": float(bound),
            "ratio": dn / bound if bound else (0.0 if dn == 0 else float("inf"))}
