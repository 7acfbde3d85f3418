"""parity_bridge.names: the same mapping as parity's C side (src/model/hfmap.c)."""
import json
import os

from parity_bridge import GoldenSet, names
from parity_bridge import safetensors as st
from util import GOLDEN, TmpCase, parity


class NamesTest(TmpCase):
    def test_convert_py_renames(self):
        cases = {
            "layers.3.attn.wq_a.weight": ("layers.3.attn.wq_a.weight", names.PARAM),
            "model.layers.0.self_attn.q_a_proj.weight": ("layers.0.attn.wq_a.weight", names.PARAM),
            "model.layers.4.mlp.experts.7.down_proj.weight": ("layers.4.ffn.experts.7.w2.weight", names.PARAM),
            "model.layers.4.mlp.gate.e_score_correction_bias": ("layers.4.ffn.gate.bias", names.PARAM),
            "model.embed_tokens.weight": ("embed.weight", names.PARAM),
            "lm_head.weight": ("head.weight", names.PARAM),
            "mtp.0.embed.weight": ("mtp.0.embed.weight", names.SKIP),
            "mtp.0.head.weight": ("mtp.0.head.weight", names.SKIP),
            "mtp.0.hc_head_fn": ("mtp.0.hc_head_fn", names.PARAM),
            "layers.0.attn.wq_a.scale": ("layers.0.attn.wq_a.scale", names.SCALE),
        }
        for hf, want in cases.items():
            self.assertEqual(names.parity_name(hf), want, hf)
        self.assertEqual(names.hf_name("layers.1.hc_attn_fn"), "layers.1.hc_attn_fn")

    def test_release_store_matches_parity_bf16_export(self):
        """parity's bf16 export keeps exactly the release's float32 tensors in F32."""
        out = self.path("hf")
        parity("export", "hf", GOLDEN, out, "--dtype", "bf16")
        hdr = st.header(os.path.join(out, "model-00001-of-00001.safetensors"))
        for name, e in hdr.items():
            if name == "__metadata__":
                continue
            store = names.release_store(name, len(e["shape"]), e["dtype"] == "I64")
            want = {"F32": "F32", "I64": "I64"}.get(store, "BF16")
            self.assertEqual(e["dtype"], want, name)

    def test_config_keys_both_ways(self):
        out = self.path("hf")
        parity("export", "hf", GOLDEN, out)
        with open(os.path.join(out, "config.json")) as f:
            j = json.load(f)
        cfg = names.parity_config(j)
        gold = GoldenSet(GOLDEN).config
        for k, v in GoldenSet(GOLDEN).manifest["model"].items():
            self.assertEqual(cfg[k], v, k)
        mine = names.hf_config(gold, "float64")
        for k, v in mine.items():
            if k != "parity":
                self.assertEqual(j[k], v, k)
        with self.assertRaisesRegex(ValueError, "quantization_config"):
            names.parity_config({**j, "quantization_config": {}})

    def test_optimizer_kinds(self):
        self.assertEqual(names.opt_kind("layers.0.attn.wq_a.weight", 2), "muon")
        self.assertEqual(names.opt_kind("layers.0.hc_attn_fn", 2), "muon")
        self.assertEqual(names.opt_kind("embed.weight", 2), "adamw")
        self.assertEqual(names.opt_kind("layers.1.attn.compressor.ape", 2), "adamw")
        self.assertEqual(names.opt_kind("norm.weight", 1), "adamw")
        self.assertEqual(names.opt_kind("layers.1.ffn.gate.bias", 1), "none")
        # the golden set's optimizer slots agree
        for n, slots in GoldenSet(GOLDEN).optimizer(1).items():
            kind = names.opt_kind(n, 2 if "momentum" in slots else 1)
            self.assertEqual(kind, "muon" if "momentum" in slots else "adamw", n)
