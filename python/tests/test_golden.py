"""parity_bridge.golden on the checked-in golden set."""
import os
import shutil

import numpy as np

from parity_bridge import GoldenSet, golden
from util import GOLDEN, TmpCase, have_torch


class GoldenTest(TmpCase):
    def test_reads_manifest_params_optimizer_steps(self):
        gs = GoldenSet(GOLDEN)
        self.assertEqual(gs.precision, "f64")
        self.assertEqual(gs.steps, 3)
        self.assertEqual(gs.step_numbers(), [0, 1, 2])
        self.assertEqual(gs.config["dim"], 32)
        self.assertEqual(gs.config["lr"], 0.001)
        p0, p1 = gs.params(0), gs.params(1)
        self.assertEqual(len(p0), 208)
        self.assertEqual(set(p0), set(p1))
        self.assertEqual(p0["layers.0.ffn.gate.tid2eid"].dtype, np.int32)
        self.assertEqual(gs.optimizer(0), {})
        o1 = gs.optimizer(1)
        self.assertEqual(set(o1["layers.0.attn.wq_a.weight"]), {"momentum"})
        self.assertEqual(set(o1["norm.weight"]), {"exp_avg", "exp_avg_sq"})
        self.assertNotIn("layers.1.ffn.gate.bias", o1)
        g = gs.grads(0)
        self.assertEqual(g["embed.weight"].shape, (128, 32))
        self.assertNotIn("layers.1.ffn.gate.bias", g, "gate.bias takes no gradient")
        self.assertFalse(np.any(g["layers.1.attn.indexer.wq_b.weight"]), "no gradient into the indexer")
        s0 = gs.step(0)
        self.assertEqual(s0["input.tokens"].shape, (8, 64))
        self.assertEqual(s0["out.loss"].shape, ())

    def test_sha256_is_verified(self):
        bad = self.path("set")
        shutil.copytree(GOLDEN, bad)
        with open(os.path.join(bad, "step.1.safetensors"), "r+b") as f:
            f.seek(-1, 2)
            last = f.read(1)
            f.seek(-1, 2)
            f.write(bytes([last[0] ^ 1]))
        with self.assertRaisesRegex(ValueError, "step.1.safetensors: sha256"):
            GoldenSet(bad)
        GoldenSet(bad, verify=False)

    def test_opt_names_split(self):
        self.assertEqual(golden.split_opt_name("opt.layers.0.attn.wq_a.weight.momentum"),
                         ("layers.0.attn.wq_a.weight", "momentum"))
        self.assertEqual(golden.split_opt_name("opt.norm.weight.exp_avg_sq"), ("norm.weight", "exp_avg_sq"))
        self.assertIsNone(golden.split_opt_name("grad.norm.weight"))

    def test_to_torch(self):
        if not have_torch():
            self.skipTest("torch is not installed")
        import torch
        t = golden.to_torch(GoldenSet(GOLDEN).params(0), dtype=torch.float32)
        self.assertEqual(t["embed.weight"].dtype, torch.float32)
        self.assertEqual(t["layers.0.ffn.gate.tid2eid"].dtype, torch.int32)
