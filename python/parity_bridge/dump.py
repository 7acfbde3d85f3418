"""Writing a dump in the golden format that `parity compare` reads (GOLDEN.md,
docs/formats.md): params.K / step.K safetensors and manifest.json with the
sha256 of every file.  The directory is built as DIR.tmp-XXXXXX and renamed
over DIR at close(), so a failed run leaves nothing half-written.

    w = GoldenWriter("out/torch", model=gs.manifest["model"], train=gs.manifest["train"],
                     precision="f64", generator=("parity_torch", "0.1.0"),
                     layout={"framework": "pytorch", "device": "cpu"}, data=gs.manifest["data"])
    w.write_params(0, params)                      # params.0 (no optimizer state)
    w.write_step(0, step_tensors)                  # input.*, out.*, act.*, router.*, grad.*
    w.write_params(1, params, opt)                 # opt: {name: {slot: array}}
    w.close()                                      # manifest.json, rename into place
"""
import json
import os
import shutil
import tempfile

import numpy as np

from . import safetensors as st
from .golden import FORMAT, sha256_file


class GoldenWriter:
    def __init__(self, path, model, train, precision, generator=("parity_bridge", "0.1.0"),
                 layout=None, data=None, first_step=0, tolerances=None):
        self.path = os.path.abspath(path)
        parent = os.path.dirname(self.path)
        self.tmp = tempfile.mkdtemp(prefix=os.path.basename(self.path) + ".tmp-", dir=parent)
        self.manifest = {
            "format": FORMAT, "version": 1,
            "generator": {"name": generator[0], "version": generator[1]},
            "model": dict(model), "train": dict(train), "precision": precision, "steps": 0,
            "layout": dict(layout or {}), "data": dict(data or {}), "files": {},
        }
        if first_step:
            self.manifest["first_step"] = int(first_step)
        if tolerances:
            self.manifest["tolerances"] = tolerances
        self.precision = precision
        self.steps = set()

    def _meta(self, k):
        return {"format": FORMAT, "precision": self.precision, "step": str(k)}

    def write_params(self, k, params, opt=None):
        t = dict(params)
        for n, slots in (opt or {}).items():
            for slot, a in slots.items():
                t[f"opt.{n}.{slot}"] = a
        st.write(os.path.join(self.tmp, f"params.{k}.safetensors"), t, self._meta(k))

    def write_step(self, k, tensors):
        st.write(os.path.join(self.tmp, f"step.{k}.safetensors"), tensors, self._meta(k))
        self.steps.add(k)

    def close(self):
        """Writes manifest.json (sha256 of every file) and renames the set into place."""
        m = self.manifest
        m["steps"] = len(self.steps)
        m["files"] = {f: sha256_file(os.path.join(self.tmp, f)) for f in sorted(os.listdir(self.tmp))
                      if not f.startswith(".") and f != "manifest.json"}
        with open(os.path.join(self.tmp, "manifest.json"), "w") as f:
            json.dump(m, f, indent=1)
        if os.path.exists(self.path):
            old = tempfile.mkdtemp(prefix=os.path.basename(self.path) + ".old-", dir=os.path.dirname(self.path))
            os.rename(self.path, os.path.join(old, "x"))
            os.rename(self.tmp, self.path)
            shutil.rmtree(old)
        else:
            os.rename(self.tmp, self.path)

    def abort(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


def as_golden_dtype(a, precision):
    """A float array in the set's working precision, integers as they are."""
    a = np.asarray(a)
    if np.issubdtype(a.dtype, np.floating):
        return a.astype(np.float64 if precision == "f64" else np.float32)
    return a
