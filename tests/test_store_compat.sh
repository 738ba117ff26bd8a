#!/bin/bash
# A GPT-2 store written before manifests (tests/data/gpt_store_f0324b6, made by
# tests/ref/make_gpt_store.sh with the build of f0324b6) opens with this
# build: dloco check, status, manifest and export read it, dloco-sync resumes
# it with the same fingerprint, and a manifest run on it is refused naming
# why. The store lacks the meta key "manifest": a GPT-2 run.
set -u
TEST_NAME=store_compat
. "$(dirname "$0")/lib_cluster.sh"
SRC=${DLOCO_SRC:-$(dirname "$0")/..}
FP=7f4c39e750ad6391
mkdir -p "$W/store"
cp "$SRC/tests/data/gpt_store_f0324b6/data.mdb" "$W/store/"

"$DLOCO" check "$W/store" > "$W/check.txt" 2>&1; rc=$?
check "dloco check of the old store: exit 0 (got $rc)" [ "$rc" = 0 ]
check "... its GPT-2 model matches the fingerprint" grep -q "model: L=1 NH=2 C=16 T=16 V=256, init seed 1337: matches" "$W/check.txt"
"$DLOCO" status "$W/store" --json > "$W/status.json"; rc=$?
check "status --json: fingerprint $FP, versions 2 2" /usr/bin/python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))
sys.exit(0 if s['fingerprint'] == sys.argv[2] and [f['version'] for f in s['fragments']] == [2, 2] else 1)" \
  "$W/status.json" "$FP"
"$DLOCO" manifest "$W/store" > "$W/manifest.json"; rc=$?
check "dloco manifest STORE: the GPT-2 table of the run" [ "$rc" = 0 ] 
check "... 16 tensors, gpt config" /usr/bin/python3 -c "
import json, sys
m = json.load(open(sys.argv[1]))
sys.exit(0 if len(m['tensors']) == 16 and m['gpt'] == {'n_layer': 1, 'n_head': 2, 'n_embd': 16, 'seq_len': 16, 'vocab': 256} else 1)" \
  "$W/manifest.json"
"$DLOCO" export "$W/store" --format safetensors "$W/out.safetensors" > "$W/export.log" 2>&1; rc=$?
check "export --format safetensors: exit 0 (got $rc)" [ "$rc" = 0 ]

# the synchronizer resumes it as the GPT-2 run it is
MODEL="--n_layer 1 --n_head 2 --n_embd 16 --seq_len 16"
start_sync resume --fragments 2
check "dloco-sync resumed it" [ "$(ev_last "$W/events-resume.log" sync_start resumed)" = 1 ]
check "... with fingerprint $FP" [ "$(ev_last "$W/events-resume.log" sync_start fingerprint)" = "$FP" ]
check "... at epoch 2" [ "$(ev_last "$W/events-resume.log" sync_start epoch)" = 2 ]
stop_sync
"$DLOCO" check "$W/store" > /dev/null 2>&1; rc=$?
check "dloco check after the resume: exit 0 (got $rc)" [ "$rc" = 0 ]

# its GPT-2 table as a manifest is not a manifest run: told to use the GPT-2 options
"$SYNC" --store "$W/other" --bind tcp://127.0.0.1:0 --metrics off --manifest "$W/manifest.json" --fragments 2 \
  > "$W/gpt-manifest.log" 2>&1; rc=$?
check "dloco-sync --manifest of a GPT-2 table: refused (exit $rc)" [ "$rc" != 0 ]
check "... naming the GPT-2 options" grep -q "the manifest is dloco's GPT-2 (n_layer 1 n_head 2 n_embd 16 seq_len 16 vocab 256): start that run with those options" "$W/gpt-manifest.log"
check "... and leaving no store behind" [ ! -e "$W/other" ]

# a manifest run on it: refused, naming the GPT-2 run
cat > "$W/m.json" <<'J'
{"dloco_manifest": 1, "tensors": [{"name": "a", "shape": [4, 4], "role": "matrix"}, {"name": "b", "shape": [4], "role": "vector"}]}
J
"$SYNC" --store "$W/store" --bind tcp://127.0.0.1:0 --metrics off --manifest "$W/m.json" --fragments 2 > "$W/manifest-run.log" 2>&1; rc=$?
check "a manifest run on the GPT-2 store: refused (exit $rc)" [ "$rc" != 0 ]
check "... naming the GPT-2 run" grep -q "holds GPT-2 run 'dloco' (L=1 NH=2 C=16 T=16 V=256 P=2); refusing a run described by a manifest" "$W/manifest-run.log"

[ $fail = 0 ] && echo "test_store_compat: all checks passed" || echo "test_store_compat: FAILED"
exit $fail
