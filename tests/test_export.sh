#!/bin/bash
# Getting the model out and in (docs/OPERATING.md, "Exporting and importing
# models"). A short cluster run makes a store; `dloco export` writes it as
# safetensors, an llm.c checkpoint and an HF GPT-2 directory; a float64
# PyTorch twin (tests/export_check.py, with nothing but the published
# formats) gets the loss `dloco eval` got on the exact same sequences
# (--dump_seqs) to 1e-4; each file starts a new run (dloco-sync --init_from)
# whose version-0 model evaluates to the same loss, and a standalone learner
# (--init_from) whose first evaluation is that loss, and whose checkpoint
# still resumes. Refusals: overwrite, an empty store, a store that holds a
# run, a shape mismatch (both shapes named), hostile files (NaN, truncated).
# Without torch in /usr/bin/python3 the torch checks are skipped loudly (exit
# 77 after the other checks), and fail under CI=true or DLOCO_REQUIRE_TORCH=1.
set -u
TEST_NAME=export
. "$(dirname "$0")/lib_cluster.sh"
PY=${DLOCO_TORCH_PYTHON:-/usr/bin/python3} # Debian's python3-torch is for /usr/bin/python3 only
CHECK_PY="$(dirname "$0")/export_check.py"
make_corpus
EVAL="--data $W/corpus.txt --batch 8 --val_batches 4"
SYNC_MODEL="$MODEL --vocab 256 --fragments 4"

# ---- a store with a trained global model
start_sync sync $OUTER
start_learner l0 --steps 40
# while the synchronizer merges: one snapshot, a complete file
wait_until 60 '[ "$(merges)" -ge 2 ]' || die "no merges"
check "export while the synchronizer merges" quietly "$DLOCO" export "$W/store" --format safetensors "$W/live.safetensors"
wait_pid 180 "$LPID" || die "learner l0 failed"
stop_sync
[ "$(merges)" -gt 0 ] || die "no merges: nothing trained"
echo "store: versions $(versions), $(merges) merges"

# ---- export: three formats, overwrite refused, --force replaces
for f in safetensors llmc hf; do
  case $f in safetensors) out=$W/m.safetensors ;; llmc) out=$W/m.bin ;; hf) out=$W/m.hf ;; esac
  check "export --format $f" quietly "$DLOCO" export "$W/store" --format $f "$out"
done
check "the hf directory holds model.safetensors and config.json" \
  test -s "$W/m.hf/model.safetensors" -a -s "$W/m.hf/config.json"
out=$("$DLOCO" export "$W/store" --format llmc "$W/m.bin" 2>&1); rc=$?
check "export over an existing file is refused (rc $rc)" \
  sh -c "[ $rc = 2 ] && echo \"\$1\" | grep -q 'exists (use --force'" _ "$out"
check "export --force replaces it" quietly "$DLOCO" export "$W/store" --format llmc --force "$W/m.bin"
check "export --force replaces an hf directory" quietly "$DLOCO" export "$W/store" --format hf "$W/m.hf" --force
out=$("$DLOCO" export "$W/nostore" --format llmc "$W/x.bin" 2>&1); rc=$?
check "export of a missing store is refused (rc $rc): $out" [ $rc = 2 -a ! -e "$W/x.bin" ]

# ---- the loss dloco computes, on sequences it writes down
line=$("$DLOCO" eval "$W/store" $EVAL --dump_seqs "$W/seqs.bin" --json) || die "dloco eval failed"
L0=$(echo "$line" | jq_py "d['val_loss']")
[ -n "$L0" ] || die "no val_loss in: $line"
echo "dloco eval: val_loss=$L0 on $(( ($(stat -c %s "$W/seqs.bin") - 32) / 256 / 2 )) sequences"

# ---- the torch twin on each format
torch_ok=1
if "$PY" -c "import torch" 2>/dev/null; then
  "$PY" "$CHECK_PY" "$W/seqs.bin" "$L0" 2 --safetensors "$W/m.safetensors" --llmc "$W/m.bin" --hf "$W/m.hf" \
    > "$W/check.txt" 2>&1; rc=$?
  sed 's/^/  /' "$W/check.txt"
  for f in safetensors llmc hf hf-conv1d; do
    check "torch loss of the $f export == dloco eval (1e-4)" \
      awk -v f="format=$f" '$2 == f { split($5, d, "="); ok = (d[2] + 0 <= 1e-4) } END { exit !ok }' "$W/check.txt"
  done
  check "export_check.py passed (rc $rc)" [ $rc = 0 ]
else
  torch_ok=0
fi

# ---- import: a new run from each file; its version 0 is the exported model
for f in safetensors llmc hf; do
  case $f in safetensors) in=$W/m.safetensors ;; llmc) in=$W/m.bin ;; hf) in=$W/m.hf ;; esac
  start_sync "from-$f" --store "$W/s-$f" --init_from "$in"
  stop_sync
  l=$("$DLOCO" eval "$W/s-$f" $EVAL --dump_seqs "$W/seqs-$f.bin" --json | jq_py "d['val_loss']")
  echo "import $f: val_loss=$l (exported $L0)"
  check "a run started from the $f file evaluates to the exported loss ($l == $L0)" [ "$l" = "$L0" ]
  check "and on the same sequences" cmp -s "$W/seqs.bin" "$W/seqs-$f.bin"
  check "its store passes dloco check" quietly "$DLOCO" check "$W/s-$f"
done
start_sync from-live --store "$W/s-live" --init_from "$W/live.safetensors"
stop_sync
check "the live export starts a run too" quietly "$DLOCO" check "$W/s-live"
check "the import was logged" grep -q "global model from $W/m.hf (safetensors (hf names), F32)" "$W/from-hf.log"
out=$("$SYNC" --store "$W/s-llmc" --bind tcp://127.0.0.1:0 $SYNC_MODEL --init_from "$W/m.bin" 2>&1); rc=$?
check "init_from on a store that holds a run is refused (rc $rc)" \
  sh -c "[ $rc = 2 ] && echo \"\$1\" | grep -q 'already holds run dloco; init_from applies only to a new'" _ "$out"
out=$("$SYNC" --store "$W/s-bad" --bind tcp://127.0.0.1:0 --n_layer 3 --n_head 2 --n_embd 32 --seq_len 32 --vocab 256 \
      --fragments 4 --init_from "$W/m.bin" 2>&1); rc=$?
check "a shape mismatch names both shapes (rc $rc)" \
  sh -c "[ $rc = 2 ] && echo \"\$1\" | grep -q 'checkpoint is L=2 NH=2 C=32 V=256 T=32, this run is L=3 NH=2 C=32 V=256 T=32'" _ "$out"
out=$("$SYNC" --store "$W/s-bad" --bind tcp://127.0.0.1:0 $SYNC_MODEL --n_head 4 --init_from "$W/m.hf" 2>&1); rc=$?
check "an n_head mismatch (hf) is refused (rc $rc)" sh -c "[ $rc = 2 ] && echo \"\$1\" | grep -q 'this run is L=2 NH=4'" _ "$out"
check "a refused --init_from leaves no store behind" [ ! -e "$W/s-bad" ]
# a store without a run (what a synchronizer killed between creating its
# store and writing the run leaves): its databases and schema, nothing else
mkdir "$W/s-empty"
{ for db in fragments learners ledger merges outer params; do
    printf 'VERSION=3\nformat=print\ndatabase=%s\ntype=btree\nHEADER=END\nDATA=END\n' $db
  done
  printf 'VERSION=3\nformat=print\ndatabase=meta\ntype=btree\nHEADER=END\n schema\n DLSC\\04\\00\\00\\00\nDATA=END\n'
} | mdb_load "$W/s-empty" || die "mdb_load of an empty store failed"
out=$("$DLOCO" export "$W/s-empty" --format llmc "$W/x.bin" 2>&1); rc=$?
check "export of a store without a run is refused (rc $rc)" \
  sh -c "[ $rc = 2 ] && echo \"\$1\" | grep -q 'holds no run'" _ "$out"
# a damaged store is not exported: flip a byte of every copy of some of wpe's floats in data.mdb
cp -r "$W/s-llmc" "$W/s-damaged"
python3 - "$W/m.safetensors" "$W/s-damaged/data.mdb" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
b, e = json.loads(raw[8:8 + n])["wpe"]["data_offsets"]
needle = raw[8 + n + b:8 + n + b + 32]
db = bytearray(open(sys.argv[2], "rb").read())
hits, at = 0, db.find(needle)
while at >= 0:
    db[at + 5] ^= 0x40; hits += 1; at = db.find(needle, at + 1)
open(sys.argv[2], "wb").write(db)
print("damaged %d copies" % hits)
PY
out=$("$DLOCO" export "$W/s-damaged" --format llmc "$W/x.bin" 2>&1); rc=$?
check "export of a damaged store is refused (rc $rc): $out" \
  sh -c "[ $rc = 2 ] && echo \"\$1\" | grep -q 'fails dloco check'" _ "$out"
# hostile files through the synchronizer (the unit test test_import has the full list)
cp "$W/m.bin" "$W/nan.bin"
printf '\x00\x00\xc0\x7f' | dd of="$W/nan.bin" bs=1 seek=$((1024 + 4 * 1000)) conv=notrunc status=none
head -c -4 "$W/m.bin" > "$W/short.bin"
printf 'not a model at all' > "$W/junk.bin"
for h in nan:"is NaN" short:"implies exactly" junk:"header length"; do
  name=${h%%:*} want=${h#*:}
  out=$("$SYNC" --store "$W/s-$name" --bind tcp://127.0.0.1:0 $SYNC_MODEL --init_from "$W/$name.bin" 2>&1); rc=$?
  check "hostile $name.bin refused: $want (rc $rc)" sh -c "[ $rc = 2 ] && echo \"\$1\" | grep -q \"\$2\"" _ "$out" "$want"
done

# ---- a standalone learner from the export trains on from the same loss
STANDALONE="--standalone --device cpu $MODEL --data $W/corpus.txt --batch 8 --val_batches 4 --warmup 1 --threads 1"
for f in safetensors llmc hf; do
  case $f in safetensors) in=$W/m.safetensors ;; llmc) in=$W/m.bin ;; hf) in=$W/m.hf ;; esac
  : > "$W/events-sa-$f.log"
  "$LEARNER" $STANDALONE --steps 4 --stop_after 2 --init_from "$in" --checkpoint "$W/sa-$f.ckpt" \
    --events "$W/events-sa-$f.log" > "$W/sa-$f.log" 2>&1 || die "standalone --init_from $f failed"
  v=$(ev_last "$W/events-sa-$f.log" train_summary val_loss_start)
  d=$(awk -v a="$v" -v b="$L0" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.3g", d }')
  echo "learner --init_from $f: first eval $v, export $L0, diff $d"
  check "learner from the $f export starts at the export's loss (diff $d <= 1e-4)" \
    awk -v d="$d" 'BEGIN { exit !(d + 0 <= 1e-4) }'
  check "its init_from event names the file" ev_has "$W/events-sa-$f.log" init_from "path=$in"
done
: > "$W/events-sa-resume.log"
"$LEARNER" $STANDALONE --steps 4 --resume "$W/sa-hf.ckpt" --events "$W/events-sa-resume.log" > "$W/sa-resume.log" 2>&1
check "the --init_from learner's checkpoint resumes at step 2" ev_has "$W/events-sa-resume.log" resumed step=2
check "and the resumed run ends at step 4" ev_has "$W/events-sa-resume.log" train_summary step=4
out=$("$LEARNER" $STANDALONE --steps 4 --resume "$W/sa-hf.ckpt" --init_from "$W/m.hf" 2>&1); rc=$?
check "--init_from with --resume is refused (rc $rc)" sh -c "[ $rc = 2 ] && echo \"\$1\" | grep -q 'choose one'" _ "$out"
out=$("$LEARNER" --connect tcp://127.0.0.1:1 $MODEL --data "$W/corpus.txt" --init_from "$W/m.hf" 2>&1); rc=$?
check "--init_from on a networked learner is refused (rc $rc)" \
  sh -c "[ $rc = 2 ] && echo \"\$1\" | grep -q 'for --standalone runs'" _ "$out"
out=$("$LEARNER" $STANDALONE --steps 2 --n_embd 64 --init_from "$W/m.bin" 2>&1); rc=$?
check "a learner of another shape is refused, both shapes named (rc $rc)" \
  sh -c "[ $rc = 2 ] && echo \"\$1\" | grep -q 'checkpoint is L=2 NH=2 C=32 V=256 T=32, this run is L=2 NH=2 C=64'" _ "$out"

if [ $fail != 0 ]; then echo "test_export: FAILED"; exit 1; fi
if [ $torch_ok = 0 ]; then
  if [ "${CI:-}" = true ] || [ "${DLOCO_REQUIRE_TORCH:-0}" = 1 ]; then
    echo "FAIL: $PY has no torch (deploy/setup.sh --with-torch installs python3-torch); CI requires it"
    exit 1
  fi
  echo "SKIP: $PY has no torch (deploy/setup.sh --with-torch): the PyTorch checks of the exports did not run"
  exit 77
fi
echo "test_export: all checks passed"
exit 0
