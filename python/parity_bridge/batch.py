"""Reading `parity export batch` directories (batch.json, batch.K.safetensors,
npy/K/<field>.npy): the packed batches of a run in a training framework's form.

    b = BatchSet("out/batch")
    for k in b.step_numbers():
        f = b.step(k)        # {"tokens": [B,S] int32, "cu_seqlens": [B, max+1], "labels": ..., ...}
"""
import json
import os

import numpy as np

from . import safetensors as st

FORMAT = "parity-batch"


class BatchSet:
    def __init__(self, path):
        self.path = path
        with open(os.path.join(path, "batch.json")) as f:
            self.doc = json.load(f)
        if self.doc.get("format") != FORMAT:
            raise ValueError(f"{path}: batch.json format {self.doc.get('format')!r}, expected {FORMAT!r}")

    @property
    def fields(self):
        return [f["name"] for f in self.doc["fields"]]

    def step_numbers(self):
        k0 = int(self.doc["first_step"])
        return list(range(k0, k0 + int(self.doc["steps"])))

    def step(self, k):
        """Step k's fields from batch.k.safetensors."""
        return st.read(os.path.join(self.path, f"batch.{k}.safetensors"))[0]

    def step_npy(self, k):
        """The same from npy/k/<field>.npy."""
        d = os.path.join(self.path, "npy", str(k))
        return {n: np.load(os.path.join(d, n + ".npy")) for n in self.fields}

    def row_thd(self, k, r):
        """(cu_seqlens, max_seqlen) of row r: the packed-THD boundaries a varlen
        attention kernel takes for that row (micro-batch size 1)."""
        f = self.step(k)
        n = int(f["num_samples"][r])
        return f["cu_seqlens"][r, :n + 1].copy(), int(f["max_seqlen"][r])
