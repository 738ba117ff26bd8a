#!/bin/bash
# Across datacenters (not a test): the scenario chaos/scenarios/wan.ini -- six
# learners in three datacenters, near and unshaped, 50 Mbit/s at 20 ms,
# 3 Mbit/s at 80 ms, every dloco setting at its default -- once with its
# faults (random learner kills, the thin datacenter partitioned for 15 s)
# and once as a failure-free twin. Bandwidth is tc tbf on each datacenter's
# veth pair (network namespaces, as root; the relay's token bucket
# otherwise); the delay is the chaos relay's (half the RTT each way on whole
# ZeroMQ messages: this kernel has no netem). Prints per run each learner's
# goodput (merged compute over provisioned time, docs/CHAOS.md), pushes,
# merges, stale drops, deaths and full fetches (the synchronizer's events),
# the seconds from each push to its first Ack (median and 90th percentile,
# the learner's events: the push's upload plus what waited ahead of the Ack
# on its downlink),
# each datacenter's goodput, and the thin learners' share of the merged
# tokens (the store's records) against their share of the trained ones (the
# learners' step events); last line
#   wan_thin_dc_goodput_vs_near: X.XX
# the thin datacenter's goodput over the near one's, the lower of the two
# runs. Bar: >= 0.8. About 4 minutes (2 runs of 100 s, plus set-up); it
# measures whatever the checkout builds, so rerun it after a change.
# Usage: bench/wan.sh [OUT_DIR]   (env: WAN_QUICK=1 for 2 runs of 50 s,
#        WAN_DURATION_S to set the run length, BUILD_DIR (build))
set -euo pipefail
. "$(dirname "$0")/../tests/lib_args.sh"
dl_args 1 "$@"
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
OUT=${1:-runs/wan-$(date +%Y%m%d-%H%M%S)}
DUR=${WAN_DURATION_S:-}
[ -n "${WAN_QUICK:-}" ] && [ -z "$DUR" ] && DUR=50
[ -n "$DUR" ] && dl_args_number WAN_DURATION_S "$DUR"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target dloco-chaos dloco-sync dloco-learner dloco > /dev/null
args=()
[ -n "$DUR" ] && args+=(--duration_s "$DUR")
mkdir -p "$OUT"
# the run's first line and its faults; every event goes to chaos.log
"$BUILD_DIR"/chaos/dloco-chaos run chaos/scenarios/wan.ini --out "$OUT" --compare decoupled --baseline "${args[@]}" \
  2> "$OUT/chaos.log" | grep --line-buffered -E '^\[chaos [a-z-]+\] ( *[0-9.]+ s  fault |wan: )' || true
[ -f "$OUT/report.json" ] || { echo "wan: dloco-chaos made no report (its log: $OUT/chaos.log)" >&2; exit 1; }
for label in decoupled decoupled-baseline; do
  "$BUILD_DIR"/tools/dloco records "$OUT/$label/store" > "$OUT/$label/records.txt"
done
/usr/bin/python3 - "$OUT" << 'PY'
import collections, json, os, re, sys

out = sys.argv[1]
rep = json.load(open(os.path.join(out, "report.json")))
runs = {r["label"]: r for r in rep["runs"]}
ratios = []
for label, title in (("decoupled-baseline", "no faults"), ("decoupled", "learner kills and a 15 s partition")):
    r = runs[label]
    d = os.path.join(out, label)
    # merged fragment-tokens per learner id (dloco records: fragment version learner decision staleness tokens ...)
    merged = collections.Counter()
    for line in open(os.path.join(d, "records.txt")):
        f = line.split()
        if len(f) >= 6 and f[3] == "merged":
            merged[f[2]] += int(f[5])
    trained, pushes, nmerged, stale, deaths, fetches = (collections.Counter() for _ in range(6))
    ack_lat = {}
    for line in open(os.path.join(d, "records.txt")):
        f = line.split()
        if len(f) >= 6 and f[3] == "merged":
            nmerged[f[2]] += 1
    for lr in r["learners"]:
        last = {}  # the last cumulative tokens of each incarnation (pid)
        path = os.path.join(d, "events-%s.log" % lr["id"])
        for line in open(path) if os.path.exists(path) else ():
            kv = dict(re.findall(r"(\w+)=(\S+)", line))
            if kv.get("event") in ("step", "learner_summary") and "tokens" in kv:
                last[kv.get("pid")] = int(kv["tokens"])
        trained[lr["id"]] = sum(last.values())
        # seconds from each push (the learner's push event) to its first Ack (merged_pending or a decision): what
        # waited ahead of the Ack on the downlink, plus the push's own upload
        sent, lat = {}, []
        for line in open(path) if os.path.exists(path) else ():
            kv = dict(re.findall(r"(\w+)=(\S+)", line))
            key = (kv.get("pid"), kv.get("fragment"), kv.get("base_version"))
            if kv.get("event") == "push":
                sent[key] = int(kv["ts"])
            elif kv.get("event") == "ack" and key in sent:
                lat.append((int(kv["ts"]) - sent.pop(key)) / 1e9)
        lat.sort()
        ack_lat[lr["id"]] = lat
    for line in open(os.path.join(d, "events-sync.log")):
        kv = dict(re.findall(r"(\w+)=(\S+)", line))
        ev, lid = kv.get("event"), kv.get("id")
        if ev == "push" and lid:
            pushes[lid] += 1
            stale[lid] += kv.get("decision") == "dropped_stale"
        elif ev == "learner_dead" and lid:
            deaths[lid] += 1
        elif ev == "learner_join" and lid and kv.get("must_fetch") == "1":
            fetches[lid] += 1
    print("\n== %s (%s): %d merges, final val loss %s" % (label, title, r["merges"],
          "%.4f" % r["final_val_loss"] if r.get("final_val_loss") is not None else "-"))
    print("%-6s %-5s %8s %8s %8s %6s %6s %6s %6s %7s %12s %12s %11s" % ("id", "dc", "goodput", "prov_s", "good_s", "pushes",
          "merged", "stale", "deaths", "fetches", "trained_tok", "merged_ftok", "ack_s p50/90"))
    dc = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])
    for lr in r["learners"]:
        lid, t = lr["id"], lr["time"]
        g = t["seconds"]["goodput"]
        lat = ack_lat.get(lid) or []
        q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]
        print("%-6s %-5s %8.3f %8.1f %8.1f %6d %6d %6d %6d %7d %12d %12d %11s" % (lid, lr["dc"], t["goodput"], t["provisioned_s"],
              g, pushes[lid], nmerged[lid], stale[lid], deaths[lid], fetches[lid], trained[lid], merged[lid],
              "%.2f/%.2f" % (q(0.5), q(0.9)) if lat else "-"))
        a = dc[lr["dc"]]
        a[0] += g; a[1] += t["provisioned_s"]; a[2] += trained[lid]; a[3] += merged[lid]
    tt = sum(a[2] for a in dc.values()) or 1
    tm = sum(a[3] for a in dc.values()) or 1
    print("%-6s %8s %14s %14s" % ("dc", "goodput", "trained share", "merged share"))
    for name, a in dc.items():
        print("%-6s %8.3f %14.3f %14.3f" % (name, a[0] / a[1] if a[1] else 0, a[2] / tt, a[3] / tm))
    near = dc["near"][0] / dc["near"][1] if dc["near"][1] else 0
    thin = dc["thin"][0] / dc["thin"][1] if dc["thin"][1] else 0
    ratio = thin / near if near > 0 else 0
    ratios.append(ratio)
    print("thin learners: %.1f%% of the trained tokens, %.1f%% of the merged; thin goodput / near: %.2f" %
          (100 * dc["thin"][2] / tt, 100 * dc["thin"][3] / tm, ratio))
worst = min(ratios)
print("\nbar wan_thin_dc_goodput_vs_near >= 0.8 (the lower of the two runs): %s" % ("met" if worst >= 0.8 else "NOT met"))
print("report: %s" % os.path.join(out, "report.md"))
print("wan_thin_dc_goodput_vs_near: %.2f" % worst)
PY
