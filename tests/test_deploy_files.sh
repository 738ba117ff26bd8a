#!/bin/bash
# The deployment files cannot rot: every program invocation in deploy/ (the
# systemd units' ExecStart with their instance and environment, the
# Kubernetes containers' args with the ConfigMap's INI texts, the Slurm batch
# script's learner command, deploy/site/*.ini) is run through the real
# program with --print-config, which refuses an unknown option or a bad
# value (exit 2). Then the tools that exist here: yamllint on deploy/k8s;
# `kubectl kustomize` (offline) and `kubectl apply --dry-run=client` (needs
# an API server's discovery: reported as not checked when none answers; the
# fields against the API schema are checked offline by deploy/k8s/validate.py
# in tests/test_k8s_validate.sh);
# consistency of the manifests (python3-yaml: selectors, services, probes on
# named ports, referenced Secrets / ConfigMap keys / volumes, non-root);
# `systemd-analyze verify` on the units (binary paths pointed at the build),
# with a typo'd copy that it must flag; `nft -c` on deploy/firewall; the Containerfile's COPY sources,
# user and ports (`docker build` only where a daemon answers). The argument
# refusals of the deploy scripts. Prints `not checked: ...` for what a
# missing tool left out; SKIP (77) only when nothing but the flags could run.
set -u
cd "$(dirname "$0")/.."
SRC=$PWD
B=${DLOCO_BIN:-build}
SYNC=$B/synchronizer/dloco-sync LEARNER=$B/learner/dloco-learner DLOCO=$B/tools/dloco
case "${1:-}" in -h | --help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;; esac
for b in "$SYNC" "$LEARNER" "$DLOCO"; do [ -x "$b" ] || { echo "FAIL: $b is not built"; exit 1; }; done
SYNC=$(readlink -f "$SYNC") LEARNER=$(readlink -f "$LEARNER") DLOCO=$(readlink -f "$DLOCO")
T=$(mktemp -d /tmp/dloco_deploy_files.XXXXXX)
trap '[ -n "${KEEP_T:-}" ] || rm -rf "$T"' EXIT
fail=0 ran_tools=0
NOTCHECKED=()
check() { local d="$1"; shift; if "$@"; then echo "ok: $d"; else echo "FAIL: $d"; fail=1; fi; }
not_checked() { echo "not checked: $*"; NOTCHECKED+=("$*"); [ "${CI:-}" = true ] && [ "${2:-}" = ci ] && fail=1; }
# The files the deployment expects (docs/DEPLOY.md) live under $ROOT here:
# /etc/dloco, /run/dloco, /var/lib/dloco, /var/log/dloco in the arguments
# and the INI files are rewritten to $ROOT/... (the learner opens its
# server_key file while it checks its configuration)
ROOT=$T/root
mkdir -p "$ROOT"/etc/dloco/keys "$ROOT"/run/dloco/keys "$ROOT"/var/lib/dloco/data "$ROOT"/var/log/dloco
for k in "$ROOT"/etc/dloco/keys/{sync,site-a-0,site-a-3,slurm7-0,slurm7-1} "$ROOT"/run/dloco/keys/sync; do
  "$DLOCO" keygen "$k" > /dev/null || { echo "FAIL: dloco keygen $k"; exit 1; }
done
cp "$ROOT/etc/dloco/keys/site-a-0.key" "$ROOT/run/dloco/keys/learner.key"
: > "$ROOT/etc/dloco/allowlist"; : > "$ROOT/run/dloco/keys/allowlist"
cp /dev/null "$ROOT/var/lib/dloco/data/corpus.txt"
rr() { sed -E "s#(^|[ =,])/(etc|run|var/lib|var/log)/dloco#\\1$ROOT/\\2/dloco#g"; }
# printcfg DESCRIPTION PROGRAM ARGS...: the program must take these exact arguments
ncfg=0
printcfg() {
  local d=$1 prog=$2 out rc a prev="" args=(); shift 2
  for a in "$@"; do
    a=$(printf '%s' "$a" | rr)
    if [ "$prev" = --config ]; then ncfg=$((ncfg + 1)); rr < "$a" > "$T/cfg$ncfg.ini"; a=$T/cfg$ncfg.ini; fi
    args+=("$a"); prev=$a
  done
  out=$("$prog" "${args[@]}" --print-config 2>&1 > /dev/null); rc=$?
  if [ "$rc" = 0 ]; then echo "ok: $d: $(basename "$prog") takes every flag"; else echo "FAIL: $d: $(basename "$prog") $*: exit $rc: $out"; fail=1; fi
}

# ---- 1. deploy/site/*.ini: the INI files the units and the image install
printcfg "deploy/site/sync.ini" "$SYNC" --config deploy/site/sync.ini
printcfg "deploy/site/learner.ini (+ the id and key file of a learner)" "$LEARNER" --config deploy/site/learner.ini \
  --id site-a-0 --key_file /etc/dloco/keys/site-a-0.key
# a negative control: the same check refuses a misspelt option
printf 'quorun = 2\n' > "$T/bad.ini"
check "the --print-config check refuses an unknown option (control)" eval '! "$SYNC" --config "$T/bad.ini" --print-config > /dev/null 2>&1'

# ---- 2. the systemd units' ExecStart, as systemd would expand them
# unit_argv UNIT INSTANCE ENVFILE: the ExecStart argv, one per line, with %i,
# $VAR / ${VAR} (Environment= defaults, then ENVFILE) and /etc/dloco/*.ini
# mapped to deploy/site/
unit_argv() {
  python3 - "$@" << 'PY'
import re, shlex, sys
unit, inst, envfile = sys.argv[1], sys.argv[2], sys.argv[3]
env, execs = {}, []
def assign(text):
    for tok in shlex.split(text):
        k, _, v = tok.partition("=")
        env[k] = v
for line in open(unit):
    line = line.strip()
    if line.startswith("Environment="):
        assign(line[len("Environment="):])
    elif line.startswith("ExecStart="):
        execs.append(line[len("ExecStart="):])
if envfile != "-":
    for line in open(envfile):
        line = line.strip()
        if line and not line.startswith("#"):
            assign(line)
assert len(execs) == 1, "one ExecStart"
cmd = execs[0].replace("%i", inst).replace("%I", inst)
out = []
for w in shlex.split(cmd):
    m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
    if m:  # an unbraced $VAR is split into words by systemd
        out += env.get(m.group(1), "").split()
        continue
    w = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda g: env.get(g.group(1), ""), w)
    w = re.sub(r"^/etc/dloco/(sync|learner)\.ini$", r"deploy/site/\1.ini", w)
    out.append(w)
print("\n".join(out))
PY
}
unit_check() { # UNIT INSTANCE ENVFILE
  local argv=() prog
  mapfile -t argv < <(unit_argv "$@") || true
  [ "${#argv[@]}" -gt 1 ] || { echo "FAIL: $1: no ExecStart found"; fail=1; return; }
  case "${argv[0]}" in
    /usr/local/bin/dloco-sync) prog=$SYNC ;;
    /usr/local/bin/dloco-learner) prog=$LEARNER ;;
    *) echo "FAIL: $1: ExecStart runs ${argv[0]}, not /usr/local/bin/dloco-sync|dloco-learner"; fail=1; return ;;
  esac
  printcfg "$(basename "$1") instance '$2' env $(basename "$3")" "$prog" "${argv[@]:1}"
}
unit_check deploy/systemd/dloco-sync.service "" -
unit_check deploy/systemd/dloco-sync@.service 0 -
unit_check deploy/systemd/dloco-sync@.service 1 deploy/systemd/sync-shard.env.example
unit_check deploy/systemd/dloco-learner@.service site-a-0 -
unit_check deploy/systemd/dloco-learner@.service site-a-3 deploy/systemd/learner.env.example

if command -v systemd-analyze > /dev/null; then
  ran_tools=$((ran_tools + 1))
  mkdir -p "$T/units"
  for u in deploy/systemd/*.service; do
    sed -e "s|/usr/local/bin/dloco-sync|$SYNC|" -e "s|/usr/local/bin/dloco-learner|$LEARNER|" "$u" > "$T/units/$(basename "$u")"
  done
  for u in "$T"/units/*.service; do
    out=$(systemd-analyze verify --man=no "$u" 2>&1); rc=$?
    if [ "$rc" = 0 ] && [ -z "$out" ]; then echo "ok: systemd-analyze verify $(basename "$u"): no findings"
    else echo "FAIL: systemd-analyze verify $(basename "$u") (exit $rc): $out"; fail=1; fi
  done
  sed -e 's/^RestartSec=/RestartSecc=/' "$T/units/dloco-sync.service" > "$T/units/typo.service"
  out=$(systemd-analyze verify --man=no "$T/units/typo.service" 2>&1)
  check "systemd-analyze verify flags a misspelt key (control)" [ -n "$out" ]
else
  not_checked "systemd-analyze (package systemd) is not installed: the units' syntax"
fi

# ---- 3. the Slurm batch script: its learner command, run by a stand-in srun
# that drops srun's own options and runs the program with --print-config
mkdir -p "$T/fakebin" "$T/sb"
cat > "$T/fakebin/srun" << 'SH'
#!/bin/bash
n=none
# the batch script gives srun its options as --name=value or bare --flag
while [ $# -gt 0 ]; do case "$1" in --job-name=*) n=${1#--job-name=}; shift ;; --*) shift ;; *) break ;; esac; done
"$@" --print-config > /dev/null 2> "$FAKE_SRUN_DIR/err.$n"; echo $? > "$FAKE_SRUN_DIR/rc.$n"
printf '%s\n' "$@" > "$FAKE_SRUN_DIR/argv.$n"
SH
chmod +x "$T/fakebin/srun"
mkdir -p "$T/srun"
rr < deploy/site/learner.ini > "$T/sb-learner.ini"
(cd "$T/sb" && PATH="$T/fakebin:$PATH" FAKE_SRUN_DIR="$T/srun" SLURM_JOB_ID=7 SLURM_NTASKS=2 SLURM_CPUS_PER_TASK=1 \
  bash "$SRC/deploy/slurm/dloco-learners.sbatch" --connect tcp://sync.example:5555 --config "$T/sb-learner.ini" \
  --steps 10 --learner "$LEARNER" --key-dir "$ROOT/etc/dloco/keys" --server-key "$ROOT/etc/dloco/keys/sync.pub" \
  --max-restarts 0 --restart-delay 0 -- --throttle 0.5 > "$T/sb.out" 2>&1)
n=$(ls "$T/srun" | grep -c '^rc\.')
check "the batch script ran one learner step per task (2, got $n)" [ "$n" = 2 ]
for r in "$T"/srun/rc.*; do
  k=${r##*.}
  if [ "$(cat "$r")" = 0 ]; then echo "ok: dloco-learners.sbatch step $k: dloco-learner takes every flag ($(tr '\n' ' ' < "$T/srun/argv.$k" | cut -c1-150)...)"
  else echo "FAIL: dloco-learners.sbatch step $k: $(cat "$T/srun/err.$k")"; fail=1; fi
done
check "the steps are named by the learner ids slurm7-0 and slurm7-1" test -f "$T/srun/rc.slurm7-0" -a -f "$T/srun/rc.slurm7-1"

# ---- 4. Kubernetes: the ConfigMap's INI texts, the containers' args, and
# the manifests' consistency (python3-yaml)
if python3 -c 'import yaml' 2> /dev/null; then
  ran_tools=$((ran_tools + 1))
  python3 - "$T/k8s" deploy/k8s/*.yaml << 'PY' > "$T/k8s.out" 2>&1
import os, sys, yaml
out, files = sys.argv[1], [f for f in sys.argv[2:] if not f.endswith("kustomization.yaml")]
os.makedirs(out, exist_ok=True)
docs = [d for f in files for d in yaml.safe_load_all(open(f)) if d]
by = {}
for d in docs:
    by.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
bad = []
def need(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond: bad.append(what)
ns = set(by.get("Namespace", {}))
for d in docs:
    if d["kind"] != "Namespace":
        need(d["metadata"].get("namespace") in ns, f'{d["kind"]}/{d["metadata"]["name"]} is in a namespace of the manifests')
for name, cm in by.get("ConfigMap", {}).items():
    for key, text in cm.get("data", {}).items():
        open(os.path.join(out, f"cm-{name}-{key}"), "w").write(text)
svcs = by.get("Service", {})
n = 0
for kind in ("StatefulSet", "Deployment"):
    for name, w in by.get(kind, {}).items():
        spec, tpl = w["spec"], w["spec"]["template"]
        labels = tpl["metadata"].get("labels", {})
        sel = spec["selector"]["matchLabels"]
        need(all(labels.get(k) == v for k, v in sel.items()), f"{kind}/{name}: selector matches the pod labels")
        pod = tpl["spec"]
        need(pod.get("securityContext", {}).get("runAsNonRoot") is True, f"{kind}/{name}: runAsNonRoot")
        if kind == "StatefulSet":
            s = svcs.get(spec.get("serviceName"))
            need(s is not None and s["spec"].get("clusterIP") == "None", f"{kind}/{name}: serviceName is a headless Service")
            need(bool(spec.get("volumeClaimTemplates")), f"{kind}/{name}: a persistent volume claim for the store")
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        vols.update({c["metadata"]["name"]: c for c in spec.get("volumeClaimTemplates", [])})
        for v in pod.get("volumes", []):
            if "secret" in v:
                need(v["secret"]["secretName"] in by.get("Secret", {}), f'{kind}/{name}: Secret {v["secret"]["secretName"]} exists')
            if "configMap" in v:
                need(v["configMap"]["name"] in by.get("ConfigMap", {}), f'{kind}/{name}: ConfigMap {v["configMap"]["name"]} exists')
        for c in pod["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            for pr in ("livenessProbe", "readinessProbe"):
                p = c.get(pr)
                need(p is not None and p.get("httpGet", {}).get("port") in ports, f"{kind}/{name}: {pr} on a named container port")
            need("cpu" in c.get("resources", {}).get("requests", {}) and "memory" in c["resources"]["requests"],
                 f"{kind}/{name}: cpu and memory requests")
            for m in c.get("volumeMounts", []):
                need(m["name"] in vols, f'{kind}/{name}: volume {m["name"]} of mount {m["mountPath"]} exists')
                v = vols.get(m["name"], {})
                if "subPath" in m and "configMap" in v:
                    cm = by["ConfigMap"].get(v["configMap"]["name"], {})
                    need(m["subPath"] in cm.get("data", {}), f'{kind}/{name}: ConfigMap key {m["subPath"]} exists')
            args = c.get("args", [])
            need(bool(args) and args[0] in ("sync", "learner"), f"{kind}/{name}: args start with sync|learner")
            # the args with the mounted INI files replaced by the ConfigMap texts written above
            mounts = {m["mountPath"]: (vols[m["name"]], m.get("subPath")) for m in c.get("volumeMounts", []) if m["name"] in vols}
            fixed = []
            for a in args[1:]:
                if a in mounts and "configMap" in mounts[a][0]:
                    a = os.path.join(out, f'cm-{mounts[a][0]["configMap"]["name"]}-{mounts[a][1]}')
                fixed.append(a)
            open(os.path.join(out, f"args-{n}-{args[0] if args else 'none'}-{name}"), "w").write("\n".join(fixed) + "\n")
            n += 1
            targets = [s for s in svcs.values() if all(labels.get(k) == v for k, v in s["spec"].get("selector", {}).items())
                       or s["spec"].get("selector", {}).get("statefulset.kubernetes.io/pod-name", "").startswith(name + "-")]
            for s in targets:
                for p in s["spec"]["ports"]:
                    need(p.get("targetPort") in ports or p.get("targetPort") in ports.values(),
                         f'Service/{s["metadata"]["name"]}: port {p["name"]} targets a port of {kind}/{name}')
sys.exit(1 if bad else 0)
PY
  rc=$?
  grep -c '^ok: ' "$T/k8s.out" | sed 's/^/ok: manifest consistency checks passed: /'
  grep '^FAIL' "$T/k8s.out"
  [ "$rc" = 0 ] || { echo "FAIL: the manifests' consistency ($rc)"; tail -n 3 "$T/k8s.out"; fail=1; }
  for f in "$T"/k8s/args-*; do
    [ -e "$f" ] || { echo "FAIL: no container args extracted"; fail=1; break; }
    mapfile -t a < "$f"
    w=$(basename "$f" | cut -d- -f3)
    case "$w" in sync) prog=$SYNC ;; learner) prog=$LEARNER ;; *) echo "FAIL: $f"; fail=1; continue ;; esac
    printcfg "k8s $(basename "$f" | cut -d- -f4-)" "$prog" "${a[@]}"
  done
  # the entrypoint maps sync|learner to the programs; with DLOCO_SHARD_FROM_HOSTNAME a pod dloco-sync-1 is shard 1
  mkdir -p "$T/bin" "$T/keysrc"
  ln -s "$SYNC" "$T/bin/dloco-sync"; ln -s "$LEARNER" "$T/bin/dloco-learner"; ln -s "$DLOCO" "$T/bin/dloco"
  "$DLOCO" keygen "$T/keysrc/sync" > /dev/null && chmod 0644 "$T/keysrc/sync.key"
  sh=$(DLOCO_BIN_DIR="$T/bin" DLOCO_RUN_DIR="$T/run" DLOCO_KEYS_SRC="$T/keysrc" HOSTNAME=dloco-sync-1 DLOCO_SHARD_FROM_HOSTNAME=1 \
    bash deploy/container/entrypoint.sh sync --config "$T/k8s/cm-dloco-config-sync.ini" --shards 2 --print-config | sed -n 's/^shard = //p')
  check "entrypoint: pod dloco-sync-1 runs shard 1 (got '$sh')" [ "$sh" = 1 ]
  check "entrypoint: the key copy is 0600 (the Secret's was 0644)" [ "$(stat -c %a "$T/run/keys/sync.key")" = 600 ]
  check "entrypoint: refuses an unknown program (exit 2)" eval '! bash deploy/container/entrypoint.sh nosuch > /dev/null 2>&1; [ "$(bash deploy/container/entrypoint.sh nosuch > /dev/null 2>&1; echo $?)" = 2 ]'
else
  not_checked "python3-yaml is not installed: the ConfigMap texts, container args and manifest consistency" ci
fi
if command -v yamllint > /dev/null; then
  ran_tools=$((ran_tools + 1))
  out=$(yamllint -s -c deploy/k8s/.yamllint deploy/k8s 2>&1); rc=$?
  [ "$rc" = 0 ] && echo "ok: yamllint -s (warnings are errors) deploy/k8s" || { echo "FAIL: yamllint: $out"; fail=1; }
else
  not_checked "yamllint is not installed (deploy/setup.sh installs it): the manifests' YAML style" ci
fi
if command -v kubectl > /dev/null; then
  ran_tools=$((ran_tools + 1))
  kinds=$(timeout 60 kubectl kustomize deploy/k8s 2> "$T/kust.err" | grep -c '^kind: ')
  check "kubectl kustomize deploy/k8s builds every object offline (10, got $kinds)" [ "$kinds" = 10 ]
  out=$(timeout 60 kubectl apply --dry-run=client -k deploy/k8s 2>&1); rc=$?
  if [ "$rc" = 0 ]; then echo "ok: kubectl apply --dry-run=client -k deploy/k8s: $(echo "$out" | wc -l) objects"
  elif echo "$out" | grep -q -i -e 'connection refused' -e 'unable to recognize' -e 'failed to download openapi' -e 'no such host' -e 'i/o timeout'; then
    not_checked "kubectl apply --dry-run=client: it needs an API server's discovery (and its OpenAPI schema to validate fields), none answers here (test_k8s_validate checks the schema offline): $(echo "$out" | tail -n 1 | cut -c1-120)"
  else echo "FAIL: kubectl apply --dry-run=client: $out"; fail=1; fi
else
  not_checked "kubectl is not installed: kustomize build and client dry-run of deploy/k8s"
fi

# ---- 5. the firewall rules of docs/DEPLOY.md
if command -v nft > /dev/null; then
  ran_tools=$((ran_tools + 1))
  out=$(nft -c -f deploy/firewall/dloco-sync.nft 2>&1); rc=$?
  if [ "$rc" = 0 ]; then echo "ok: nft -c -f deploy/firewall/dloco-sync.nft"
  elif echo "$out" | grep -q -i -e 'Operation not permitted' -e 'cache initialization failed'; then
    not_checked "nft -c cannot talk to netfilter here ($(echo "$out" | head -n 1 | cut -c1-100))"
  else echo "FAIL: nft -c -f deploy/firewall/dloco-sync.nft: $out"; fail=1; fi
  sed 's/ accept$/ acept/' deploy/firewall/dloco-sync.nft > "$T/typo.nft"
  check "nft -c refuses a misspelt verb (control)" eval '! nft -c -f "$T/typo.nft" > /dev/null 2>&1'
else
  not_checked "nft (nftables) is not installed (deploy/setup.sh installs it): the firewall rules" ci
fi

# ---- 6. the container file
CF=deploy/container/Containerfile
check "Containerfile: Debian 12 base" grep -q '^FROM debian:12' "$CF"
check "Containerfile: builds with deploy/setup.sh" grep -q 'deploy/setup.sh' "$CF"
u=$(sed -n 's/^USER \([0-9]*\).*/\1/p' "$CF" | tail -n 1)
check "Containerfile: runs as a numeric non-root user (USER $u)" test -n "$u" -a "$u" != 0
while read -r src; do
  check "Containerfile: COPY source $src exists" [ -e "$src" ]
done < <(awk '$1 == "COPY" && $2 !~ /^--from/ { for (i = 2; i < NF; i++) print $i }' "$CF" | grep -v '^\.$')
for p in 5555 9470 9471; do check "Containerfile: EXPOSE $p" grep -q "^EXPOSE.* $p\b" "$CF"; done
check "entrypoint.sh parses (bash -n)" bash -n deploy/container/entrypoint.sh
if command -v docker > /dev/null && timeout 10 docker info > /dev/null 2>&1; then
  ran_tools=$((ran_tools + 1))
  echo "docker answers: building the image (may need the Debian base image in the local cache)"
  if timeout 1200 docker build -q -f "$CF" -t dloco-test:deploy-files . > "$T/docker.out" 2>&1; then echo "ok: docker build"
  elif grep -q -i -e 'pull' -e 'resolve' -e 'network' "$T/docker.out"; then not_checked "docker build: no base image here ($(tail -n 1 "$T/docker.out" | cut -c1-120))"
  else echo "FAIL: docker build: $(tail -n 5 "$T/docker.out")"; fail=1; fi
else
  not_checked "docker build of $CF: no container daemon answers here (hadolint is not packaged either)"
fi

# ---- 7. the scripts' own argument refusals (exit 2, before anything runs)
expect2() { local d=$1 rc; shift; "$@" > /dev/null 2>&1; rc=$?; check "$d (exit 2, got $rc)" [ "$rc" = 2 ]; }
SB=deploy/slurm/dloco-learners.sbatch
expect2 "sbatch script: no --connect" env SLURM_JOB_ID=1 bash "$SB" --config deploy/site/learner.ini
expect2 "sbatch script: --steps not a number" env SLURM_JOB_ID=1 bash "$SB" --connect tcp://x:1 --steps ten
expect2 "sbatch script: an id prefix that is no learner id" env SLURM_JOB_ID=1 bash "$SB" --connect tcp://x:1 --id-prefix 'a b'
expect2 "sbatch script: --key-dir without --server-key" env SLURM_JOB_ID=1 bash "$SB" --connect tcp://x:1 --key-dir /tmp
expect2 "sbatch script: outside a job" env -u SLURM_JOB_ID bash "$SB" --connect tcp://x:1
expect2 "sbatch script: data shards that do not fit" env SLURM_JOB_ID=1 SLURM_NTASKS=4 bash "$SB" --connect tcp://x:1 --data-shards 2 --config deploy/site/learner.ini --learner "$LEARNER"
expect2 "sbatch script: an unknown option" env SLURM_JOB_ID=1 bash "$SB" --frobnicate
expect2 "run-by-hand.sh: an unknown option" bash deploy/slurm/run-by-hand.sh --frobnicate
expect2 "requeue-by-hand.sh: an unknown option" bash deploy/slurm/requeue-by-hand.sh --frobnicate
expect2 "private-slurm.sh: no DIR" bash deploy/slurm/private-slurm.sh start
expect2 "private-slurm.sh: --port out of range" bash deploy/slurm/private-slurm.sh start "$T/ps" --port 80
for s in "$SB" deploy/slurm/run-by-hand.sh deploy/slurm/requeue-by-hand.sh deploy/slurm/private-slurm.sh deploy/container/entrypoint.sh; do
  check "$s --help prints its usage" eval '[ -n "$(bash "$s" --help 2>&1)" ] && bash "$s" --help > /dev/null 2>&1'
done

echo "checked with the tools here: $ran_tools of 6 (systemd-analyze, python3-yaml, yamllint, kubectl, nft, docker)"
for n in "${NOTCHECKED[@]}"; do echo "  not checked: $n"; done
[ "$fail" = 0 ] || { echo "FAIL: deploy files"; exit 1; }
[ "$ran_tools" -gt 0 ] || { echo "SKIP: none of systemd-analyze, python3-yaml, yamllint, kubectl, nft, docker is here (the flags were checked)"; exit 77; }
echo "PASS: deploy files"
