"""parity_bridge.batch on `parity export batch` output."""
import numpy as np

from parity_bridge import BatchSet, GoldenSet
from util import GOLDEN, TmpCase, parity


class BatchTest(TmpCase):
    def test_fields_npy_and_thd(self):
        out = self.path("b")
        parity("export", "batch", GOLDEN, out)
        b = BatchSet(out)
        self.assertEqual(b.step_numbers(), [0, 1, 2])
        self.assertIn("cu_seqlens", b.fields)
        gs = GoldenSet(GOLDEN)
        for k in b.step_numbers():
            f, n = b.step(k), b.step_npy(k)
            self.assertEqual(set(f), set(n))
            for name in f:
                self.assertTrue(np.array_equal(f[name], n[name]), name)
                self.assertEqual(f[name].dtype, n[name].dtype, name)
            s = gs.step(k)
            self.assertTrue(np.array_equal(f["tokens"], s["input.tokens"]))
            self.assertTrue(np.array_equal(f["segments"], s["input.segments"]))
            for r in range(f["tokens"].shape[0]):
                cu, mx = b.row_thd(k, r)
                lens = np.diff(cu)
                self.assertEqual(cu[0], 0)
                self.assertEqual(cu[-1], 64)
                self.assertEqual(mx, lens.max())
                self.assertEqual(len(lens), f["segments"][r, -1] + 1)
            self.assertEqual(int(f["n_main"]), int((f["labels"] >= 0).sum()))
            self.assertEqual(int(f["n_mtp"]), int(f["mtp_loss_mask"].sum()))
