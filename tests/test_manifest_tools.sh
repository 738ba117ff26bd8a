#!/bin/bash
# A manifest run through the operator's tools: a Llama-like init written by
# numpy (not by dloco) starts dloco-sync; dloco manifest, check, status
# (text and --json), records and export --format safetensors work on it, the
# export round-trips the init bit for bit (compared by numpy), and the
# GPT-2-only tools (eval, --format llmc|hf) are refused with the reason. Then
# tests/test_manifest_run leaves a run with merges (its learner's fetched
# global model beside it): check, status, records and an export that equals
# that model bit for bit.
set -u
TEST_NAME=manifest_tools
. "$(dirname "$0")/lib_cluster.sh"
PY=/usr/bin/python3
$PY -c "import numpy" 2>/dev/null || { echo "SKIP: /usr/bin/python3 has no numpy"; exit 77; }

# ---- the init file: a Llama-like table, roles in __metadata__ dloco_manifest
$PY - "$W/init.safetensors" "$W/init.npz" <<'EOF'
import json, struct, sys
import numpy as np
rng = np.random.default_rng(5)
C, V, L = 16, 64, 2
t = [("model.embed_tokens.weight", (V, C), "embedding")]
for l in range(L):
    p = "model.layers.%d." % l
    t += [(p + "input_layernorm.weight", (C,), "vector")]
    t += [(p + "self_attn.%s_proj.weight" % k, (C, C), "matrix") for k in "qkvo"]
    t += [(p + "post_attention_layernorm.weight", (C,), "vector"),
          (p + "mlp.gate_proj.weight", (3 * C, C), "matrix"), (p + "mlp.up_proj.weight", (3 * C, C), "matrix"),
          (p + "mlp.down_proj.weight", (C, 3 * C), "matrix")]
t += [("model.rotary.inv_freq_table", (2, 4, 2), "vector"), ("model.norm.weight", (C,), "vector"),
      ("lm_head.weight", (V, C), "matrix")]
arrays = {n: (rng.standard_normal(s) * 0.02).astype("<f4") for n, s, _ in t}
manifest = {"dloco_manifest": 1, "tensors": [{"name": n, "shape": list(s), "role": r} for n, s, r in t]}
hdr, off, data = {"__metadata__": {"format": "pt", "dloco_manifest": json.dumps(manifest)}}, 0, []
# the file's data in reverse order: a file need not be in the manifest's order
for n, s, _ in reversed(t):
    b = arrays[n].tobytes()
    hdr[n] = {"dtype": "F32", "shape": list(s), "data_offsets": [off, off + len(b)]}
    off += len(b)
    data.append(b)
h = json.dumps(hdr).encode()
h += b" " * (-(8 + len(h)) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"".join(data))
np.savez(sys.argv[2], **arrays)
json.dump(manifest, open(sys.argv[2] + ".json", "w"))
EOF
[ -s "$W/init.safetensors" ] || die "numpy did not write the init file"

# the manifest the file carries, as dloco reads it
"$DLOCO" manifest "$W/init.safetensors" > "$W/manifest.json" 2> "$W/manifest.err"; rc=$?
check "dloco manifest FILE: exit 0 (got $rc)" [ "$rc" = 0 ]
check "... the file's own manifest (nothing guessed)" [ ! -s "$W/manifest.err" ]
check "... equal to the one numpy wrote" $PY -c "
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
sys.exit(0 if a['tensors'] == b['tensors'] else 1)" "$W/manifest.json" "$W/init.npz.json"
"$DLOCO" plan --manifest "$W/manifest.json" --fragments 4 > "$W/plan.txt"; rc=$?
check "dloco plan --manifest: exit 0 and 4 fragments" [ "$rc" = 0 -a "$(grep -c '^fragment ' "$W/plan.txt")" = 4 ]

# ---- version 0 from the file
make_corpus
start_sync v0 --init_from "$W/init.safetensors"
FP=$(ev_last "$W/events-v0.log" sync_start fingerprint)
# dloco's GPT-2 learner on this run: refused at once, for good (exit 3, no retry loop)
start_learner gpt --steps 50
wait_pid 60 "$LPID"; rc=$?
check "dloco-learner on a manifest run: exit 3 (got $rc)" [ "$rc" = 3 ]
check "... refused, saying it is a GPT-2 learner on a manifest run" \
  grep -q "this learner is a GPT-2 learner.*described by a manifest (22 tensors" "$W/gpt.log"
check "... one refusal, no retry loop" [ "$(grep -c "event=refused" "$W/events-gpt.log")" = 1 ]
stop_sync
check "the run's fingerprint is dloco plan's" grep -q "fingerprint $FP" "$W/plan.txt"
"$DLOCO" check "$W/store" > "$W/check.txt" 2>&1; rc=$?
check "dloco check: exit 0 (got $rc)" [ "$rc" = 0 ]
check "... the manifest matches the fingerprint" grep -q "model: a manifest of 22 tensors" "$W/check.txt"
"$DLOCO" status "$W/store" > "$W/status.txt" 2>&1; rc=$?
check "dloco status: exit 0 (got $rc)" [ "$rc" = 0 ]
check "... names the manifest" grep -q "^model: a manifest of 22 tensors" "$W/status.txt"
"$DLOCO" status "$W/store" --json > "$W/status.json"; rc=$?
check "dloco status --json: exit 0, 4 fragments at version 0" $PY -c "
import json, sys
s = json.load(open(sys.argv[1]))
sys.exit(0 if [f['version'] for f in s['fragments']] == [0] * 4 and s['fingerprint'] == sys.argv[2] else 1)" \
  "$W/status.json" "$FP"
"$DLOCO" records "$W/store" > "$W/records.txt"; rc=$?
check "dloco records: exit 0, the header alone" [ "$rc" = 0 -a "$(wc -l < "$W/records.txt")" = 1 ]
"$DLOCO" manifest "$W/store" > "$W/store-manifest.json"; rc=$?
check "dloco manifest STORE: exit 0 (got $rc)" [ "$rc" = 0 ]
check "... the run's manifest, the file's" cmp "$W/store-manifest.json" "$W/manifest.json"

"$DLOCO" export "$W/store" --format safetensors "$W/out0.safetensors" > "$W/export0.log" 2>&1; rc=$?
check "dloco export --format safetensors: exit 0 (got $rc)" [ "$rc" = 0 ]
check "... the init, bit for bit, under the manifest's names and shapes, roles in metadata" $PY - "$W/out0.safetensors" "$W/init.npz" <<'EOF'
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
meta = hdr.pop("__metadata__")
want = np.load(sys.argv[2])
man = json.load(open(sys.argv[2] + ".json"))
assert json.loads(meta["dloco_manifest"])["tensors"] == man["tensors"], "roles or order differ"
assert sorted(hdr) == sorted(want.files), "names differ"
for name, e in hdr.items():
    assert e["dtype"] == "F32" and tuple(e["shape"]) == want[name].shape, name
    b, f = e["data_offsets"]
    assert raw[8 + n + b:8 + n + f] == want[name].astype("<f4").tobytes(), "bytes of " + name
print("export: %d tensors equal to the init bit for bit" % len(hdr))
EOF

for fmt in llmc hf; do
  "$DLOCO" export "$W/store" --format $fmt "$W/out.$fmt" > "$W/export-$fmt.log" 2>&1; rc=$?
  check "export --format $fmt: refused (exit $rc)" [ "$rc" = 2 ]
  check "... saying why" grep -q "writes dloco's GPT-2 only.*use --format safetensors" "$W/export-$fmt.log"
done
"$DLOCO" eval "$W/store" --data /dev/null > "$W/eval.log" 2>&1; rc=$?
check "dloco eval: refused (exit $rc)" [ "$rc" = 2 ]
check "... saying why" grep -q "described by a manifest.*evaluates dloco's GPT-2 only" "$W/eval.log"

# ---- a run with merges, from tests/test_manifest_run
mkdir -p "$W/run"
MANIFEST_RUN_OUT="$W/run" "$B/synchronizer/test_manifest_run" > "$W/manifest_run.log" 2>&1; rc=$?
check "test_manifest_run left a run (exit $rc)" [ "$rc" = 0 -a -d "$W/run/store" ]
"$DLOCO" check "$W/run/store" > "$W/check-run.txt" 2>&1; rc=$?
check "dloco check on the merged run: exit 0 (got $rc)" [ "$rc" = 0 ]
"$DLOCO" status "$W/run/store" --json > "$W/status-run.json"
check "status --json: versions 1 1 0" $PY -c "
import json, sys
s = json.load(open(sys.argv[1]))
sys.exit(0 if [f['version'] for f in s['fragments']] == [1, 1, 0] else 1)" "$W/status-run.json"
"$DLOCO" records "$W/run/store" > "$W/records-run.txt"
check "records: two merged contributions of llama-0" \
  [ "$(awk 'NR > 1 && $3 == "llama-0" && $4 == "merged"' "$W/records-run.txt" | wc -l)" = 2 ]
"$DLOCO" export "$W/run/store" --format safetensors "$W/run.safetensors" > "$W/export-run.log" 2>&1; rc=$?
check "export of the merged run: exit 0 (got $rc)" [ "$rc" = 0 ]
check "... equal, bit for bit, to the global model the learner fetched" $PY - "$W/run.safetensors" "$W/run/global.bin" "$W/run/manifest.json" <<'EOF'
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
hdr.pop("__metadata__")
glob = np.fromfile(sys.argv[2], dtype="<f4")
off = 0
for t in json.load(open(sys.argv[3]))["tensors"]:
    k = int(np.prod(t["shape"]))
    e = hdr[t["name"]]
    b, f = e["data_offsets"]
    assert e["shape"] == t["shape"], t["name"]
    assert raw[8 + n + b:8 + n + f] == glob[off:off + k].tobytes(), "bytes of " + t["name"]
    off += k
assert off == glob.size
print("export of the merged run: %d floats equal to the learner's fetch" % off)
EOF

[ $fail = 0 ] && echo "test_manifest_tools: all checks passed" || echo "test_manifest_tools: FAILED"
exit $fail
