"""parity_torch.v4 against parity's serial reference (needs torch): the
checked-in v4-tiny set under the f64 policy, through the HF and batch exports,
the recorder and a golden-format dump judged by `parity compare`."""
import json
import os
import unittest

from util import GOLDEN, TmpCase, have_torch, parity, parity_exe


@unittest.skipUnless(have_torch(), "torch is not installed (tools/setup.sh --with-torch)")
class TorchV4Test(TmpCase):
    def check(self, *extra, golden=GOLDEN):
        from parity_torch import check
        if not parity_exe():
            self.skipTest("the parity binary is not built")
        rep = self.path("report.json")
        rc = check.main(["--golden", golden, "--parity", parity_exe(), "--out", self.path("dump"),
                         "--report", rep] + list(extra))
        with open(rep) as f:
            return rc, json.load(f)["runs"]

    def test_module_tree_has_parity_names(self):
        from parity_bridge import GoldenSet
        from parity_torch import v4
        gs = GoldenSet(GOLDEN)
        model = v4.V4(gs.config)
        self.assertEqual(set(model.state_dict()), set(gs.params(0)))
        grads = {n for n, p in model.named_parameters() if p.requires_grad}
        self.assertEqual({"grad." + n for n in grads}, {n for n in gs.step(0) if n.startswith("grad.")})

    def test_v4_tiny_f64_within_policy(self):
        rc, runs = self.check()
        self.assertEqual(rc, 0, runs)
        r = runs[0]
        self.assertTrue(r["pass"])
        self.assertEqual(r["parity_compare"]["exit"], 0)
        self.assertEqual(r["tensors"], 2278)  # 4 params files + 3 step files, every tensor
        self.assertLess(r["worst"]["ratio"], 1.0)
        print(f"v4-tiny f64: worst {r['worst']['file']} {r['worst']['tensor']} at {r['worst']['ratio']:.3g} x bound")

    def test_f32_step_within_f32_policy(self):
        rc, runs = self.check("--precision", "f32", "--steps", "1")
        self.assertEqual(rc, 0, runs)
        self.assertEqual(runs[0]["failed"], 0)

    def test_forced_decisions_match_the_golden(self):
        """bf16 autocast with routing and selections taken from the golden: every
        integer tensor equal (continuous differences are reported, not judged here)."""
        rc, runs = self.check("--precision", "bf16", "--steps", "1", "--force-decisions", "--blockwise")
        r = runs[0]
        self.assertEqual(r["decisions"], "forced from the golden")
        ints = [f for f in r["failures"] if f.get("n_diff") is not None]
        self.assertEqual(ints, [])
        self.assertEqual(r["tensors"], 898 + 4, "params.0, step.0, params.1 and one row per block")

    @unittest.skipUnless(os.environ.get("PARITY_SLOW_TESTS") == "1", "v4-mini: slow (-Dslow_tests=true)")
    def test_v4_mini_f64_within_policy(self):
        g = self.path("mini")
        parity("golden", "--preset", "v4-mini", "--fixture", "mini-boundary-mix", "--steps", "1", "--quiet",
               "--out", g)
        rc, runs = self.check(golden=g)
        self.assertEqual(rc, 0, runs)
        r = runs[0]
        print(f"v4-mini f64: worst {r['worst']['file']} {r['worst']['tensor']} at {r['worst']['ratio']:.3g} x bound")
