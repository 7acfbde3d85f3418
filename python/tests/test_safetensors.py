"""parity_bridge.safetensors against parity's own writer and reader."""
import os
import struct

import numpy as np

from parity_bridge import safetensors as st
from util import GOLDEN, TmpCase, parity


class SafetensorsTest(TmpCase):
    def test_round_trip_every_dtype(self):
        t = {"f64": np.arange(6, dtype=np.float64).reshape(2, 3) / 7, "f32": np.float32([1.5, -2]),
             "i32": np.int32([[1, -2], [3, 4]]), "i64": np.int64([2 ** 40]), "scalar": np.array(3.25),
             "bf": st.f32_to_bf16(np.float32([1.0, -0.5, 3.0]))}
        p = self.path("a.safetensors")
        st.write(p, t, {"format": "test"})
        back, meta = st.read(p, bf16="raw")
        self.assertEqual(meta, {"format": "test"})
        for n, a in t.items():
            self.assertEqual(back[n].shape, np.shape(a), n)
            self.assertEqual(np.asarray(back[n]).tobytes(), np.asarray(a).tobytes(), n)
        self.assertEqual(st.header(p)["bf"]["dtype"], "BF16")
        (n,) = struct.unpack("<Q", open(p, "rb").read(8))
        self.assertEqual(n % 8, 0, "header padded to 8 bytes")
        self.assertEqual([f for f in os.listdir(self.tmp) if ".tmp-" in f], [], "no temporary left")

    def test_parity_reads_ours_and_judges_it(self):
        p0, _ = st.read(os.path.join(GOLDEN, "params.0.safetensors"))
        mine = self.path("mine.safetensors")
        st.write(mine, p0)
        parity("compare", "--policy", "bitwise", os.path.join(GOLDEN, "params.0.safetensors"), mine)
        p0["norm.weight"] = p0["norm.weight"] + 1e-6
        st.write(mine, p0)
        r = parity("compare", os.path.join(GOLDEN, "params.0.safetensors"), mine, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("norm.weight", r.stdout)

    def test_bf16_rounding_equals_parity(self):
        """parity export hf --dtype bf16 rounds each double once; so do we."""
        out = self.path("hf")
        parity("export", "hf", GOLDEN, out, "--dtype", "bf16")
        got, _ = st.read(os.path.join(out, "model-00001-of-00001.safetensors"), bf16="raw")
        ref, _ = st.read(os.path.join(GOLDEN, "params.0.safetensors"))
        n_bf16 = 0
        for name, a in got.items():
            if isinstance(a, st.BF16):
                n_bf16 += 1
                self.assertTrue(np.array_equal(a.view(np.uint16), st.f32_to_bf16(ref[name]).view(np.uint16)), name)
        self.assertGreater(n_bf16, 100)

    def test_f64_to_bf16_ties_and_edges(self):
        x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 1e-12, -2.5, 1e-40, 0.0, -0.0, np.inf])
        bits = st.f32_to_bf16(x).view(np.uint16)
        self.assertEqual([hex(b) for b in bits],
                         ["0x3f80", "0x3f80", "0x3f82", "0x3f81", "0xc020", "0x1", "0x0", "0x8000", "0x7f80"])
        self.assertTrue(np.isnan(st.bf16_to_f32(st.f32_to_bf16(np.array([np.nan])).view(np.uint16)))[0])
