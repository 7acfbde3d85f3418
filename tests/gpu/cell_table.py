#!/usr/bin/env python3
"""The GPU check's table (tests/gpu/against_cpu.sh, docs/gpu.md).

Usage: cell_table.py CMPJSON_DIR MATRIX_LOG...

CMPJSON_DIR: one folder per cell, "pJ-" and the matrix's kept-cell folder name
("p1-07-dp2-tiny-boundary-mix": part J's cell 7; "00-serial-f64" for the
serial goldens), of `parity compare --json` reports of the cell's files
against the CPU golden.
MATRIX_LOG: the output of each part of the GPU matrix, in part order ("[ i/n]
cell data   PASS (x s)" lines).

Prints a Markdown table: per cell its verdict and wall time on the device (the
matrix's own check against the serial reference run on the device), then
against the CPU golden the files and tensors compared, how many fail, and the
largest error: rel. L2 and the fraction of its policy bound (||B-A|| / bound),
with the tensor.  Exit 0; a failure is already reported by the caller.
"""
import json
import os
import re
import sys

LINE = re.compile(r"^\[\s*(\d+)/\d+\]\s+(\S+)\s+(\S+)\s+(PASS|FAIL|ERROR|WARN)\S*\s*(?:\(([\d.]+) s\))?")


def verdicts(log):
    out = {}
    with open(log, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                out[int(m.group(1))] = (m.group(2), m.group(3), m.group(4), m.group(5) or "")
    return out


def part_index(d):
    """("p2-07-dp2-...") -> (2, 7); a name without its part is part 1's"""
    m = re.match(r"^(?:p(\d+)-)?(\d+)-", d)
    return (int(m.group(1) or 1), int(m.group(2))) if m else (1, 0)


def order(d):
    return (0, 0, d) if d.startswith("00-serial-") else (1,) + part_index(d)


def worst_of(folder):
    files = tensors = failed = 0
    worst = None  # (fraction of bound, rel_l2, "file tensor", policy)
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            r = json.load(f)
        files += 1
        for t in r.get("tensors", []):
            tensors += 1
            failed += not t.get("pass", False)
            bound = t.get("bound") or 0.0
            frac = (t.get("diff_norm") or 0.0) / bound if bound > 0 else 0.0
            if worst is None or frac > worst[0]:
                worst = (frac, t.get("rel_l2") or 0.0, f"{t['file']} {t['tensor']}", t.get("mode", ""))
    return files, tensors, failed, worst


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: cell_table.py CMPJSON_DIR MATRIX_LOG...")
    jdir, logs = sys.argv[1], sys.argv[2:]
    v = {}  # (part, index) -> (cell, data, verdict, wall)
    for j, log in enumerate(logs, 1):
        for i, row in (verdicts(log) if os.path.exists(log) else {}).items():
            v[(j, i)] = row
    rows = sorted(os.listdir(jdir), key=order) if os.path.isdir(jdir) else []
    print("| # | cell | data | on the device | wall | vs CPU golden: files | tensors | failed | "
          "worst rel. L2 | x bound | worst tensor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    seen = set()
    for d in rows:
        files, tensors, failed, w = worst_of(os.path.join(jdir, d))
        if d.startswith("00-serial-"):
            idx, cell, data, verdict, wall = "-", "serial " + d[len("00-serial-"):], "v4-tiny", "golden", ""
        else:
            key = part_index(d)
            seen.add(key)
            idx = f"{key[0]}.{key[1]}" if len(logs) > 1 else str(key[1])
            cell, data, verdict, wall = v.get(key, (d.split("-", 2)[-1], "", "?", ""))
        wr = f"{w[1]:.3g}" if w else "-"
        wf = f"{w[0]:.3g} ({w[3]})" if w else "-"
        wt = w[2] if w else "-"
        print(f"| {idx} | {cell} | {data} | {verdict} | {wall + ' s' if wall else ''} | {files} | {tensors} | "
              f"{failed} | {wr} | {wf} | {wt} |")
    for key in sorted(set(v) - seen):  # cells with no set compared against the CPU golden
        cell, data, verdict, wall = v[key]
        idx = f"{key[0]}.{key[1]}" if len(logs) > 1 else str(key[1])
        print(f"| {idx} | {cell} | {data} | {verdict} | {wall + ' s' if wall else ''} | - | - | - | - | - | "
              "(no CPU golden of its data, or nothing kept) |")


if __name__ == "__main__":
    main()
