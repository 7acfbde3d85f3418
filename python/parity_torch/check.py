"""parity-torch-check: the PyTorch V4 step (parity_torch.v4) against a parity
golden set, end to end through the bridge a GPU team uses (docs/gpu-rollout.md):

  1. parameters from `parity export hf GOLDEN` (parity_bridge.hf.load),
  2. batches from `parity export batch GOLDEN` (parity_bridge.BatchSet; the model
     is fed tokens + cu_seqlens, and the exported labels are checked against its own),
  3. forward / loss / autograd backward / Muon + AdamW, activations and
     gradients recorded by parity_bridge.Recorder under golden names,
  4. a dump in the golden format (parity_bridge.GoldenWriter) that
     `parity compare GOLDEN DUMP` judges, plus a per-tensor report.

    python3 -m parity_torch.check --golden golden/v4-tiny --parity build/parity --out /tmp/torch-tiny
    python3 -m parity_torch.check --golden G --parity P --out D --device cuda --precision all

--precision all (f64, f32, bf16 autocast) writes D/<precision> for each and
reports, per tensor, the error against the golden and whether that
precision's policy (GOLDEN.md) holds.  Exit: 0 every requested check within
its policy, 1 a check failed, 2 bad usage.
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from parity_bridge import BatchSet, GoldenSet, GoldenWriter, Recorder, compare, hf

GOLDEN_DTYPES = {"f64": np.float64, "f32": np.float32}


def segments_from_cu(cu, num, S):
    """[B, S] sample numbers from per-row cu_seqlens (packed THD boundaries)."""
    B = cu.shape[0]
    seg = np.zeros((B, S), dtype=np.int64)
    for r in range(B):
        for i in range(int(num[r])):
            seg[r, cu[r, i]:cu[r, i + 1]] = i
    return seg


def make_batch(torch, v4, fields, device):
    """The model's batch from the exported fields; the derived targets must be the exported ones."""
    tok = fields["tokens"]
    seg = segments_from_cu(fields["cu_seqlens"], fields["num_samples"], tok.shape[1])
    bt = v4.Batch(torch.from_numpy(tok.astype(np.int64)), torch.from_numpy(seg), device=device)
    for name, mine in (("position_ids", bt.pos), ("labels", bt.labels), ("mtp_input_ids", bt.mtp_inputs),
                       ("mtp_labels", bt.mtp_labels)):
        if not np.array_equal(mine.cpu().numpy(), fields[name]):
            raise ValueError(f"exported {name} disagree with MODEL.md 1 as derived here")
    return bt, seg


def export(parity, golden, tmp):
    """`parity export hf` (fp64) and `parity export batch` of the golden set."""
    hf_dir, batch_dir = os.path.join(tmp, "hf"), os.path.join(tmp, "batch")
    for args in (["export", "hf", golden, hf_dir, "--dtype", "fp64"], ["export", "batch", golden, batch_dir]):
        subprocess.run([parity] + args, check=True, stdout=subprocess.DEVNULL)
    return hf_dir, batch_dir


def recorder(model):
    acts = {name: f"act.{name}" for name in model.block_names()}
    acts.update({"logits_tap": "out.logits", "mtp_logits_tap": "out.mtp_logits"})
    return Recorder(model, activations=acts)  # parameter names are parity's already


def step_tensors(rec, out, bt, seg, grad_norm, fdt):
    t = {"input.tokens": bt.tokens.cpu().numpy().astype(np.int32), "input.segments": seg.astype(np.int32)}
    for k in ("loss", "loss_main", "loss_mtp", "loss_aux"):
        t["out." + k] = np.array(float(getattr(out, k)), dtype=fdt)
    t["out.grad_norm"] = np.array(grad_norm, dtype=fdt)
    for name, r in zip(out.names, out.recs):
        t[f"router.{name}.idx"] = r["idx"].cpu().numpy().astype(np.int32)
        t[f"router.{name}.load"] = r["load"].cpu().numpy().astype(np.int64)
        if "selected" in r:
            t[f"attn.{name}.selected"] = r["selected"].cpu().numpy().astype(np.int32)
    for name, a in list(rec.records.items()) + list(rec.grads().items()):
        t[name] = a.astype(fdt)
    return t


def to_numpy(state, fdt):
    """{name: tensor} -> {name: ndarray}, floats in the golden's dtype (exact widening)."""
    import torch
    out = {}
    for n, v in state.items():
        v = v.detach()
        if v.dtype.is_floating_point and v.dtype not in (torch.float32, torch.float64):
            v = v.float()
        a = v.cpu().numpy()
        out[n] = a.astype(fdt) if np.issubdtype(a.dtype, np.floating) else a
    return out


def run(args, precision, out_dir, hf_dir, batch_dir, blockwise):
    """Runs the steps in one precision and writes the dump; returns its wall time.
    With --blockwise, appends a row per block and step to `blockwise`: the block
    fed the golden's input, judged against the golden's output."""
    import torch
    from parity_torch import v4
    gs = GoldenSet(args.golden)
    recipe = args.recipe or gs.manifest["train"].get("recipe", "none")  # the golden's casts (docs/recipes.md)
    fdt = GOLDEN_DTYPES[gs.precision]
    cfg, params, opt = hf.load(hf_dir)
    cfg = {**gs.config, **cfg}
    dev = torch.device(args.device)
    wdt = torch.float64 if precision == "f64" else torch.float32
    model = v4.V4(cfg).to(device=dev, dtype=wdt)
    model.set_recipe(recipe)
    model.load_parity_state(params)
    optim = v4.MuonAdamW(model, cfg)
    bs = BatchSet(batch_dir)
    ks = bs.step_numbers()[:args.steps] if args.steps else bs.step_numbers()
    for n, a in opt.items():  # a set resumed at first_step > 0
        name, slot = n[4:].rsplit(".", 1)
        optim.state.setdefault(name, {})[slot] = torch.from_numpy(a).to(device=dev, dtype=wdt)
    optim.t = ks[0]
    layout = {"framework": "pytorch", "torch": torch.__version__, "device": str(dev), "precision": precision,
              "world_size": 1, "backend": "parity_torch", "recipe": recipe}
    w = GoldenWriter(out_dir, gs.manifest["model"], gs.manifest["train"], precision,
                     generator=("parity_torch", "0.1.0"), layout=layout, data=gs.manifest["data"], first_step=ks[0])
    t0 = time.time()
    try:
        w.write_params(ks[0], to_numpy(model.parity_state(), fdt),
                       {n: to_numpy(s, fdt) for n, s in optim.state.items()} if ks[0] else None)
        for k in ks:
            bt, seg = make_batch(torch, v4, bs.step(k), dev)
            if args.force_decisions:
                bt.force_decisions(gs.step(k))
            rec = recorder(model)
            auto = torch.autocast(dev.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
            with rec:
                with auto:
                    out = model(bt)
                out.loss.backward()
            gn = optim.grad_norm()
            w.write_step(k, step_tensors(rec, out, bt, seg, gn, fdt))
            if args.blockwise:
                gstep = gs.step(k)
                with auto:
                    bw = model.blockwise(bt, gstep)
                for name, t in bw.items():
                    r = compare.judge(gstep[name], to_numpy({name: t}, fdt)[name], precision)
                    blockwise.append({"file": f"blockwise.{k}", "tensor": name, "gating": True, **r})
            optim.step(out)
            model.zero_grad(set_to_none=True)
            w.write_params(k + 1, to_numpy(model.parity_state(), fdt),
                           {n: to_numpy(s, fdt) for n, s in optim.state.items()})
            print(f"parity_torch: {precision} step {k}: loss {float(out.loss):.15g} grad_norm {gn:.10g}",
                  file=sys.stderr)
        w.close()
    except BaseException:
        w.abort()
        raise
    return time.time() - t0


def gating(policy, file, first_step):
    """Which comparisons decide pass/fail (the others are reported as informational).  f64: all.  f32 / bf16 against the f64
    golden: what a step computes (step.K) and params.first, while the parameters
    after updates are informational: AdamW's m/(sqrt(v)+eps) turns a relative
    error of a near-zero gradient into an absolute one of up to lr per step
    (docs/matrix.md "Reading: f32 against f64"; docs/gpu-rollout.md)."""
    return policy == "f64" or file.startswith("step.") or file == f"params.{first_step}.safetensors"


def gating_tensor(policy, file, tensor, first_step):
    """gating(), and for bf16 the gradients too are informational: they carry the bf16
    error of the whole backward (docs/gpu-rollout.md "Which policy")."""
    if policy == "bf16" and tensor.startswith("grad."):
        return False
    return gating(policy, file, first_step)


def judge_dump(golden, dump, policy):
    """Per-tensor numpy judgement of every file pair (the report's numbers)."""
    gs, ds = GoldenSet(golden), GoldenSet(dump)
    rows = []
    for f in sorted(ds.manifest["files"]):
        if not f.endswith(".safetensors"):
            continue
        a, b = gs.file(f), ds.file(f)
        for name in sorted(set(a) | set(b)):
            g = gating_tensor(policy, f, name, ds.first_step)
            if name not in a or name not in b:
                rows.append({"file": f, "tensor": name, "pass": False, "gating": True,
                             "reason": "missing in " + ("golden" if name not in a else "dump")})
                continue
            r = compare.judge(a[name], b[name], policy)
            rows.append({"file": f, "tensor": name, "gating": g, **r})
    return rows


def parity_compare(parity, golden, dump, policy, json_path):
    """`parity compare` (the authoritative judge) of the two sets, or of each
    file pair when the dump holds fewer steps than the golden; returns
    (exit code, {"pass", "entries", "failed"})."""
    gfiles = {f for f in GoldenSet(golden, verify=False).manifest["files"] if f.endswith(".safetensors")}
    dfiles = {f for f in GoldenSet(dump, verify=False).manifest["files"] if f.endswith(".safetensors")}
    pairs = [(golden, dump)] if gfiles == dfiles else \
        [(os.path.join(golden, f), os.path.join(dump, f)) for f in sorted(dfiles & gfiles)]
    rc, tot = 0, {"pass": True, "entries": 0, "failed": 0}
    for a, b in pairs:
        r = subprocess.run([parity, "compare", a, b, "--policy", policy, "--json", json_path],
                           stdout=subprocess.DEVNULL).returncode
        with open(json_path) as f:
            j = json.load(f)
        rc = max(rc, r)
        tot["pass"] = tot["pass"] and bool(j.get("pass"))
        tot["entries"] += int(j.get("entries", 0))
        tot["failed"] += int(j.get("failed", 0))
    return rc, tot


def worst(rows):
    fl = [r for r in rows if "ratio" in r]
    return max(fl, key=lambda r: r["ratio"]) if fl else None


def tensor_class(file, tensor):
    """The class a row is reported under: 'params' (the parameters after an update), or a
    step tensor's kind: act, grad, out, router (ids, loads), attn (indexer selections)."""
    if file.startswith("params."):
        return "params"
    if file.startswith("blockwise."):
        return "blockwise"
    if tensor in ("out.logits", "out.mtp_logits"):
        return "logits"
    return tensor.split(".", 1)[0]


def by_class(rows):
    """{class: the largest error of its tensors}: floats by rel_l2 (and the largest max_abs),
    integer tensors by the count of differing elements."""
    out = {}
    for r in rows:
        if "rel_l2" not in r and "n_diff" not in r:
            continue
        c = out.setdefault(tensor_class(r["file"], r["tensor"]), {"tensors": 0})
        c["tensors"] += 1
        if "n_diff" in r:
            c["n_diff"] = c.get("n_diff", 0) + r["n_diff"]
            continue
        if r["rel_l2"] >= c.get("rel_l2", -1.0):
            c.update(rel_l2=r["rel_l2"], worst=f"{r['file']}:{r['tensor']}")
        c["max_abs"] = max(c.get("max_abs", 0.0), r["max_abs"])
    return out


def summarize(precision, rows, wall, forced, pc=None):
    w = worst([r for r in rows if r["gating"]])
    fails = [r for r in rows if not r["pass"] and r["gating"]]
    info = [r for r in rows if not r["pass"] and not r["gating"]]
    wi = worst([r for r in rows if not r["gating"]])
    s = {"precision": precision, "policy": precision, "decisions": "forced from the golden" if forced else "computed",
         "tensors": len(rows), "failed": len(fails), "informational_outside": len(info),
         "informational_worst": {k: wi[k] for k in ("file", "tensor", "rel_l2", "ratio")} if wi else None,
         "pass": not fails, "wall_s": round(wall, 3),
         "blockwise_worst": ({k: wb[k] for k in ("file", "tensor", "rel_l2", "ratio")}
                             if (wb := worst([r for r in rows if r["file"].startswith("blockwise.")])) else None),
         "worst": {k: w[k] for k in ("file", "tensor", "rel_l2", "diff_norm", "bound", "ratio", "max_abs")} if w else None,
         "classes": by_class(rows),
         "failures": [{k: r.get(k) for k in ("file", "tensor", "reason", "n_diff", "rel_l2", "ratio")} for r in fails[:40]]}
    if pc is not None:
        s["parity_compare"] = {"exit": pc[0], "pass": pc[1].get("pass"), "entries": pc[1].get("entries"),
                               "failed": pc[1].get("failed")}
    return s


def main(argv=None):
    ap = argparse.ArgumentParser(prog="parity-torch-check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--golden", required=True, help="the golden set (parity golden --out)")
    ap.add_argument("--out", required=True, help="dump directory (one per precision under --precision all)")
    ap.add_argument("--parity", help="the parity binary: exports the set and judges the dump")
    ap.add_argument("--hf", help="an existing `parity export hf` directory (else exported with --parity)")
    ap.add_argument("--batch", help="an existing `parity export batch` directory (else exported with --parity)")
    ap.add_argument("--steps", type=int, default=0, help="steps to run (default: all of the set)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda[:N], or auto (cuda when present; default cpu)")
    ap.add_argument("--precision", default="f64", help="f64, f32, bf16 (autocast) or all")
    ap.add_argument("--force-decisions", action="store_true",
                    help="take routing and indexer selections from the golden (isolates continuous error)")
    ap.add_argument("--blockwise", action="store_true",
                    help="also run each block on the golden's input and judge its output alone (gating)")
    ap.add_argument("--recipe", help="run under this recipe (none, bf16, fp8, v4; default: the golden's, "
                    "its manifest's train.recipe)")
    ap.add_argument("--report", help="write the summary as JSON")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's)")
    ap.add_argument("--verbose", action="store_true", help="print every tensor's line")
    a = ap.parse_args(argv)
    import torch
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
        print(f"parity-torch-check: device {a.device}", file=sys.stderr)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("parity-torch-check: no CUDA device here (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    precs = ["f64", "f32", "bf16"] if a.precision == "all" else [a.precision]
    if any(p not in ("f64", "f32", "bf16") for p in precs):
        print(f"parity-torch-check: --precision expects f64, f32, bf16 or all, got {a.precision!r}", file=sys.stderr)
        return 2
    if (not a.hf or not a.batch) and not a.parity:
        print("parity-torch-check: give --parity (to export the set) or both --hf and --batch", file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    tmp = tempfile.mkdtemp(prefix="parity-torch-")
    summary = []
    try:
        hf_dir, batch_dir = (a.hf, a.batch) if a.hf and a.batch else export(a.parity, a.golden, tmp)
        if len(precs) > 1:
            os.makedirs(a.out, exist_ok=True)
        for p in precs:
            out = a.out if len(precs) == 1 else os.path.join(a.out, p)
            bw = []
            wall = run(a, p, out, hf_dir, batch_dir, bw)
            rows = judge_dump(a.golden, out, p)
            if a.blockwise:  # the whole-model activations then inform; the block-local ones gate
                for r in rows:
                    if r["tensor"].startswith("act."):
                        r["gating"] = False
                rows += bw
            pc = parity_compare(a.parity, a.golden, out, p, os.path.join(tmp, f"cmp-{p}.json")) if a.parity else None
            s = summarize(p, rows, wall, a.force_decisions, pc)
            summary.append(s)
            print_report(s, rows, a.verbose)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.report:
        with open(a.report, "w") as f:
            json.dump({"golden": a.golden, "device": a.device, "torch": torch.__version__, "runs": summary}, f, indent=1)
    # parity compare judges every file alike: it decides only where everything is gating (f64)
    return 0 if all(s["pass"] and (s["precision"] != "f64" or (s.get("parity_compare") or {}).get("exit", 0) == 0)
                    for s in summary) else 1


def print_report(s, rows, verbose):
    for r in rows:
        if verbose or (not r["pass"] and r["gating"]):
            err = f"rel_l2 {r['rel_l2']:.3e} ratio {r['ratio']:.3e}" if "ratio" in r else \
                  r.get("reason", f"n_diff {r.get('n_diff')}")
            print(f"  {'PASS' if r['pass'] else 'FAIL'} {r['file']} {r['tensor']}: {err}")
    w = s["worst"]
    pc = s.get("parity_compare")
    wi = s["informational_worst"]
    print(f"{s['precision']} ({s['decisions']} decisions): {s['tensors']} tensors, {s['failed']} gating ones outside the {s['policy']} policy"
          + (f"; worst {w['file']} {w['tensor']}: ||d|| {w['diff_norm']:.3e} = {w['ratio']:.3e} x bound "
             f"(rel_l2 {w['rel_l2']:.3e})" if w else "")
          + (f"; parity compare exit {pc['exit']} ({pc['entries']} entries, {pc['failed']} failed)" if pc else "")
          + (f"; informational: {s['informational_outside']} outside, worst {wi['file']} "
             f"{wi['tensor']} {wi['ratio']:.3g} x bound" if wi else "")
          + f"; {s['wall_s']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
