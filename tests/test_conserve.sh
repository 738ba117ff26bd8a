#!/bin/bash
# Progress conservation (issue 27): no trained step is lost or counted twice.
# Three learners whose "training" adds a known, per-learner amount to every
# parameter each step (tests/conserve.c: `conserve learn`) run against a real
# dloco-sync whose outer step is the plain weighted mean (outer lr 1, momentum
# 0, merge mean, aggregate weighted, staleness const, share scaling off: the
# global model is then an exact function of which steps were applied), under
# fates drawn from a seed: adopt keep / overwrite / mix, quorum 1 or 3, fp32
# or int4 pushes with error feedback, a tiny pool (busy refusals), a tight
# max_staleness (drops and rebases), a short push_decision_timeout (held
# pushes released: a learner's second push while its first is pooled), a
# learner SIGKILLed right after one of its saves and restarted under its id
# from its saved state (every learner saves its parameters and node state,
# error feedback residuals included, every 10 steps: conserve --state,
# learner/node.h "the node's state across a restart"), the synchronizer
# SIGKILLed and restarted on its store. At the end, for each seed:
#   (a) every step each learner trained is in exactly one ledger state: for
#       every learner that finished its flush, fragment-tokens trained =
#       APPLIED (the store's merge records) + DROPPED_STALE (the synchronizers'
#       push events) + what it discarded itself + what it left unpushed (its
#       own counters; the ledger's LOST); for a killed and restarted one (one
#       id, two processes) the same sum over both processes leaves a rest,
#       LOST AT THE KILL: what the killed process trained after its last save,
#       and what the restart cannot carry because it was not its own to carry
#       (a fragment pushed after the save: that push took its progress; keep:
#       a push undecided at the save and refused after it; overwrite / mix:
#       a fragment pushed since its adopt, what it trained since that push:
#       more than H steps when the hold rule held its next push; the learner
#       logs the tokens its node held at each save, which bound all these);
#       the test asserts 0 <= rest <= that bound (when no hold was released);
#       the store's ledger has nothing REJECTED (no push here
#       is refused with rebase), its states never sum above what the learners
#       trained (exactly that without kills or hold releases), and `dloco
#       check` passes. Two fates are exact only up to the pushes in flight:
#       a synchronizer SIGKILL (a pooled push forgotten though its merge was
#       committed is made again; at most one push per fragment) and a hold
#       released by push_decision_timeout_ms (the undecided push merges after
#       all: at most one push per release); the test bounds those by the
#       learner's largest push;
#   (b) the global model moved by exactly the steps the merge records call
#       applied: `conserve check` replays them against the seeded init (fp32:
#       to 1e-4 of the shift; int4 + error feedback: to 1/7 of it, a quantum
#       of each push, which is what the residuals still hold and what moves
#       between merge weights; adopt mix keeps alpha of progress it counts
#       discarded, so (b) is not checked under mix, nor for int4 pushes
#       across a synchronizer crash, whose lost pushes' residuals move).
# A restarted learner ends out of phase with the others: at quorum 3 their
# last rounds must not wait for it once it is in its final flush
# (synchronizer/policy.h dl_policy_learner_final), or every flush runs into
# its timeout. An int4 restart checks that its saved state held its residuals.
# Usage: tests/test_conserve.sh [SEEDS]   (default: the CI seeds "1 2 5 7 10": 10 is an int4 restart;
#        e.g. "$(seq 1 40)" for a longer soak). Bounded: every wait has a
#        deadline; only our own PIDs are killed.
set -u
TEST_NAME=conserve
. "$(dirname "$0")/lib_cluster.sh"
CONSERVE=$B/bench/conserve
[ -x "$CONSERVE" ] || die "$CONSERVE not built"
SEEDS=${1:-1 2 5 7 10}
P=4
# about 400 KiB per fragment. The three learners push the same fragment at
# the same steps (the schedule's offsets are the fleet's), so a tiny pool of
# 1 MiB (two pushes) refuses one of them busy nearly every time at quorum 1;
# at quorum 3 the tiny pool is 4 MiB (ten pushes): a pool that cannot hold a
# round of three for some fragment, (K - 1) x P + 1 pushes, deadlocks a
# decoupled run (every fragment short of its quorum, every push busy)
MODEL="--n_layer 2 --n_head 2 --n_embd 128 --seq_len 8"
LMODEL="--n_layer 2 --n_head 2 --n_embd 128 --seq_len 8 --vocab 64 --fragments $P"
STEPS=80 RATE=40 BATCH=2

# tokens field of the last line of a learner's log that has one
last_field() { sed -n "s/.* $2=\([0-9-]*\).*/\1/p; s/^$2=\([0-9-]*\).*/\1/p" "$1" | tail -1; }

run_seed() {
  local seed=$1
  RANDOM=$seed
  local adopts=(keep overwrite mix) codecs=(fp32 int4)
  local adopt=${adopts[$((RANDOM % 3))]} quorum=$(( RANDOM % 2 ? 3 : 1 )) codec=${codecs[$((RANDOM % 2))]}
  local pool=$(( RANDOM % 2 ? (quorum == 1 ? 1 : 4) : 0 )) stale=$(( RANDOM % 3 ? 8 : 1 )) hold=$(( RANDOM % 2 ? 400 : 0 ))
  local kill_learner=$(( RANDOM % 2 )) kill_sync=$(( RANDOM % 3 == 0 ? 1 : 0 ))
  # a synchronizer killed after a drop loses the drop's record (written with the
  # fragment's next merge): keep drops out of those runs so (a) stays exact
  [ "$kill_sync" = 1 ] && stale=8
  echo "== seed $seed: adopt=$adopt quorum=$quorum push=$codec pool_mb=$pool max_staleness=$stale" \
       "hold_ms=$hold kill_learner=$kill_learner kill_sync=$kill_sync"
  rm -rf "$W/store" "$W"/c-*.log "$W"/state-*
  local SYNCARGS=(--vocab 64 --H 4 --quorum "$quorum" --max_staleness "$stale" --pool_mb "$pool"
    --outer_lr 1 --outer_momentum 0 --merge mean --aggregate weighted --staleness const --share_scaling false
    --norm_k 0 --norm_param_ratio 0 --param_abs_max 0 --heartbeat_ms 100 --durability sync --metrics off
    --update_codec off) # (b) replays fp32 outer steps: an int4 downlink's residual would be in none of them
  BIND=tcp://127.0.0.1:0 start_sync "sync-$seed" "${SYNCARGS[@]}"
  local port=${EP##*:}
  local ids=() amounts=() pids=() killed=()
  start_one() { # name amount [log suffix]: every learner saves its state every 10 steps (--state)
    "$CONSERVE" learn --endpoint "$EP" --id "$1" --log "$W/c-$1${3:-}.log" $LMODEL --steps $STEPS --rate $RATE \
      --batch $BATCH --amount "$2" --adopt "$adopt" --push_codec "$codec" --hold_ms "$hold" --flush_ms 20000 \
      --events "$W/events-$1${3:-}.log" --state "$W/state-$1" --save_every 10 \
      > "$W/$1${3:-}.out" 2>&1 &
    PIDS+=($!); pids+=($!); ids+=("$1${3:-}"); amounts+=("$2"); killed+=(0)
  }
  # per-learner amounts: distinct powers of two over 1024, so sums stay exact in fp32
  start_one "s$seed-a" 0.0009765625
  start_one "s$seed-b" 0.001953125
  start_one "s$seed-c" 0.00390625
  if [ "$kill_learner" = 1 ]; then
    # right after a save (at or past a drawn step): the fragments not pushed since carry their progress
    # and residuals into the restart
    local at=$(( 10 + RANDOM % 40 ))
    local deadline=$(( $(date +%s) + 60 )) # polled closely (a step is 25 ms): the kill lands a step or two after
    until [ "$(sed -n 's/^saved step=\([0-9]*\).*/\1/p' "$W/c-s$seed-b.log" 2>/dev/null | tail -1)" -ge "$at" ] 2>/dev/null; do
      [ "$(date +%s)" -lt "$deadline" ] || die "learner b made no progress"
      sleep 0.01
    done
    kill -KILL "${pids[1]}"; wait "${pids[1]}" 2>/dev/null; killed[1]=1
    echo "   learner s$seed-b killed at step $(last_field "$W/c-s$seed-b.log" step); restarted from its state"
    start_one "s$seed-b" 0.001953125 -r
  fi
  if [ "$kill_sync" = 1 ]; then
    local at=$(( 20 + RANDOM % 30 ))
    wait_until 60 "[ \"\$(last_field $W/c-s$seed-a.log step 2>/dev/null || echo 0)\" -ge $at ] 2>/dev/null" \
      || die "learner a made no progress"
    kill -KILL "$SPID"; wait "$SPID" 2>/dev/null
    echo "   synchronizer killed at step $at of learner a; restarted on its store"
    BIND=tcp://127.0.0.1:$port start_sync "sync-$seed-2" "${SYNCARGS[@]}"
  fi
  for i in "${!pids[@]}"; do [ "${killed[$i]}" = 1 ] || wait_pid 90 "${pids[$i]}" > /dev/null; done
  stop_sync

  # (a) the ledger
  "$DLOCO" records "$W/store" > "$W/records-$seed.txt" 2>&1 || die "dloco records failed"
  check "seed $seed: dloco check passes" quietly "$DLOCO" check "$W/store"
  "$DLOCO" status "$W/store" --json > "$W/status-$seed.json" || die "dloco status failed"
  local total_trained=0
  for i in "${!ids[@]}"; do
    local id=${ids[$i]} log="$W/c-${ids[$i]}.log"
    [ "${id%-r}" != "$id" ] && continue # a restarted process: accounted with the one it replaced
    if [ "${killed[$i]}" = 1 ] && [ -f "$W/c-$id-r.log" ]; then
      # the killed process and its restart, one id: every step either in a ledger state or lost at the kill
      # (trained after the last save, or after a push since it: the restart does not carry it), which is
      # at most the steps after the last save
      local rlog="$W/c-$id-r.log" tk tr dk dr ur sk ss lost bound applied dropped
      tk=$(( $(last_field "$log" tokens) * P )); tr=$(( $(last_field "$rlog" tokens) * P ))
      dk=$(last_field "$log" discarded); dr=$(last_field "$rlog" discarded); ur=$(last_field "$rlog" unpushed)
      sk=$(last_field "$log" step); ss=$(sed -n 's/^saved step=\([0-9]*\).*/\1/p' "$log" | tail -1)
      # what the node held at that save and the restart did not carry (a fragment pushed since its adopt
      # under overwrite / mix, or since the save: that push took its progress; keep: a push undecided at
      # the save, left to the synchronizer). Held pushes make that more than H steps of a fragment.
      local held carried uncarried
      held=$(sed -n 's/^saved step=[0-9]* held=\([0-9]*\).*/\1/p' "$log" | tail -1)
      carried=$(sed -n 's/^restored .* carried=\([0-9]*\).*/\1/p' "$rlog" | head -1)
      uncarried=$(( ${held:-0} - ${carried:-0} )); [ "$uncarried" -ge 0 ] || uncarried=0
      applied=$(awk -v id="$id" '$3 == id && $4 == "merged" { s += $6 } END { print s + 0 }' "$W/records-$seed.txt")
      dropped=$(cat "$W"/events-sync-"$seed".log "$W"/events-sync-"$seed"-2.log 2>/dev/null \
        | ev_field - push tokens id="$id" decision=dropped_stale | awk '{ s += $1 } END { print s + 0 }')
      lost=$(( tk + tr - applied - dropped - ${dk:-0} - ${dr:-0} - ${ur:-0} ))
      # plus what the restart did not carry of what the node held at the save (above), the pushes returned
      # to the killed process, one pooled push per fragment of the killed process that a push of the restarted one
      # replaced in the pool (the restart's push does not hold it), and the restarted process's pushes
      # refused with a rebase (a replay of a base the killed process's push merged: REJECTED)
      local ret maxpush rej
      ret=$(ev_field "$W/events-$id.log" push_returned tokens | awk '{ s += $1 } END { print s + 0 }')
      maxpush=$(cat "$W"/events-sync-"$seed"*.log | ev_field - push tokens id="$id" | sort -n | tail -1)
      rej=$(cat "$W"/events-sync-"$seed"*.log | ev_field - push tokens id="$id" decision=rejected \
        | awk '{ s += $1 } END { print s + 0 }')
      bound=$(( (sk - ${ss:-0}) * BATCH * 8 * P + uncarried + ret + ${maxpush:-0} * P + rej ))
      total_trained=$(( total_trained + tk + tr ))
      # a kill that came 10 steps late, between the next save's node state and parameters, is refused (a
      # node state newer than the parameters): nothing carried, which the bound below allows
      if [ "$sk" -lt $(( ${ss:-0} + 10 )) ]; then
        check "seed $seed: $id restored its saved state (format 2)" grep -q "^restored step=$ss rc=0 .* format=2 " "$rlog"
      fi
      if [ "$codec" = int4 ] && grep -q "^restored step=$ss rc=0 " "$rlog"; then
        # the state held the residuals of its int4 pushes (restored where the journal agrees, else dropped)
        local rres rdrop
        rres=$(sed -n 's/^restored .* residuals=\([0-9]*\) .*/\1/p' "$rlog" | head -1)
        rdrop=$(sed -n 's/^restored .* residuals_dropped=\([0-9]*\).*/\1/p' "$rlog" | head -1)
        check "seed $seed: $id's saved state held its error feedback residuals ($rres restored, $rdrop dropped)" \
          [ $(( ${rres:-0} + ${rdrop:-0} )) -ge 1 ]
      fi
      echo "   $id: trained $tk (killed at step $sk, saved at ${ss:-none}) + $tr (restarted: $(grep -m1 restored "$rlog"))" \
           "= applied $applied + dropped $dropped + discarded $(( ${dk:-0} + ${dr:-0} )) + left unpushed ${ur:-0}" \
           "+ lost at the kill $lost (<= $bound: the steps after its last save, $uncarried held then and not carried)"
      if [ "$kill_sync" = 0 ] && [ "$(ev_count "$W/events-$id.log" push_hold_released)" = 0 ] \
         && [ "$(ev_count "$W/events-$id-r.log" push_hold_released)" = 0 ]; then
        check "seed $seed: killed $id: lost at the kill within the steps after its save (0 <= $lost <= $bound)" \
          [ "$lost" -ge 0 -a "$lost" -le "$bound" ]
      fi
      continue
    fi
    local tok disc left unp applied dropped
    tok=$(last_field "$log" tokens); disc=$(last_field "$log" discarded); left=$(last_field "$log" left)
    unp=$(last_field "$log" unpushed)
    tok=$(( ${tok:-0} * P )); disc=${disc:-0}; unp=${unp:-0}
    total_trained=$(( total_trained + tok ))
    applied=$(awk -v id="$id" '$3 == id && $4 == "merged" { s += $6 } END { print s + 0 }' "$W/records-$seed.txt")
    # drops from the synchronizers' events (a drop's record is written only with its fragment's next merge)
    dropped=$(cat "$W"/events-sync-"$seed".log "$W"/events-sync-"$seed"-2.log 2>/dev/null \
      | ev_field - push tokens id="$id" decision=dropped_stale | awk '{ s += $1 } END { print s + 0 }')
    local acc=$(( applied + dropped + disc + unp ))
    local releases
    releases=$(ev_count "$W/events-$id.log" push_hold_released)
    echo "   $id: trained $tok = applied $applied + dropped $dropped + discarded $disc + left unpushed $unp" \
         "(+ $(( tok - acc )))" \
         "killed=${killed[$i]} flush_left=${left:-none}"
    if [ "${killed[$i]}" = 1 ]; then
      check "seed $seed: killed $id: nothing counted beyond what it trained" [ "$acc" -le "$tok" ]
    elif [ "$kill_sync" = 1 ] || [ "$releases" -gt 0 ]; then
      # a synchronizer crash may lose, or merge twice, the pushes in flight at
      # that instant (at most one per fragment); a hold released by
      # push_decision_timeout_ms sends progress whose push is still undecided,
      # merged twice if that one merges after all (docs/FAILURE_MODEL.md)
      local maxpush bound gap
      maxpush=$(cat "$W"/events-sync-"$seed".log "$W"/events-sync-"$seed"-2.log 2>/dev/null \
        | ev_field - push tokens id="$id" | sort -n | tail -1)
      bound=$(( ${maxpush:-0} * (releases + (kill_sync ? P : 0)) ))
      gap=$(( tok - acc )); gap=${gap#-}
      check "seed $seed: $id finished its flush" [ "${left:-x}" = 0 ]
      check "seed $seed: $id: off by at most the pushes in flight at a crash or a hold release ($gap <= $bound)" \
        [ "$gap" -le "$bound" ]
    else
      check "seed $seed: $id finished its flush" [ "${left:-x}" = 0 ]
      check "seed $seed: $id: every trained step in exactly one state" [ "$acc" = "$tok" ]
    fi
  done
  local states rejected
  states=$(python3 -c "import json,sys; l=json.load(open(sys.argv[1]))['ledger']; print(sum(l[k] for k in ('applied','dropped_stale','rejected','lost','discarded','outstanding')))" "$W/status-$seed.json")
  rejected=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ledger']['rejected'])" "$W/status-$seed.json")
  check "seed $seed: nothing REJECTED (no refusal here asks for a rebase): $rejected" [ "$rejected" = 0 ]
  if [ "$kill_sync" = 0 ] && [ "$(cat "$W"/events-s"$seed"-*.log | ev_count - push_hold_released)" = 0 ]; then
    check "seed $seed: the ledger's states ($states) never exceed what was trained ($total_trained)" \
      [ "$states" -le "$total_trained" ]
  fi
  if [ "$kill_learner" = 0 ] && [ "$kill_sync" = 0 ] && [ "$(cat "$W"/events-s"$seed"-*.log | ev_count - push_hold_released)" = 0 ]; then
    check "seed $seed: without kills the ledger holds every trained fragment-token ($states = $total_trained)" \
      [ "$states" = "$total_trained" ]
  fi
  # (b) the model
  if [ "$adopt" != mix ] && ! { [ "$codec" = int4 ] && [ "$kill_sync" = 1 ]; }; then
    local am="" int4=0
    for i in "${!ids[@]}"; do am="$am${am:+,}${ids[$i]}=${amounts[$i]}"; done
    [ "$codec" = int4 ] && int4=1
    "$CONSERVE" check --store "$W/store" --amounts "$am" --int4 "$int4" > "$W/check-$seed.txt" 2>&1
    local rc=$?
    tail -1 "$W/check-$seed.txt" | sed 's/^/   /'
    check "seed $seed: the global model moved by exactly the applied steps" [ "$rc" = 0 ]
  fi
}

for seed in $SEEDS; do run_seed "$seed"; done
[ $fail = 0 ] && echo "test_conserve: all checks passed" || echo "test_conserve: FAILED"
exit $fail
