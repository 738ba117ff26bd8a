#!/bin/bash
# The operator command on real stores: `dloco records` starts with a header
# line naming its columns, then one line per contribution in those columns;
# `dloco eval` refuses data of another vocab than the store's (text is one
# token per byte: vocab 256; token shards must stay below the store's vocab)
# with a message naming both, and evaluates text of another vocab only when
# asked (--data_format text).
set -u
TEST_NAME=operator
. "$(dirname "$0")/lib_cluster.sh"
make_corpus

# records: a short run with merges
start_sync sync $OUTER
start_learner l0 --steps 24
wait_pid 120 "$LPID" || die "learner l0 failed"
stop_sync
"$DLOCO" records "$W/store" > "$W/records.txt"; rc=$?
check "records: exit 0" [ "$rc" = 0 ]
check "records: the first line is the header" \
  [ "$(head -1 "$W/records.txt")" = "fragment version learner decision staleness tokens weight epoch" ]
check "records: contributions follow" [ "$(tail -n +2 "$W/records.txt" | wc -l)" -gt 0 ]
check "records: every line has the header's 8 columns" \
  awk 'NF != 8 { exit 1 } NR > 1 && ($3 != "l0" || $8 !~ /^epoch=[0-9]+$/ || $1 !~ /^[0-9]+$/) { exit 1 }' "$W/records.txt"

# eval: a store of vocab 300 against text data (vocab 256)
rm -rf "$W/store"
start_sync v300 --vocab 300
stop_sync
"$DLOCO" eval "$W/store" --data "$W/corpus.txt" --batch 4 --val_batches 2 > "$W/eval-text.log" 2>&1; rc=$?
check "eval of text on a vocab-300 store: exit 2 (got $rc)" [ "$rc" = 2 ]
check "... naming the store's vocab and the data's" \
  grep -q "the store's model has vocab 300, but the data $W/corpus.txt is text (one token per byte: vocab 256)" "$W/eval-text.log"
"$DLOCO" eval "$W/store" --data "$W/corpus.txt" --data_format text --batch 4 --val_batches 2 > "$W/eval-asked.log" 2>&1; rc=$?
check "eval with --data_format text: exit 0 (got $rc)" [ "$rc" = 0 ]
check "... and a loss" grep -q "val loss [0-9]" "$W/eval-asked.log"
# an llm.c shard with tokens up to 999 (magic 20240520, version 1)
python3 -c "
import struct, sys
n = 4096
hdr = [20240520, 1, n] + [0] * 253
open(sys.argv[1], 'wb').write(struct.pack('<256i', *hdr) + struct.pack('<%dH' % n, *[(i * 7) % 1000 for i in range(n)]))
" "$W/tokens.bin"
"$DLOCO" eval "$W/store" --data "$W/tokens.bin" --batch 4 --val_batches 2 > "$W/eval-bin.log" 2>&1; rc=$?
check "eval of shards beyond the store's vocab: exit 2 (got $rc)" [ "$rc" = 2 ]
check "... naming the store's vocab" grep -q "the store's model has vocab 300, but the data $W/tokens.bin holds larger tokens" "$W/eval-bin.log"
# a .bin that is not a shard is refused, never read as text
head -c 5000 "$W/corpus.txt" > "$W/notashard.bin"
"$DLOCO" eval "$W/store" --data "$W/notashard.bin" --batch 4 --val_batches 2 > "$W/eval-bad.log" 2>&1; rc=$?
check "eval of a .bin with another magic: exit 2 (got $rc)" [ "$rc" = 2 ]
check "... not an llm.c token shard" grep -q "not an llm.c token shard" "$W/eval-bad.log"

[ $fail = 0 ] && echo "test_operator: all checks passed" || echo "test_operator: FAILED"
exit $fail
