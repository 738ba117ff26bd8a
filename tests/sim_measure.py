#!/usr/bin/env python3
"""From a dloco-chaos run directory, the timings dloco-sim needs to simulate
the same run (tests/test_sim_crosscheck.sh), as [sim] INI lines, and the
chaos goodput: measured from the machine-readable events and report.json
(docs/EVENTS.md, docs/CHAOS.md), never from log sentences.
  startup_s        mean of the slots' startup seconds (report.json)
  restart_s        mean recovery seconds of the slots that were restarted
  step_s           median compute_s / steps over the learners' push events,
                   times the learners' speed (dloco-sim divides by it)
  step_overhead_s  median wall time per step (between `step` events) - the
                   step's compute
  merge_s          median over merges of merge ts - the latest arrival (sync
                   `push` event) of its contributors' pushes: the commit
  update_s         median of adopt ts - merge ts of the same fragment and
                   version: the Update's way back and its apply
usage: sim_measure.py OUT_DIR SPEED -> prints INI lines, then 'chaos_goodput X'"""
import glob, json, re, statistics as st, sys

out, speed = sys.argv[1], float(sys.argv[2])
run = glob.glob(out + "/decoupled")[0]
KV = re.compile(r'(\w+)=("[^"]*"|\S+)')


def events(path):
    with open(path) as f:
        for line in f:
            if line.endswith("\n"):
                yield dict(KV.findall(line))


rep = json.load(open(out + "/report.json"))["runs"][0]
slots = rep["learners"]
startup = st.mean(l["time"]["seconds"]["startup"] for l in slots)
rest = [l["time"]["seconds"]["recovery"] for l in slots if l["incarnations"] > 1]
restart = st.mean(rest) if rest else 0.0
per, wall, adopts = [], [], []
for path in glob.glob(run + "/events-*.log"):
    if path.endswith(("-sync.log", "-chaos.log")):
        continue
    steps = []
    for e in events(path):
        ev = e.get("event")
        if ev == "push" and int(e["steps"]) > 0:
            per.append(float(e["compute_s"]) / int(e["steps"]))
        elif ev == "step":
            steps.append((int(e["ts"]), int(e["step"]), e.get("pid")))
        elif ev == "adopt" and e.get("mode") != "rebase":
            adopts.append((e["fragment"], e["version"], int(e["ts"])))
    for (t0, s0, p0), (t1, s1, p1) in zip(steps, steps[1:]):
        if p0 == p1 and s1 > s0:
            wall.append((t1 - t0) / 1e9 / (s1 - s0))
last, latest, merge_ts, commit = {}, {}, {}, []
for e in events(run + "/events-sync.log"):
    ev = e.get("event")
    if ev == "push" and e.get("decision") == "pooled":
        last[(e["id"], e["frag"])] = int(e["ts"])
    elif ev == "merge_contrib":
        k = (e["frag"], e["version"])
        latest[k] = max(latest.get(k, 0), last.get((e["id"], e["frag"]), 0))
    elif ev == "merge":
        k = (e["frag"], e["version"])
        merge_ts[k] = int(e["ts"])
        if latest.get(k):
            commit.append((int(e["ts"]) - latest[k]) / 1e9)
upd = [(t - merge_ts[(f, v)]) / 1e9 for f, v, t in adopts if (f, v) in merge_ts and t >= merge_ts[(f, v)]]
if not (per and wall and commit and upd):
    sys.exit("sim_measure: missing events (pushes %d, steps %d, merges %d, adopts %d)" %
             (len(per), len(wall), len(commit), len(upd)))
step = st.median(per)
print("startup_s = %.6f" % startup)
print("restart_s = %.6f" % restart)
print("step_s = %.6f" % (step * speed))
print("step_overhead_s = %.6f" % max(0.0, st.median(wall) - step))
print("merge_s = %.6f" % st.median(commit))
print("update_s = %.6f" % st.median(upd))
print("chaos_goodput %.6f" % rep["goodput"])
