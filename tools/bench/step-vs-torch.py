#!/usr/bin/python3
"""step-vs-torch: the wall time of one serial training step in parity's golden
beside the PyTorch fp64 step of the same batch (python/parity_torch), on the
same number of threads, printed side by side (issue 29's "the serial v4-mini
step against the PyTorch fp64 step of the same batch").

    flock /work/heavy.lock nice /usr/bin/python3 tools/bench/step-vs-torch.py \
        --parity build/parity [--preset v4-mini] [--fixture mini-boundary-mix] [--threads 2] [--repeat 3]

parity: `parity golden --steps 1` run --repeat times with OMP_NUM_THREADS=T;
its step line's wall_s is forward + backward + update, the writing of the set
left out (model/golden.c golden_step).  torch: the parameters through `parity
export hf` (fp64), the batch through `parity export batch` of that set, then
--repeat steps timed the same way: forward, loss backward, the gradient norm
and the Muon/AdamW update (the model reloaded from the export before each), no
hooks ("bare"), and once more with parity_bridge's Recorder on (every
activation kept, as parity's golden keeps them for its dump: "recorded").
The script checks that the two steps agree (loss and grad norm to 1e-9
relative), so that the figures are of the same batch.  Needs torch (Debian's
/usr/bin/python3 has torch 1.13) and numpy; run it under the heavy lock.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def parity_steps(a, work):
    """Runs the golden --repeat times; the step's wall_s, loss, grad norm of each, the last set's path."""
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    walls, gdir = [], os.path.join(work, "golden")
    for _ in range(a.repeat):
        shutil.rmtree(gdir, ignore_errors=True)
        cmd = [a.parity, "golden", "--preset", a.preset, "--fixture", a.fixture, "--steps", "1",
               "--seed", str(a.seed), "--out", gdir]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        m = re.search(r"^\s*0\s+(\S+\s+){5}(\S+)\s*$", out, re.M)
        if not m:
            sys.exit(f"step-vs-torch: no step line in parity golden's output:\n{out}")
        walls.append(float(m.group(2)))
    from parity_bridge import GoldenSet
    step = GoldenSet(gdir).step(0)  # the exact values, not the printed ones
    return walls, float(step["out.loss"]), float(step["out.grad_norm"]), gdir


def torch_steps(a, gdir, work, record):
    import torch
    from parity_bridge import BatchSet, GoldenSet, Recorder, hf
    from parity_torch import check, v4
    torch.set_num_threads(a.threads)
    hf_dir, batch_dir = check.export(a.parity, gdir, work) if not os.path.isdir(os.path.join(work, "hf")) else (
        os.path.join(work, "hf"), os.path.join(work, "batch"))
    gs = GoldenSet(gdir)
    cfg, params, _ = hf.load(hf_dir)
    cfg = {**gs.config, **cfg}
    fields = BatchSet(batch_dir).step(0)
    walls, loss, gn = [], None, None
    for _ in range(a.repeat if not record else 1):
        model = v4.V4(cfg).to(dtype=torch.float64)
        model.load_parity_state(params)
        optim = v4.MuonAdamW(model, cfg)
        optim.t = 0
        bt, _ = check.make_batch(torch, v4, fields, torch.device("cpu"))
        rec = Recorder(model, activations={n: f"act.{n}" for n in model.block_names()}) if record else None
        t0 = time.perf_counter()
        if rec:
            with rec:
                out = model(bt)
                out.loss.backward()
        else:
            out = model(bt)
            out.loss.backward()
        gn = optim.grad_norm()
        optim.step(out)
        walls.append(time.perf_counter() - t0)
        loss = float(out.loss)
    return walls, loss, gn


def line(name, walls):
    med = statistics.median(walls)
    return f"{name:<34} {med:8.2f} s  (min {min(walls):.2f}, max {max(walls):.2f}, n {len(walls)})", med


def main():
    ap = argparse.ArgumentParser(prog="step-vs-torch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--parity", required=True, help="the parity binary")
    ap.add_argument("--preset", default="v4-mini")
    ap.add_argument("--fixture", default="mini-boundary-mix")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2, help="threads of both (OMP_NUM_THREADS, torch.set_num_threads)")
    ap.add_argument("--repeat", type=int, default=3, help="steps timed on each side (the median is printed)")
    ap.add_argument("--keep", help="directory to keep the golden set and exports in (default: a removed temp dir)")
    a = ap.parse_args()
    work = a.keep or tempfile.mkdtemp(prefix="step-vs-torch-")
    os.makedirs(work, exist_ok=True)
    try:
        pw, ploss, pgn, gdir = parity_steps(a, work)
        tw, tloss, tgn = torch_steps(a, gdir, work, False)
        rw, _, _ = torch_steps(a, gdir, work, True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    for what, x, y in (("loss", ploss, tloss), ("grad norm", pgn, tgn)):
        if abs(x - y) > 1e-9 * abs(x):
            sys.exit(f"step-vs-torch: the two steps disagree on the {what}: parity {x!r}, torch {y!r}")
    import torch
    print(f"{a.preset} one step, fixture {a.fixture}, seed {a.seed}, {a.threads} threads, f64 "
          f"(loss {ploss:.15g} both, grad norm {pgn:.10g} / {tgn:.10g}); torch {torch.__version__}")
    l1, p = line("parity golden (serial step)", pw)
    l2, t = line("parity_torch fp64 step (bare)", tw)
    l3, r = line("parity_torch fp64 step (recorded)", rw)
    print(l1)
    print(l2 + f"  torch / parity {t / p:.2f}")
    print(l3 + f"  torch / parity {r / p:.2f}")


if __name__ == "__main__":
    main()
