#!/usr/bin/python3
"""The same GPT-2 step in PyTorch (eager, fp32, AdamW, grad clipping), timed
on random tokens, with examples/torch/gpt2.py's model (dloco's layout, tied
head). Usage: torch_gpt.py L C NH T B V steps threads"""
import ctypes
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "torch"))
from gpt2 import GPT2, adamw  # noqa: E402

L, C, NH, T, B, V, STEPS, THREADS = (int(x) for x in sys.argv[1:9])
torch.set_num_threads(THREADS)
torch.manual_seed(0)
m = GPT2(L, NH, C, T, V)
m.init_weights(0)  # GPT-2 init, as dloco: N(0, 0.02), zero biases, unit layernorm
opt = adamw(m, 1e-4)
x = torch.randint(0, V, (B, T))
y = torch.randint(0, V, (B, T))
WARM = 3
for i in range(WARM + STEPS):
    if i == WARM:
        t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = m(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
dt = (time.perf_counter() - t0) / STEPS


def blas():
    """The OpenBLAS this torch runs its matmuls on (Debian's links it through
    libblas.so.3): its core and threads, or "none" when it is another BLAS."""
    with open("/proc/self/maps") as f:
        libs = sorted({l.split()[-1] for l in f if "libopenblas" in l})
    if not libs:
        return "none", 0
    lib = ctypes.CDLL(libs[0])
    lib.openblas_get_corename.restype = ctypes.c_char_p
    return lib.openblas_get_corename().decode(), lib.openblas_get_num_threads()


core, bthreads = blas()
print("torch_cpu: torch %s params %d threads %d ms/step %.1f tok/s %.0f loss %.4f blas_core %s blas_threads %d" % (
    torch.__version__, sum(p.numel() for p in m.parameters()), THREADS, dt * 1e3, B * T / dt, loss.item(), core,
    bthreads))
