"""The export/import commands' refusals: exit 2, one clear message, nothing written
and nothing that parity did not write replaced."""
import os

from util import GOLDEN, TmpCase, parity


class CliTest(TmpCase):
    def test_existing_foreign_out_is_kept(self):
        out = self.path("mine")
        os.makedirs(out)
        with open(os.path.join(out, "notes.txt"), "w") as f:
            f.write("keep me")
        for args in (["export", "hf", GOLDEN, out], ["export", "batch", GOLDEN, out]):
            r = parity(*args, check=False)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn("parity replaces only what it wrote", r.stderr)
        self.assertEqual(os.listdir(out), ["notes.txt"])
        f = self.path("x.safetensors")
        with open(f, "w") as fh:
            fh.write("not mine")
        parity("export", "hf", GOLDEN, self.path("hf"))
        r = parity("import", "hf", self.path("hf"), f, check=False)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(open(f).read(), "not mine")

    def test_own_output_is_replaced(self):
        out = self.path("hf")
        parity("export", "hf", GOLDEN, out)
        parity("export", "hf", GOLDEN, out, "--dtype", "fp32")
        with open(os.path.join(out, "config.json")) as f:
            self.assertIn('"float32"', f.read())
        back = self.path("back.safetensors")
        parity("import", "hf", out, back)
        parity("import", "hf", out, back, "--precision", "f32")

    def test_bad_arguments(self):
        cases = [
            (["export", "hf", GOLDEN, self.path("a"), "--dtype", "fp16"], "bf16, fp32 or fp64"),
            (["export", "hf", GOLDEN, self.path("a"), "--max-shard-size", "lots"], "--max-shard-size"),
            (["export", "hf", GOLDEN, self.path("a"), "--preset", "v4-mini"], "golden set"),
            (["export", "hf", os.path.join(GOLDEN, "step.0.safetensors"), self.path("a")], "no tensor 'embed.weight'"),
            (["export", "batch", GOLDEN, self.path("a"), "--steps", "2"], "expected SET OUT"),
            (["export", "batch", "--fixture", "no-such-fixture", self.path("a")], "no-such-fixture"),
            (["export", "nope", self.path("a")], "unknown format"),
            (["import", "hf", self.tmp, self.path("a.safetensors")], "config.json"),
        ]
        for args, msg in cases:
            r = parity(*args, check=False)
            self.assertEqual(r.returncode, 2, f"{args}: {r.stdout} {r.stderr}")
            self.assertIn(msg, r.stderr, args)
            self.assertFalse(os.path.exists(self.path("a")) or os.path.exists(self.path("a.safetensors")), args)
