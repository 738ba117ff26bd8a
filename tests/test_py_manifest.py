#!/usr/bin/python3
"""The package's manifests and init files, checked against dloco's own C
readers (no synchronizer): roles from named_parameters() (tied weights once
under the first name, nn.Embedding weights as embeddings, 1-D vectors, the
rest matrices, 3-D/4-D included, a roles override), the refusals (bad role,
a role for no parameter, shared storage, a 0-dim or empty parameter, an
overlong name), dloco.write_init's file read back by `dloco manifest` (the
C reader: the same manifest), and `dloco plan --manifest` giving the
fingerprint the library computes for the same model and P; and after
`cmake --install` into a fresh prefix, the installed package finds the
installed library with no DLOCO_LIBRARY."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pycluster as pc  # noqa: E402

pc.needs_torch()
sys.path.insert(0, os.path.join(pc.SRC, "python"))
os.environ["DLOCO_LIBRARY"] = pc.library()
import torch  # noqa: E402

import dloco  # noqa: E402

c = pc.Cluster("py_manifest")


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(64, 16)
        self.conv = torch.nn.Conv2d(4, 8, 3)           # a 4-D weight
        self.mix = torch.nn.Parameter(torch.randn(3, 4, 5))  # a 3-D one
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 64, bias=False)
        self.head.weight = self.emb.weight             # tied: once, as emb.weight


m = Tied()
man = dloco.manifest(m)
got = [(e.name, e.shape, e.role) for e in man]
want = [("mix", [3, 4, 5], "matrix"),  # a module's own parameters come before its children's
        ("emb.weight", [64, 16], "embedding"), ("conv.weight", [8, 4, 3, 3], "matrix"), ("conv.bias", [8], "vector"),
        ("norm.weight", [16], "vector"), ("norm.bias", [16], "vector")]
c.check("roles and tied weights: %s" % got, got == want)
over = dloco.manifest(m, roles={"mix": "embedding", "norm.bias": "matrix"})
c.check("a roles override", [e.role for e in over] == ["embedding", "embedding", "matrix", "vector", "vector", "matrix"])


def refused(what, fn, needle):
    try:
        fn()
        c.check("%s is refused" % what, False)
    except dloco.ManifestError as e:
        c.check("%s is refused naming it: %s" % (what, e), needle in str(e))


refused("an unknown role", lambda: dloco.manifest(m, roles={"mix": "bias"}), "mix")
refused("a role for no parameter", lambda: dloco.manifest(m, roles={"head.weight": "matrix"}), "head.weight")
shared = torch.zeros(10)
refused("two parameters on one storage",
        lambda: dloco.manifest([("a", shared[:6]), ("b", shared[4:])]), "share memory")
refused("a 0-dim parameter", lambda: dloco.manifest([("s", torch.tensor(1.0))]), "'s'")
refused("an empty parameter", lambda: dloco.manifest([("e", torch.zeros(0, 3))]), "'e'")
refused("a 128-byte name", lambda: dloco.manifest([("x" * 128, torch.zeros(2))]), "x" * 20)
refused("a model without parameters", lambda: dloco.manifest(torch.nn.ReLU()), "no parameters")
refused("a float64 parameter", lambda: dloco.manifest([("d", torch.zeros(2, dtype=torch.float64))]), "'d'")

# ---- the init file, read by dloco's C reader
init = os.path.join(c.w, "init.safetensors")
dloco.write_init(m, init)
r = c.run([pc.DLOCO, "manifest", init])
cm = json.loads(r.stdout)
c.check("dloco manifest reads write_init's file: the same manifest",
        cm["tensors"] == json.loads(dloco.manifest_json(man))["tensors"])
t, meta = dloco.read_safetensors(init)
c.check("the file holds each parameter's bytes in manifest order",
        list(t) == [e.name for e in man] and all(t[e.name].numpy().tobytes() == e.tensor.detach().numpy().tobytes()
                                                 for e in man))
raw = open(init, "rb").read()
hlen = int.from_bytes(raw[:8], "little")
c.check("its data starts 8-byte aligned (header %d bytes)" % hlen, (8 + hlen) % 8 == 0)

# ---- the fingerprint: the library's == dloco plan's for the same manifest and P
js = os.path.join(c.w, "m.json")
dloco.write_manifest(m, js)
plan = c.run([pc.DLOCO, "plan", "--manifest", js, "--fragments", "3"]).stdout
dl = dloco.Learner(m, connect="tcp://127.0.0.1:1", run_id="x", fragments=3, max_tokens_per_step=1)
fp = "%016x" % dl.fingerprint
spans = [dl.spans(p) for p in range(3)]
dl.close()
c.check("the library's fingerprint %s is dloco plan's" % fp, fp in plan)
c.check("the fragments' spans cover every tensor exactly once",
        sorted((n, s) for sp in spans for n, s, _, _ in sp if s == 0) == sorted((e.name, 0) for e in man) and
        sum(k for sp in spans for _, _, k, _ in sp) == sum(e.tensor.numel() for e in man))

# ---- cmake --install: the installed package finds the installed library by itself
prefix = os.path.join(c.w, "prefix")
c.run(["cmake", "--install", pc.BIN, "--prefix", prefix])
env = {k: v for k, v in os.environ.items() if k not in ("DLOCO_LIBRARY", "PYTHONPATH")}
env["PYTHONPATH"] = os.path.join(prefix, "lib", "python3", "dist-packages")
import subprocess  # noqa: E402
r = subprocess.run([pc.PY, "-c", "import dloco; print(dloco.__file__); print(dloco.check_library())"],
                   capture_output=True, text=True, env=env, cwd=c.w, timeout=120)
lines = r.stdout.split()
c.check("the installed package imports and loads the installed library (%s)" % (lines or r.stderr[-300:]),
        r.returncode == 0 and len(lines) == 2 and all(x.startswith(prefix) for x in lines))
c.done()
