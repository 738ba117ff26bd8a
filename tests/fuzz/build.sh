#!/bin/bash
# Build the libFuzzer harnesses of tests/fuzz and their seed generator with clang
# (ASan + UBSan + libFuzzer, -g -O1), apart from the gcc/CMake build.
# Usage: tests/fuzz/build.sh OUT_DIR [TARGET...]   (default: every target)
#   TARGET: fuzz_envelope fuzz_message fuzz_config fuzz_allowlist fuzz_modelfile fuzz_manifest seedgen
#   DLOCO_FUZZ_CC  the compiler (default clang)
# Objects and binaries go under OUT_DIR; each is rebuilt only when one of its
# inputs (the source, a header it includes, the flags) changed. The project's
# core/*.c, proto/*.c, storage/modelfile*.c and tensorfile.c (not store*.c: no LMDB here) and
# protoc-c's proto/dloco.pb-c.c go into one archive,
# so a harness pulls in exactly the objects it needs.
# Exits 77 after a "SKIP: ..." line when clang cannot build a fuzzer here
# (tests/fuzz/run.sh and CTest then report the test as skipped).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { echo "usage: tests/fuzz/build.sh OUT_DIR [TARGET...]" >&2; exit 2; }
OUT=$1
shift
ALL=(fuzz_envelope fuzz_message fuzz_config fuzz_allowlist fuzz_modelfile fuzz_manifest seedgen)
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  case " ${ALL[*]} " in *" $t "*) ;; *) echo "build.sh: unknown target '$t' (${ALL[*]})" >&2; exit 2 ;; esac
done
CC=${DLOCO_FUZZ_CC:-clang}
mkdir -p "$OUT/obj" "$OUT/gen/proto"
OUT=$(cd "$OUT" && pwd)

skip() { echo "SKIP: $* — fuzz targets not built (install: clang libclang-rt-14-dev, see deploy/setup.sh)"; exit 77; }
command -v "$CC" >/dev/null || skip "no $CC on PATH"
command -v protoc-c >/dev/null || { echo "build.sh: protoc-c not found (deploy/setup.sh installs it)" >&2; exit 1; }

# One build at a time per OUT_DIR (CTest may run the fuzz tests in parallel).
if command -v flock >/dev/null; then
  exec 9>"$OUT/.lock"
  flock 9
fi

# Can this clang link a libFuzzer binary? (clang without libclang-rt-*-dev cannot)
probe_log=$OUT/probe.log
if ! printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' |
     "$CC" -x c - -fsanitize=fuzzer,address,undefined -o "$OUT/probe" >"$probe_log" 2>&1; then
  skip "$CC -fsanitize=fuzzer,address,undefined cannot build a fuzzer: $(grep -m1 -i error "$probe_log" || head -1 "$probe_log")"
fi

PKG_CFLAGS=$(pkg-config --cflags libzmq libprotobuf-c 2>/dev/null || true)
CFLAGS="-std=gnu11 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined,fuzzer-no-link
  -fno-sanitize-recover=undefined -Wall -Wextra -I$SRC -I$OUT/gen $PKG_CFLAGS"
LIBS="-lzmq -lprotobuf-c -lm -lpthread"
# Objects built with other flags (or another compiler) are stale.
stamp="$CC $("$CC" --version 2>/dev/null | sed -n 1p) | $CFLAGS | $LIBS"
if [ "$(cat "$OUT/flags" 2>/dev/null)" != "$stamp" ]; then
  rm -f "$OUT"/obj/*.o "$OUT"/obj/*.d
  printf '%s' "$stamp" >"$OUT/flags"
fi

# newer_than OUT FILE...: true when OUT is missing or a FILE is newer (or gone).
newer_than() {
  local out=$1 f
  shift
  [ -e "$out" ] || return 0
  for f in "$@"; do
    [ -e "$f" ] || return 0
    [ "$f" -nt "$out" ] && return 0
  done
  return 1
}

# compile SRC.c -> obj/NAME.o, with its header list in obj/NAME.d
compile() {
  local src=$1 name=$2 obj=$OUT/obj/$2.o dep=$OUT/obj/$2.d deps=()
  if [ -e "$dep" ]; then
    read -r -a deps <<<"$(sed -e 's/^[^:]*://' -e 's/\\$//' "$dep" | tr '\n' ' ')"
  fi
  if [ ! -e "$dep" ] || newer_than "$obj" "$src" "${deps[@]}"; then
    # shellcheck disable=SC2086
    "$CC" $CFLAGS -MMD -MF "$dep" -c "$src" -o "$obj"
  fi
  OBJS+=("$obj")
}

# ---- protoc-c output and the archive of project code
gen_c=$OUT/gen/proto/dloco.pb-c.c
if newer_than "$gen_c" "$SRC/proto/dloco.proto"; then
  protoc-c --proto_path="$SRC/proto" --c_out="$OUT/gen/proto" "$SRC/proto/dloco.proto"
fi
OBJS=()
compile "$gen_c" gen_dloco.pb-c
for f in "$SRC"/core/*.c "$SRC"/proto/*.c "$SRC"/storage/modelfile*.c "$SRC"/storage/tensorfile.c; do
  rel=${f#"$SRC"/}
  compile "$f" "$(echo "${rel%.c}" | tr / _)"
done
lib=$OUT/libdlfuzz.a
if newer_than "$lib" "${OBJS[@]}"; then
  rm -f "$lib"
  ar rcs "$lib" "${OBJS[@]}"
fi

# ---- the binaries
for t in "${TARGETS[@]}"; do
  if [ "$t" = fuzz_allowlist ] && [ ! -e "$SRC/proto/auth.h" ]; then
    # only an explicit request is an error; "every target" leaves it out
    [ $# -gt 0 ] && skip "proto/auth.h does not exist yet"
    echo "build.sh: fuzz_allowlist left out: proto/auth.h does not exist yet" >&2
    continue
  fi
  OBJS=()
  compile "$SRC/tests/fuzz/$t.c" "tests_fuzz_$t"
  bin=$OUT/$t
  if newer_than "$bin" "${OBJS[@]}" "$lib"; then
    if [ "$t" = seedgen ]; then link=-fsanitize=address,undefined; else link=-fsanitize=fuzzer,address,undefined; fi
    # shellcheck disable=SC2086
    "$CC" $link "${OBJS[@]}" "$lib" $LIBS -o "$bin.tmp"
    mv -f "$bin.tmp" "$bin"
    echo "build.sh: built $bin" >&2
  fi
done
