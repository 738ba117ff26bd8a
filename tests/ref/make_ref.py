#!/usr/bin/python3
"""Write tests/data/gpt_ref.bin: a tiny GPT-2 built in PyTorch (float64) with
dloco's parameter layout, and what the C code must reproduce: logits, loss,
every parameter gradient, and the losses of 10 AdamW steps on one batch.

Run with Debian's python3-torch (deploy/setup.sh --with-torch):
    /usr/bin/python3 tests/ref/make_ref.py tests/data/gpt_ref.bin
CI does not need torch: the output file is committed.

File layout (little-endian):
  int32[16]  magic 0x46524C44 ("DLRF"), version 1, L, NH, C, T, V, B, nsteps, nparams, 0...
  float32[8] lr, beta1, beta2, eps, weight_decay, grad_clip, 0, 0
  float32[nparams]  initial parameters, dloco layout (wte, wpe, per-layer block, ln_f)
  int32[B*T] inputs, int32[B*T] targets
  float32[B*T*V] logits
  float64    loss
  float32[nparams] gradients of the mean loss
  float64[nsteps]  loss before each AdamW step (same batch every step)
"""
import math
import struct
import sys

import torch

L, NH, C, T, V, B, NSTEPS = 2, 4, 64, 64, 256, 4, 10
LR, BETA1, BETA2, EPS, WD, CLIP = 1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0

torch.manual_seed(42)
dt = torch.float64


def table():
    """(name, shape, decay) in dloco's buffer order (gpt/gpt.c)."""
    t = [("wte", (V, C), True), ("wpe", (T, C), True)]
    for l in range(L):
        p = "h.%d." % l
        t += [(p + "ln_1.weight", (C,), False), (p + "ln_1.bias", (C,), False),
              (p + "attn.c_attn.weight", (3 * C, C), True), (p + "attn.c_attn.bias", (3 * C,), False),
              (p + "attn.c_proj.weight", (C, C), True), (p + "attn.c_proj.bias", (C,), False),
              (p + "ln_2.weight", (C,), False), (p + "ln_2.bias", (C,), False),
              (p + "mlp.c_fc.weight", (4 * C, C), True), (p + "mlp.c_fc.bias", (4 * C,), False),
              (p + "mlp.c_proj.weight", (C, 4 * C), True), (p + "mlp.c_proj.bias", (C,), False)]
    t += [("ln_f.weight", (C,), False), ("ln_f.bias", (C,), False)]
    return t


def init(name, shape):
    # non-trivial values everywhere (biases and layernorm params too), so that
    # every gradient path is exercised
    if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
        return 1.0 + 0.1 * torch.randn(shape, dtype=dt)
    if len(shape) == 1:
        return 0.02 * torch.randn(shape, dtype=dt)
    return 0.08 * torch.randn(shape, dtype=dt)


TAB = table()
P = {n: init(n, s).requires_grad_(True) for n, s, _ in TAB}


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(idx, tgt):
    x = P["wte"][idx] + P["wpe"][:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    hs = C // NH
    for l in range(L):
        p = "h.%d." % l
        h = torch.nn.functional.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], 1e-5)
        qkv = h @ P[p + "attn.c_attn.weight"].t() + P[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        a = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        a = a.masked_fill(mask, float("-inf")).softmax(-1)
        y = (a @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + y @ P[p + "attn.c_proj.weight"].t() + P[p + "attn.c_proj.bias"]
        h = torch.nn.functional.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], 1e-5)
        h = gelu(h @ P[p + "mlp.c_fc.weight"].t() + P[p + "mlp.c_fc.bias"])
        x = x + h @ P[p + "mlp.c_proj.weight"].t() + P[p + "mlp.c_proj.bias"]
    x = torch.nn.functional.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
    logits = x @ P["wte"].t()
    loss = torch.nn.functional.cross_entropy(logits.view(-1, V), tgt.view(-1))
    return logits, loss


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).to(torch.float32)


def main(out):
    idx = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    params0 = flat([P[n] for n, _, _ in TAB])
    logits, loss = forward(idx, tgt)
    loss.backward()
    grads = flat([P[n].grad for n, _, _ in TAB])
    logits0, loss0 = logits.detach().to(torch.float32), loss.item()

    for p in P.values():
        p.grad = None
    opt = torch.optim.AdamW(
        [{"params": [P[n] for n, _, d in TAB if d], "weight_decay": WD},
         {"params": [P[n] for n, _, d in TAB if not d], "weight_decay": 0.0}],
        lr=LR, betas=(BETA1, BETA2), eps=EPS)
    losses = []
    for _ in range(NSTEPS):
        opt.zero_grad()
        _, l = forward(idx, tgt)
        l.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), CLIP)
        opt.step()
        losses.append(l.item())

    n = params0.numel()
    with open(out, "wb") as f:
        f.write(struct.pack("<16i", 0x46524C44, 1, L, NH, C, T, V, B, NSTEPS, n, 0, 0, 0, 0, 0, 0))
        f.write(struct.pack("<8f", LR, BETA1, BETA2, EPS, WD, CLIP, 0, 0))
        f.write(params0.numpy().astype("<f4").tobytes())
        f.write(idx.to(torch.int32).numpy().astype("<i4").tobytes())
        f.write(tgt.to(torch.int32).numpy().astype("<i4").tobytes())
        f.write(logits0.numpy().astype("<f4").tobytes())
        f.write(struct.pack("<d", loss0))
        f.write(grads.numpy().astype("<f4").tobytes())
        f.write(struct.pack("<%dd" % NSTEPS, *losses))
    print("wrote %s: %d params, loss %.6f, losses %s" % (out, n, loss0, " ".join("%.6f" % x for x in losses)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/gpt_ref.bin")
