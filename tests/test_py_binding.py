#!/usr/bin/python3
"""The two ways the package binds parameters, each against a real
dloco-sync (GPT-2 run), in this process: host (zero copy: the library reads
and writes the tensors' memory) and callbacks (the path of CUDA tensors, here
forced on CPU tensors). For each: after join the model is the store's global
model bit for bit (dloco export); a learner trains with adopt=overwrite and
finishes with every final push answered, after which its parameters are the
store's final global model bit for bit (every fragment's last merge adopted
by theta = global); the StepResults name the tensors that changed, and those
are exactly the tensors whose values changed in that call."""
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
from gpt2 import GPT2, adamw  # noqa: E402

torch.set_num_threads(1)
c = pc.Cluster("py_binding")
CFG = dict(n_layer=2, n_head=2, n_embd=32, seq_len=32, vocab=256)
data = Data(c.corpus(), 32)


def export(tag):
    out = os.path.join(c.w, "%s.safetensors" % tag)
    c.run([pc.DLOCO, "export", os.path.join(c.w, "store"), "--format", "safetensors", out])
    return dloco.read_safetensors(out)[0]


def differs(model, tensors):
    """Names of the parameters that are not bit-identical to the exported ones."""
    bad = []
    for n, p in model.named_parameters():
        v = p.detach()[:tensors[n].shape[0]] if n == "wte" else p.detach()
        if v.numpy().tobytes() != tensors[n].numpy().tobytes():
            bad.append(n)
    return bad


ep = c.start_sync("sync", "--fragments", "4", "--H", "8", *pc.OUTER)
for i, binding in enumerate(("host", "callbacks")):
    model = GPT2(**CFG)
    model.init_weights(100 + i)  # not the run's init: join must replace it
    dl = dloco.Learner(model, connect=ep, run_id="dloco", learner_id=binding, fragments=4, max_tokens_per_step=256,
                       gpt2=CFG, binding=binding, options={"adopt": "overwrite", "events": c.ev(binding)})
    c.check("%s: the binding is %s" % (binding, dl.binding), dl.binding == binding)
    dl.join(60)
    bad = differs(model, export("%s-join" % binding))
    c.check("%s: after join the model is the global model bit for bit (%d tensors differ)" % (binding, len(bad)),
            not bad)
    opt = adamw(model, 3e-3)
    wrong, changes = [], 0
    for step in range(48):
        x, y = data.next_train(8)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        r = dl.step(256, loss.item())
        moved = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
        changes += bool(r.tensors)
        if not moved <= set(r.tensors):  # an adopted tensor may keep its values; none may change unreported
            wrong.append((step, sorted(moved - set(r.tensors))))
    c.check("%s: %d steps adopted, and no tensor changed unreported (%s)" % (binding, changes, wrong[:2]),
            changes > 0 and not wrong)
    c.check("%s: finish answered every final push" % binding, dl.finish(30) == 0)
    bad = differs(model, export("%s-end" % binding))
    c.check("%s: after finish (adopt=overwrite) the model is the final global model bit for bit (%d differ: %s)"
            % (binding, len(bad), bad[:3]), not bad)
    st = dl.stats()
    c.check("%s: stats: state done, pushes accepted (%s, %d)" % (binding, st["state"], st["accepted"]),
            st["state"] == "done" and st["accepted"] > 0)
    dl.close()
c.done()
