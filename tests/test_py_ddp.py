#!/usr/bin/python3
"""A learner that is a data-parallel group (examples/torch/ddp_group.py):
two ranks under torch.distributed with the gloo backend on the CPU train one
replica with DistributedDataParallel; rank 0 talks to a real dloco-sync and
broadcasts the tensors each adoption changed. Checks: the group joined as one
learner, its pushes were accepted, adoptions happened, and after every step
whose adoption changed parameters (and at the end) both ranks hold
bit-identical parameters (the ranks' checksums agree step by step)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import json  # noqa: E402

import pycluster as pc  # noqa: E402

pc.needs_torch()
c = pc.Cluster("py_ddp")
ep = c.start_sync("sync", "--fragments", "4", "--H", "8", *pc.OUTER)
c.start_py("group", "examples/torch/ddp_group.py", "--ranks", "2", "--model", "gpt2", "--connect", ep, "--id", "group",
           "--data", c.corpus(), "--fragments", "4", "--steps", "64", "--batch", "4", "--events", c.ev("group"),
           "--join_timeout", "60", "--init_method", "file://" + os.path.join(c.w, "rendezvous"))
rc = c.wait_pid("group", 400)
c.check("the group's processes exit 0 (rc %s)" % rc, rc == 0)
# the ranks share one log: a line may hold two ranks' objects back to back when their writes met
lines = []
dec = json.JSONDecoder()
with open(os.path.join(c.w, "group.log"), errors="replace") as f:
    for line in f:
        i = 0
        while line.startswith("{", i):
            obj, i = dec.raw_decode(line, i)
            lines.append(obj)
by = {r: {str(x["step"]): x for x in lines if x["rank"] == r} for r in (0, 1)}
joins = pc.events(c.ev("sync"), "learner_join")
c.check("the group joined as one learner (%s)" % [j["id"] for j in joins], {j["id"] for j in joins} == {"group"})
acc = pc.events(c.ev("group"), "ack", decision="accepted")
c.check("its pushes were accepted (%d)" % len(acc), len(acc) > 0)
changed = [s for s in by[0] if s != "end"]
c.check("adoptions changed parameters at %d steps" % len(changed), len(changed) >= 3)
c.check("both ranks saw the same adoption steps", sorted(changed) == sorted(s for s in by[1] if s != "end"))
diff = [s for s in by[0] if s in by[1] and by[0][s]["checksum"] != by[1][s]["checksum"]]
c.check("after every adoption both ranks hold identical parameters (%d steps differ)" % len(diff), not diff)
c.check("and at the end (%s == %s)" % (by[0].get("end", {}).get("checksum"), by[1].get("end", {}).get("checksum")),
        "end" in by[0] and "end" in by[1] and by[0]["end"]["checksum"] == by[1]["end"]["checksum"])
c.check("rank 0's finish flushed (unanswered %s)" % by[0].get("end", {}).get("flush_unanswered"),
        by[0].get("end", {}).get("flush_unanswered") == 0)
c.done()
