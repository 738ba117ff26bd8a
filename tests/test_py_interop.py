#!/usr/bin/python3
"""Interop: one C dloco-learner and one PyTorch GPT-2 learner
(examples/torch/gpt2.py through the dloco package) in one GPT-2 run.
Checks, from the event logs and the store:
  - the PyTorch learner joins with the C learner's fingerprint (same manifest);
  - both learners' pushes are merged into the same fragment versions
    (merge_contrib lines of one (frag, version) name both);
  - every base each learner accepts (update_base hash) hashes equal to the
    synchronizer's committed fragment at that version (merge hash);
  - the exported model (dloco export --format safetensors) loaded into the
    PyTorch GPT-2 evaluates to `dloco eval`'s loss on the same sequences
    (--dump_seqs), to 1e-4;
  - the fleet's validation loss is below either learner's alone at equal
    steps (the same run with only the C learner, and with only the PyTorch one).
Prints the figures (losses, merges) as `interop:` lines."""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pycluster as pc  # noqa: E402

pc.needs_torch()
sys.path.insert(0, os.path.join(pc.SRC, "examples", "torch"))
sys.path.insert(0, os.path.join(pc.SRC, "python"))
import torch  # noqa: E402

import dloco  # noqa: E402
from gpt2 import GPT2  # noqa: E402

STEPS = int(os.environ.get("INTEROP_STEPS", "96"))
c = pc.Cluster("py_interop")
SYNC_ARGS = ["--fragments", "4", "--H", "8"] + pc.OUTER
EVAL = ["--data", c.corpus(), "--batch", "8", "--val_batches", "8"]


def torch_learner(name, ep):
    return c.start_py(name, "examples/torch/gpt2.py", "--connect", ep, "--id", name, "--data", c.corpus(),
                      "--fragments", "4", "--steps", str(STEPS), "--batch", "8", "--lr", "3e-3", "--warmup", "5",
                      "--events", c.ev(name), "--loss_log", os.path.join(c.w, "loss-%s.txt" % name),
                      "--join_timeout", "60")


def run(tag, with_c, with_torch, extra=()):
    """A run with the given learners to the end; returns the store's dloco eval loss and the dump."""
    store = os.path.join(c.w, "store-" + tag)
    ep = c.start_sync("sync-" + tag, *(SYNC_ARGS + list(extra)), store=store)
    names = []
    if with_torch:  # first: it takes seconds to import torch, the C learner starts at once
        torch_learner("t-" + tag, ep)
        names.append("t-" + tag)
        if with_c and not c.wait_event(120, c.ev("t-" + tag), "welcome"):
            c.die("the PyTorch learner got no Welcome")
    if with_c:
        c.start_learner("c-" + tag, ep, "--fragments", "4", "--steps", str(STEPS))
        names.append("c-" + tag)
    for n in names:
        rc = c.wait_pid(n, 600)
        if rc != 0:
            c.die("learner %s exited %d" % (n, rc))
    c.stop("sync-" + tag)
    seqs = os.path.join(c.w, "seqs-%s.bin" % tag)
    out = c.run([pc.DLOCO, "eval", store] + EVAL + ["--dump_seqs", seqs]).stdout
    loss = float(out.split("val_loss=")[1].split()[0])
    return store, loss, seqs, names


# ---- the fleet: C + PyTorch, quorum 2 so rounds wait for both
store, fleet, seqs, (tname, cname) = run("fleet", True, True, ["--quorum", "2"])
sev = c.ev("sync-fleet")
starts = {n: pc.events(c.ev(n), "learner_start") for n in (cname,)}
fp_c = starts[cname][-1]["fingerprint"] if starts[cname] else None
tsum = c.json_out(tname)
c.check("the PyTorch learner's fingerprint is the C learner's (%s == %s)" % (tsum.get("fingerprint"), fp_c),
        fp_c is not None and tsum.get("fingerprint") == fp_c)
joined = {e["id"] for e in pc.events(sev, "learner_join")}
c.check("both learners joined the synchronizer (%s)" % sorted(joined), {cname, tname} <= joined)

contrib = {}
for e in pc.events(sev, "merge_contrib"):
    contrib.setdefault((e["frag"], e["version"]), set()).add(e["id"])
both = sorted(k for k, ids in contrib.items() if {cname, tname} <= ids)
mine = {n: sum(1 for ids in contrib.values() if n in ids) for n in (cname, tname)}
print("interop: merges=%d merged_with_both=%d c_contribs=%d torch_contribs=%d" % (
    len(contrib), len(both), mine[cname], mine[tname]))
c.check("fragment versions merged from both learners' pushes (%d of %d)" % (len(both), len(contrib)), len(both) > 0)

committed = {(e["frag"], e["version"]): e["hash"] for e in pc.events(sev, "merge")}
for n in (cname, tname):
    bases = pc.events(c.ev(n), "update_base")
    matched = [b for b in bases if (b["fragment"], b["version"]) in committed]
    bad = [b for b in matched if committed[(b["fragment"], b["version"])] != b["hash"]]
    c.check("%s: every adopted base hashes as the committed fragment (%d bases, %d at merged versions, %d differ)"
            % (n, len(bases), len(matched), len(bad)), len(matched) > 0 and not bad)

# ---- the exported model in PyTorch == dloco eval
exp = os.path.join(c.w, "fleet.safetensors")
c.run([pc.DLOCO, "export", store, "--format", "safetensors", exp])
tensors, meta = dloco.read_safetensors(exp)
model = GPT2(2, 2, 32, 32, 256)
model.load_dloco(tensors)
model.eval()
raw = bytearray(open(seqs, "rb").read())
magic, ver, nb, B, T, V = struct.unpack("<6i", raw[:24])
s = torch.frombuffer(raw, dtype=torch.int32, offset=32).reshape(nb, B, 2, T).long()
with torch.no_grad():
    tl = sum(model(s[i, :, 0], s[i, :, 1]).item() for i in range(nb)) / nb
print("interop: dloco_eval=%.6f torch_eval=%.6f diff=%.2g" % (fleet, tl, abs(tl - fleet)))
c.check("the export evaluates in PyTorch to dloco eval's loss (%.6f vs %.6f)" % (tl, fleet), abs(tl - fleet) <= 1e-4)

# ---- each learner alone, the same steps
_, alone_c, _, _ = run("c", True, False)
_, alone_t, _, _ = run("t", False, True)
print("interop: val_loss fleet=%.4f c_alone=%.4f torch_alone=%.4f steps=%d" % (fleet, alone_c, alone_t, STEPS))
c.check("the fleet's loss is below the C learner's alone (%.4f < %.4f)" % (fleet, alone_c), fleet < alone_c)
c.check("the fleet's loss is below the PyTorch learner's alone (%.4f < %.4f)" % (fleet, alone_t), fleet < alone_t)
c.done()
