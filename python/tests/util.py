"""Paths and helpers the tests share."""
import os
import shutil
import subprocess
import tempfile
import unittest

ROOT = os.environ.get("PARITY_SOURCE_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "golden", "v4-tiny")


def parity_exe():
    p = os.environ.get("PARITY_EXE") or os.path.join(ROOT, "build", "parity")
    return p if os.path.exists(p) else None


def parity(*args, check=True):
    """Runs the parity binary; returns the CompletedProcess (stdout/stderr text)."""
    exe = parity_exe()
    if not exe:
        raise unittest.SkipTest("the parity binary is not built (PARITY_EXE)")
    r = subprocess.run([exe] + [str(a) for a in args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"parity {' '.join(map(str, args))}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


class TmpCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="parity-py-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, *p):
        return os.path.join(self.tmp, *p)
