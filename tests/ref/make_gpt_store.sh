#!/bin/bash
# Makes tests/data/gpt_store_f0324b6/data.mdb: a GPT-2 run's store written by
# the build of commit f0324b6 (before manifests), for tests/test_store_compat.sh.
# Usage: tests/ref/make_gpt_store.sh BUILD_OF_F0324B6 OUT_DIR
# (BUILD_OF_F0324B6: a build directory of `git archive f0324b6`, with
# dloco-sync and dloco-learner built.) The store: L=1 NH=2 C=16 T=16 V=256,
# P=2, seed 1337, one learner l0 of 16 steps of batch 4 on a generated text,
# four merges (versions 2 2); fingerprint 7f4c39e750ad6391. Compacted with
# mdb_copy -c (an LMDB copy as the library writes it, without free pages).
set -eu
M=$1 OUT=$2
W=$(mktemp -d)
trap 'kill "$SP" 2>/dev/null; rm -rf "$W"' EXIT
for i in $(seq 1 400); do echo "line $i: the quick brown fox jumps over the lazy dog $((i*7919%1000))."; done > "$W/corpus.txt"
"$M/synchronizer/dloco-sync" --store "$W/store" --bind tcp://127.0.0.1:0 --n_layer 1 --n_head 2 --n_embd 16 \
  --seq_len 16 --vocab 256 --fragments 2 --H 4 --heartbeat_ms 200 --status_every_ms 0 --metrics off \
  --events "$W/ev.log" > "$W/sync.log" 2>&1 &
SP=$!
for _ in $(seq 1 100); do grep -q sync_start "$W/ev.log" 2>/dev/null && break; sleep 0.1; done
EP=$(grep sync_start "$W/ev.log" | sed 's/.*endpoint=\([^ ]*\).*/\1/')
"$M/learner/dloco-learner" --connect "$EP" --id l0 --device cpu --n_layer 1 --n_head 2 --n_embd 16 --seq_len 16 \
  --fragments 2 --data "$W/corpus.txt" --batch 4 --steps 16 --threads 1 --metrics off > "$W/l0.log" 2>&1
kill -TERM "$SP"
wait "$SP" || true
mkdir -p "$OUT"
rm -f "$OUT/data.mdb"
mdb_copy -c "$W/store" "$OUT"
"$M/tools/dloco" status "$OUT" | head -4
rm -f "$OUT/lock.mdb" "$OUT/dloco.lock" # made by opening it; only data.mdb is the fixture
