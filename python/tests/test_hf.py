"""parity_bridge.hf: reads parity's export, writes directories parity imports."""
import os

import numpy as np

from parity_bridge import GoldenSet, hf
from parity_bridge import safetensors as st
from util import GOLDEN, TmpCase, parity


class HFTest(TmpCase):
    def test_load_export_is_the_golden(self):
        out = self.path("hf")
        parity("export", "hf", GOLDEN, out, "--step", "1", "--max-shard-size", "200KB")
        cfg, params, opt = hf.load(out)
        gs = GoldenSet(GOLDEN)
        p1, o1 = gs.params(1), gs.optimizer(1)
        self.assertEqual(set(params), set(p1))
        for n, a in p1.items():
            self.assertTrue(np.array_equal(params[n], a), n)
            self.assertEqual(params[n].dtype, a.dtype, n)
        self.assertEqual(len(opt), sum(len(s) for s in o1.values()))
        self.assertEqual(cfg["n_routed_experts"], 8)

    def test_python_written_dir_imports_bitwise(self):
        gs = GoldenSet(GOLDEN)
        cfg = gs.config
        out = self.path("mine")
        hf.save(out, cfg, gs.params(0), dtype="fp64", max_shard_bytes=300_000)
        self.assertGreater(len([f for f in os.listdir(out) if f.startswith("model-")]), 1)
        back = self.path("back.safetensors")
        r = parity("import", "hf", out, back)
        self.assertIn("208 parameters", r.stdout)
        parity("compare", "--policy", "bitwise", os.path.join(GOLDEN, "params.0.safetensors"), back)

    def test_bf16_dir_imports_within_bf16(self):
        gs = GoldenSet(GOLDEN)
        out = self.path("bf")
        hf.save(out, gs.config, gs.params(0), dtype="bf16")
        back = self.path("back.safetensors")
        parity("import", "hf", out, back)
        parity("compare", "--policy", "bf16", os.path.join(GOLDEN, "params.0.safetensors"), back)
        # and parity's own bf16 export gives the same bits
        theirs = self.path("theirs")
        parity("export", "hf", GOLDEN, theirs, "--dtype", "bf16")
        a, _ = st.read(os.path.join(out, "model-00001-of-00001.safetensors"), bf16="raw")
        b, _ = st.read(os.path.join(theirs, "model-00001-of-00001.safetensors"), bf16="raw")
        for n in b:
            self.assertTrue(np.array_equal(np.asarray(a[n]).view(np.uint8), np.asarray(b[n]).view(np.uint8)), n)

    def test_scale_next_to_an_unquantized_weight_is_refused(self):
        out = self.path("hf")
        parity("export", "hf", GOLDEN, out)
        shard = os.path.join(out, "model-00001-of-00001.safetensors")
        t, m = st.read(shard)
        t["layers.0.attn.wq_a.scale"] = np.ones((1, 1), dtype=np.float32)
        st.write(shard, t, m)
        os.unlink(os.path.join(out, "model.safetensors.index.json"))
        os.rename(shard, os.path.join(out, "model.safetensors"))
        with self.assertRaisesRegex(ValueError, "stored unquantized"):
            hf.load(out)
        r = parity("import", "hf", out, self.path("x.safetensors"), check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unquantized (F64) but has a .scale", r.stderr)
        self.assertFalse(os.path.exists(self.path("x.safetensors")))

    def test_quantized_export_loads_as_parity_imports_it(self):
        """FP8 / FP4 storage: numpy's dequantization (hf.load) equals the C import's, bit for bit."""
        g, q, back = self.path("G"), self.path("Q"), self.path("p.safetensors")
        parity("golden", "--preset", "v4-tiny", "--set", "moe_inter_dim=32", "--steps", "1", "--out", g, "--quiet")
        parity("export", "hf", g, q, "--quantize", "--dtype", "bf16")
        parity("import", "hf", q, back)
        _, params, _ = hf.load(q)
        ref, _ = st.read(back)
        for n, a in ref.items():
            got = np.asarray(params[n], dtype=np.float64) if a.dtype.kind == "f" else params[n]
            self.assertTrue(np.array_equal(np.asarray(got).view(np.uint8), np.asarray(a).view(np.uint8)), n)
        t, _ = st.read(os.path.join(q, "model-00001-of-00001.safetensors"))
        self.assertEqual(sum(isinstance(a, st.F8E4M3) for a in t.values()), 35)
        self.assertEqual(sum(a.dtype == np.int8 for a in t.values()), 96)
