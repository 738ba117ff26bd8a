# Shared helpers of the cluster tests (sourced): start/stop dloco-sync and
# learners by PID, bounded waits, store and event-log queries. Every process a
# test starts is recorded in PIDS and killed by PID on exit; nothing else is
# touched. Assertions read the event logs (docs/EVENTS.md), never the human
# log lines, which may change freely.
# `tests/test_X.sh --help` prints the test's header comment and starts nothing
. "$(dirname "${BASH_SOURCE[0]}")/lib_args.sh"
case "${1:-}" in -h | --help) dl_usage; exit 0 ;; esac
B=${DLOCO_BIN:-build}
SYNC=$B/synchronizer/dloco-sync LEARNER=$B/learner/dloco-learner DLOCO=$B/tools/dloco
W=$(mktemp -d /tmp/dloco_${TEST_NAME:-cluster}.XXXXXX)
PIDS=()
fail=0
. "$(dirname "${BASH_SOURCE[0]}")/lib_events.sh"
cleanup() { for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done; [ -n "${KEEP_W:-}" ] || rm -rf "$W"; }
trap cleanup EXIT
die() { echo "FAIL: $*"; for f in "$W"/*.log; do echo "== $f"; tail -15 "$f"; done; exit 1; }
check() { # description command...
  local d="$1"; shift
  if "$@"; then echo "ok: $d"; else echo "FAIL: $d"; fail=1; fi
}
quietly() { "$@" > /dev/null 2>&1; }  # run a check's command without its output
# kill_at_saved_file PID EVENTS FILE: SIGKILL a learner at a moment its recovery FILE is the one its last
# recovery_saved event in EVENTS names. Its writer renames the file, then writes the event, so a kill between
# the two leaves the event one file behind; the learner is frozen, its file's step (the header's int64 at byte
# 40, gpt/ckpt.c) read, and it runs on to that file's event when they differ.
recovery_file_step() { od -An -t d8 -j 40 -N 8 "$1" | tr -d ' '; }
kill_at_saved_file() {
  local pid=$1 ev=$2 file=$3 f try
  for try in $(seq 100); do
    kill -STOP "$pid"
    f=$(recovery_file_step "$file")
    [ "$f" = "$(ev_last "$ev" recovery_saved step)" ] && { kill -KILL "$pid"; wait "$pid" 2>/dev/null; return 0; }
    kill -CONT "$pid"
    ev_wait 10 "$ev" recovery_saved "step=$f" || die "the recovery file is at step $f and no event names it"
  done
  die "the recovery file never matched its last recovery_saved event"
}
make_corpus() { for i in $(seq 1 3000); do echo "line $i: the quick brown fox jumps over the lazy dog number $((i * 7919 % 1000))."; done > "$W/corpus.txt"; }
MODEL="--n_layer 2 --n_head 2 --n_embd 32 --seq_len 32"
# Outer step of the tests that check the loss falls: the local-SGD settings
# (dloco-sync's default, and deploy/cluster.ini's), said here so a change of
# the default does not change the tests. DiLoCo's Nesterov 0.7/0.9 is meant
# for long periods after a warm start; at H=8 it amplifies each averaged
# delta ~7x and the tiny test model sometimes diverges.
OUTER="--outer_lr 1.0 --outer_momentum 0"
# Chunked transfers (docs/PROTOCOL.md): the test model's fragments are tens
# of KiB, so the synchronizer's chunks are the protocol's smallest (4 KiB)
# and every Update and Push travels in several chunks, as at GPT-2 size; a
# learner's push chunks grow on loopback to PUSH_CHUNK_MAX_KB (8: resized
# once, still several per push; CHUNK_KB: fixed).
CHUNK_KB=${CHUNK_KB:-4}
PUSH_CHUNK_MAX_KB=${PUSH_CHUNK_MAX_KB:-8}

# need_netns: SKIP (exit 77) unless root with tc (network namespaces, tbf links); sets CHAOS (dloco-chaos)
need_netns() {
  [ "$(id -u)" = 0 ] || { echo "SKIP: needs root for network namespaces and tc"; exit 77; }
  command -v tc > /dev/null || { echo "SKIP: no tc"; exit 77; }
  CHAOS=$B/chaos/dloco-chaos
  [ -x "$CHAOS" ] || die "no $CHAOS"
}
# start_sync LOGNAME [extra args...]: binds $BIND (default: a free loopback
# port); sets SPID and EP; events go to $W/events-LOGNAME.log. $SYNC_WRAP (words, e.g.
# `fiu-run -x -f PREFIX`) runs before the program and must exec it (SPID stays its pid)
start_sync() {
  local log=$1; shift
  : > "$W/events-$log.log" # a fresh file, like the log: the endpoint below is this start's
  ${SYNC_WRAP:-} "$SYNC" --store "$W/store" --bind "${BIND:-tcp://127.0.0.1:0}" $MODEL --vocab 256 --fragments 4 --H 8 --heartbeat_ms 200 \
    --status_every_ms 0 --chunk_kb "$CHUNK_KB" --push_chunk_max_kb "$PUSH_CHUNK_MAX_KB" \
    --events "$W/events-$log.log" "$@" > "$W/$log.log" 2>&1 &
  SPID=$!; PIDS+=("$SPID")
  EP=""
  for _ in $(seq 1 150); do
    EP=$(ev_last "$W/events-$log.log" sync_start endpoint)
    [ -n "$EP" ] && return 0
    kill -0 "$SPID" 2>/dev/null || die "dloco-sync exited at start ($log)"
    sleep 0.1
  done
  die "dloco-sync did not start ($log)"
}
stop_sync() {
  kill -TERM "$SPID" 2>/dev/null
  for _ in $(seq 1 150); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$SPID" 2>/dev/null && die "dloco-sync did not stop on SIGTERM"
  wait "$SPID" 2>/dev/null
}
# start_learner NAME [extra args...]: sets LPID; events go to $W/events-NAME.log
start_learner() {
  local name=$1; shift
  : > "$W/events-$name.log"
  "$LEARNER" --connect "$EP" --id "$name" --device cpu $MODEL --data "$W/corpus.txt" --batch 8 --warmup 5 --lr 3e-3 \
    --fragments 4 --threads 1 --log_every 50 --events "$W/events-$name.log" --loss_log "$W/loss-$name.txt" \
    --state_dir "$W/state" "$@" \
    > "$W/$name.log" 2>&1 &
  LPID=$!; PIDS+=("$LPID")
}
wait_pid() { # deadline-seconds pid -> returns its exit code
  local deadline=$(( $(date +%s) + $1 ))
  while kill -0 "$2" 2>/dev/null; do [ "$(date +%s)" -lt "$deadline" ] || die "process $2 still running after $1 s"; sleep 0.1; done
  wait "$2"
}
# jq_py EXPR: EXPR evaluated over the JSON document on stdin as `d` (Debian's python3; empty on no document)
jq_py() { /usr/bin/python3 -c "import json, sys
t = sys.stdin.read()
if t.strip(): print(eval(sys.argv[1], {'d': json.loads(t)}))" "$1" 2>/dev/null; }
# the store's fragment versions (space-separated), merges (committed fragment versions), global val loss:
# from `dloco status --json` and `dloco eval --json` (docs/OPERATING.md), never the text lines
versions() { "$DLOCO" status "$W/store" --json 2>/dev/null | jq_py "' '.join(str(f['version']) for f in d['fragments'])"; }
merges() { "$DLOCO" status "$W/store" --json 2>/dev/null | jq_py "d['merges']"; }
val_loss() { "$DLOCO" eval "$W/store" --data "$W/corpus.txt" --batch 8 --val_batches 8 --json | jq_py "d['val_loss']"; }
steps_of() { [ -f "$W/loss-$1.txt" ] && wc -l < "$W/loss-$1.txt" || echo 0; }
# wait_until SECONDS 'shell condition' -> 0 when it became true
wait_until() { local deadline=$(( $(date +%s) + $1 )); while ! eval "$2"; do [ "$(date +%s)" -lt "$deadline" ] || return 1; sleep 0.2; done; }
# json EXPR: EXPR evaluated over the swarm's JSON summary $W/swarm.json as `s` (bench/swarm --json)
json() { /usr/bin/python3 -c "import json, sys; print(eval(sys.argv[1], {'s': json.load(open(sys.argv[2]))}))" "$1" "$W/swarm.json"; }
