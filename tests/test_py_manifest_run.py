#!/usr/bin/python3
"""A model dloco has never seen: the Llama-style model of
examples/torch/llama.py (RMSNorm, SwiGLU, RoPE, untied head) in a manifest
run. Version 0 is the model's own init written by dloco.write_init (the
manifest in the safetensors metadata) for `dloco-sync --init_from`.
Checks:
  - two PyTorch learners train it (their pushes merged, the manifest fingerprint
    the same for both), and the run's exported model evaluates (in PyTorch, on
    the validation sequences) below the model of the same run with one
    learner at the same steps;
  - `dloco export --format safetensors` loads back into the PyTorch model bit for
    bit: every tensor under its own name and shape, the same bytes, and the
    manifest in its metadata is the model's (names, shapes, roles, order);
  - a GPT-2 learner pointed at this run is refused at once: dloco.Refused from
    join (no timeout, no retry loop: one refusal in its event log, no Welcome)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pycluster as pc  # noqa: E402

pc.needs_torch()
sys.path.insert(0, os.path.join(pc.SRC, "examples", "torch"))
sys.path.insert(0, os.path.join(pc.SRC, "python"))
os.environ["DLOCO_LIBRARY"] = pc.library()
import torch  # noqa: E402

import dloco  # noqa: E402
from dloco_data import Data  # noqa: E402
from gpt2 import GPT2  # noqa: E402
from llama import Llama  # noqa: E402

STEPS = int(os.environ.get("MANIFEST_STEPS", "192"))
c = pc.Cluster("py_manifest_run")
init = os.path.join(c.w, "init.safetensors")
c.run([pc.PY, os.path.join(pc.SRC, "examples/torch/llama.py"), "--write_init", init])
SYNC = ["--fragments", "4", "--H", "8", "--run_id", "llama", "--init_from", init] + pc.OUTER
torch.set_num_threads(1)
# real text (a part of the bundled fortunes corpus): on the tests' synthetic lines both runs reach about the
# same loss in 96 steps, and "two learners below one" would compare noise
TEXT = os.path.join(c.w, "text.txt")
with open(TEXT, "wb") as out:
    for name in sorted(os.listdir("/usr/share/games/fortunes")):
        path = os.path.join("/usr/share/games/fortunes", name)
        if "." not in name and os.path.isfile(path) and out.tell() < 600000:
            out.write(open(path, "rb").read())
val = Data(TEXT, 32)


def learner(name, ep, shard):
    c.start_py(name, "examples/torch/llama.py", "--connect", ep, "--run_id", "llama", "--id", name,
               "--data", TEXT, "--data_shard", shard, "--fragments", "4", "--steps", str(STEPS), "--batch", "8",
               "--lr", "3e-3", "--warmup", "5", "--events", c.ev(name), "--join_timeout", "60")


def run(tag, n):
    store = os.path.join(c.w, "store-" + tag)
    ep = c.start_sync("sync-" + tag, *SYNC, store=store, model=False)
    names = ["%s-%d" % (tag, i) for i in range(n)]
    for i, name in enumerate(names):
        learner(name, ep, "%d/%d" % (i, n))
    for name in names:
        rc = c.wait_pid(name, 600)
        if rc != 0:
            c.die("learner %s exited %d" % (name, rc))
    return store, ep, names


def val_loss(path):
    m = Llama()
    dloco.load_into(m, path)
    m.eval()
    with torch.no_grad():
        return sum(m(*val.val_batch(i, 8)).item() for i in range(8)) / 8


# ---- two learners
store, ep, names = run("pair", 2)
fps = {c.json_out(n).get("fingerprint") for n in names}
c.check("both learners have one fingerprint (%s)" % fps, len(fps) == 1 and None not in fps)
contrib = {}
for e in pc.events(c.ev("sync-pair"), "merge_contrib"):
    contrib.setdefault(e["id"], 0)
    contrib[e["id"]] += 1
c.check("both learners' pushes were merged (%s)" % contrib, all(contrib.get(n, 0) > 0 for n in names))

# ---- a GPT-2 learner pointed at this run: refused at once
cfg = dict(n_layer=2, n_head=2, n_embd=32, seq_len=32, vocab=256)
gev = os.path.join(c.w, "events-gpt2.log")
dl = dloco.Learner(GPT2(**cfg), connect=ep, run_id="llama", learner_id="gpt2", fragments=4, max_tokens_per_step=256,
                   gpt2=cfg, options={"events": gev})
try:
    dl.join(timeout=60)
    c.check("a GPT-2 learner is refused on the Llama run", False)
except dloco.Refused as e:
    c.check("a GPT-2 learner is refused on the Llama run: %s" % e, True)
except dloco.Error as e:
    c.check("a GPT-2 learner is refused (Refused), not %s: %s" % (type(e).__name__, e), False)
dl.close()
c.check("at once: one refusal, no Welcome, no retry (%d refused, %d welcome, %d rehello)" % (
    len(pc.events(gev, "refused")), len(pc.events(gev, "welcome")), len(pc.events(gev, "rehello"))),
    len(pc.events(gev, "refused")) == 1 and not pc.events(gev, "welcome") and not pc.events(gev, "rehello"))
c.check("the synchronizer never admitted it", not pc.events(c.ev("sync-pair"), "learner_join", id="gpt2"))
c.stop("sync-pair")

# ---- the export, back into PyTorch bit for bit
exp = os.path.join(c.w, "pair.safetensors")
c.run([pc.DLOCO, "export", store, "--format", "safetensors", exp])
tensors, meta = dloco.read_safetensors(exp)
model = Llama()
loaded = dloco.load_into(model, exp)
want = dloco.manifest(model)
c.check("the export holds exactly the model's tensors (%d)" % len(loaded),
        sorted(loaded) == sorted(e.name for e in want) == sorted(tensors))
same = all(p.detach().numpy().tobytes() == tensors[n].numpy().tobytes() for n, p in model.named_parameters())
c.check("every parameter loaded bit for bit", same)
again = os.path.join(c.w, "again.safetensors")
dloco.write_init(model, again)
t2, meta2 = dloco.read_safetensors(again)
c.check("and written back, the same bytes under the same names",
        list(t2) == list(tensors) and all(t2[n].numpy().tobytes() == tensors[n].numpy().tobytes() for n in t2))
m_exp = json.loads(meta.get("dloco_manifest", "{}")).get("tensors")
m_mod = json.loads(dloco.manifest_json(want))["tensors"]
c.check("the export's manifest is the model's (names, shapes, roles, order)", m_exp == m_mod)

# ---- one learner, the same steps
store1, _, _ = run("one", 1)
c.stop("sync-one")
exp1 = os.path.join(c.w, "one.safetensors")
c.run([pc.DLOCO, "export", store1, "--format", "safetensors", exp1])
l2, l1, l0 = val_loss(exp), val_loss(exp1), val_loss(init)
print("manifest_run: val_loss init=%.4f one=%.4f two=%.4f steps=%d" % (l0, l1, l2, STEPS))
c.check("training lowered the loss (%.4f < %.4f)" % (l1, l0), l1 < l0)
c.check("two learners' model is below one learner's at equal steps (%.4f < %.4f)" % (l2, l1), l2 < l1)
c.done()
