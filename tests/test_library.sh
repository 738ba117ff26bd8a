#!/usr/bin/env bash
# libdloco_learner as another program sees it: `cmake --install` into a fresh prefix (library with its
# soname and only the API exported, header, pkg-config file, Python package), the C example
# (examples/c/learner.c) built with pkg-config alone, joining a real dloco-sync: its pushes are accepted
# and it adopts merged versions (its events); the same learner against a synchronizer of another model is
# refused at once (exit 1, a `refused` event), not retried. Then a learner of a model dloco has never seen
# (tests/api_any_model.c, a 4-dim tensor among others) on a manifest run (dloco-sync --init_from a
# safetensors file carrying the manifest): merged; one with a differing tensor is refused.
TEST_NAME=library
. "$(dirname "$0")/lib_cluster.sh"
SRC=${DLOCO_SRC:-.}
P=$W/prefix

cmake --install "$B" --prefix "$P" > "$W/install.log" 2>&1 || die "cmake --install failed"
lib=$(find "$P" -name 'libdloco_learner.so.*.*' | head -n 1)
pc=$(find "$P" -name dloco-learner.pc | head -n 1)
check "the library is installed" test -n "$lib"
check "the header is installed" test -f "$P/include/dloco/learner.h"
check "the pkg-config file is installed" test -n "$pc"
check "the Python package is installed" test -f "$P/lib/python3/dist-packages/dloco/__init__.py"
check "the soname is the API's major" quietly bash -c "readelf -d '$lib' | grep -q 'SONAME.*libdloco_learner.so.1\\]'"
others=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ && $3 !~ /^dloco_learner_/' | wc -l)
api=$(nm -D --defined-only "$lib" | awk '$3 ~ /^dloco_learner_/' | wc -l)
check "only the API is exported ($api dloco_learner_* symbols, $others others)" test "$others" -eq 0 -a "$api" -ge 20

export PKG_CONFIG_PATH=$(dirname "$pc")
cc -std=c11 -Wall -Wextra -Werror "$SRC/examples/c/learner.c" $(pkg-config --cflags --libs dloco-learner) -lm \
  -o "$W/c-learner" > "$W/cc.log" 2>&1 || die "the example does not build with pkg-config alone: $(cat "$W/cc.log")"
export LD_LIBRARY_PATH=$(dirname "$lib")

make_corpus
start_sync sync
printf 'events = %s\nflush_timeout_ms = 20000\n' "$W/events-c1.log" > "$W/c1.ini"
"$W/c-learner" "$EP" dloco c1 60 "$W/c1.ini" > "$W/c1.log" 2>&1 &
CPID=$!; PIDS+=("$CPID")
wait_pid 120 "$CPID"; rc=$?
check "the C learner ran to its end (exit $rc)" test "$rc" -eq 0
pushes=$(ev_count "$W/events-c1.log" push)
accepted=$(ev_count "$W/events-c1.log" ack decision=accepted)
adopted=$(ev_count "$W/events-c1.log" adopt mode=keep)
fetched=$(ev_count "$W/events-c1.log" adopt mode=rebase)
echo "C learner: $pushes pushes, $accepted accepted, $adopted merged versions adopted, $fetched fetched"
check "it fetched the whole model at join" test "$fetched" -ge 4
check "its pushes were accepted" test "$accepted" -ge 3
check "it adopted merged versions" test "$adopted" -ge 3
check "the synchronizer merged its pushes" test "$(ev_count "$W/events-sync.log" merge)" -ge 3
stop_sync

# another model: refused at once, no retry loop
rm -rf "$W/store"
MODEL="--n_layer 1 --n_head 2 --n_embd 32 --seq_len 32" start_sync other
printf 'events = %s\n' "$W/events-c2.log" > "$W/c2.ini"
"$W/c-learner" "$EP" dloco c2 10 "$W/c2.ini" > "$W/c2.log" 2>&1 &
CPID=$!; PIDS+=("$CPID")
wait_pid 60 "$CPID"; rc=$?
check "a learner of another model exits 1 (exit $rc)" test "$rc" -eq 1
check "it was refused by the synchronizer" ev_has "$W/events-c2.log" refused
check "and never fetched" test "$(ev_count "$W/events-c2.log" adopt)" -eq 0
stop_sync

# a model dloco has never seen: the init file (safetensors, the manifest in its metadata) and the learner
cc -std=c11 -Wall -Wextra -Werror "$SRC/tests/api_any_model.c" $(pkg-config --cflags --libs dloco-learner) \
  -o "$W/any-learner" > "$W/cc2.log" 2>&1 || die "api_any_model does not build: $(cat "$W/cc2.log")"
/usr/bin/python3 - "$W/init.safetensors" <<'PY' || die "cannot write the init file"
import json, struct, sys
import numpy as np
tensors = [("conv.weight", [8, 3, 3, 3], "matrix"), ("tok.embedding", [100, 16], "embedding"),
           ("norm.weight", [16], "vector")]
manifest = {"dloco_manifest": 1, "tensors": [{"name": n, "shape": s, "role": r} for n, s, r in tensors]}
rng = np.random.default_rng(1)
header, blobs, off = {"__metadata__": {"dloco_manifest": json.dumps(manifest)}}, [], 0
for n, s, _ in tensors:
    a = (0.02 * rng.standard_normal(s)).astype("<f4")
    header[n] = {"dtype": "F32", "shape": s, "data_offsets": [off, off + a.nbytes]}
    blobs.append(a.tobytes()); off += a.nbytes
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
rm -rf "$W/store"
: > "$W/events-any.log"
"$SYNC" --store "$W/store" --bind tcp://127.0.0.1:0 --init_from "$W/init.safetensors" --fragments 3 --H 4 \
  --heartbeat_ms 200 --status_every_ms 0 --events "$W/events-any.log" > "$W/any.log" 2>&1 &
SPID=$!; PIDS+=("$SPID")
ev_wait 15 "$W/events-any.log" sync_start || die "dloco-sync did not start a manifest run"
EP=$(ev_last "$W/events-any.log" sync_start endpoint)
printf 'events = %s\nflush_timeout_ms = 20000\n' "$W/events-a1.log" > "$W/a1.ini"
"$W/any-learner" "$EP" a1 40 "$W/a1.ini" > "$W/a1.log" 2>&1 &
APID=$!; PIDS+=("$APID")
wait_pid 120 "$APID"; rc=$?
check "a learner of an unknown model ran (exit $rc)" test "$rc" -eq 0
check "its pushes were accepted" test "$(ev_count "$W/events-a1.log" ack decision=accepted)" -ge 3
check "it adopted merged versions" test "$(ev_count "$W/events-a1.log" adopt mode=keep)" -ge 3
printf 'events = %s\n' "$W/events-a2.log" > "$W/a2.ini"
"$W/any-learner" "$EP" a2 5 "$W/a2.ini" other > "$W/a2.log" 2>&1 &
APID=$!; PIDS+=("$APID")
wait_pid 60 "$APID"; rc=$?
check "a learner whose manifest differs exits 1 (exit $rc)" test "$rc" -eq 1
check "it was refused by the synchronizer" ev_has "$W/events-a2.log" refused
check "the refusal names the tensor" quietly grep -q "tok.embedding" "$W/a2.log"
stop_sync
exit $fail
