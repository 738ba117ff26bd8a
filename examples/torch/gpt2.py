#!/usr/bin/python3
"""A nanoGPT-style GPT-2 in PyTorch whose parameters are dloco's GPT-2 tensor
table (llm.c layout: wte [Vp, C] with the vocabulary padded to a multiple of
64 rows, wpe, h.<l>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
mlp.c_proj}.{weight, bias} with nn.Linear's [out, in] weights, ln_f; the LM
head tied to wte over the real vocabulary), trained on dloco's data format,
so it can join a fleet of `dloco-learner`s of the same config: same manifest,
same fingerprint.

    /usr/bin/python3 examples/torch/gpt2.py --connect tcp://127.0.0.1:5555 --run_id run1 \\
        --data corpus.txt --n_layer 2 --n_head 2 --n_embd 32 --seq_len 32 --vocab 256 --steps 200

Without --connect it trains alone (the same loop without dloco). Its last
line is a JSON summary. Needs Debian's python3-torch and libdloco_learner
(PYTHONPATH=python from a checkout; docs/LIBRARY.md)."""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def padded_vocab(vocab):
    return (vocab + 63) // 64 * 64  # dloco's Vp (core/model.c)


class Attention(torch.nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.c_proj = torch.nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.NH, C // self.NH).transpose(1, 2) for z in (q, k, v))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.NH))
        y = a.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(torch.nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = torch.nn.Linear(C, 4 * C)
        self.c_proj = torch.nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(torch.nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(C)
        self.attn = Attention(C, NH)
        self.ln_2 = torch.nn.LayerNorm(C)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(torch.nn.Module):
    """dloco's GPT-2. Parameters in named_parameters() order are dloco's
    table (wte, wpe, h.0..., ln_f); wte and wpe are plain Parameters so their
    names carry no ".weight", as in the table."""

    def __init__(self, n_layer, n_head, n_embd, seq_len, vocab):
        super().__init__()
        self.config = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, seq_len=seq_len, vocab=vocab)
        self.V, self.T = vocab, seq_len
        self.wte = torch.nn.Parameter(torch.zeros(padded_vocab(vocab), n_embd))
        self.wpe = torch.nn.Parameter(torch.zeros(seq_len, n_embd))
        self.h = torch.nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = torch.nn.LayerNorm(n_embd)

    @torch.no_grad()
    def init_weights(self, seed):
        """dloco's GPT-2 init in distribution (core/model.c): N(0, 0.02),
        residual projections N(0, 0.02/sqrt(2L)), biases 0, layernorm weights 1,
        padded wte rows 0. (Not the same numbers: a learner's initial values are
        replaced by the global model at join anyway.)"""
        g = torch.Generator().manual_seed(seed)
        resid = 0.02 / math.sqrt(2 * len(self.h))
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0 if name.endswith(".weight") else 0.0)
            else:
                p.normal_(0.0, resid if name.endswith("c_proj.weight") else 0.02, generator=g)
        self.wte[self.V:].zero_()

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = F.embedding(idx, self.wte) + self.wpe[:T]
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte[:self.V])  # tied head over the real vocabulary
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))

    def load_dloco(self, tensors):
        """Load dloco's exported GPT-2 (dloco export --format safetensors: names
        as here, wte without its padded rows) bit for bit."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                src = tensors[name]
                if name == "wte":
                    p.zero_()
                    p[:src.shape[0]].copy_(src)
                else:
                    p.copy_(src.reshape(p.shape))


def adamw(model, lr, weight_decay=0.1):
    """dloco-learner's AdamW: decay on matrices and embeddings, not on vectors."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": other, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step, lr, warmup, steps, min_frac=0.1):
    """dloco-learner's schedule (gpt/train.c): linear warm-up, cosine to min_frac * lr."""
    if step <= warmup:
        return lr * step / max(warmup, 1)
    if step >= steps:
        return lr * min_frac
    frac = (step - warmup) / (steps - warmup)
    return lr * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


def evaluate(model, data, B, batches):
    model.eval()
    with torch.no_grad():
        losses = [model(*data.val_batch(i, B)).item() for i in range(batches)]
    model.train()
    return sum(losses) / len(losses)


def add_dloco_args(ap):
    """The options every example shares: where the synchronizer is, and the
    library's networked options as --option key=value."""
    ap.add_argument("--connect", help="the synchronizer's endpoint(s); none: train alone")
    ap.add_argument("--run_id", default="dloco")
    ap.add_argument("--id", help="learner id (default <hostname>-<pid>)")
    ap.add_argument("--fragments", type=int, default=4)
    ap.add_argument("--events", help="the library's event log (docs/EVENTS.md)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a networked option of the library (adopt, push_codec, ...; docs/LIBRARY.md)")
    ap.add_argument("--binding", default="auto", choices=["auto", "host", "callbacks"])
    ap.add_argument("--join_timeout", type=float, default=None, help="seconds (default: the library's 30 s)")
    ap.add_argument("--finish_timeout", type=float, default=None)


def make_learner(args, model, tokens_per_step, **kw):
    import dloco
    opts = dict(o.split("=", 1) for o in args.option)
    if args.events:
        opts["events"] = args.events
    return dloco.Learner(model, connect=args.connect, run_id=args.run_id, learner_id=args.id,
                         fragments=args.fragments, max_tokens_per_step=tokens_per_step, options=opts,
                         binding=args.binding, **kw)


def common_args(ap, model_defaults):
    """The flags of the examples' training loop (train_loop)."""
    add_dloco_args(ap)
    ap.add_argument("--data", required=True, help="text file, llm.c .bin shard, or a directory of either")
    for k, v in model_defaults.items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data_shard", default="0/1", help="I/N: this learner's shard of the training sequences")
    ap.add_argument("--val_batches", type=int, default=0, help="evaluate on this many validation batches at the end")
    ap.add_argument("--loss_log", help="append each step's training loss here, one per line")
    ap.add_argument("--save", help="write the final parameters as safetensors (dloco.write_init)")
    ap.add_argument("--state", help="this learner's own restart file: resume from it when it exists (step, "
                    "AdamW state, data position, parameters) and write it every --state_every steps and at the end")
    ap.add_argument("--state_every", type=int, default=100)


def save_state(path, step, model, opt, data):
    """The caller's part of a restart (the library keeps none): written to path.tmp, then renamed, so a
    kill leaves the old file or the new one."""
    st = {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
          "data": {"perm": data.perm, "at": data.at, "gen": data.gen.get_state()}}
    torch.save(st, path + ".tmp")
    with open(path + ".tmp", "rb") as f:
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def load_state(path, model, opt, data):
    """Resume from save_state's file: returns its step (0 when there is none)."""
    if not path or not os.path.exists(path):
        return 0
    st = torch.load(path, weights_only=False)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["optimizer"])
    data.perm, data.at = st["data"]["perm"], st["data"]["at"]
    data.gen.set_state(st["data"]["gen"])
    return int(st["step"])


def load_data(args):
    from dloco_data import Data
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    si, sc = (int(x) for x in args.data_shard.split("/"))
    return Data(args.data, args.seq_len, seed=args.seed, shard_index=si, shard_count=sc)


def train_loop(args, model, data, **learner_kw):
    """The examples' loop: a plain PyTorch loop, plus three dloco lines when
    --connect is given. Prints a JSON summary as its last line."""
    opt = adamw(model, args.lr)
    B, T = args.batch, args.seq_len
    start = load_state(args.state, model, opt, data)  # a restart: the schedule, AdamW and the data go on
    dl = None
    if args.connect:  # 1 of 3: the learner, joined (the global model replaces the init)
        import dloco
        dl = make_learner(args, model, B * T, start_step=start, **learner_kw).handle_signals()
        try:
            dl.join(args.join_timeout)
        except dloco.Stopped:  # SIGTERM while joining: nothing trained, nothing to flush
            dl.close()
            print(json.dumps({"steps": 0, "stopped": True}), flush=True)
            return None
    loss_log = open(args.loss_log, "a") if args.loss_log else None
    t0, step, adopted, lv = time.time(), start, 0, float("nan")
    for step in range(start + 1, args.steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.lr, args.warmup, args.steps)
        x, y = (t.to(args.device) for t in data.next_train(B))
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        if loss_log:
            loss_log.write("%.6f\n" % lv)
            loss_log.flush()
        if dl:  # 2 of 3: push what is due, adopt what has arrived
            r = dl.step(B * T, lv)
            adopted += r.adopted
            if r.stop_requested:
                break
        if args.state and step % args.state_every == 0:
            save_state(args.state, step, model, opt, data)
    summary = {"steps": step, "train_loss": lv, "wall_s": round(time.time() - t0, 3), "resumed_at": start}
    if dl:  # 3 of 3: final pushes, their decisions, Bye
        summary["flush_unanswered"] = dl.finish(args.finish_timeout,
                                                reason="signal" if dl.stop_requested else "done")
        summary.update(stats=dl.stats(), fingerprint="%016x" % dl.fingerprint, adopted=adopted,
                       stopped=dl.stop_requested)
        dl.close()
    if args.state:
        save_state(args.state, step, model, opt, data)
    if args.val_batches:
        summary["val_loss"] = evaluate(model, data, B, args.val_batches)
    if args.save:
        import dloco
        dloco.write_init(model, args.save)
    print(json.dumps(summary), flush=True)
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common_args(ap, dict(n_layer=2, n_head=2, n_embd=32, seq_len=32, vocab=256))
    args = ap.parse_args()
    data = load_data(args)
    model = GPT2(args.n_layer, args.n_head, args.n_embd, args.seq_len, args.vocab).to(args.device)
    model.init_weights(args.seed)
    train_loop(args, model, data, gpt2=model.config)


if __name__ == "__main__":
    main()
