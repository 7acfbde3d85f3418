"""A recorder that attaches forward/backward hooks to a torch module tree and
records activations and gradients under golden names (GOLDEN.md).

The user gives the name maps for their own module paths:

    rec = Recorder(model,
                   activations={"decoder.layers.3": "act.layers.3"},     # module output
                   output_grads={"decoder.layers.3": "dact.layers.3"},   # d loss / d output
                   params=lambda path: my_to_parity(path),               # param path -> parity name
                   transform={"act.layers.3": lambda t: t.transpose(0, 1)})  # e.g. [S,B,..] -> [B,S,..]
    with rec:
        loss = model(batch); loss.backward()
    step = {**rec.records, **rec.grads()}      # numpy arrays: "act.layers.3", "grad.layers.3.attn.wq_a.weight", ...

A name recorded more than once in one pass (micro-batches, a module called
twice) is concatenated along dim 0 in call order (merge="cat"), or the last
call is kept (merge="last").  Torch is imported lazily: the module loads with
numpy only.
"""
import numpy as np


def _to_numpy(t):
    import torch
    t = t.detach()
    if t.dtype.is_floating_point and t.dtype not in (torch.float32, torch.float64):
        t = t.float()  # bf16 / fp16 -> fp32 (exact)
    return t.cpu().numpy().copy()


class Recorder:
    def __init__(self, root, activations=None, output_grads=None, params=None, transform=None, merge="cat"):
        self.root = root
        self.activations = dict(activations or {})
        self.output_grads = dict(output_grads or {})
        self.params = params
        self.transform = dict(transform or {})
        self.merge = merge
        self.records = {}
        self._parts = {}
        self._handles = []

    # -- hooks ------------------------------------------------------------------
    def attach(self):
        mods = dict(self.root.named_modules())
        missing = [p for p in list(self.activations) + list(self.output_grads) if p not in mods]
        if missing:
            raise KeyError(f"no module at {missing} (paths as in named_modules())")
        for path, name in self.activations.items():
            self._handles.append(mods[path].register_forward_hook(self._fwd(name)))
        for path, name in self.output_grads.items():
            self._handles.append(mods[path].register_full_backward_hook(self._bwd(name)))
        return self

    def detach(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self.attach()

    def __exit__(self, *exc):
        self.detach()
        self.finish()
        return False

    def _fwd(self, name):
        def hook(module, inputs, output):
            out = output[0] if isinstance(output, (tuple, list)) else output
            self.record(name, out)
        return hook

    def _bwd(self, name):
        def hook(module, grad_input, grad_output):
            if grad_output and grad_output[0] is not None:
                self.record(name, grad_output[0])
        return hook

    # -- records ----------------------------------------------------------------
    def record(self, name, tensor):
        """Records a tensor (torch or numpy) under a golden name."""
        if name in self.transform:
            tensor = self.transform[name](tensor)
        a = _to_numpy(tensor) if hasattr(tensor, "detach") else np.asarray(tensor).copy()
        self._parts.setdefault(name, []).append(a)

    def finish(self):
        """Merges the parts recorded so far into self.records."""
        for name, parts in self._parts.items():
            self.records[name] = parts[-1] if self.merge == "last" or len(parts) == 1 else np.concatenate(parts, 0)
        self._parts = {}
        return self.records

    def reset(self):
        self.records, self._parts = {}, {}

    def parity_name(self, path):
        if self.params is None:
            return path
        if callable(self.params):
            return self.params(path)
        return self.params.get(path)

    def grads(self, prefix="grad.", zero_missing=True):
        """{prefix + parity name: gradient} from every parameter's .grad (None ->
        zeros when zero_missing, e.g. a tensor no gradient flows into)."""
        out = {}
        for path, p in self.root.named_parameters():
            name = self.parity_name(path)
            if name is None:
                continue
            if p.grad is None:
                if not zero_missing or not p.requires_grad:
                    continue
                out[prefix + name] = np.zeros(tuple(p.shape), dtype=_to_numpy(p).dtype)
            else:
                out[prefix + name] = _to_numpy(p.grad)
        return out
