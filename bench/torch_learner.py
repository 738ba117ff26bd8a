#!/usr/bin/python3
"""The same PyTorch GPT-2 loop (examples/torch/gpt2.py's model, AdamW, clip)
with and without dloco.Learner, interleaved in blocks so that a drift in the
machine's load hits both alike: ROUNDS x (BLOCK steps plain, BLOCK steps with
Learner.step after each optimizer step). Prints each mode's median ms/step
and tokens/s, the learner's counters, and `overhead: X.XXX` (with / without).
Usage: torch_learner.py ENDPOINT L C NH T B V BLOCK ROUNDS THREADS [--option k=v ...]"""
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "torch"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import torch  # noqa: E402

import dloco  # noqa: E402
from gpt2 import GPT2, adamw  # noqa: E402

ep = sys.argv[1]
L, C, NH, T, B, V, BLOCK, ROUNDS, THREADS = (int(x) for x in sys.argv[2:11])
opts = dict(o.split("=", 1) for o in sys.argv[11:] if "=" in o)
torch.set_num_threads(THREADS)
torch.manual_seed(0)
m = GPT2(L, NH, C, T, V)
m.init_weights(0)
opt = adamw(m, 1e-4)
x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
dl = dloco.Learner(m, connect=ep, run_id="dloco", learner_id="bench", fragments=4, max_tokens_per_step=B * T,
                   options=opts, gpt2=m.config)
dl.join(60)


in_step = []  # seconds inside Learner.step, per call


def block(with_dloco):
    t0 = time.perf_counter()
    for _ in range(BLOCK):
        loss = m(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        if with_dloco:
            lv = loss.item()
            t1 = time.perf_counter()
            dl.step(B * T, lv)
            in_step.append(time.perf_counter() - t1)
        else:
            loss.item()  # the same synchronisation point as the dloco loop
    return (time.perf_counter() - t0) / BLOCK


block(False), block(True)  # warm-up of both paths
plain, with_ = [], []
for _ in range(ROUNDS):
    plain.append(block(False))
    with_.append(block(True))
dl.finish(30)
st = dl.stats()
dl.close()
p, w = statistics.median(plain), statistics.median(with_)
print("torch plain:        %.1f ms/step  %.0f tok/s  (blocks: %s)" % (p * 1e3, B * T / p,
                                                                        " ".join("%.1f" % (v * 1e3) for v in plain)))
print("torch + dloco:      %.1f ms/step  %.0f tok/s  (blocks: %s)" % (w * 1e3, B * T / w,
                                                                        " ".join("%.1f" % (v * 1e3) for v in with_)))
print("learner: " + json.dumps({k: st[k] for k in ("steps", "pushes", "push_bytes", "accepted", "adopted",
                                                   "dropped_stale", "rebased", "flush_unanswered")}))
print("inside Learner.step: mean %.2f ms, max %.2f ms per call (%.2f%% of the plain step)" % (
    1e3 * statistics.mean(in_step), 1e3 * max(in_step), 100 * statistics.mean(in_step) / p))
print("torch_tok_s: %.0f" % (B * T / w))
print("overhead: %.3f" % (w / p))
