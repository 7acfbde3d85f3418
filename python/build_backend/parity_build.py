"""A PEP 517 build backend with the standard library only.

`pip install ./python` builds in an isolated environment; with setuptools as
the backend that environment needs setuptools and `wheel` from PyPI, which an
offline machine cannot fetch.  This backend needs nothing: it zips the two
packages into a pure-Python wheel (and an sdist, and an editable wheel that
points at the source tree), so a fresh virtual environment installs the
package with no network at all.  The project's metadata lives here.
"""
import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME = "parity-bridge"
DIST = "parity_bridge"
VERSION = "0.1.0"
SUMMARY = ("parity golden sets for PyTorch/Megatron teams: readers, HF name maps, dumps, "
           "a hook recorder, and a PyTorch DeepSeek-V4 step")
REQUIRES_PYTHON = ">=3.9"
REQUIRES = ["numpy"]
EXTRAS = {"torch": ["torch"]}
PACKAGES = ["parity_bridge", "parity_torch"]
SCRIPTS = {"parity-torch-check": "parity_torch.check:main"}
TAG = "py3-none-any"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST_INFO = f"{DIST}-{VERSION}.dist-info"


def _metadata():
    lines = ["Metadata-Version: 2.1", f"Name: {NAME}", f"Version: {VERSION}", f"Summary: {SUMMARY}",
             f"Requires-Python: {REQUIRES_PYTHON}"]
    lines += [f"Requires-Dist: {r}" for r in REQUIRES]
    for extra, reqs in EXTRAS.items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    readme = os.path.join(ROOT, "README.md")
    body = open(readme, encoding="utf-8").read() if os.path.exists(readme) else ""
    return "\n".join(lines + ["Description-Content-Type: text/markdown", "", body])


def _dist_info_files():
    wheel = f"Wheel-Version: 1.0\nGenerator: parity_build {VERSION}\nRoot-Is-Purelib: true\nTag: {TAG}\n"
    eps = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in SCRIPTS.items())
    return {"METADATA": _metadata(), "WHEEL": wheel, "entry_points.txt": eps}


def _package_files():
    for pkg in PACKAGES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, pkg)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fn in sorted(filenames):
                if fn.endswith(".py"):
                    full = os.path.join(dirpath, fn)
                    yield os.path.relpath(full, ROOT).replace(os.sep, "/"), full


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, members):
    """members: [(arcname, bytes)]; adds the dist-info and RECORD."""
    for fn, text in _dist_info_files().items():
        members.append((f"{DIST_INFO}/{fn}", text.encode("utf-8")))
    record = [_record_line(a, d) for a, d in members] + [f"{DIST_INFO}/RECORD,,"]
    members.append((f"{DIST_INFO}/RECORD", ("\n".join(record) + "\n").encode("utf-8")))
    name = f"{DIST}-{VERSION}-{TAG}.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in members:
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, DIST_INFO)
    os.makedirs(d, exist_ok=True)
    for fn, text in _dist_info_files().items():
        with open(os.path.join(d, fn), "w", encoding="utf-8") as f:
            f.write(text)
    return DIST_INFO


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    members = [(arc, open(full, "rb").read()) for arc, full in _package_files()]
    return _write_wheel(wheel_directory, members)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel holding one .pth line: the source tree goes on sys.path."""
    return _write_wheel(wheel_directory, [(f"{DIST}.pth", (ROOT + "\n").encode("utf-8"))])


def build_sdist(sdist_directory, config_settings=None):
    base = f"{DIST}-{VERSION}"
    name = f"{base}.tar.gz"
    files = [("pyproject.toml", os.path.join(ROOT, "pyproject.toml")),
             ("README.md", os.path.join(ROOT, "README.md")),
             ("build_backend/parity_build.py", os.path.abspath(__file__))] + list(_package_files())
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        pkg_info = _metadata().encode("utf-8")
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(pkg_info)
        t.addfile(ti, io.BytesIO(pkg_info))
        for arc, full in files:
            if os.path.exists(full):
                t.add(full, arcname=f"{base}/{arc}")
    return name
