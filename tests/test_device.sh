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

expect "unknown device" 2 "option device" $RUN --device tpu
expect "unknown matmul precision" 2 "option matmul" $RUN --matmul fp16
expect "--device cpu trains on the cpu" 0 "^device: cpu (--device cpu)" $RUN --device cpu
echo "$LAST" | grep -q "^summary: 3 steps" || { echo "FAIL: --device cpu did not train 3 steps"; fail=1; }
expect "--matmul on the cpu is ignored with a note" 0 "note: --matmul bf16 ignored on the cpu" $RUN --device cpu --matmul bf16
expect "--device auto trains" 0 "^device: " $RUN --device auto
auto_line=$(echo "$LAST" | grep -m1 "^device: ")
default_line=$("$BIN" $RUN 2>&1 | grep -m1 "^device: ")
[ "$default_line" = "$auto_line" ] && echo "ok: the default is auto ($default_line)" \
  || { echo "FAIL: default device line '$default_line' differs from auto's '$auto_line'"; fail=1; }

case "$auto_line" in
"device: cuda"*)
  echo "a usable CUDA device: auto chose it"
  expect "--device cuda trains on the GPU" 0 "^device: cuda: .*matmul tf32" $RUN --device cuda
  expect "--device cuda --matmul bf16" 0 "^device: cuda: .*matmul bf16" $RUN --device cuda --matmul bf16
  ;;
"device: cpu (--device auto: "*)
  reason=$(echo "$auto_line" | sed -E 's/^device: cpu \(--device auto: (.*)\)$/\1/')
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
*) echo "FAIL: unexpected device line '$auto_line'"; fail=1 ;;
esac

[ $fail = 0 ] && echo "test_device: all checks passed" || echo "test_device: FAILED"
exit $fail
