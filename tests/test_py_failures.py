#!/usr/bin/python3
"""Failure paths of the dloco Python package, with real processes:
  - a parameter that is not fp32, or not contiguous: dloco.ManifestError from
    the constructor, and nothing connects to the endpoint it was given;
  - nothing listening at join: dloco.Timeout whose message names the endpoint;
  - a restart: start_step must be a step (dloco.InvalidArgument otherwise), and
    examples/torch/gpt2.py --state resumes its own step, AdamW state and data;
  - SIGTERM to a PyTorch learner (examples/torch/gpt2.py, Learner.handle_signals):
    the loop stops, finish flushes, the synchronizer records its Bye (reason
    signal), the process exits 0;
  - the synchronizer killed (SIGKILL) mid-run: the PyTorch learner keeps
    training while it is gone, and rejoins the restarted synchronizer (a new
    Welcome, new pushes accepted)."""
import json
import os
import signal
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pycluster as pc  # noqa: E402

pc.needs_torch()
sys.path.insert(0, os.path.join(pc.SRC, "examples", "torch"))
sys.path.insert(0, os.path.join(pc.SRC, "python"))
os.environ["DLOCO_LIBRARY"] = pc.library()
import torch  # noqa: E402

import dloco  # noqa: E402
from gpt2 import GPT2  # noqa: E402

c = pc.Cluster("py_failures")
CFG = dict(n_layer=2, n_head=2, n_embd=32, seq_len=32, vocab=256)

# ---- a bad parameter: refused before any network
lsn = socket.socket()
lsn.bind(("127.0.0.1", 0))
lsn.listen(4)
lsn.setblocking(False)
ep = "tcp://127.0.0.1:%d" % lsn.getsockname()[1]
for what, spoil in (("an fp16 parameter", lambda m: m.h[0].ln_1.half()),
                    ("a non-contiguous parameter",
                     lambda m: setattr(m.h[0].attn.c_proj.weight, "data", m.h[0].attn.c_proj.weight.data.t()))):
    m = GPT2(**CFG)
    spoil(m)
    try:
        dloco.Learner(m, connect=ep, run_id="dloco", fragments=4, max_tokens_per_step=256, gpt2=CFG)
        c.check("%s is refused" % what, False)
    except dloco.ManifestError as e:
        c.check("%s is refused with a ManifestError naming it: %s" % (what, e), "h.0." in str(e))
try:
    lsn.accept()
    connected = True
except BlockingIOError:
    connected = False
c.check("nothing connected to the endpoint a refused model was given", not connected)
lsn.close()

# ---- nothing listening at join: a timeout naming the endpoint
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()  # a port nobody listens on
m = GPT2(**CFG)
dl = dloco.Learner(m, connect="tcp://127.0.0.1:%d" % port, run_id="dloco", fragments=4, max_tokens_per_step=256,
                   gpt2=CFG)
try:
    dl.join(timeout=2)
    c.check("join with nothing listening fails", False)
except dloco.Timeout as e:
    c.check("join with nothing listening: dloco.Timeout naming the endpoint: %s" % e, str(port) in str(e))
    c.check("dloco.Timeout is a TimeoutError", isinstance(e, TimeoutError))
dl.close()
dl.close()  # safe twice

# ---- a restart: start_step is a step (>= 0); the example resumes its own state (--state)
try:
    dloco.Learner(GPT2(**CFG), connect="tcp://127.0.0.1:%d" % port, run_id="dloco", fragments=4,
                  max_tokens_per_step=256, gpt2=CFG, start_step=-1)
    c.check("start_step -1 is refused", False)
except dloco.InvalidArgument as e:
    c.check("start_step -1 is refused naming it: %s" % e, "start_step" in str(e))
state = os.path.join(c.w, "gpt2.state")
runs = []
for steps in (4, 6):
    r = subprocess.run([pc.PY, os.path.join(pc.SRC, "examples/torch/gpt2.py"), "--data", c.corpus(), "--steps",
                        str(steps), "--state", state, "--state_every", "2"], capture_output=True, text=True,
                       timeout=120)
    runs.append(json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {"rc": r.returncode,
                                                                                          "err": r.stderr[-500:]})
c.check("the example resumes its own state: %s" % runs,
        runs[0].get("resumed_at") == 0 and runs[1].get("resumed_at") == 4 and runs[1].get("steps") == 6)

# ---- SIGTERM: flush and Bye
LOOP = ["examples/torch/gpt2.py", "--data", c.corpus(), "--fragments", "4", "--steps", "1000000", "--batch", "8",
        "--join_timeout", "60"]
ep = c.start_sync("sync", "--fragments", "4", "--H", "8", *pc.OUTER)
c.start_py("term", *LOOP, "--connect", ep, "--id", "term", "--events", c.ev("term"))
if not c.wait_until(120, lambda: len(pc.events(c.ev("term"), "ack", decision="accepted")) >= 3):
    c.die("the PyTorch learner had no pushes accepted")
c.procs["term"].send_signal(signal.SIGTERM)
rc = c.wait_pid("term", 60)
out = c.json_out("term")
c.check("SIGTERM: the learner exits 0 (rc %s)" % rc, rc == 0)
c.check("SIGTERM: the loop saw stop_requested (%s)" % out.get("stopped"), out.get("stopped") is True)
c.check("SIGTERM: finish flushed every final push (unanswered %s)" % out.get("flush_unanswered"),
        out.get("flush_unanswered") == 0)
byes = pc.events(c.ev("sync"), "learner_bye", id="term")
c.check("SIGTERM: the synchronizer got its Bye with reason signal (%s)" % [b.get("reason") for b in byes],
        any(b.get("reason") == "signal" for b in byes))

# ---- the synchronizer killed mid-run: training goes on, the learner rejoins
c.start_py("survivor", *LOOP, "--connect", ep, "--id", "survivor", "--events", c.ev("survivor"),
           "--loss_log", os.path.join(c.w, "loss-survivor.txt"))
if not c.wait_until(120, lambda: len(pc.events(c.ev("survivor"), "ack", decision="accepted")) >= 3):
    c.die("the survivor had no pushes accepted")
c.procs["sync"].send_signal(signal.SIGKILL)
c.procs["sync"].wait()


def steps():
    p = os.path.join(c.w, "loss-survivor.txt")
    return sum(1 for _ in open(p)) if os.path.exists(p) else 0


at_kill = steps()
c.check("with the synchronizer gone, the learner keeps training (%d steps at the kill)" % at_kill,
        c.wait_until(60, lambda: steps() >= at_kill + 50))
welcomes = len(pc.events(c.ev("survivor"), "welcome"))
acks = len(pc.events(c.ev("survivor"), "ack", decision="accepted"))
ep2 = c.start_sync("sync2", "--fragments", "4", "--H", "8", *pc.OUTER, "--bind", ep)
c.check("the synchronizer restarts on the same endpoint (%s)" % ep2, ep2 == ep)
c.check("the learner rejoins: a new Welcome",
        c.wait_until(120, lambda: len(pc.events(c.ev("survivor"), "welcome")) > welcomes))
c.check("and its pushes are accepted again",
        c.wait_until(120, lambda: len(pc.events(c.ev("survivor"), "ack", decision="accepted")) > acks))
c.check("the restarted synchronizer saw it join", len(pc.events(c.ev("sync2"), "learner_join", id="survivor")) >= 1)
c.procs["survivor"].send_signal(signal.SIGTERM)
rc = c.wait_pid("survivor", 60)
c.check("the survivor exits 0 on SIGTERM (rc %s)" % rc, rc == 0)
c.done()
