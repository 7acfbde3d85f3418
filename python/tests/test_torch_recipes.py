"""parity_torch under the recipes (docs/recipes.md) against parity's C recipe goldens (needs
torch): for each of bf16, fp8 and v4, the v4-tiny recipe golden (3 steps, the pinned
golden/recipes command) is made by the C binary, parity_torch runs the same recipe through the
HF / batch exports, and the dump must be within the f64 policy on every tensor with every
router id and indexer selection equal.  A cast in the wrong place or of the wrong kind moves
routing and the activations by 1e-2 or more (docs/recipes.md "parity_torch under the recipes");
the control at the end shows that a recipe other than the golden's fails."""
import json
import unittest

from util import TmpCase, have_torch, parity, parity_exe

GOLDEN_ARGS = ["--preset", "v4-tiny", "--fixture", "tiny-boundary-mix", "--seed", "1234", "--precision", "f64"]


@unittest.skipUnless(have_torch(), "torch is not installed (tools/setup.sh --with-torch)")
class TorchRecipeTest(TmpCase):
    def golden(self, recipe, steps):
        g = self.path(f"g-{recipe}")
        parity("golden", *GOLDEN_ARGS, "--steps", steps, "--recipe", recipe, "--quiet", "--out", g)
        return g

    def check(self, golden, *extra):
        from parity_torch import check
        if not parity_exe():
            self.skipTest("the parity binary is not built")
        rep = self.path("report.json")
        rc = check.main(["--golden", golden, "--parity", parity_exe(), "--out", self.path("dump"), "--report", rep,
                         "--threads", "1"] + list(extra))
        with open(rep) as f:
            return rc, json.load(f)["runs"][0]

    def agrees(self, recipe):
        rc, r = self.check(self.golden(recipe, 3))
        cls = r["classes"]
        print(f"{recipe}: " + "; ".join(
            f"{k} {v['rel_l2']:.3g}" if "rel_l2" in v else f"{k} {v['n_diff']} differ" for k, v in sorted(cls.items())))
        self.assertEqual(rc, 0, r["failures"])
        self.assertTrue(r["pass"])
        self.assertEqual(r["parity_compare"]["exit"], 0)
        self.assertEqual(r["tensors"], 2278)
        for k in ("router", "attn", "input"):
            self.assertEqual(cls[k]["n_diff"], 0, f"{recipe}: {k} differs")
        for k in ("act", "logits", "out", "grad", "params"):
            self.assertLess(cls[k]["rel_l2"], 1e-10, f"{recipe}: {k} worst {cls[k]['worst']}")

    def test_bf16(self):
        self.agrees("bf16")

    def test_fp8(self):
        self.agrees("fp8")

    def test_v4(self):
        self.agrees("v4")

    def test_another_recipe_fails(self):
        """The control: parity_torch under fp8 against the v4 golden (the same FP8 casts with fp32
        scales instead of UE8M0, FP8 experts instead of MXFP4, no FP4 indexer) fails."""
        rc, r = self.check(self.golden("v4", 1), "--recipe", "fp8")
        self.assertEqual(rc, 1)
        self.assertGreater(r["failed"], 100)
        self.assertGreater(r["classes"]["router"]["n_diff"], 0)
