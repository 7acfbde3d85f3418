#!/bin/sh
# Prints the directory under a REFDIR (a CPU matrix's ref/) whose golden set
# was made from the same model, training settings, data and precision as the
# set SET (a matrix cell's kept set).  Exit 1 when none is.
# Usage: cpu_ref.sh SET REFDIR...
key() { # the manifest's identity: model, train, data (where it starts aside: a resumed set), precision
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); x=dict(d.get("data") or {})
for k in ("cursor", "next_cursor"): x.pop(k, None)
print(json.dumps([d.get("model"), d.get("train"), x, d.get("precision")], sort_keys=True))' "$1/manifest.json"
}
want=$(key "$1") || exit 1
shift
for d in "$@"; do for r in "$d"/*/; do
    [ -f "$r/manifest.json" ] || continue
    [ "$(key "$r")" = "$want" ] && { echo "${r%/}"; exit 0; }
done; done
exit 1
