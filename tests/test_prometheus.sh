#!/bin/bash
# The operator's walk-through of docs/OPERATING.md, end to end, with the real
# tools: a synchronizer (config file) and two learners; `dloco status ADDR
# --watch`; a real Prometheus server (Debian's prometheus) scraping the
# synchronizer and both learners, asked through its HTTP API whether every
# target is up and what the metrics say; a reloadable setting changed in the
# file + SIGHUP and seen through Prometheus; then the model exported and
# evaluated by PyTorch (tests/export_check.py) to dloco's loss.
# Exit 77 (skip) without prometheus or torch, except under CI=true, where a
# missing tool fails the test.
set -u
TEST_NAME=prometheus
. "$(dirname "$0")/lib_cluster.sh"
PY=/usr/bin/python3 # Debian's python3-torch lives under Debian's python
missing() {
  echo "SKIP: $1 (deploy/setup.sh --with-torch installs it)"
  [ "${CI:-}" = true ] && { echo "FAIL: CI=true and $1"; exit 1; }
  exit 77
}
command -v prometheus > /dev/null || missing "prometheus not installed"
command -v curl > /dev/null || missing "curl not installed"
"$PY" -c "import torch" 2> /dev/null || missing "python3-torch not installed"
make_corpus

# ---- the run: a synchronizer with a config file, two learners
printf 'outer_lr = 1\nouter_momentum = 0\n' > "$W/sync.ini"
start_sync sync --config "$W/sync.ini" --eval_every_s 2 --eval_data "$W/corpus.txt" --eval_seqs 32 --eval_batch 8
MS=$(ev_last "$W/events-sync.log" metrics_listen addr)
[ -n "$MS" ] || die "the synchronizer wrote no metrics_listen event"
start_learner a --steps 100000000 --throttle 0.2
start_learner b --steps 100000000 --throttle 0.2
wait_until 30 '[ -n "$(ev_last "$W/events-a.log" metrics_listen addr)" ] && [ -n "$(ev_last "$W/events-b.log" metrics_listen addr)" ]' \
  || die "the learners wrote no metrics_listen event"
MA=$(ev_last "$W/events-a.log" metrics_listen addr) MB=$(ev_last "$W/events-b.log" metrics_listen addr)
wait_until 60 '[ "$(ev_count "$W/events-sync.log" merge)" -ge 4 ]' || die "no merges"

# ---- dloco status --watch: refreshed blocks until SIGINT
timeout -s INT 4 "$DLOCO" status "$MS" --watch 1 > "$W/watch.txt" 2>&1
blocks=$(grep -c '^run ' "$W/watch.txt")
check "dloco status ADDR --watch 1 printed $blocks refreshed blocks in 4 s (>= 2)" [ "$blocks" -ge 2 ]
check "the watched view lists both learners" sh -c "grep -q '^a ' '$W/watch.txt' && grep -q '^b ' '$W/watch.txt'"

# ---- Prometheus scrapes all three endpoints
PP=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$W/prometheus.yml" << EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: dloco-sync
    static_configs: [{targets: ['$MS']}]
  - job_name: dloco-learner
    static_configs: [{targets: ['$MA', '$MB']}]
EOF
check "promtool check config accepts the scrape config" quietly promtool check config "$W/prometheus.yml"
prometheus --config.file="$W/prometheus.yml" --storage.tsdb.path="$W/tsdb" --web.listen-address="127.0.0.1:$PP" \
  > "$W/prometheus.log" 2>&1 &
PIDS+=("$!")
# q PROMQL PYEXPR: the instant query's result as `r` (list of {metric, value}); exit status of PYEXPR
q() {
  "$PY" - "$PP" "$1" "$2" << 'EOF'
import json, sys, urllib.parse, urllib.request
port, query, expr = sys.argv[1:4]
try:
    url = "http://127.0.0.1:%s/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": query}))
    d = json.load(urllib.request.urlopen(url, timeout=5))
    r = [{"metric": x["metric"], "value": float(x["value"][1])} for x in d["data"]["result"]]
    sys.exit(0 if d["status"] == "success" and eval(expr) else 1)
except Exception:
    sys.exit(1)
EOF
}
check "Prometheus sees all three targets up" \
  wait_until 60 "q up 'len(r) == 3 and all(x[\"value\"] == 1 for x in r)'"
check "Prometheus has the synchronizer's merges" \
  wait_until 30 "q dloco_sync_merges_total 'len(r) == 1 and r[0][\"value\"] > 0'"
check "Prometheus has both learners' steps" \
  wait_until 30 "q dloco_learner_steps_total 'len(r) == 2 and all(x[\"value\"] > 0 for x in r)'"
check "Prometheus has the synchronizer's validation loss" \
  wait_until 30 "q dloco_sync_eval_loss 'len(r) == 1 and 0 < r[0][\"value\"] < 10'"
check "Prometheus has per-learner tokens at the synchronizer" \
  wait_until 30 "q dloco_sync_learner_tokens_applied_total 'len(r) == 2 and all(x[\"value\"] > 0 for x in r)'"
check "Prometheus sees outer_lr 1" wait_until 30 "q 'dloco_sync_config{option=\"outer_lr\"}' 'r[0][\"value\"] == 1'"

# ---- a reloadable setting changed in the file, seen through Prometheus
n=$(ev_count "$W/events-sync.log" reload)
printf 'outer_lr = 0.5\nouter_momentum = 0\n' > "$W/sync.ini"
kill -HUP "$SPID"
wait_until 10 "[ \$(ev_count '$W/events-sync.log' reload) -gt $n ]" || die "no reload event"
check "the reload was applied" [ "$(ev_last "$W/events-sync.log" reload refused)" = 0 ]
check "Prometheus sees outer_lr 0.5 after SIGHUP" \
  wait_until 30 "q 'dloco_sync_config{option=\"outer_lr\"}' 'r[0][\"value\"] == 0.5'"

# ---- the model out: PyTorch evaluates the export to dloco's loss
kill -TERM "${PIDS[1]}" "${PIDS[2]}" 2> /dev/null
for p in "${PIDS[1]}" "${PIDS[2]}"; do wait_pid 60 "$p" > /dev/null; done
stop_sync
check "dloco export --format safetensors" quietly "$DLOCO" export "$W/store" --format safetensors "$W/model.safetensors"
line=$("$DLOCO" eval "$W/store" --data "$W/corpus.txt" --batch 8 --val_batches 4 --dump_seqs "$W/seqs.bin" --json) \
  || die "dloco eval failed"
L0=$(echo "$line" | jq_py "d['val_loss']")
"$PY" "$(dirname "$0")/export_check.py" "$W/seqs.bin" "$L0" 2 --safetensors "$W/model.safetensors" > "$W/check.txt" 2>&1
rc=$?
sed 's/^/  /' "$W/check.txt"
check "PyTorch's loss of the export equals dloco eval's $L0 to 1e-4 (rc $rc)" [ $rc = 0 ]
exit $fail
