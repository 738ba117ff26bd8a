#!/bin/bash
# Your own text with a real tokenizer, end to end: tools/make_shards.py trains
# a SentencePiece BPE vocabulary on a small corpus and writes llm.c shards
# whose tokens decode back to the text; a synchronizer (--eval_data the shards)
# and two learners train on them with the matching vocab and the loss falls;
# dloco eval uses the recorded shards; the HF export carries the tokenizer.
# Bad inputs are refused with the reason. Exit 77 (skip) without
# python3-sentencepiece; a failure with CI=true.
set -u
TEST_NAME=tokenizer
. "$(dirname "$0")/lib_cluster.sh"
PY=/usr/bin/python3
MS="$(dirname "$0")/../tools/make_shards.py"
if ! "$PY" -c 'import sentencepiece' 2>/dev/null; then
  [ "${CI:-}" = true ] && die "python3-sentencepiece is missing under CI (deploy/setup.sh installs it)"
  echo "SKIP: python3-sentencepiece is not installed (deploy/setup.sh installs it)"; exit 77
fi
# a small corpus of two files: varied words, so BPE has merges to learn
mkdir -p "$W/text"
for i in $(seq 1 1500); do
  echo "line $i: the quick brown fox jumps over the lazy dog number $((i * 7919 % 1000)); ünïcode $((i % 7))"
  [ $((i % 9)) = 0 ] && printf '\tan indented line %d with a tab\n\n' "$i"
done > "$W/text/a.txt"
for i in $(seq 1 1500); do echo "Another document, sentence $i, about $((i * 31 % 97)) red apples."; done > "$W/text/b.txt"
V=384
out=$("$PY" "$MS" "$W/text" --out "$W/shards" --vocab $V --shard_tokens 40000 2>&1); rc=$?
echo "$out"
check "make_shards.py exits 0" [ "$rc" = 0 ]
check "it wrote the tokenizer and several shards" \
  bash -c "[ -s '$W/shards/tokenizer.model' ] && [ \$(ls '$W/shards'/shard_*.bin | wc -l) -ge 2 ]"
# every shard: llm.c header, uint16 tokens < V; the tokens decode to the text exactly
check "the shards are llm.c shards of the vocab, and decode back to the text exactly" "$PY" - "$W/shards" "$W/text" $V <<'EOF'
import array, glob, os, sys
import sentencepiece as spm
d, text, V = sys.argv[1], sys.argv[2], int(sys.argv[3])
sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
assert sp.get_piece_size() == V, sp.get_piece_size()
toks = array.array("H")
for f in sorted(glob.glob(os.path.join(d, "shard_*.bin"))):
    raw = open(f, "rb").read()
    hdr = array.array("i", raw[:1024])
    assert hdr[0] == 20240520 and hdr[1] == 1 and len(raw) == 1024 + 2 * hdr[2], (f, hdr[:3])
    toks.frombytes(raw[1024:])
assert max(toks) < V
docs, cur = [], []
for t in toks:
    if t == sp.eos_id():
        docs.append(cur); cur = []
    else:
        cur.append(t)
want = [open(os.path.join(text, n), encoding="utf-8").read() for n in sorted(os.listdir(text))]
assert [sp.decode(x) for x in docs] == want, "decoded text differs"
print("%d tokens in %d documents decode to the text" % (len(toks), len(docs)))
EOF
# refusals: an output that already holds a tokenizer, a vocab out of range, no input
out=$("$PY" "$MS" "$W/text" --out "$W/shards" --vocab $V 2>&1); rc=$?
check "an --out that holds shards is refused, exit 2 ($rc)" bash -c "[ $rc = 2 ] && grep -q 'give an empty --out' <<< \"\$0\"" "$out"
out=$("$PY" "$MS" "$W/text" --out "$W/x" --vocab 70000 2>&1); rc=$?
check "--vocab 70000 is refused, exit 2 ($rc)" bash -c "[ $rc = 2 ] && grep -q 'uint16' <<< \"\$0\"" "$out"
out=$("$PY" "$MS" "$W/nothing" --out "$W/y" 2>&1); rc=$?
check "a missing input is refused, exit 2 ($rc)" bash -c "[ $rc = 2 ] && grep -q 'no such file' <<< \"\$0\"" "$out"

# a cluster on the shards, vocab V: the synchronizer evaluates on them
MODEL="--n_layer 2 --n_head 2 --n_embd 32 --seq_len 32 --vocab $V"
start_sync sync --vocab $V --eval_data "$W/shards" --eval_every_s 1 --eval_seqs 64 $OUTER
# the initial model's loss first: learners this small can finish before a periodic evaluation comes round
ev_wait 60 "$W/events-sync.log" eval version=0 || die "no evaluation of the initial model"
LP=()
for i in 0 1; do
  "$LEARNER" --connect "$EP" --id "l$i" --state_dir "$W" --device cpu $MODEL --data "$W/shards" --batch 8 --warmup 5 --lr 3e-3 \
    --steps 80 --data_shard $i --data_shards 2 --threads 1 --events "$W/events-l$i.log" > "$W/l$i.log" 2>&1 &
  LP+=($!); PIDS+=($!)
done
for i in 0 1; do
  wait_pid 240 "${LP[$i]}"; rc=$?
  check "learner l$i on the shards exits 0 ($rc)" [ "$rc" = 0 ]
done
check "the learners read the shards as tokens of vocab $V" grep -q "shards.*vocab $V" "$W/l0.log"
stop_sync
EV="$W/events-sync.log"
check "the final global model was evaluated on the shards" ev_has "$EV" eval final=1 data="$W/shards"
first=$(ev_field "$EV" eval loss | head -n 1); last=$(ev_last "$EV" eval loss final=1)
check "the global validation loss fell on the run's own data ($first -> $last)" \
  python3 -c "import sys; sys.exit(0 if $last < $first - 0.3 else 1)"
out=$("$DLOCO" eval "$W/store"); echo "$out"
check "dloco eval without --data evaluates on the recorded shards" grep -q "val loss [0-9.]* on $W/shards (the run's recorded" <<< "$out"

# the HF export carries the tokenizer
out=$("$DLOCO" export "$W/store" --format hf --tokenizer "$W/shards/tokenizer.model" "$W/hf/" 2>&1); rc=$? # OUT/ as a shell completes it
echo "$out"
check "dloco export --format hf --tokenizer exits 0 ($rc)" [ "$rc" = 0 ]
check "the export holds the tokenizer, byte for byte" cmp -s "$W/shards/tokenizer.model" "$W/hf/tokenizer.model"
check "... a tokenizer_config.json, and the model's vocab is the tokenizer's" "$PY" - "$W/hf" $V <<'EOF'
import json, os, sys
import sentencepiece as spm
d, V = sys.argv[1], int(sys.argv[2])
tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
cfg = json.load(open(os.path.join(d, "config.json")))
sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
assert tc["tokenizer_class"] == "LlamaTokenizer" and tc["eos_token"] == sp.id_to_piece(sp.eos_id()), tc
assert cfg["vocab_size"] == V == sp.get_piece_size(), (cfg["vocab_size"], sp.get_piece_size())
EOF
out=$("$DLOCO" export "$W/store" --format safetensors --tokenizer "$W/shards/tokenizer.model" "$W/m.safetensors" 2>&1); rc=$?
check "--tokenizer without --format hf is refused, exit 2 ($rc)" bash -c "[ $rc = 2 ] && grep -q 'goes with --format hf' <<< \"\$0\"" "$out"
out=$("$DLOCO" export "$W/store" --format hf --tokenizer "$W/text" "$W/hf2" 2>&1); rc=$?
check "a tokenizer that is not a file is refused, exit 2 ($rc)" bash -c "[ $rc = 2 ] && grep -q 'not a regular file' <<< \"\$0\"" "$out"
check "... before anything is written" [ ! -e "$W/hf2" ]

[ $fail = 0 ] && echo "test_tokenizer: all checks passed" || echo "test_tokenizer: FAILED"
exit $fail
