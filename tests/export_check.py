#!/usr/bin/python3
"""The exported model files of tests/test_export.sh, read with nothing but
their published formats (struct + json + torch.frombuffer; no safetensors or
transformers package), loaded into a float64 PyTorch twin of dloco's GPT, and
evaluated on the exact sequences `dloco eval --dump_seqs` evaluated.

Usage: export_check.py SEQS DLOCO_LOSS NH [--safetensors F] [--hf DIR] [--llmc F] [--tol 1e-4]
Prints one machine-readable line per format:
    export_check: format=NAME loss=X dloco=Y diff=D
and exits 1 when any |loss - dloco| > tol (or a file breaks its format).
Needs Debian's python3-torch (deploy/setup.sh --with-torch): run it with /usr/bin/python3.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

DT = torch.float64
LAYER = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
         "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
         "mlp.c_proj.bias"]
CONV1D = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}


def fail(msg):
    print("export_check: FAIL: " + msg)
    sys.exit(1)


def read_safetensors(path):
    """{name: float64 tensor} and the __metadata__, per the safetensors spec."""
    raw = open(path, "rb").read()
    if len(raw) < 8:
        fail("%s: too short" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        fail("%s: header length %d beyond the file" % (path, n))
    if (8 + n) % 8:
        fail("%s: data does not start 8-byte aligned (header %d)" % (path, n))
    head = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = head.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in meta.values()):
        fail("%s: __metadata__ values must be strings" % path)
    data = bytearray(raw[8 + n:])
    spans, out = [], {}
    for name, e in head.items():
        if e["dtype"] != "F32":
            fail("%s: %s has dtype %s" % (path, name, e["dtype"]))
        b, end = e["data_offsets"]
        numel = math.prod(e["shape"]) if e["shape"] else 1
        if end - b != 4 * numel:
            fail("%s: %s offsets [%d, %d] for %d floats" % (path, name, b, end, numel))
        spans.append((b, end))
        t = torch.frombuffer(data, dtype=torch.float32, count=numel, offset=b) if numel else torch.zeros(0)
        out[name] = t.reshape(e["shape"]).to(DT)
    spans.sort()
    at = 0
    for b, end in spans:
        if b != at:
            fail("%s: tensors not contiguous at %d" % (path, b))
        at = end
    if at != len(data):
        fail("%s: %d data bytes, tensors cover %d" % (path, len(data), at))
    return out, meta


def from_dloco_names(t):
    return t


def from_hf_names(t):
    """HF GPT2LMHeadModel names -> dloco's; Conv1D weights are [in, out]: transpose back."""
    out = {}
    for name, v in t.items():
        n = name[len("transformer."):] if name.startswith("transformer.") else name
        if n in ("wte.weight", "wpe.weight"):
            n = n[:3]
        suffix = n.split(".", 2)[2] if n.startswith("h.") else ""
        out[n] = v.t().contiguous() if suffix in CONV1D else v
    return out


def read_llmc(path):
    """llm.c train_gpt2.c: int32 header[256], fp32 params in its stacked order."""
    raw = bytearray(open(path, "rb").read())
    h = struct.unpack("<256i", raw[:1024])
    if h[0] != 20240326 or h[1] != 3:
        fail("%s: magic/version %d/%d" % (path, h[0], h[1]))
    maxT, V, L, NH, C, Vp = h[2], h[3], h[4], h[5], h[6], h[7]
    if Vp % 128 or Vp < V:
        fail("%s: padded vocab %d" % (path, Vp))
    sizes = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln_1.weight", (L, C)), ("ln_1.bias", (L, C)),
             ("attn.c_attn.weight", (L, 3 * C, C)), ("attn.c_attn.bias", (L, 3 * C)),
             ("attn.c_proj.weight", (L, C, C)), ("attn.c_proj.bias", (L, C)), ("ln_2.weight", (L, C)),
             ("ln_2.bias", (L, C)), ("mlp.c_fc.weight", (L, 4 * C, C)), ("mlp.c_fc.bias", (L, 4 * C)),
             ("mlp.c_proj.weight", (L, C, 4 * C)), ("mlp.c_proj.bias", (L, C)), ("ln_f.weight", (C,)),
             ("ln_f.bias", (C,))]
    total = sum(math.prod(s) for _, s in sizes)
    if len(raw) != 1024 + 4 * total:
        fail("%s: %d bytes, header implies %d" % (path, len(raw), 1024 + 4 * total))
    flat = torch.frombuffer(raw, dtype=torch.float32, offset=1024).to(DT)
    out, at = {}, 0
    for name, shape in sizes:
        n = math.prod(shape)
        v = flat[at:at + n].reshape(shape)
        at += n
        if name == "wte":
            if Vp > V and v[V:].abs().max().item() != 0.0:
                fail("%s: padded wte rows are not zero" % path)
            out["wte"] = v[:V]
        elif name in ("wpe", "ln_f.weight", "ln_f.bias"):
            out[name] = v
        else:
            for l in range(L):
                out["h.%d.%s" % (l, name)] = v[l]
    return out, {"n_head": str(NH)}


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def loss_of(P, NH, idx, tgt):
    """dloco's GPT (gpt/gpt.c) in float64: examples/torch/gpt2.py's model (dloco's layout,
    tied head over the real vocabulary) loaded with the file's tensors."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "torch"))
    from gpt2 import GPT2
    V, C = P["wte"].shape
    L = sum(1 for k in P if k.endswith(".ln_1.weight"))
    for k in ["wte", "wpe", "ln_f.weight", "ln_f.bias"] + ["h.%d.%s" % (l, s) for l in range(L) for s in LAYER]:
        if k not in P:
            fail("tensor %s missing" % k)
    m = GPT2(L, NH, C, P["wpe"].shape[0], V).to(DT)
    m.load_dloco(P)
    with torch.no_grad():
        return m(idx, tgt).item()


def loss_hf(P, NH, idx, tgt):
    """The same model the way HF GPT2LMHeadModel computes it, on the HF names as
    they are: Conv1D is x @ W + b with W [in, out] (modeling_gpt2.py), no
    transposing back, so the export's orientation is checked against HF's
    convention rather than against dloco's own inverse."""
    B, T = idx.shape
    t = lambda n: P["transformer." + n]
    V, C = t("wte.weight").shape
    L = sum(1 for k in P if k.endswith(".ln_1.weight"))
    conv = lambda x, n: x @ t(n + ".weight") + t(n + ".bias")
    ln = lambda x, n: torch.nn.functional.layer_norm(x, (C,), t(n + ".weight"), t(n + ".bias"), 1e-5)
    x = t("wte.weight")[idx] + t("wpe.weight")[:T]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    hs = C // NH
    for l in range(L):
        p = "h.%d." % l
        q, k, v = conv(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (z.view(B, T, NH, hs).transpose(1, 2) for z in (q, k, v))
        a = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(mask, float("-inf")).softmax(-1)
        x = x + conv((a @ v).transpose(1, 2).contiguous().view(B, T, C), p + "attn.c_proj")
        x = x + conv(gelu(conv(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    logits = ln(x, "ln_f") @ t("wte.weight").t()  # tie_word_embeddings
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1)).item()


def read_seqs(path):
    raw = bytearray(open(path, "rb").read())
    magic, ver, batches, B, T, V = struct.unpack("<6i", raw[:24])
    if magic != 0x51534C44 or ver != 1:
        fail("%s: not a dloco eval dump" % path)
    if len(raw) != 32 + batches * B * 2 * T * 4:
        fail("%s: size %d for %d x %d sequences of %d" % (path, len(raw), batches, B, T))
    s = torch.frombuffer(raw, dtype=torch.int32, offset=32).reshape(batches, B, 2, T).long()
    return s, V


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seqs")
    ap.add_argument("dloco_loss", type=float)
    ap.add_argument("n_head", type=int)
    ap.add_argument("--safetensors")
    ap.add_argument("--hf")
    ap.add_argument("--llmc")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    seqs, V = read_seqs(a.seqs)
    jobs = []
    if a.safetensors:
        t, meta = read_safetensors(a.safetensors)
        if meta.get("dloco_names") != "dloco":
            fail("safetensors metadata %r" % meta)
        jobs.append(("safetensors", from_dloco_names(t), meta))
    if a.hf:
        t, meta = read_safetensors(os.path.join(a.hf, "model.safetensors"))
        cfg = json.load(open(os.path.join(a.hf, "config.json")))
        for k, want in (("model_type", "gpt2"), ("activation_function", "gelu_new"), ("tie_word_embeddings", True),
                        ("n_head", a.n_head), ("vocab_size", V), ("layer_norm_epsilon", 1e-5)):
            if cfg.get(k) != want:
                fail("hf config.json %s = %r, expected %r" % (k, cfg.get(k), want))
        if cfg.get("architectures") != ["GPT2LMHeadModel"]:
            fail("hf config.json architectures %r" % cfg.get("architectures"))
        if any(not k.startswith("transformer.") for k in t):
            fail("hf names without the transformer. prefix: %r" % [k for k in t if not k.startswith("transformer.")])
        P = from_hf_names(t)
        if t["transformer.h.0.attn.c_attn.weight"].shape != (cfg["n_embd"], 3 * cfg["n_embd"]):
            fail("hf c_attn.weight is %r, Conv1D wants [in, out]" % (tuple(t["transformer.h.0.attn.c_attn.weight"].shape),))
        jobs.append(("hf", P, meta))
        jobs.append(("hf-conv1d", t, meta))
    if a.llmc:
        t, meta = read_llmc(a.llmc)
        jobs.append(("llmc", t, meta))
    bad = 0
    for name, P, meta in jobs:
        nh = int(meta.get("n_head", a.n_head))
        if nh != a.n_head:
            fail("%s says n_head %d, expected %d" % (name, nh, a.n_head))
        f = loss_hf if name == "hf-conv1d" else loss_of
        losses = [f(P, nh, seqs[i, :, 0], seqs[i, :, 1]) for i in range(seqs.shape[0])]
        loss = sum(losses) / len(losses)
        diff = abs(loss - a.dloco_loss)
        print("export_check: format=%s loss=%.9f dloco=%.9f diff=%.3g" % (name, loss, a.dloco_loss, diff))
        if not diff <= a.tol:
            bad = 1
    if not jobs:
        fail("no model file given")
    print("export_check: %s" % ("FAILED" if bad else "ok"))
    sys.exit(bad)


if __name__ == "__main__":
    main()
