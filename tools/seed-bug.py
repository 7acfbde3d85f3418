#!/usr/bin/env python3
"""Seeds a bug into a copy of a golden set or dump, in place, and rewrites its
manifest's sha256 of the changed file (docs/recipes.md "Derived bounds": the
derived policy must flag it).

  seed-bug.py SET scale FILE TENSOR FACTOR
      multiplies one float tensor of SET/FILE by FACTOR (e.g. one expert's
      gradient by 1.01)
  seed-bug.py SET flip STEP BLOCK smallest|largest --scores GOLDEN
      in SET/step.STEP, router.BLOCK.idx: the token whose K-th and (K+1)-th
      selection values in GOLDEN/scores.STEP are closest (smallest) or
      farthest apart (largest) takes the (K+1)-th expert instead of the K-th;
      router.BLOCK.load moves with it.  Prints the token and its margin.
  seed-bug.py SET manifest SECTION.KEY VALUE
      rewrites one config key of SET/manifest.json (a JSON value): a run made
      with --set mtp_lambda=0.09 (the MTP weight 0.3 applied twice) whose
      manifest states the intended 0.3, as a GPU team's dump would
"""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import numpy as np  # noqa: E402
from parity_bridge import safetensors as st  # noqa: E402


def rewrite(set_dir, fname, tensors, meta):
    path = os.path.join(set_dir, fname)
    st.write(path, tensors, meta)
    mpath = os.path.join(set_dir, "manifest.json")
    man = json.load(open(mpath))
    man["files"][fname] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    with open(mpath, "w") as f:
        json.dump(man, f, indent=2)
        f.write("\n")


def scale(set_dir, fname, name, factor):
    t, meta = st.read(os.path.join(set_dir, fname), bf16="raw")
    if name not in t or t[name].dtype.kind != "f":
        sys.exit(f"seed-bug: {fname} has no float tensor {name}")
    t[name] = (t[name] * factor).astype(t[name].dtype)
    rewrite(set_dir, fname, t, meta)
    print(f"seeded: {fname} {name} x {factor}")


def flip(set_dir, step, block, which, golden):
    fname = f"step.{step}.safetensors"
    t, meta = st.read(os.path.join(set_dir, fname), bf16="raw")
    sc = st.read(os.path.join(golden, f"scores.{step}.safetensors"))[0][f"router.{block}.score"].astype(np.float64)
    idx = t[f"router.{block}.idx"]
    B, S, K = idx.shape
    E = sc.shape[2]
    srt = -np.sort(-sc, axis=2)
    margin = srt[:, :, K - 1] - srt[:, :, K]
    flat = int(np.argmin(margin) if which == "smallest" else np.argmax(margin))
    b, s = divmod(flat, S)
    order = np.argsort(-sc[b, s], kind="stable")
    kth, nxt = int(order[K - 1]), int(order[K])
    row = [int(x) for x in idx[b, s]]
    if kth not in row:
        sys.exit(f"seed-bug: token ({b}, {s}) does not pick expert {kth} in {fname}: not the golden's routing")
    row[row.index(kth)] = nxt
    idx = idx.copy()
    idx[b, s] = sorted(row)
    t[f"router.{block}.idx"] = idx
    load = t[f"router.{block}.load"].copy()
    load[kth] -= 1
    load[nxt] += 1
    t[f"router.{block}.load"] = load
    rewrite(set_dir, fname, t, meta)
    print(f"seeded: {fname} router.{block}.idx row {b} pos {s}: expert {kth} -> {nxt}, margin {margin[b, s]:.6e} "
          f"(of E={E}, K={K})")


def set_key(set_dir, key, value):
    mpath = os.path.join(set_dir, "manifest.json")
    man = json.load(open(mpath))
    sec, name = key.split(".", 1)
    if name not in man.get(sec, {}):
        sys.exit(f"seed-bug: {mpath} has no {key}")
    man[sec][name] = json.loads(value)
    with open(mpath, "w") as f:
        json.dump(man, f, indent=2)
        f.write("\n")
    print(f"seeded: manifest {key} = {value}")


def main(a):
    if len(a) == 4 and a[1] == "manifest":
        return set_key(a[0], a[2], a[3])
    if len(a) >= 5 and a[1] == "scale":
        return scale(a[0], a[2], a[3], float(a[4]))
    if len(a) == 7 and a[1] == "flip" and a[5] == "--scores":
        return flip(a[0], int(a[2]), a[3], a[4], a[6])
    sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
