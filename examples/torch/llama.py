#!/usr/bin/python3
"""A small Llama-style model (RMSNorm, SwiGLU MLP, rotary position
embeddings, untied LM head) that dloco has never heard of, trained across
learners through a manifest run:

    # version 0 of the run, with the manifest (names, shapes, roles) in its metadata
    /usr/bin/python3 examples/torch/llama.py --write_init init.safetensors
    dloco-sync --store st --init_from init.safetensors --fragments 4 --run_id llama ...
    /usr/bin/python3 examples/torch/llama.py --connect tcp://127.0.0.1:5555 --run_id llama --data corpus.txt

Its parameters are plain PyTorch names (tok.weight, layers.0.attn.wq.weight,
...); the token embedding is an nn.Embedding, so dloco merges it as an
embedding (weighted mean), everything else by radial-directional averaging."""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt2  # noqa: E402  (the shared loop and flags)


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    """Rotary embedding on [B, H, T, D] (pairs (2i, 2i+1) rotated)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(torch.nn.Module):
    def __init__(self, dim, n_head):
        super().__init__()
        self.nh, self.hd = n_head, dim // n_head
        self.wq = torch.nn.Linear(dim, dim, bias=False)
        self.wk = torch.nn.Linear(dim, dim, bias=False)
        self.wv = torch.nn.Linear(dim, dim, bias=False)
        self.wo = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = (w(x).view(B, T, self.nh, self.hd).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        a = a.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
        return self.wo((a.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))


class SwiGLU(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = torch.nn.Linear(dim, hidden, bias=False)
        self.w3 = torch.nn.Linear(dim, hidden, bias=False)
        self.w2 = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Layer(torch.nn.Module):
    def __init__(self, dim, n_head, hidden):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, n_head)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(torch.nn.Module):
    def __init__(self, n_layer=2, n_head=2, n_embd=32, seq_len=32, vocab=256, seed=1337):
        super().__init__()
        torch.manual_seed(seed)
        hidden = 64 * ((8 * n_embd // 3 + 63) // 64)
        self.tok = torch.nn.Embedding(vocab, n_embd)
        self.layers = torch.nn.ModuleList([Layer(n_embd, n_head, hidden) for _ in range(n_layer)])
        self.norm = RMSNorm(n_embd)
        self.head = torch.nn.Linear(n_embd, vocab, bias=False)
        hd = n_embd // n_head
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.arange(seq_len).float()[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02 / math.sqrt(2 * n_layer) if name.endswith(("wo.weight", "w2.weight"))
                              else 0.02)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T])
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpt2.common_args(ap, dict(n_layer=2, n_head=2, n_embd=32, seq_len=32, vocab=256))
    ap.add_argument("--write_init", metavar="FILE",
                    help="write the seeded initial model with its manifest (for dloco-sync --init_from) and exit")
    ap.add_argument("--write_manifest", metavar="FILE", help="write the manifest as JSON (dloco-sync --manifest)")
    if "--write_init" in sys.argv or "--write_manifest" in sys.argv:
        for a in ap._actions:
            if a.dest == "data":
                a.required = False
    args = ap.parse_args()
    model = Llama(args.n_layer, args.n_head, args.n_embd, args.seq_len, args.vocab, seed=args.seed)
    if args.write_init or args.write_manifest:
        sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
        import dloco
        if args.write_init:
            dloco.write_init(model, args.write_init)
        if args.write_manifest:
            dloco.write_manifest(model, args.write_manifest)
        return
    data = gpt2.load_data(args)
    gpt2.train_loop(args, model.to(args.device), data)


if __name__ == "__main__":
    main()
