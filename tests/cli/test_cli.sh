#!/usr/bin/env bash
# End-to-end test of the kernelcraft CLI: every command, its --json output, and that user mistakes
# give one stderr line and exit 2 (usage) or 1 (failure). Usage: test_cli.sh PATH/TO/kernelcraft
set -u
KC=${1:?usage: test_cli.sh PATH/TO/kernelcraft}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kc-cli-test-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export KERNELCRAFT_CACHE_DIR="$WORK/default-cache"   # never touch the user's real cache
CACHE="$WORK/cache"
FAILS=0
OUT="$WORK/stdout" ERR="$WORK/stderr"

fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }

# expect RC CMD...: runs the CLI, checks the exit code; a non-zero code must come with exactly
# one stderr line starting "kernelcraft: ".
expect() {
  local want=$1; shift
  "$KC" "$@" >"$OUT" 2>"$ERR"
  local rc=$?
  if [ "$rc" != "$want" ]; then
    fail "kernelcraft $* -> exit $rc, wanted $want; stderr: $(cat "$ERR")"
    return
  fi
  if [ "$want" != 0 ]; then
    local lines
    lines=$(wc -l <"$ERR")
    if [ "$lines" != 1 ] || ! grep -q '^kernelcraft: ' "$ERR"; then
      fail "kernelcraft $* -> stderr is not one 'kernelcraft: ' line: $(cat "$ERR")"
    fi
  fi
}

# jcheck PYTHON-EXPR: evaluates EXPR with j = the JSON on stdout of the last command.
jcheck() {
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if ($1) else 1)" "$OUT" \
    || fail "json check '$1' on: $(head -c 400 "$OUT")"
}

# ---- usage and discovery
expect 2
expect 2 bogus
expect 2 cache
expect 2 cache frobnicate
expect 2 --no-such-option ops
expect 2 ops --key x
expect 2 cache show
expect 2 cache show a b
expect 2 --cache-dir
expect 0 --help
grep -q "cache put" "$OUT" || fail "--help does not mention cache put"
expect 0 ops
grep -q "aten::native_layer_norm" "$OUT" || fail "ops does not list layer_norm"
expect 0 ops --json
# Every row of runtime/ops.def, however many families have been added.
NOPS=$(grep -cE '^KC_(OP|COMPOSITE)\(' "$HERE/../../runtime/ops.def")   # backend rows and composites
jcheck 'len(j) == '"$NOPS"' and {"name": "cumsum", "aten": "aten::cumsum", "family": "scan", "default": True} in j and {"name": "relu", "aten": "aten::relu", "family": "unary", "default": True} in j'
expect 0 targets --json
jcheck 'j[0]["backend"] == "cpu" and j[0]["target"].startswith("cpu-")'
TARGET=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[0]['target'])" "$OUT")

# ---- a cache that does not exist yet: read commands list it as empty (exit 0), a key in it is
# still missing (exit 1), and nothing is created
expect 0 --cache-dir "$CACHE" cache ls --json
jcheck 'j == []'
expect 0 --cache-dir "$CACHE" cache ls
grep -q "no kernel cache" "$ERR" || fail "cache ls on a missing cache does not say so: $(cat "$ERR")"
expect 0 --cache-dir "$CACHE" cache stats --json
jcheck 'j["records"] == 0 and j["by_state"] == {}'
expect 0 --cache-dir "$CACHE" cache export "$WORK/empty.kcb" --json
jcheck 'j["exported"] == 0'
expect 1 --cache-dir "$CACHE" cache show "kc1|x|aten::relu|fp32"
expect 1 --cache-dir "$CACHE" cache rm "kc1|x|aten::relu|fp32"
[ -e "$CACHE" ] && fail "a read command created the cache"
expect 0 --cache-dir "$WORK/other-empty" cache import "$WORK/empty.kcb" --json
jcheck 'j["imported"] == 0 and j["rejected"] == 0'

# ---- put
KEY1="kc1|$TARGET|aten::relu|fp32|self=T:f32[1024]s[1]a16"
KEY2="kc1|$TARGET|aten::relu|fp32|self=T:f32[64,64]s[64,1]a16"
SRC="$HERE/copy_cpu.cpp" SPEC="$HERE/copy_cpu.json"
expect 2 --cache-dir "$CACHE" cache put --key "$KEY1" --source "$SRC"
expect 2 --cache-dir "$CACHE" cache put --key "not a key" --source "$SRC" --launch "$SPEC"
expect 2 --cache-dir "$CACHE" cache put --key "kc1|tpu-v5|aten::relu|fp32|" --source "$SRC" --launch "$SPEC"
expect 1 --cache-dir "$CACHE" cache put --key "$KEY1" --source "$WORK/missing.cpp" --launch "$SPEC"
echo '{"version": 1, "launches": [' >"$WORK/broken.json"
expect 1 --cache-dir "$CACHE" cache put --key "$KEY1" --source "$SRC" --launch "$WORK/broken.json"
echo '{"version": 1, "launches": [{"entry": "k"}]}' >"$WORK/invalid.json"
expect 1 --cache-dir "$CACHE" cache put --key "$KEY1" --source "$SRC" --launch "$WORK/invalid.json"
printf 'extern "C" void kc_copy_f32(const kc_cpu_ctx* ctx, void* const* args) { this is not C++; }\n' >"$WORK/bad.cpp"
expect 1 --cache-dir "$CACHE" cache put --key "$KEY1" --source "$WORK/bad.cpp" --launch "$SPEC"
grep -q "compile failed" "$ERR" || fail "compile error not reported as such: $(cat "$ERR")"
expect 0 --cache-dir "$CACHE" cache put --key "$KEY1" --source "$SRC" --launch "$SPEC"
grep -q "^stored " "$OUT" || fail "put did not say what it stored"
expect 0 --cache-dir "$CACHE" cache ls
grep -q "^served *unverified " "$OUT" || fail "ls does not mark the hand-stored record unverified: $(cat "$OUT")"
expect 0 --cache-dir "$CACHE" --json cache put --key="$KEY2" --source "$SRC" --launch "$SPEC"
jcheck 'j["key"].endswith("s[64,1]a16") and j["backend"] == "cpu" and j["blob_bytes"] > 0'

# ---- ls, show, stats
expect 0 --cache-dir "$CACHE" cache ls
[ "$(wc -l <"$OUT")" = 2 ] || fail "ls shows $(wc -l <"$OUT") lines, wanted 2"
expect 0 --cache-dir "$CACHE" cache ls --json
jcheck 'len(j) == 2 and all(r["state"] == "served" and r["backend"] == "cpu" and r["blob_bytes"] > 0 and r["verified"] is False for r in j)'
expect 0 --cache-dir "$CACHE" cache ls --json --op relu --match "[1024]"
jcheck 'len(j) == 1 and j[0]["key"].endswith("f32[1024]s[1]a16")'
expect 0 --cache-dir "$CACHE" cache ls --json --op aten::gelu
jcheck 'j == []'
expect 2 --cache-dir "$CACHE" cache ls --op no_such_op
expect 0 --cache-dir "$CACHE" cache show "$KEY1" --json
jcheck 'j["meta"]["provenance"]["by"] == "kernelcraft cache put" and j["meta"]["provenance"]["verified"] is False and isinstance(j["meta"]["provenance"]["created"], int)'
jcheck 'j["state"] == "served" and j["op"] == "aten::relu" and len(j["blob"]["fnv1a64"]) == 16 and "kc_copy_f32" in j["source"]'
jcheck 'j["launch"]["launches"][0]["entry"] == "kc_copy_f32"'
expect 1 --cache-dir "$CACHE" cache show "kc1|$TARGET|aten::relu|fp32|nothing"
expect 0 --cache-dir "$CACHE" cache stats --json
jcheck 'j["records"] == 2 and j["by_state"] == {"served": 2} and j["by_op"] == {"aten::relu": 2} and j["disk_bytes"] > 0'
expect 0 --cache-dir "$CACHE" cache stats

# ---- export and import
expect 0 --cache-dir "$CACHE" cache export "$WORK/relu.kcb" --op relu --json
jcheck 'j["exported"] == 2 and j["skipped"] == 0'
expect 0 --cache-dir "$CACHE" cache export "$WORK/none.kcb" --op gelu --json
jcheck 'j["exported"] == 0'
expect 2 --cache-dir "$CACHE" cache export
expect 0 --cache-dir "$WORK/other" cache import "$WORK/relu.kcb" --json
jcheck 'j["imported"] == 2 and j["rejected"] == 0'
expect 0 --cache-dir "$WORK/other" cache import "$WORK/relu.kcb" --json
jcheck 'j["imported"] == 0 and j["unchanged"] == 2'
expect 0 --cache-dir "$WORK/other" cache show "$KEY2" --json
jcheck 'j["key"].endswith("s[64,1]a16")'
expect 1 --cache-dir "$WORK/other" cache import "$WORK/missing.kcb"
echo "definitely not a bundle" >"$WORK/garbage.kcb"
expect 1 --cache-dir "$WORK/other" cache import "$WORK/garbage.kcb"
expect 1 --cache-dir "$CACHE" cache export "$WORK/no/such/dir/x.kcb"

# ---- signed bundles and --reverify (kernel_cache/bundle.h: what import trusts)
expect 0 keygen --out "$WORK/keys" --json
jcheck 'len(j["id"]) == 64'
expect 1 keygen --out "$WORK/keys"
expect 0 keygen --out "$WORK/other-keys"
expect 0 --cache-dir "$CACHE" cache export "$WORK/signed.kcb" --op relu --sign "$WORK/keys/bundle-signing.key" --json
jcheck 'j["exported"] == 2 and len(j["signed_by"]) == 64'
expect 1 --cache-dir "$CACHE" cache export "$WORK/x.kcb" --sign "$WORK/keys/bundle-signing.pub"
expect 0 --cache-dir "$WORK/signed-dst" cache import "$WORK/signed.kcb" --trust "$WORK/keys/bundle-signing.pub" --json
jcheck 'j["imported"] == 2 and j["rejected"] == 0 and len(j["signed_by"]) == 64'
expect 0 --cache-dir "$WORK/signed-dst2" cache import "$WORK/signed.kcb" --trust "$WORK/other-keys" --trust "$WORK/keys" --json
jcheck 'j["imported"] == 2'
expect 1 --cache-dir "$WORK/signed-dst3" cache import "$WORK/signed.kcb" --trust "$WORK/other-keys/bundle-signing.pub"
expect 1 --cache-dir "$WORK/signed-dst3" cache import "$WORK/relu.kcb" --trust "$WORK/keys/bundle-signing.pub"
KERNELCRAFT_TRUSTED_KEYS="$WORK/other-keys" expect 1 --cache-dir "$WORK/signed-dst3" cache import "$WORK/signed.kcb"
# copy_cpu.cpp stored for relu keys is a wrong relu: the gauntlet here refuses both, one line each
expect 1 --cache-dir "$WORK/reverify-dst" cache import "$WORK/relu.kcb" --reverify --json
jcheck 'j["imported"] == 0 and j["rejected"] == 2 and all("rejected by the gauntlet here: numerics" in e for e in j["errors"])'

# ---- rm
expect 0 --cache-dir "$CACHE" cache rm "$KEY1"
expect 1 --cache-dir "$CACHE" cache rm "$KEY1"
expect 1 --cache-dir "$CACHE" cache show "$KEY1"
expect 0 --cache-dir "$CACHE" cache ls --json
jcheck 'len(j) == 1'

# ---- KERNELCRAFT_CACHE_DIR is the default, and serving-side files stay out of the cache dir
expect 0 cache import "$WORK/relu.kcb"
expect 0 cache ls --json
jcheck 'len(j) == 2'
ls "$CACHE" "$KERNELCRAFT_CACHE_DIR" 2>/dev/null | grep -q '^LOG' && fail "RocksDB info logs were written into a cache dir"


# ---- verify: exit 0 only for a verified kernel, 1 rejected (with the stage), 2 usage / infrastructure
KDIR="$(cd "$(dirname "$0")/../../examples/kernels" && pwd)"
expect 0 verify --backend cpu --op relu --shape 300x7 --shape 5 --source "$KDIR/relu_cpu.cpp" --launch "$KDIR/relu_cpu.json" --json
jcheck 'j["verified"] is True and len(j["calls"]) == 2 and all(c["verified"] for c in j["calls"])'
jcheck '[s["name"] for s in j["calls"][0]["stages"]] == ["static", "compile", "load", "numerics", "timing", "recheck", "sanitizer"]'
sed 's/out\[i\] = (v > 0.0f || v != v) ? v : 0.0f;/out[i] = v > 0.0f ? v : 0.5f * v;/' "$KDIR/relu_cpu.cpp" >"$WORK/leaky.cpp"
expect 1 verify --backend cpu --op relu --shape 300x7 --source "$WORK/leaky.cpp" --launch "$KDIR/relu_cpu.json" --json
jcheck 'j["verified"] is False and j["stage"] == "numerics" and "index" in j["evidence"] and "expected" in j["evidence"]'
printf 'static int calls = 0;\n' | cat - "$KDIR/relu_cpu.cpp" >"$WORK/stateful.cpp"
expect 1 verify --backend cpu --op relu --shape 300x7 --source "$WORK/stateful.cpp" --launch "$KDIR/relu_cpu.json" --json
jcheck 'j["stage"] == "static"'
# precision policy: a relu rounded to bf16 is wrong under fp32 (the default) and fine under bf16
sed 's/kc_relu_f32/kc_relu_bf16/' "$KDIR/relu_cpu.json" >"$WORK/relu_bf16.json"
expect 1 verify --backend cpu --op relu --shape 300x7 --source "$HERE/relu_bf16_cpu.cpp" --launch "$WORK/relu_bf16.json" --json
jcheck 'j["stage"] == "numerics"'
expect 0 verify --backend cpu --op relu --shape 300x7 --precision bf16 --source "$HERE/relu_bf16_cpu.cpp" --launch "$WORK/relu_bf16.json"
expect 2 verify --backend cpu --op relu --shape 300x7 --source "$WORK/missing.cpp" --launch "$KDIR/relu_cpu.json"
expect 2 verify --backend cpu --op nosuchop --shape 3 --source "$KDIR/relu_cpu.cpp" --launch "$KDIR/relu_cpu.json"
expect 2 verify --backend cpu --op relu --shape 3xq --source "$KDIR/relu_cpu.cpp" --launch "$KDIR/relu_cpu.json"

# ---- cache put --verify: stored only if the gauntlet passes, and then marked verified
VCACHE="$WORK/vcache"
VKEY="kc1|$TARGET|aten::relu|fp32|self=T:f32[300,7]s[7,1]a16"
expect 1 --cache-dir "$VCACHE" cache put --verify --key "$VKEY" --source "$WORK/leaky.cpp" --launch "$KDIR/relu_cpu.json"
grep -q "REJECTED at numerics" "$OUT" || fail "put --verify did not say where it rejected: $(head -c 300 "$OUT")"
[ -e "$VCACHE/CURRENT" ] && fail "put --verify stored a rejected kernel"
expect 0 --cache-dir "$VCACHE" --json cache put --verify --key "$VKEY" --source "$KDIR/relu_cpu.cpp" --launch "$KDIR/relu_cpu.json"
jcheck 'j["verified"] is True and j["key"] == "'"$VKEY"'"'
expect 0 --cache-dir "$VCACHE" cache show "$VKEY" --json
jcheck 'j["meta"]["provenance"]["verified"] is True and j["meta"]["provenance"]["by"] == "kernelcraft cache put --verify"'
jcheck '[s["name"] for s in j["meta"]["verification"]["stages"]][-1] == "sanitizer" and j["meta"]["verification"]["eager_median_ms"] > 0'
expect 0 --cache-dir "$VCACHE" cache ls --json
jcheck 'len(j) == 1 and j[0]["verified"] is True'

# ---- a lost CURRENT file is damage, not an empty cache: nothing may be created over it
DCACHE="$WORK/damaged"
expect 0 --cache-dir "$DCACHE" cache put --key "$KEY1" --source "$SRC" --launch "$SPEC"
expect 0 --cache-dir "$DCACHE" cache put --key "$KEY2" --source "$SRC" --launch "$SPEC"
rm "$DCACHE/CURRENT"
expect 1 --cache-dir "$DCACHE" cache put --key "$KEY1" --source "$SRC" --launch "$SPEC"
grep -q "cache repair" "$ERR" || fail "a put on a cache without CURRENT does not point to the repair: $(cat "$ERR")"
expect 1 --cache-dir "$DCACHE" cache put --key "$KEY2" --source "$SRC" --launch "$SPEC"
expect 1 --cache-dir "$DCACHE" cache ls --json
[ -e "$DCACHE/CURRENT" ] && fail "a writer created a fresh database over the damaged one"
ls "$DCACHE"/*.sst "$DCACHE"/[0-9]*.log >/dev/null 2>&1 || fail "the damaged cache's files were deleted: $(ls "$DCACHE")"
# repair salvages both records and keeps the files as they were
expect 0 --cache-dir "$DCACHE" --json cache repair
jcheck 'j["records"] == 2 and j["dropped"] == 0 and "repair-backup-" in j["backup"]'
BACKUP=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['backup'])" "$OUT")
[ -e "$BACKUP/CURRENT" ] && fail "the backup has a CURRENT the damaged cache did not have"
ls "$BACKUP"/MANIFEST-* >/dev/null 2>&1 || fail "the backup lacks the damaged cache's MANIFEST"
expect 0 --cache-dir "$DCACHE" cache ls --json
jcheck 'len(j) == 2'
expect 1 --cache-dir "$WORK/never" cache repair

if [ "$FAILS" != 0 ]; then
  echo "test_cli.sh: $FAILS failure(s)" >&2
  exit 1
fi
echo "test_cli.sh: all passed"
