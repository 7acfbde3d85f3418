#!/bin/sh
# parity run --load of a checkpoint with one flipped byte: a clear error that
# names the file, exit status 2, and nothing written (no --save, no --dump
# directory, the checkpoint itself unchanged).  Usage: ckpt_run_fault.sh PARITY
P="$1"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$P" run --preset v4-tiny --steps 1 --world-size 4 --use-distributed-optimizer --save "$T/c" --quiet >/dev/null \
    || fail "save run"
# resuming the intact checkpoint works
"$P" run --preset v4-tiny --steps 1 --world-size 2 --load "$T/c" --quiet >/dev/null || fail "intact load"

for f in rank-00002.safetensors metadata.json; do
    rm -rf "$T/bad" "$T/out" "$T/dump"
    cp -r "$T/c" "$T/bad"
    size=$(wc -c <"$T/bad/$f")
    off=$((size / 2))
    # flip one byte in the middle of the file
    b=$(od -An -tu1 -j "$off" -N1 "$T/bad/$f" | tr -d ' ')
    printf "$(printf '\\%03o' $(( (b + 1) % 256 )))" | dd of="$T/bad/$f" bs=1 seek="$off" conv=notrunc 2>/dev/null
    cmp -s "$T/c/$f" "$T/bad/$f" && fail "byte not flipped in $f"
    (cd "$T/bad" && find . -type f -exec sha256sum {} + | sort) >"$T/before"
    "$P" run --preset v4-tiny --steps 1 --world-size 2 --load "$T/bad" --save "$T/out" --dump "$T/dump" \
        --quiet >"$T/stdout" 2>"$T/stderr"
    rc=$?
    [ "$rc" -eq 2 ] || fail "$f: exit $rc, expected 2 ($(cat "$T/stderr"))"
    grep -q "parity run: --load: .*$f" "$T/stderr" || fail "$f: message does not name the file: $(cat "$T/stderr")"
    grep -qi "corrupt\|sha256\|mismatch" "$T/stderr" || fail "$f: message does not say why: $(cat "$T/stderr")"
    [ -e "$T/out" ] && fail "$f: --save directory written"
    [ -e "$T/dump" ] && fail "$f: --dump directory written"
    ls "$T" | grep -q "tmp-" && fail "$f: a temporary directory was left"
    (cd "$T/bad" && find . -type f -exec sha256sum {} + | sort) >"$T/after"
    cmp -s "$T/before" "$T/after" || fail "$f: the checkpoint changed"
    echo "ok: $f flipped -> exit 2: $(cat "$T/stderr")"
done
# another model config: exit 2 naming the tensor and both shapes (issue 13 item 17)
"$P" run --preset v4-tiny --steps 1 --world-size 2 --load "$T/c" --set dim=64 --quiet >/dev/null 2>"$T/stderr"
rc=$?
[ "$rc" -eq 2 ] || fail "--set dim=64: exit $rc, expected 2 ($(cat "$T/stderr"))"
grep -q "tensor 'embed.weight' is F64 \[128,64\] in this model but F64 \[128,32\] in the checkpoint" "$T/stderr" \
    || fail "--set dim=64: the message lacks the tensor or a shape: $(cat "$T/stderr")"
echo "ok: --set dim=64 -> exit 2: $(cat "$T/stderr")"

# a tensor listed twice in metadata.json, hashes made for it (issue 13 item 1: SIGSEGV before)
rm -rf "$T/dup"
cp -r "$T/c" "$T/dup"
sed -i '0,/"embed.weight"/s//"head.weight"/' "$T/dup/metadata.json"
(cd "$T/dup" && sha256sum metadata.json rank-*.safetensors >SHA256SUMS)
for cmd in "ckpt info $T/dup" "ckpt diff $T/c $T/dup" \
           "run --preset v4-tiny --steps 1 --world-size 2 --quiet --load $T/dup"; do
    # shellcheck disable=SC2086
    "$P" $cmd >/dev/null 2>"$T/stderr"
    rc=$?
    [ "$rc" -eq 2 ] || fail "duplicate name, $cmd: exit $rc, expected 2 ($(cat "$T/stderr"))"
    grep -q "tensor 'head.weight' is listed twice" "$T/stderr" \
        || fail "duplicate name, $cmd: message: $(cat "$T/stderr")"
done
echo "ok: duplicate tensor name -> exit 2: $(cat "$T/stderr")"
exit 0
