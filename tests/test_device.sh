#!/bin/bash
# dloco-learner --device / --matmul: a bad value exits 2 naming the option;
# --device cpu runs on the cpu; auto picks cuda only with a build that has
# CUDA and a usable device, else the cpu with the reason; --device cuda
# without one exits 2 with that reason, before loading data; --matmul on the
# cpu is ignored with a note. Runs on any machine: with a GPU it checks that
# auto and cuda run there instead.
set -u
BIN=${DLOCO_BIN:-build}/learner/dloco-learner
W=$(mktemp -d /tmp/dloco_device.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail=0
. "$(dirname "$0")/lib_events.sh"
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$W/corpus.txt"
RUN="--standalone --data $W/corpus.txt --n_layer 1 --n_embd 16 --n_head 2 --seq_len 16 --batch 2 --steps 3 --warmup 1 --val_batches 1 --log_every 1"

expect() { # description want-rc want-substring args...
  local d="$1" want_rc="$2" want="$3"; shift 3
  local out rc
  out=$("$BIN" "$@" 2>&1); rc=$?
  if [ "$rc" = "$want_rc" ] && echo "$out" | grep -q -- "$want"; then
    echo "ok: $d -> rc $rc: $(echo "$out" | grep -m1 -- "$want" | cut -c1-220)"
  else
    echo "FAIL: $d: rc $rc (want $want_rc), output lacks '$want':"; echo "$out" | tail -8; fail=1
  fi
  LAST="$out"
}
# expect_run description COND... -- args...: exit 0, and the run's device
# event (its --events file is $W/ev.log) matches every COND
expect_run() {
  local d="$1"; shift
  local conds=(); while [ $# -gt 0 ] && [ "$1" != -- ]; do conds+=("$1"); shift; done; shift
  : > "$W/ev.log"
  local out rc
  out=$("$BIN" "$@" --events "$W/ev.log" 2>&1); rc=$?
  if [ "$rc" = 0 ] && ev_has "$W/ev.log" device "${conds[@]}"; then
    echo "ok: $d -> $(ev_last "$W/ev.log" device "device matmul") ($(ev_last "$W/ev.log" device desc))"
  else
    echo "FAIL: $d: rc $rc, no device event with ${conds[*]}:"; cat "$W/ev.log"; echo "$out" | tail -5; fail=1
  fi
  LAST="$out"
}

expect "unknown device" 2 "option device" $RUN --device tpu
expect "unknown matmul precision" 2 "option matmul" $RUN --matmul fp16
# comms timeouts out of order are refused at start (networked mode; nothing listens on the endpoint)
NET="--connect tcp://127.0.0.1:9 --data $W/corpus.txt --steps 1"
expect "hello retry at the poll period" 2 "poll_max_ms < hello_retry_ms <= hello_retry_max_ms, got 20, 100, 100, 16000" $NET --hello_retry_ms 100
expect "hello retry above its cap" 2 "got 20, 2000, 100, 1000" $NET --hello_retry_ms 2000 --hello_retry_max_ms 1000
expect "silence at the poll period" 2 "poll_max_ms < silence_min_ms, got 500 < 400" $NET --poll_max_ms 500 --silence_min_ms 400
expect "reconnect backoff above the hello backoff" 2 "reconnect_max_ms <= hello_retry_max_ms, got 100, 20000, 1000, 16000" $NET --reconnect_max_ms 20000
expect "first reconnect after the first hello retry" 2 "reconnect_ms < hello_retry_ms, reconnect_max_ms <= hello_retry_max_ms, got 1500, 1000, 1000, 16000" $NET --reconnect_ms 1500
expect "connect timeout below the hello retry" 2 "hello_retry_ms < connect_timeout_ms, got 1000 < 500" $NET --connect_timeout_ms 500
# connect_timeout_ms 0 (the default) is no bound: Hello retries of any length are in order
expect "hello retries of 40 s under no connect bound" 0 "hello_retry_max_ms = 40000" $NET --hello_retry_ms 40000 --hello_retry_max_ms 40000 --print-config
expect "push decision before the ack expiry" 2 "ack_expiry_min_ms < push_decision_timeout_ms, got 5000 < 4000" $NET --push_decision_timeout_ms 4000
expect_run "--device cpu trains on the cpu" device=cpu matmul=fp32 "desc=cpu (--device cpu)" -- $RUN --device cpu
ev_has "$W/ev.log" train_summary steps=3 || { echo "FAIL: --device cpu did not train 3 steps"; fail=1; }
expect_run "--matmul on the cpu is ignored" device=cpu matmul=fp32 -- $RUN --device cpu --matmul bf16
echo "$LAST" | grep -q "note: --matmul bf16 ignored on the cpu" || { echo "FAIL: no note that --matmul is ignored on the cpu"; fail=1; }
expect_run "--device auto trains" -- $RUN --device auto
auto_desc=$(ev_last "$W/ev.log" device desc)
: > "$W/ev.log"; "$BIN" $RUN --events "$W/ev.log" > /dev/null 2>&1
default_desc=$(ev_last "$W/ev.log" device desc)
[ "$default_desc" = "$auto_desc" ] && echo "ok: the default is auto ($default_desc)" \
  || { echo "FAIL: default device '$default_desc' differs from auto's '$auto_desc'"; fail=1; }

case "$auto_desc" in
"cuda"*)
  echo "a usable CUDA device: auto chose it"
  expect_run "--device cuda trains on the GPU" "device~^cuda:0 " matmul=tf32 -- $RUN --device cuda
  expect_run "--device cuda --matmul bf16" "device~^cuda:0 " matmul=bf16 -- $RUN --device cuda --matmul bf16
  ;;
"cpu (--device auto: "*)
  reason=$(echo "$auto_desc" | sed -E 's/^cpu \(--device auto: (.*)\)$/\1/')
  case "$reason" in
  "no usable CUDA device"*|"this build has no CUDA"*) echo "ok: auto fell back to the cpu: $reason" ;;
  *) echo "FAIL: auto's reason is neither 'no usable CUDA device' nor 'this build has no CUDA': $reason"; fail=1 ;;
  esac
  want=$(echo "$reason" | cut -c1-21)
  # exits before loading data: a data path that does not exist is never read
  expect "--device cuda without a device, standalone" 2 "--device cuda: $want" $RUN --device cuda --data /nonexistent
  echo "$LAST" | grep -q "loading data" && { echo "FAIL: --device cuda loaded data before failing"; fail=1; }
  expect "--device cuda without a device, networked" 2 "--device cuda: $want" \
    --connect tcp://127.0.0.1:1 --id dev-test --data "$W/corpus.txt" --device cuda
  ;;
*) echo "FAIL: unexpected device '$auto_desc'"; fail=1 ;;
esac

[ $fail = 0 ] && echo "test_device: all checks passed" || echo "test_device: FAILED"
exit $fail
