#!/usr/bin/python3
"""The same GPT-2 step in PyTorch (eager, fp32, AdamW, grad clipping), timed
on random tokens. Usage: torch_gpt.py L C NH T B V steps threads"""
import ctypes
import math
import sys
import time

import torch

L, C, NH, T, B, V, STEPS, THREADS = (int(x) for x in sys.argv[1:9])
torch.set_num_threads(THREADS)
torch.manual_seed(0)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(C)
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.c_proj = torch.nn.Linear(C, C)
        self.ln_2 = torch.nn.LayerNorm(C)
        self.c_fc = torch.nn.Linear(C, 4 * C)
        self.mlp_proj = torch.nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        hs = C // NH
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        a = a.masked_fill(self.mask, float("-inf")).softmax(-1)
        y = (a @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(torch.nn.functional.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(V, C)
        self.wpe = torch.nn.Embedding(T, C)
        self.h = torch.nn.ModuleList([Block() for _ in range(L)])
        self.ln_f = torch.nn.LayerNorm(C)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head, as in dloco
        return torch.nn.functional.cross_entropy(logits.view(-1, V), tgt.view(-1))


m = GPT()
with torch.no_grad():  # GPT-2 init, as dloco: N(0, 0.02), zero biases, unit layernorm
    for name, p in m.named_parameters():
        if name.endswith("bias"):
            p.zero_()
        elif "ln" in name:
            p.fill_(1.0)
        else:
            p.normal_(0.0, 0.02)
decay = [p for p in m.parameters() if p.dim() >= 2]
other = [p for p in m.parameters() if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                        lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
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
