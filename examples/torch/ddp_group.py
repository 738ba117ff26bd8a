#!/usr/bin/python3
"""A learner that is itself a data-parallel group: the ranks of one site
(a node's GPUs under torch.distributed; here gloo on the CPU) train one
replica with DistributedDataParallel, and rank 0 alone talks to dloco. After
each optimizer step rank 0 calls Learner.step and broadcasts which tensors
the adoption changed; every rank then receives those tensors from rank 0, so
the group stays one replica. This is how a multi-GPU site joins a dloco run
as one learner (its steps claim the whole group's tokens).

    /usr/bin/python3 examples/torch/ddp_group.py --ranks 2 --connect tcp://127.0.0.1:5555 \\
        --run_id llama --data corpus.txt --model llama

Each rank prints JSON lines: {"rank", "step", "changed", "checksum"} after
every step whose adoption changed parameters and at the end (the checksum is
over all parameters' bytes, so the ranks' lines can be compared)."""
import argparse
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt2  # noqa: E402
import llama  # noqa: E402


def checksum(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def broadcast_changed(model_params, names, changed, stop):
    """Rank 0's changed tensors (and its stop flag) to every rank."""
    flags = torch.zeros(len(names) + 1, dtype=torch.uint8)
    if dist.get_rank() == 0:
        for n in changed:
            flags[names.index(n)] = 1
        flags[-1] = 1 if stop else 0
    dist.broadcast(flags, src=0)
    for i in torch.nonzero(flags[:-1]).flatten().tolist():
        dist.broadcast(model_params[names[i]].data, src=0)
    return [names[i] for i in torch.nonzero(flags[:-1]).flatten().tolist()], bool(flags[-1])


def run(rank, args):
    dist.init_process_group("gloo", init_method=args.init_method, rank=rank, world_size=args.ranks)
    torch.set_num_threads(args.threads)
    dims = dict(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, seq_len=args.seq_len,
                vocab=args.vocab)
    if args.model == "gpt2":
        model = gpt2.GPT2(**dims)
        model.init_weights(args.seed)
        kw = {"gpt2": model.config}
    else:
        model = llama.Llama(**dims, seed=args.seed)
        kw = {}
    params = dict(model.named_parameters())
    names = list(params)
    # every rank trains its own shard of the data: rank r of the group is data shard r of `ranks`
    args.data_shard = "%d/%d" % (rank, args.ranks)
    data = gpt2.load_data(args)
    B, T = args.batch, args.seq_len
    dl = None
    if rank == 0 and args.connect:
        dl = gpt2.make_learner(args, model, B * T * args.ranks, **kw).handle_signals()
        dl.join(args.join_timeout)
    for p in params.values():  # the global model (rank 0's, after join) to the whole group
        dist.broadcast(p.data, src=0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = gpt2.adamw(model, args.lr)
    out = []
    for step in range(1, args.steps + 1):
        for g in opt.param_groups:
            g["lr"] = gpt2.lr_at(step, args.lr, args.warmup, args.steps)
        x, y = data.next_train(B)
        loss = ddp(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        changed, stop = [], False
        lv = torch.tensor([loss.item()])
        dist.all_reduce(lv)  # the group's mean loss is the learner's
        if dl:
            r = dl.step(B * T * args.ranks, lv.item() / args.ranks)
            changed, stop = r.tensors, r.stop_requested
        changed, stop = broadcast_changed(params, names, changed, stop)
        if changed:
            out.append({"rank": rank, "step": step, "changed": len(changed), "checksum": checksum(model)})
        if stop:
            break
    final = {}
    if dl:
        final["flush_unanswered"] = dl.finish(args.finish_timeout)
        final["adopted"] = dl.stats()["adopted"]
    # finish may have adopted the final updates: one last broadcast of everything
    for p in params.values():
        dist.broadcast(p.data, src=0)
    out.append(dict(final, rank=rank, step="end", checksum=checksum(model)))
    for line in out:
        print(json.dumps(line), flush=True)
    if dl:
        dl.close()
    del ddp  # DDP's reducer goes before its process group
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    gpt2.common_args(ap, dict(n_layer=2, n_head=2, n_embd=32, seq_len=32, vocab=256))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--model", default="llama", choices=["llama", "gpt2"])
    ap.add_argument("--init_method", default=None, help="torch.distributed init (default: a file in /tmp)")
    args = ap.parse_args()
    if args.init_method is None:
        import tempfile
        args.init_method = "file://" + os.path.join(tempfile.mkdtemp(prefix="dloco_ddp"), "rendezvous")
    torch.multiprocessing.spawn(run, args=(args,), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
