"""parity_bridge.GoldenWriter: dumps that `parity compare` reads."""
import json
import os

import numpy as np

from parity_bridge import GoldenSet, GoldenWriter
from util import GOLDEN, TmpCase, parity


def copy_set(gs, out, perturb=None):
    w = GoldenWriter(out, gs.manifest["model"], gs.manifest["train"], gs.precision,
                     generator=("test", "1"), layout={"framework": "test"}, data=gs.manifest["data"])
    for k in range(gs.steps + 1):
        w.write_params(k, gs.params(k), gs.optimizer(k))
        if k < gs.steps:
            s = gs.step(k)
            if perturb and k == perturb[0]:
                s[perturb[1]] = s[perturb[1]] + perturb[2]
            w.write_step(k, s)
    w.close()


class DumpTest(TmpCase):
    def test_copy_is_bitwise_equal(self):
        gs = GoldenSet(GOLDEN)
        out = self.path("dump")
        copy_set(gs, out)
        r = parity("compare", "--policy", "bitwise", GOLDEN, out)
        self.assertIn("EQUAL", r.stdout)
        self.assertEqual(GoldenSet(out).steps, 3)
        self.assertEqual([f for f in os.listdir(self.tmp) if ".tmp-" in f], [])

    def test_a_difference_is_found_and_named(self):
        gs = GoldenSet(GOLDEN)
        out = self.path("dump")
        copy_set(gs, out, perturb=(1, "act.layers.2", 1e-6))
        rep = self.path("cmp.json")
        r = parity("compare", GOLDEN, out, "--json", rep, check=False)
        self.assertEqual(r.returncode, 1)
        with open(rep) as f:
            j = json.load(f)
        bad = [(t["file"], t["tensor"]) for t in j["tensors"] if not t["pass"]]
        self.assertEqual(bad, [("step.1.safetensors", "act.layers.2")])

    def test_a_broken_manifest_is_refused(self):
        gs = GoldenSet(GOLDEN)
        out = self.path("dump")
        copy_set(gs, out)
        with open(os.path.join(out, "step.0.safetensors"), "ab") as f:
            f.write(b"x")
        r = parity("compare", GOLDEN, out, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("sha256", r.stderr + r.stdout)
