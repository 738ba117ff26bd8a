#!/bin/bash
# Install every Debian package dloco's build, tests and demo need (idempotent).
# Usage: deploy/setup.sh [--with-torch] [--with-slurm] [--force]
#   --with-torch  also install python3-torch (benchmarks, tests/ref, test_export's
#                 PyTorch checks, and the dloco Python package's examples, test_py_* and
#                 bench/torch_learner.sh; tests/run.sh passes it)
#   --with-slurm  also install slurm-wlm and munge (tests/test_slurm.sh runs a private
#                 single-node Slurm; without them it SKIPs). Not by default: on a host
#                 with systemd their packages enable and start system daemons
#   --force       run apt-get update + install even if everything is present
# Nothing is fetched from anywhere but the Debian archive.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config        # compiler and build
  libopenblas-dev libopenblas0-openmp     # CPU sgemm (the OpenMP build is linked)
  libzmq3-dev                             # wire: ZeroMQ
  protobuf-c-compiler libprotobuf-c-dev   # wire: protobuf-c messages
  liblmdb-dev lmdb-utils                  # synchronizer state store
  libev-dev                               # synchronizer event loop
  libxxhash-dev                           # checksums: XXH64 compiled in from xxhash.h (core/hash.c); bench/hash links the library
  fortunes fortunes-min                   # the bundled training corpus (~2.5 MB of English text)
  python3                                 # small helpers in tests and benchmarks
  iproute2 procps                         # network namespaces / tc for network tests, ps/pkill-free process checks
  clang libclang-rt-14-dev                # libFuzzer + ASan/UBSan runtimes for tests/fuzz (without them those tests SKIP)
  fiu-utils libfiu0                       # dloco-chaos disk faults: fiu-run / fiu-ctrl and libfiu's POSIX preload
  gnuplot-nox                             # dloco-chaos report plots (SVG)
  libmicrohttpd-dev                       # /metrics and /status.json endpoints (core/httpd.c)
  prometheus                              # promtool and the server: tests/test_metrics.sh, tests/test_prometheus.sh
  curl                                    # tests/test_metrics.sh: scrapes and hostile HTTP requests
  yamllint                                # tests/test_deploy_files.sh: the Kubernetes manifests in deploy/k8s
  nftables                                # tests/test_deploy_files.sh: nft -c on deploy/firewall (no daemon is started)
  python3-kubernetes                      # tests/test_k8s_validate.sh: deploy/k8s/validate.py, the manifests against the Kubernetes API schema
  python3-yaml                            # tests/test_deploy_files.sh, tests/test_k8s_validate.sh: reading the manifests
  python3-sentencepiece                   # tools/make_shards.py: a BPE vocabulary and llm.c shards from your own text (tests/test_tokenizer.sh)
)
WITH_TORCH=0
WITH_SLURM=0
FORCE=0
for a in "$@"; do
  case "$a" in
    --with-torch) WITH_TORCH=1 ;;
    --with-slurm) WITH_SLURM=1 ;;
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$a' (try --help)" >&2; exit 2 ;;
  esac
done
if [ "$WITH_TORCH" = 1 ]; then PKGS+=(python3-torch python3-numpy); fi
if [ "$WITH_SLURM" = 1 ]; then PKGS+=(slurm-wlm munge); fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" = 0 ] && [ "$FORCE" = 0 ]; then
  echo "setup.sh: all ${#PKGS[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "setup.sh: installing ${missing[*]:-(forced)}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${PKGS[@]}"
echo "setup.sh: done"
