#!/bin/bash
# CURVE on a real cluster: a synchronizer with a key pair and an allowlist on
# a loopback bind (auth auto: keys given turn CURVE on, loopback or not),
# real learners with key files. Listed learners join and train; a learner
# whose key is not listed never gets in (ZAP denies it; it gives up with a
# clear reason); a learner using another learner's key under its own id is
# refused; an allowlist reload (SIGHUP) without a key cuts that learner off
# while the others go on merging.
set -u
TEST_NAME=curve
. "$(dirname "$0")/lib_cluster.sh"
make_corpus
# keygen makes the missing keys/ directory itself (mode 0700), as on a fresh clone
K="$W/keys"
for n in sync k0 k1 k2; do quietly "$DLOCO" keygen "$K/$n" || die "dloco keygen $n"; done
check "dloco keygen made the keys directory, mode 0700" [ "$(stat -c %a "$K")" = 700 ]
pub() { sed -n 's/^public = //p' "$K/$1.pub"; }
printf '# learners of this run\nk0 %s\nk1 %s\n' "$(pub k0)" "$(pub k1)" > "$W/allow.txt"
chmod 644 "$W/allow.txt"
start_sync sync --key_file "$K/sync.key" --allowlist "$W/allow.txt" --H 4 --max_staleness 100
EV="$W/events-sync.log"
check "keys given on a loopback bind: the synchronizer runs with CURVE on (auth auto)" ev_has "$EV" sync_start auth=curve
CURVE=(--server_key "$K/sync.pub")
start_learner k0 "${CURVE[@]}" --key_file "$K/k0.key" --steps 100000000 --throttle 0.5 --data_shard 0 --data_shards 2
P0=$LPID
start_learner k1 "${CURVE[@]}" --key_file "$K/k1.key" --steps 100000000 --throttle 0.5 --data_shard 1 --data_shards 2
P1=$LPID
ev_wait 60 "$EV" learner_join id=k0 auth=1 || die "k0 did not join"
ev_wait 60 "$EV" learner_join id=k1 auth=1 || die "k1 did not join"
wait_until 90 '[ "$(merges)" -ge 8 ]' || die "no merges with CURVE"
check "k0 pushed" [ "$(ev_count "$EV" push id=k0)" -gt 0 ]
check "k1 pushed" [ "$(ev_count "$EV" push id=k1)" -gt 0 ]

# a key that is not in the allowlist: no Hello ever arrives; ZAP's denial
# (status 400) is final, so the learner stops at once with the reason, exit 3
# (its connect timeout is far beyond the wait: exit 3 is not a timeout)
start_learner k2 "${CURVE[@]}" --key_file "$K/k2.key" --steps 10 --connect_timeout_ms 120000
wait_pid 60 "$LPID"; rc=$?
check "an unlisted key's learner exits 3 (status $rc)" [ "$rc" = 3 ]
check "ZAP denied it" ev_has "$EV" auth_denied reason=unknown_key
check "it never joined" [ "$(ev_count "$EV" learner_join id=k2)" = 0 ]
check "its handshake failed (authentication): refused kind=unauthorized" \
  ev_has "$W/events-k2.log" refused kind=unauthorized "reason~authentication.*allowlist"

# the wrong server key: every handshake fails without a status; 3 in a row
# before any Welcome end the learner (exit 3), long before its timeout
start_learner k0w --id k0 --server_key "$K/k2.pub" --key_file "$K/k0.key" --steps 10 --connect_timeout_ms 120000
wait_pid 60 "$LPID"; rc=$?
check "a learner with the wrong server key exits 3 (status $rc)" [ "$rc" = 3 ]
check "... refused kind=handshake naming server_key" ev_has "$W/events-k0w.log" refused kind=handshake "reason~server_key"

# no keys at all against a CURVE synchronizer: the mechanisms differ at the
# greeting; the learner names the missing keys and the endpoint, exit 3
# (libzmq reports the mechanism mismatch only when the learner reads the
# synchronizer's greeting before the connection closes; on a loaded machine
# most attempts end in a bare EPIPE, so a keyless learner retries every
# reconnect_ms until one reports it: 4-13 s with both cores busy. The wait's
# bound is the learner's own 120 s.)
start_learner k0n --id k0 --steps 10 --connect_timeout_ms 120000
wait_pid 125 "$LPID"; rc=$?
check "a learner without keys exits 3 (status $rc)" [ "$rc" = 3 ]
check "... refused kind=handshake naming the missing keys and the endpoint" \
  ev_has "$W/events-k0n.log" refused kind=handshake "reason~requires CURVE keys.*--server_key.*--key_file"
check "... and the endpoint" ev_has "$W/events-k0n.log" refused kind=handshake "reason~tcp://"
check "the synchronizer logged the refused handshakes (rate-limited, counted)" \
  ev_wait 10 "$EV" handshake_refused "reason~^(hung_up|mechanism)$" "count~^[0-9]+$"
check "... with the likely cause in its log" grep -Eq "refused [0-9]+ handshake\(s\) on tcp://.*(no CURVE keys|does not use CURVE)" "$W/sync.log"

# a listed key used for another id: refused, never registered
start_learner k3 "${CURVE[@]}" --key_file "$K/k0.key" --steps 10 --connect_timeout_ms 120000
wait_pid 60 "$LPID"; rc=$?
check "k0's key under id k3 is refused, exit 3 (status $rc)" [ "$rc" = 3 ]
check "k3: refused kind=unauthorized" ev_has "$W/events-k3.log" refused kind=unauthorized
check "auth_refused names the key's owner" ev_has "$EV" auth_refused id=k3 key_owner=k0
check "k3 never joined" [ "$(ev_count "$EV" learner_join id=k3)" = 0 ]

# revoke k1: it is cut off, k0 goes on
printf 'k0 %s\n' "$(pub k0)" > "$W/allow.txt"
kill -HUP "$SPID"
ev_wait 30 "$EV" learner_revoked id=k1 || die "k1 was not revoked"
check "the reload was applied" ev_has "$EV" allowlist_reload refused=0 revoked=1
wait_pid 60 "$P1"; rc=$?
check "the revoked learner stopped (status $rc)" [ "$rc" -ne 0 ]
pooled_k1=$(ev_count "$EV" push id=k1)
m=$(merges)
wait_until 60 "[ \$(merges) -ge $((m + 4)) ]" || die "merges stopped after the revocation"
check "nothing of k1 was accepted after its revocation" [ "$(ev_count "$EV" push id=k1)" = "$pooled_k1" ]
kill -TERM "$P0"; wait_pid 60 "$P0"
stop_sync
check "the synchronizer summary came out" ev_has "$EV" sync_summary
[ $fail = 0 ] && echo "test_curve: all checks passed" || echo "test_curve: FAILED"
exit $fail
