#!/usr/bin/env python3
"""tools/coverage-math.py - which branches of the model's math a workload
reaches (issue 33 item 2): gcov's branch counts over src/kernels and
src/model of a coverage build, after a workload (default: the quick
matrix, whose goldens are what a GPU team compares against).

    meson setup build-cov -Db_coverage=true -Doptimization=0   # once (-O0: a
        # clamp or a select stays a branch gcov can see; at -O2 it is a cmov)
    ninja -C build-cov parity
    flock /work/heavy.lock nice python3 tools/coverage-math.py [--build build-cov]
          [--run "matrix --quick --fixture tiny-boundary-mix"] [--no-run] [--json FILE]
          [--diff OLD.json]

Zeroes the counters, runs `BUILD/parity RUN --out TMP` (unless --no-run),
then reads every .gcda of BUILD/src/kernels and BUILD/src/model with
`gcov --json-format --stdout`.  The two instantiations of a templated unit
(f64, f32) are merged line by line: a branch counts as taken when either
took it.  Prints, per directory, conditional branches taken of the total
and lines never run; then every line with a branch never taken, split into
math (the rest) and plumbing (lines that only handle an error, an
allocation, a NULL or a bad argument: par_err, PAR_E*, goto fail*, return
with a status, `if (!p)`), with its source text.  --json writes all of it.  --diff OLD.json (an
earlier --json) prints what changed against it: the math lines taken now
that were not, and those untaken now that were not listed, matched by file
and source text (line numbers move when a file is edited).
"""
import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRS = ("src/kernels", "src/model")
# The files of the model's math (the rest of src/model reads, writes, compares and configures).
MATH = ("src/kernels/", "src/model/block.c", "src/model/model.c", "src/model/step.c", "src/model/head.c",
        "src/model/optim.c", "src/model/init.c", "src/model/data.c", "src/model/fixtures.c")
PLUMBING = re.compile(r"par_err|PAR_E[A-Z]|goto fail|goto done|return s;|return st;|if \(!\w+\)|if \(s\)|if \(st\)|"
                      r"\|\| !|&& !\w+\)|malloc|calloc|NULL\)|== NULL|!= PAR_OK|assert")


def gcov_json(build, gcda):
    r = subprocess.run(["gcov", "-j", "-t", "-b", "-o", os.path.dirname(gcda), gcda], cwd=build,
                       capture_output=True, text=True)
    out = []
    for chunk in r.stdout.splitlines():
        chunk = chunk.strip()
        if chunk.startswith("{"):
            out.append(json.loads(chunk))
    return out


def source_of(build, path):
    p = os.path.normpath(os.path.join(build, path))
    return os.path.relpath(p, ROOT)


def collect(build):
    # (src, line) -> [taken flags per branch index], line counts
    br = {}
    lines = {}
    for d in DIRS:
        for gcda in glob.glob(os.path.join(build, d, "**", "*.gcda"), recursive=True):
            for doc in gcov_json(build, gcda):
                for f in doc.get("files", []):
                    src = source_of(build, f["file"])
                    if not any(src.startswith(x + "/") for x in DIRS) or not src.endswith(".c"):
                        continue
                    for ln in f.get("lines", []):
                        key = (src, ln["line_number"])
                        lines[key] = lines.get(key, 0) + ln["count"]
                        b = [x["count"] > 0 for x in ln.get("branches", []) if not x.get("throw")]
                        if not b:
                            continue
                        if key not in br or len(br[key]) != len(b):
                            br[key] = b if key not in br else [x or y for x, y in zip(br[key], b)] + \
                                br[key][len(b):] + b[len(br[key]):]
                        else:
                            br[key] = [x or y for x, y in zip(br[key], b)]
    return br, lines


# A condition whose body only fails (the next lines return an error or jump to a cleanup label).
FAILS = re.compile(r"return par_err|return PAR_E|goto |return s;|return st;|return -1;|PAR_LOG_E")


def is_plumbing(src, line, t):
    if PLUMBING.search(t):
        return True
    if not re.match(r"(\}\s*else\s+)?if \(", t) and not t.endswith(("||", "&&")):
        return False
    nxt = " ".join(text_of(src, line + k) for k in (1, 2, 3))
    return bool(FAILS.search(nxt))


def text_of(src, line, cache={}):
    if src not in cache:
        with open(os.path.join(ROOT, src)) as f:
            cache[src] = f.read().splitlines()
    t = cache[src]
    return t[line - 1].strip() if 0 < line <= len(t) else ""


def print_diff(path, summary, math):
    """The math lines that changed against an earlier --json, by (file, source text, branches)."""
    with open(path) as f:
        old = json.load(f)
    for d in DIRS + ("math",):
        o, n = old["summary"].get(d), summary.get(d)
        if o and n:
            print(f"vs {path}: {d}: {o['taken']} of {o['branches']} -> {n['taken']} of {n['branches']} taken")
    key = lambda r: (r["file"], r["text"])
    was = collections.defaultdict(list)
    for r in old["math"]:
        was[key(r)].append(r)
    now = collections.defaultdict(list)
    for r in math:
        now[key(r)].append(r)
    gone = [r for k, rs in was.items() for r in rs[len(now.get(k, [])):]]
    new = [r for k, rs in now.items() for r in rs[len(was.get(k, [])):]]
    print(f"math lines taken now that were not ({len(gone)}; old line numbers):")
    for r in gone:
        print(f"  {r['file']}:{r['line']} [{r['taken']}] {r['text']}")
    print(f"math lines untaken now that were not listed ({len(new)}):")
    for r in new:
        print(f"  {r['file']}:{r['line']} [{r['taken']}] {r['text']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-cov"))
    ap.add_argument("--run", default="matrix --quick", help="parity arguments of the workload (--out is added)")
    ap.add_argument("--no-run", action="store_true", help="read the counters as they are")
    ap.add_argument("--json", help="write the full result as JSON")
    ap.add_argument("--list", type=int, default=400, help="untaken math branch lines printed (default 400)")
    ap.add_argument("--diff", help="an earlier --json: print the math lines that changed against it")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    if not a.no_run:
        for g in glob.glob(os.path.join(build, "**", "*.gcda"), recursive=True):
            os.remove(g)
        out = tempfile.mkdtemp(prefix="coverage-math-")
        shutil.rmtree(out)
        cmd = [os.path.join(build, "parity")] + a.run.split() + ["--out", out, "--quiet"]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        shutil.rmtree(out, ignore_errors=True)
        tail = "\n".join(r.stdout.splitlines()[-3:])
        print(f"workload: parity {a.run}: exit {r.returncode}\n{tail}")
    br, lines = collect(build)
    summary = {}
    for d in DIRS:
        bl = [v for k, v in br.items() if k[0].startswith(d + "/")]
        tot = sum(len(v) for v in bl)
        taken = sum(sum(v) for v in bl)
        ll = [c for k, c in lines.items() if k[0].startswith(d + "/")]
        summary[d] = {"branches": tot, "taken": taken, "lines": len(ll), "lines_run": sum(1 for c in ll if c > 0)}
        pct = 100.0 * taken / tot if tot else 0
        print(f"{d}: {taken} of {tot} conditional branches taken ({pct:.1f} %); "
              f"{summary[d]['lines_run']} of {len(ll)} lines run")
    untaken = sorted(k for k, v in br.items() if not all(v) and lines.get(k, 0) >= 0)
    math, plumbing = [], []
    untaken = [k for k in untaken if k[0].startswith(MATH)]
    for src, ln in untaken:
        t = text_of(src, ln)
        v = br[(src, ln)]
        row = {"file": src, "line": ln, "taken": "".join("1" if x else "0" for x in v), "runs": lines.get((src, ln), 0),
               "text": t}
        (plumbing if is_plumbing(src, ln, t) else math).append(row)
    mb = [v for k, v in br.items() if k[0].startswith(MATH)]
    summary["math"] = {"branches": sum(len(v) for v in mb), "taken": sum(sum(v) for v in mb)}
    print(f"math files ({', '.join(MATH)}): {sum(sum(v) for v in mb)} of {sum(len(v) for v in mb)} conditional "
          f"branches taken")
    print(f"math-file lines with a branch never taken: {len(untaken)} ({len(math)} math, {len(plumbing)} plumbing: "
          f"an error, allocation or argument check)")
    per = collections.Counter(r["file"] for r in math)
    for f, n in sorted(per.items()):
        print(f"  {f}: {n} math lines")
    print("math lines with a branch never taken (file:line [taken per branch, line runs] text):")
    for r in math[:a.list]:
        print(f"  {r['file']}:{r['line']} [{r['taken']}, {r['runs']}] {r['text']}")
    if a.diff:
        print_diff(a.diff, summary, math)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"workload": a.run, "summary": summary, "math": math, "plumbing": plumbing}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
