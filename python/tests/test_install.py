"""`pip install ./python` in a fresh virtual environment, offline (--no-index):
the in-tree build backend needs nothing from PyPI; numpy comes from Debian
through --system-site-packages."""
import os
import subprocess
import sys
import unittest

from util import ROOT, GOLDEN, TmpCase


class InstallTest(TmpCase):
    def test_fresh_venv_offline(self):
        venv = self.path("venv")
        r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest(f"python3 -m venv failed (python3-venv missing?): {r.stderr.strip()[:200]}")
        py = os.path.join(venv, "bin", "python")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS")}
        r = subprocess.run([py, "-m", "pip", "install", "--no-index", os.path.join(ROOT, "python")],
                           capture_output=True, text=True, env=env, cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        code = ("import parity_bridge, parity_torch.check as c; from parity_bridge import GoldenSet; "
                f"print(parity_bridge.__file__, GoldenSet({GOLDEN!r}).steps)")
        r = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(os.path.join(venv, "lib"), r.stdout, "imported from the venv, not the source tree")
        self.assertTrue(r.stdout.strip().endswith(" 3"))
        r = subprocess.run([os.path.join(venv, "bin", "parity-torch-check"), "--help"], capture_output=True,
                           text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_readme_shows_the_tested_commands(self):
        """python/README.md's install lines are the ones test_fresh_venv_offline runs (issue 33 item 5: it
        justified another command, --no-build-isolation with Debian's setuptools)."""
        with open(os.path.join(ROOT, "python", "README.md")) as f:
            text = f.read()
        self.assertIn("    python3 -m venv --system-site-packages VENV\n", text)
        self.assertIn("    VENV/bin/pip install --no-index ./python\n", text)
        self.assertNotIn("--no-build-isolation", text)
        self.assertNotIn("Debian's setuptools", text)


if __name__ == "__main__":
    unittest.main()
