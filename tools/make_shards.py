#!/usr/bin/python3
# Your own text as llm.c token shards, with a real tokenizer: trains a
# SentencePiece BPE vocabulary on the text, encodes it, writes the shards.
"""make_shards.py: text -> SentencePiece BPE vocabulary -> llm.c token shards.

Usage:
  /usr/bin/python3 tools/make_shards.py TEXT [TEXT ...] --out DIR [--vocab 4096]
      [--shard_tokens 100000000] [--max_sentences 2000000]

TEXT is a file or a directory (its regular files, sorted; hidden files,
fortune's .dat index files and symlinks skipped: what dloco-learner --data
reads). Writes into DIR (created; existing outputs are refused):
  tokenizer.model, tokenizer.vocab   the SentencePiece model (BPE, byte
                                     fallback: any text encodes, no <unk>)
  shard_000000.bin, ...              llm.c token shards (1024-byte header,
                                     magic 20240520, version 1, uint16 tokens)
Text is encoded exactly (byte fallback, no normalisation, no dummy prefix:
decoding a file's tokens gives its text back, newlines and tabs as byte
pieces); each input file ends with </s> (id 2), the document separator. Prints the dloco flags to use last:
  dloco-learner --data DIR --vocab V ...   dloco-sync --vocab V --eval_data DIR
and `dloco export STORE --format hf --tokenizer DIR/tokenizer.model OUT`
puts the tokenizer next to the exported model. Needs python3-sentencepiece
(deploy/setup.sh installs it); run with /usr/bin/python3. Exit status 2 on a
bad argument or input, with the reason.
"""
import argparse
import array
import os
import sys
import tempfile

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256


def die(msg):
    print("make_shards.py: " + msg, file=sys.stderr)
    sys.exit(2)


def list_inputs(paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            for name in sorted(os.listdir(p)):
                full = os.path.join(p, name)
                if name.startswith(".") or name.endswith(".dat") or os.path.islink(full) or not os.path.isfile(full):
                    continue
                files.append(full)
        elif os.path.isfile(p):
            files.append(p)
        else:
            die("%s: no such file or directory" % p)
    if not files:
        die("no input files in %s" % " ".join(paths))
    return files


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def write_shard(path, tokens):
    header = array.array("i", [0] * HEADER_INTS)
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 2)[2], usage=__doc__.split("Usage:\n")[1].split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("text", nargs="+")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--vocab", type=int, default=4096, help="vocabulary size, 259..65535 (uint16 tokens)")
    ap.add_argument("--shard_tokens", type=int, default=100_000_000, help="tokens per shard file (< 2^31)")
    ap.add_argument("--max_sentences", type=int, default=2_000_000, help="lines sampled to train the vocabulary")
    a = ap.parse_args()
    if not 259 <= a.vocab <= 65535:
        die("--vocab %d: must be in 259..65535 (256 byte pieces + 3 specials at least; tokens are uint16)" % a.vocab)
    if not 1 <= a.shard_tokens < 2**31:
        die("--shard_tokens %d: must be in 1..2^31-1" % a.shard_tokens)
    try:
        import sentencepiece as spm
    except ImportError:
        die("python3-sentencepiece is missing: run deploy/setup.sh (or apt-get install python3-sentencepiece), "
            "and use /usr/bin/python3")
    files = list_inputs(a.text)
    os.makedirs(a.out, exist_ok=True)
    model_prefix = os.path.join(a.out, "tokenizer")
    if os.path.exists(model_prefix + ".model") or any(n.startswith("shard_") for n in os.listdir(a.out)):
        die("%s already holds a tokenizer or shards: give an empty --out" % a.out)

    # 1. the vocabulary, from the lines of every file
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as lines:
        n_lines = 0
        for path in files:
            for line in read_text(path).split("\n"):
                if line.strip():
                    lines.write(line + "\n")
                    n_lines += 1
    if n_lines == 0:
        os.unlink(lines.name)
        die("the input holds no text")
    try:
        spm.SentencePieceTrainer.train(
            input=lines.name, model_prefix=model_prefix, vocab_size=a.vocab, model_type="bpe",
            byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
            remove_extra_whitespaces=False, add_dummy_prefix=False, split_digits=True,
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1, input_sentence_size=a.max_sentences,
            shuffle_input_sentence=True, num_threads=os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as e:
        die("training the vocabulary failed: %s (a smaller --vocab for a small text?)" % e)
    finally:
        os.unlink(lines.name)
    sp = spm.SentencePieceProcessor(model_file=model_prefix + ".model")
    V, eos = sp.get_piece_size(), sp.eos_id()

    # 2. encode and write shards of shard_tokens
    buf, n_shards, total = array.array("H"), 0, 0

    def flush(final):
        nonlocal buf, n_shards
        while len(buf) >= a.shard_tokens or (final and len(buf)):
            part = buf[: a.shard_tokens]
            write_shard(os.path.join(a.out, "shard_%06d.bin" % n_shards), part)
            n_shards += 1
            buf = buf[a.shard_tokens:]

    for path in files:
        lines_of = read_text(path).split("\n")
        for i, line in enumerate(lines_of):  # line by line (bounded memory); "\n" as its byte piece
            piece = line + "\n" if i + 1 < len(lines_of) else line
            if piece:
                ids = sp.encode(piece)
                buf.extend(ids)
                total += len(ids)
        buf.append(eos)
        total += 1
        flush(False)
    flush(True)
    print("make_shards.py: %d file(s), %d lines -> vocabulary of %d (BPE) in %s.model; %d tokens in %d shard(s) in %s"
          % (len(files), n_lines, V, model_prefix, total, n_shards, a.out))
    print("use: dloco-learner --data %s --vocab %d ...; dloco-sync --vocab %d --eval_data %s; "
          "dloco export STORE --format hf --tokenizer %s.model OUT" % (a.out, V, V, a.out, model_prefix))


if __name__ == "__main__":
    main()
