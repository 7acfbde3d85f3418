"""Reading a parity golden set (GOLDEN.md, docs/golden.md) into numpy or torch.

    gs = GoldenSet("golden/v4-tiny")          # manifest checked, sha256 verified
    gs.config                                 # model + train keys (MODEL.md names)
    p0 = gs.params(0)                         # {name: ndarray}, parameters only
    opt1 = gs.optimizer(1)                    # {name: {"momentum" | "exp_avg" | "exp_avg_sq": ndarray}}
    s0 = gs.step(0)                           # inputs, out.*, act.*, router.*, attn.*, grad.*
    g0 = gs.grads(0)                          # {parameter name: gradient}
    t = to_torch(p0, dtype=torch.float64)     # torch tensors (torch optional)
"""
import hashlib
import json
import os
import re

from . import safetensors as st

FORMAT = "parity-golden"
OPT_SLOTS = ("momentum", "exp_avg_sq", "exp_avg")  # longest suffix first


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def split_opt_name(name):
    """'opt.<param>.<slot>' -> (param, slot), or None."""
    if not name.startswith("opt."):
        return None
    for slot in OPT_SLOTS:
        if name.endswith("." + slot):
            return name[4:-len(slot) - 1], slot
    return None


class GoldenSet:
    """A golden set directory: manifest.json, params.K and step.K safetensors."""

    def __init__(self, path, verify=True):
        self.path = path
        with open(os.path.join(path, "manifest.json")) as f:
            self.manifest = json.load(f)
        m = self.manifest
        if m.get("format") != FORMAT:
            raise ValueError(f"{path}: manifest format {m.get('format')!r}, expected {FORMAT!r}")
        for key in ("model", "train", "layout", "data", "files"):
            if not isinstance(m.get(key), dict):
                raise ValueError(f"{path}: manifest needs the object {key!r}")
        if verify:
            for name, sha in m["files"].items():
                got = sha256_file(os.path.join(path, name))
                if got != sha:
                    raise ValueError(f"{path}/{name}: sha256 {got}, manifest says {sha}")

    @property
    def config(self):
        """Every model and train key by its MODEL.md name (one flat dict)."""
        c = dict(self.manifest["model"])
        c.update(self.manifest["train"])
        return c

    @property
    def precision(self):
        return self.manifest["precision"]

    @property
    def steps(self):
        return int(self.manifest["steps"])

    @property
    def first_step(self):
        return int(self.manifest.get("first_step", 0))

    def step_numbers(self):
        """Step numbers K with a step.K file, ascending."""
        ks = [int(m.group(1)) for f in os.listdir(self.path) if (m := re.fullmatch(r"step\.(0|[1-9]\d*)\.safetensors", f))]
        return sorted(ks)

    def file(self, name):
        return st.read(os.path.join(self.path, name))[0]

    def params(self, k):
        """Parameters before update k (params.k), without optimizer state."""
        return {n: a for n, a in self.file(f"params.{k}.safetensors").items() if not n.startswith("opt.")}

    def optimizer(self, k):
        """Optimizer state in params.k: {param: {slot: array}} (empty for k = 0)."""
        out = {}
        for n, a in self.file(f"params.{k}.safetensors").items():
            ps = split_opt_name(n)
            if ps:
                out.setdefault(ps[0], {})[ps[1]] = a
        return out

    def step(self, k):
        return self.file(f"step.{k}.safetensors")

    def grads(self, k):
        return {n[5:]: a for n, a in self.step(k).items() if n.startswith("grad.")}


def to_torch(arrays, dtype=None, device=None):
    """{name: ndarray} -> {name: torch.Tensor}; float arrays cast to dtype when given."""
    import torch
    out = {}
    for n, a in arrays.items():
        t = torch.from_numpy(a.copy())
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[n] = t.to(device) if device is not None else t
    return out
