#!/bin/sh
# Regenerates the golden wire corpus for tests/test_proto.c: each NAME.txtpb
# (protobuf text format of a dloco.v1.Envelope) is encoded to NAME.bin by
# protoc-c's own encoder, independent of our C code. The .bin files are the
# wire format as shipped (protocol_version 3: XXH3 checksums since 2, the
# per-block codec layouts and delta updates since 3): if a change to proto/dloco.proto makes
# them decode differently, the change broke "field numbers are forever".
# Usage: tests/data/proto_corpus/make_corpus.sh   (needs /usr/bin/protoc-c)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
proto=$(cd "$here/../../../proto" && pwd)
for t in "$here"/*.txtpb; do
    n=${t%.txtpb}
    protoc-c --proto_path="$proto" --encode=dloco.v1.Envelope "$proto/dloco.proto" <"$t" >"$n.bin"
    echo "$(basename "$n.bin"): $(wc -c <"$n.bin") bytes"
done
