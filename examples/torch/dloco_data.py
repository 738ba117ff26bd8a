"""dloco's training data in PyTorch: raw text as bytes (vocab 256) or llm.c
uint16 token shards (a 256-int32 header, magic 20240520, version 1, the
token count at [2]), cut into sequences of T+1 tokens every T, and split
into training and validation sequences by the same fixed hash as
dloco-learner and `dloco eval` (XXH64 of the sequence index, seed 0x5EED):
the examples train on dloco-learner's training set and never on its
validation set."""
import os
import struct

import torch

SHARD_MAGIC = 20240520
M64 = (1 << 64) - 1
P1, P2, P3, P4, P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161, 9650029242287828579,
                      2870177450012600261)


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def xxh64_u64(v, seed):
    """XXH64 of the 8 little-endian bytes of v (the published algorithm, for
    an 8-byte input)."""
    h = (seed + P5 + 8) & M64
    k = (_rotl((v * P2) & M64, 31) * P1) & M64
    h ^= k
    h = (_rotl(h, 27) * P1 + P4) & M64
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    return h ^ (h >> 32)


def read_tokens(path):
    """All tokens of a file or a directory (sorted; .bin shards only when
    there are any) as an int64 tensor, and the kind ("text" or "shards")."""
    files = [os.path.join(path, f) for f in sorted(os.listdir(path))] if os.path.isdir(path) else [path]
    bins = [f for f in files if f.endswith(".bin")]
    with open(files[0], "rb") as f:
        head = f.read(4)
    shards = bool(bins) or (len(head) == 4 and struct.unpack("<i", head)[0] == SHARD_MAGIC)
    parts = []
    for f in (bins or files) if shards else files:
        raw = open(f, "rb").read()
        if shards:
            magic, version, n = struct.unpack("<3i", raw[:12])
            if magic != SHARD_MAGIC or version != 1 or len(raw) < 1024 + 2 * n:
                raise ValueError("%s: not an llm.c token shard (magic %d version %d)" % (f, magic, version))
            parts.append(torch.frombuffer(bytearray(raw[1024:1024 + 2 * n]), dtype=torch.int16).long() & 0xFFFF)
        else:
            parts.append(torch.frombuffer(bytearray(raw), dtype=torch.uint8).long())
    return torch.cat(parts), "shards" if shards else "text"


class Data:
    """Training batches (shuffled per epoch from `seed`, this learner's
    shard of the training sequences: index % shard_count == shard_index, as
    dloco-learner's --data_shard) and validation batches (never sharded)."""

    def __init__(self, path, T, val_frac=0.05, seed=1337, shard_index=0, shard_count=1):
        self.tok, self.kind = read_tokens(path)
        self.T = T
        nseq = (len(self.tok) - 1) // T if len(self.tok) > T else 0
        thresh = int(val_frac * 1000000.0)
        train, val, k = [], [], 0
        for s in range(nseq):
            if xxh64_u64(s, 0x5EED) % 1000000 < thresh:
                val.append(s * T)
            else:
                if k % max(shard_count, 1) == shard_index:
                    train.append(s * T)
                k += 1
        if not train or (val_frac > 0 and not val):
            raise ValueError("%s: %d sequences of %d leave an empty train or validation set" % (path, nseq, T))
        self.train, self.val = torch.tensor(train), torch.tensor(val)
        self.gen = torch.Generator().manual_seed(seed)
        self.perm, self.at = torch.randperm(len(self.train), generator=self.gen), 0
        self.vocab = int(self.tok.max()) + 1

    def _batch(self, offs):
        idx = offs[:, None] + torch.arange(self.T + 1)[None, :]
        seq = self.tok[idx]
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def next_train(self, B):
        out = []
        while len(out) < B:
            if self.at == len(self.perm):
                self.perm, self.at = torch.randperm(len(self.train), generator=self.gen), 0
            out.append(self.train[self.perm[self.at]])
            self.at += 1
        return self._batch(torch.stack(out))

    def val_batch(self, i, B):
        """Validation batch i: sequences i*B .. i*B+B-1, wrapping (as dloco's)."""
        n = len(self.val)
        return self._batch(self.val[torch.tensor([(i * B + j) % n for j in range(B)])])
