"""A PyTorch model as a dloco manifest: its parameters (named_parameters(),
tied weights once under the first name), each with a role, checked to be
fp32 and contiguous before anything touches the network; the manifest's JSON
form for `dloco-sync --manifest`; and safetensors files with the manifest in
their metadata for `dloco-sync --init_from`."""
import json
import math
import struct

from . import _lib
from .errors import ManifestError


class Entry:
    """One manifest tensor: `name`, `tensor` (the live parameter), `role`
    ("matrix" | "vector" | "embedding")."""

    __slots__ = ("name", "tensor", "role")

    def __init__(self, name, tensor, role):
        self.name, self.tensor, self.role = name, tensor, role

    @property
    def shape(self):
        return list(self.tensor.shape)

    def __repr__(self):
        return "Entry(%r, %s, %s)" % (self.name, self.shape, self.role)


def _named(model):
    if hasattr(model, "named_parameters"):
        return list(model.named_parameters())  # remove_duplicate: tied weights once, first name wins
    pairs = list(model.items()) if isinstance(model, dict) else list(model)
    seen, out = set(), []
    for name, t in pairs:
        if id(t) not in seen:
            seen.add(id(t))
            out.append((name, t))
    return out


def _embedding_ids(model):
    if not hasattr(model, "modules"):
        return set()
    import torch
    return {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}


def build(model, roles=None):
    """The manifest of `model` (an nn.Module, a dict or a list of (name,
    tensor) pairs): a list of Entry in named_parameters() order. Roles:
    nn.Embedding weights are embeddings, 1-D tensors vectors, the rest
    matrices; `roles` ({name: role}) overrides. Raises ManifestError naming
    the parameter for anything dloco cannot train: not fp32, not contiguous,
    0 or more than 4 dims, an empty tensor, a name dloco cannot carry, storage
    shared between two parameters, a role override for no parameter."""
    import torch
    roles = dict(roles or {})
    named = _named(model)
    if not named:
        raise ManifestError("the model has no parameters: nothing to train across learners")
    emb = _embedding_ids(model)
    out = []
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise ManifestError("parameter %r is a %s, not a torch tensor" % (name, type(t).__name__))
        if t.dtype != torch.float32:
            raise ManifestError("parameter %r is %s; dloco trains fp32 parameters only: keep the master weights "
                                "in fp32 (autocast or a bf16 copy for compute are fine)" % (name, t.dtype))
        if not t.is_contiguous():
            raise ManifestError("parameter %r is not contiguous (strides %s): make it so before training, e.g. "
                                "p.data = p.data.contiguous()" % (name, tuple(t.stride())))
        if not 1 <= t.dim() <= _lib.MAX_DIMS:
            raise ManifestError("parameter %r has %d dimensions; dloco takes 1 to %d (reshape a scalar to [1])"
                                % (name, t.dim(), _lib.MAX_DIMS))
        if t.numel() == 0:
            raise ManifestError("parameter %r is empty (shape %s)" % (name, list(t.shape)))
        if t.is_sparse or t.layout != torch.strided:
            raise ManifestError("parameter %r is not a dense strided tensor" % name)
        if not (1 <= len(name.encode()) <= _lib.NAME_MAX and all(ord(c) >= 32 and ord(c) != 127 for c in name)):
            raise ManifestError("parameter name %r: dloco needs 1 to %d UTF-8 bytes without control characters; "
                                "give the tensor a shorter name" % (name, _lib.NAME_MAX))
        if name in roles:
            role = roles.pop(name)
            if role not in _lib.ROLE_NAMES:
                raise ManifestError("role %r of %r: use matrix, vector or embedding" % (role, name))
            role = _lib.ROLE_OF[_lib.ROLE_NAMES[role]]
        elif id(t) in emb:
            role = "embedding"
        elif t.dim() == 1:
            role = "vector"
        else:
            role = "matrix"
        out.append(Entry(name, t, role))
    if roles:
        raise ManifestError("roles given for %s, which the model does not have as parameters (tied weights "
                            "count under their first name)" % ", ".join(repr(k) for k in sorted(roles)))
    _check_no_overlap(out)
    return out


def _check_no_overlap(entries):
    spans = sorted((e.tensor.device.type, e.tensor.device.index or 0, e.tensor.data_ptr(),
                    e.tensor.data_ptr() + 4 * e.tensor.numel(), e.name) for e in entries)
    for a, b in zip(spans, spans[1:]):
        if a[:2] == b[:2] and b[2] < a[3]:
            raise ManifestError("parameters %r and %r share memory; dloco needs each weight once (tie them "
                                "as one Parameter, or give dloco only one of them)" % (a[4], b[4]))


def to_json(entries, gpt2=None):
    """The manifest's JSON form (docs/ARCHITECTURE.md "Manifest"), for
    `dloco-sync --manifest FILE`."""
    doc = {"dloco_manifest": 1}
    if gpt2:
        doc["gpt"] = {k: int(gpt2[k]) for k in ("n_layer", "n_head", "n_embd", "seq_len", "vocab")}
    doc["tensors"] = [{"name": e.name, "shape": e.shape, "role": e.role} for e in entries]
    return json.dumps(doc, indent=None, separators=(", ", ": "))


def write_manifest(model, path, roles=None):
    """Write `model`'s manifest as JSON to `path` (for dloco-sync --manifest)."""
    text = to_json(build(model, roles))
    with open(path, "w") as f:
        f.write(text + "\n")
    return path


def write_init(model, path, roles=None):
    """Write `model`'s parameters as a safetensors file (F32, in manifest
    order, contiguous) whose __metadata__ carries the manifest (names, shapes,
    roles, order) under "dloco_manifest": version 0 of a run for
    `dloco-sync --init_from path`. Returns the manifest (a list of Entry)."""
    import torch
    entries = build(model, roles)
    head, at = {}, 0
    for e in entries:
        n = 4 * e.tensor.numel()
        head[e.name] = {"dtype": "F32", "shape": e.shape, "data_offsets": [at, at + n]}
        at += n
    meta = {"format": "pt", "dloco_manifest": to_json(entries)}
    blob = json.dumps(dict([("__metadata__", meta)] + list(head.items())), separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % 8)  # data 8-byte aligned, as the spec recommends
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for e in entries:
            t = e.tensor.detach().to("cpu", torch.float32).contiguous()
            f.write(t.numpy().tobytes() if t.numel() else b"")
    import os
    os.replace(tmp, path)
    return entries


def read_safetensors(path):
    """(dict name -> float32 CPU tensor in file order, __metadata__ dict) of a
    safetensors file of F32 tensors (what dloco writes and exports)."""
    import torch
    raw = bytearray(open(path, "rb").read())
    if len(raw) < 8:
        raise ManifestError("%s: too short for a safetensors file" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ManifestError("%s: header of %d bytes runs past the end of the file" % (path, n))
    head = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = head.pop("__metadata__", {}) or {}
    base = 8 + n
    items = sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0])
    out = {}
    for name, e in items:
        if e.get("dtype") != "F32":
            raise ManifestError("%s: tensor %r has dtype %s; only F32 is read" % (path, name, e.get("dtype")))
        b, end = e["data_offsets"]
        numel = math.prod(e["shape"]) if e["shape"] else 1
        if end - b != 4 * numel or base + end > len(raw):
            raise ManifestError("%s: tensor %r offsets [%d, %d] do not hold %d floats" % (path, name, b, end, numel))
        t = torch.frombuffer(raw, dtype=torch.float32, count=numel, offset=base + b) if numel else torch.zeros(0)
        out[name] = t.reshape(e["shape"]).clone()
    return out, meta


def load_into(model, path, strict=True):
    """Copy a safetensors file's tensors into `model`'s parameters by name
    (bit for bit); with strict, every manifest tensor must be in the file with
    its shape and the file must hold nothing else. Returns the names loaded."""
    import torch
    tensors, _ = read_safetensors(path)
    entries = build(model) if hasattr(model, "named_parameters") else None
    names = [e.name for e in entries] if entries else list(tensors)
    if strict:
        missing = [n for n in names if n not in tensors]
        extra = [n for n in tensors if n not in names]
        if missing or extra:
            raise ManifestError("%s does not match the model: missing %s, extra %s" % (path, missing[:3], extra[:3]))
    with torch.no_grad():
        for e in entries:
            if e.name in tensors:
                src = tensors[e.name]
                if list(src.shape) != e.shape:
                    raise ManifestError("%s: %r has shape %s, the model's is %s" % (path, e.name, list(src.shape),
                                                                                     e.shape))
                e.tensor.copy_(src)
    return [e.name for e in entries if e.name in tensors]
