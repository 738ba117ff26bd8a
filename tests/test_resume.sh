#!/bin/bash
# Checkpoint resume is bit-exact: 20 straight steps and 10 + resume + 10 give
# the same per-step losses (hex floats) and byte-identical final checkpoints.
# Also: bad config values and flags are refused with a message naming them.
set -u
BIN=${DLOCO_BIN:-build}/learner/dloco-learner
W=$(mktemp -d /tmp/dloco_resume.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
. "$(dirname "$0")/lib_events.sh"
# a small text corpus made here, so the test does not depend on fortunes
for i in $(seq 1 400); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$W/corpus.txt"
COMMON="--standalone --device cpu --data $W/corpus.txt --n_layer 2 --n_embd 32 --n_head 2 --seq_len 32 --batch 4 --steps 20 --warmup 3 --val_every 5 --val_batches 2 --log_every 5"

"$BIN" $COMMON --checkpoint "$W/a.ckpt" --loss_log "$W/a.log" > "$W/a.out" 2>&1 || { echo "FAIL: straight run"; cat "$W/a.out"; exit 1; }
"$BIN" $COMMON --checkpoint "$W/b.ckpt" --loss_log "$W/b.log" --stop_after 10 --events "$W/events-b1.log" > "$W/b1.out" 2>&1 || { echo "FAIL: first half"; cat "$W/b1.out"; exit 1; }
ev_has "$W/events-b1.log" checkpoint step=10 path="$W/b.ckpt" || { echo "FAIL: first half did not stop at step 10"; cat "$W/events-b1.log"; fail=1; }
"$BIN" $COMMON --checkpoint "$W/b.ckpt" --loss_log "$W/b.log" --resume "$W/b.ckpt" --events "$W/events-b2.log" > "$W/b2.out" 2>&1 || { echo "FAIL: resumed half"; cat "$W/b2.out"; exit 1; }
ev_has "$W/events-b2.log" resumed step=10 || { echo "FAIL: resume not reported"; fail=1; }
ev_has "$W/events-b2.log" train_summary steps=10 step=20 || { echo "FAIL: the resumed half did not train steps 11..20"; fail=1; }

if [ "$(wc -l < "$W/a.log")" != 20 ] || [ "$(wc -l < "$W/b.log")" != 20 ]; then
  echo "FAIL: expected 20 loss lines each"; fail=1
fi
if cmp -s "$W/a.log" "$W/b.log"; then
  echo "ok: 20 per-step losses identical bit for bit (hex floats), e.g. step 20: $(tail -1 "$W/a.log")"
else
  echo "FAIL: losses differ after resume"; diff "$W/a.log" "$W/b.log" | head; fail=1
fi
if cmp -s "$W/a.ckpt" "$W/b.ckpt"; then
  echo "ok: final checkpoints byte-identical ($(stat -c %s "$W/a.ckpt") bytes: params, AdamW moments, step, data position)"
else
  echo "FAIL: final checkpoints differ"; fail=1
fi
# the loss must have fallen, or the comparison above proves little
first=$(head -1 "$W/a.log" | awk '{print $2}'); last=$(tail -1 "$W/a.log" | awk '{print $2}')
python3 -c "import sys; a=float.fromhex('$first'); b=float.fromhex('$last'); print('loss %.4f -> %.4f' % (a, b)); sys.exit(0 if b < a - 0.5 else 1)" || { echo "FAIL: loss did not fall"; fail=1; }

# a damaged checkpoint is refused, not loaded
cp "$W/a.ckpt" "$W/bad.ckpt"; printf 'XXXX' | dd of="$W/bad.ckpt" bs=1 seek=2000 conv=notrunc 2>/dev/null
out=$("$BIN" $COMMON --resume "$W/bad.ckpt" 2>&1); rc=$?
if [ $rc = 2 ] && echo "$out" | grep -q "checksum mismatch"; then echo "ok: damaged checkpoint -> $(echo "$out" | tail -1)"; else echo "FAIL: damaged checkpoint rc=$rc: $out"; fail=1; fi
out=$("$BIN" $COMMON --n_embd 64 --resume "$W/a.ckpt" 2>&1); rc=$?
if [ $rc = 2 ] && echo "$out" | grep -q "mismatch"; then echo "ok: other model's checkpoint -> $(echo "$out" | tail -1)"; else echo "FAIL: mismatched checkpoint rc=$rc: $out"; fail=1; fi

# bad configuration: each gets exit 2 and names the problem
check_bad() { # expected-substring args...
  local want="$1"; shift
  local out rc
  out=$("$BIN" "$@" 2>&1); rc=$?
  if [ $rc = 2 ] && echo "$out" | grep -q -- "$want"; then echo "ok: $* -> $(echo "$out" | tail -1)";
  else echo "FAIL: '$*' gave rc=$rc: $out"; fail=1; fi
}
check_bad "option lr: -1 out of range" --standalone --lr -1
check_bad "unknown option '--bogus'" --standalone --bogus 3
check_bad "option steps: 'ten' is not an integer" --standalone --steps ten
check_bad "is not a multiple of n_head" --standalone --data "$W/corpus.txt" --n_embd 30 --n_head 4
check_bad "data path /nonexistent" --standalone --data /nonexistent
printf 'steps = 5\n[model\n' > "$W/bad.ini"
check_bad "bad.ini:2: malformed section header" --standalone --config "$W/bad.ini"
printf 'lr = 2e-3\nwarmup = abc\n' > "$W/bad2.ini"
check_bad "bad2.ini:2: option warmup: 'abc' is not an integer" --standalone --config "$W/bad2.ini"
check_bad "adam_fleet needs an even batch" $COMMON --adam_fleet 8 --batch 3
check_bad "adam_fleet 0.5: 0 (off) or a batch multiple" $COMMON --adam_fleet 0.5
check_bad "resume it with --optimizer adamw" $COMMON --adam_fleet 8 --resume "$W/a.ckpt"
# the model options are one set of rows (core/model.h): dloco-sync refuses a
# bad value with the same bounds error as the learner
SYNC=${DLOCO_BIN:-build}/synchronizer/dloco-sync
check_both() { # expected-substring args...
  local want="$1"; shift
  check_bad "$want" --standalone --data "$W/corpus.txt" "$@"
  local out rc
  out=$("$SYNC" --store "$W/sync-store" "$@" 2>&1); rc=$?
  if [ $rc = 2 ] && echo "$out" | grep -q -- "$want"; then echo "ok: dloco-sync $* -> $(echo "$out" | tail -1)";
  else echo "FAIL: 'dloco-sync $*' gave rc=$rc: $out"; fail=1; fi
}
check_both "option n_embd: 4 out of range \[8, 16384\]" --n_embd 4
check_both "option n_head: 300 out of range \[1, 256\]" --n_head 300
check_both "option fragments: 5000 out of range \[1, 4096\]" --fragments 5000
check_both "option vocab: 1 out of range \[2, 16777216\]" --vocab 1
[ -e "$W/sync-store" ] && { echo "FAIL: a refused dloco-sync config created its store"; fail=1; }
# adam_fleet trains: the run finishes and its validation loss falls
out=$("$BIN" $COMMON --adam_fleet 8 --events "$W/events-fleet.log" 2>&1); rc=$?
v=$(ev_last "$W/events-fleet.log" train_summary "val_loss_start val_loss")
if [ $rc = 0 ] && [ -n "$v" ] && python3 -c "import sys; a, b = map(float, '$v'.split()); sys.exit(0 if b < a else 1)"; then
  echo "ok: --adam_fleet 8 trains (val loss $v)"; else echo "FAIL: --adam_fleet 8 rc=$rc: $(echo "$out" | tail -3)"; fail=1; fi
# --stop_after between evaluations: the summary's loss is the final model's,
# not the one before training (val_every 5, stop at 7), and names the data
out=$("$BIN" $COMMON --stop_after 7 --events "$W/events-s7.log" 2>&1); rc=$?
v=$(ev_last "$W/events-s7.log" train_summary "val_loss_start val_loss")
if [ $rc = 0 ] && [ -n "$v" ] && python3 -c "import sys; a, b = map(float, '$v'.split()); sys.exit(0 if b < a else 1)" \
   && echo "$out" | grep -q "^summary: .*val loss on $W/corpus.txt "; then
  echo "ok: --stop_after 7: the summary evaluates the final model (val loss $v) and names the data"
else echo "FAIL: --stop_after 7 rc=$rc, val loss $v: $(echo "$out" | tail -1)"; fail=1; fi
# networked mode (the default): a bad learner id, and no synchronizer to answer
check_bad "option id: 'bad id'" --data "$W/corpus.txt" --id "bad id"
check_bad "joining the synchronizer at tcp://127.0.0.1:9: .*no Welcome from" --data "$W/corpus.txt" --n_layer 1 --n_embd 16 --n_head 2 \
  --seq_len 16 --connect tcp://127.0.0.1:9 --connect_timeout_ms 1500

[ $fail = 0 ] && echo "test_resume: all checks passed" || echo "test_resume: FAILED"
exit $fail
