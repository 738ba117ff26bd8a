#!/bin/bash
# deploy/k8s/validate.py, the offline check of the Kubernetes manifests against
# the API schema (no API server answers `kubectl apply --dry-run` here): the
# bundle `kubectl kustomize deploy/k8s` renders must validate, one ok JSON line
# per object; copies of it broken by one edit each must be refused with exit
# 1 and exactly one problem at the expected JSON path by the expected rule
# (an unknown field, a string or a bool where an int is declared, a missing
# required field, a selector that misses the template, a volumeMount naming
# no volume, bad names, an unknown kind, a dangling Secret, a bad quantity),
# a YAML error or a duplicate key with exit 2; two legal IntOrString and
# Quantity spellings must be accepted. Needs python3-kubernetes
# (deploy/setup.sh): without it `not checked` and SKIP (77), a FAIL under
# CI=true. Without kubectl the kustomization's files are validated as
# written, and the test says so.
set -u
cd "$(dirname "$0")/.." || exit 1
case "${1:-}" in -h | --help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;; esac
V=deploy/k8s/validate.py
T=$(mktemp -d /tmp/dloco_k8s_validate.XXXXXX)
trap '[ -n "${KEEP_T:-}" ] || rm -rf "$T"' EXIT
fail=0
check() { local d="$1"; shift; if "$@"; then echo "ok: $d"; else echo "FAIL: $d"; fail=1; fi; }
# both DESCRIPTION A = B C = D: ok when A equals B and C equals D
both() { if [ "$2" = "$4" ] && [ "$5" = "$7" ]; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }
not_checked() { echo "not checked: $*"; }

# the validator's own interpreter (/usr/bin/python3, Debian's packages), else python3 on PATH
PY=
for p in /usr/bin/python3 python3; do
  if "$p" -c 'import kubernetes.client, yaml' 2> /dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
  not_checked "deploy/k8s/validate.py: python3-kubernetes is not installed (deploy/setup.sh installs it): the manifests' fields, types and required fields against the Kubernetes API schema"
  [ "${CI:-}" = true ] && { echo "FAIL: python3-kubernetes is missing under CI"; exit 1; }
  echo "SKIP: python3-kubernetes is not installed (deploy/setup.sh), so deploy/k8s/validate.py cannot run"
  exit 77
fi

B=$T/bundle.yaml
if command -v kubectl > /dev/null; then
  timeout 60 kubectl kustomize deploy/k8s > "$B" 2> "$T/kust.err" \
    || { echo "FAIL: kubectl kustomize deploy/k8s: $(cat "$T/kust.err")"; exit 1; }
  echo "ok: rendered with kubectl kustomize deploy/k8s"
else
  not_checked "kubectl is not installed: the kustomization's resources are validated as written, not as kustomize renders them"
  for f in $("$PY" -c 'import yaml; print(" ".join(yaml.safe_load(open("deploy/k8s/kustomization.yaml"))["resources"]))'); do
    printf -- '---\n'; cat "deploy/k8s/$f"
  done > "$B"
fi
ndocs=$("$PY" -c 'import sys, yaml; print(sum(d is not None for d in yaml.safe_load_all(open(sys.argv[1]))))' "$B")

# ---- the real bundle: exit 0 and one {"ok": true} line per object, in order
"$PY" "$V" "$B" > "$T/real.jsonl" 2> "$T/real.err"; rc=$?
check "validate.py exits 0 on the rendered bundle (got $rc)" [ "$rc" = 0 ]
out=$("$PY" - "$B" "$T/real.jsonl" << 'PY'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]
lines = [json.loads(l) for l in open(sys.argv[2])]
want = [{"kind": d["kind"], "name": d["metadata"]["name"], "ok": True} for d in docs]
print(f"OK {len(lines)} objects: " + ", ".join(f'{l["kind"]}/{l["name"]}' for l in lines) if lines == want and docs
      else f"MISMATCH: got {lines}, want {want}")
PY
)
check "every object of the bundle is valid: ${out#OK }" [ "${out:0:3}" = "OK " ]
grep -v '^  ' "$T/real.err"
if [ "$PY" = /usr/bin/python3 ]; then
  rc=$("$V" - < "$B" > /dev/null 2>&1; echo $?)
  check "deploy/k8s/validate.py - (its #! line, reading stdin) exits 0 (got $rc)" [ "$rc" = 0 ]
fi

# ---- broken copies of the bundle
# edit FILE PYTHON: the bundle with one edit, as FILE; in PYTHON, D is the
# documents, O(kind, name) one of them, P(obj) its pod spec, C(obj) its first container
edit() {
  "$PY" - "$B" "$1" "$2" << 'PY'
import sys, yaml
D = list(yaml.safe_load_all(open(sys.argv[1])))
def O(kind, name): return next(d for d in D if d and d["kind"] == kind and d["metadata"]["name"] == name)
def P(obj): return obj["spec"]["template"]["spec"]
def C(obj, i=0): return P(obj)["containers"][i]
exec(sys.argv[3])
yaml.safe_dump_all(D, open(sys.argv[2], "w"), sort_keys=False)
PY
}
# refused DESCRIPTION PYTHON KIND OBJECT PATH RULE ERROR-TEXT: the bundle with
# the edit PYTHON must give exit 1 and exactly one problem, of OBJECT (its
# name after the edit) at PATH by RULE, its error containing ERROR-TEXT; every
# other object ok
nv=0
refused() {
  local d=$1 f rc out
  nv=$((nv + 1)); f=$T/variant$nv
  edit "$f.yaml" "$2" || { echo "FAIL: $d: the edit does not apply to the bundle"; fail=1; return; }
  "$PY" "$V" "$f.yaml" > "$f.jsonl" 2> "$f.err"; rc=$?
  out=$("$PY" - "$f.jsonl" "$ndocs" "$3" "$4" "$5" "$6" "$7" << 'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ndocs, kind, name, path, rule, text = int(sys.argv[2]), *sys.argv[3:]
bad = [l for l in lines if not l["ok"]]
good = [l for l in lines if l["ok"]]
ok = len(bad) == 1 and len(good) == ndocs - 1 and text in bad[0]["error"] and \
    (bad[0]["kind"], bad[0]["name"], bad[0]["path"], bad[0]["rule"]) == (kind, name, path, rule)
print(("OK " if ok else f"MISMATCH ({len(good)} ok of {ndocs}): ") + json.dumps(bad)[:400])
PY
)
  both "$d: exit 1 (got $rc), ${out#OK }" "$rc" = 1 "${out:0:3}" = "OK "
}
SS="O('StatefulSet', 'dloco-sync')" LA="O('Deployment', 'dloco-learner-site-a-0')" LB="O('Deployment', 'dloco-learner-site-b-0')"
CT="spec.template.spec.containers[0]"

refused "unknown field (imagePullPolicyy)" "C($LA)['imagePullPolicyy'] = C($LA).pop('imagePullPolicy')" \
  Deployment dloco-learner-site-a-0 "$CT.imagePullPolicyy" schema.unknown-field "unknown field; allowed: args, command, env"
refused "replicas: \"2\" (a string where an int is declared)" "${SS}['spec']['replicas'] = '2'" \
  StatefulSet dloco-sync spec.replicas schema.type 'expected int, got string "2"'
refused "containerPort: true (a bool where an int is declared)" "C($LB)['ports'][0]['containerPort'] = True" \
  Deployment dloco-learner-site-b-0 "$CT.ports[0].containerPort" schema.type "expected int, got bool"
refused "env value: 1 (an int where a string is declared)" "C($SS)['env'][1]['value'] = 1" \
  StatefulSet dloco-sync "$CT.env[1].value" schema.type "expected str, got int"
refused "args: a string (where a list is declared)" "C($LA)['args'] = 'learner --config /etc/dloco/learner.ini'" \
  Deployment dloco-learner-site-a-0 "$CT.args" schema.type "expected a list, got string"
refused "a container without name" "del C($SS)['name']" \
  StatefulSet dloco-sync "$CT.name" schema.required "required field missing (V1Container)"
refused "a Service port without port" "del O('Service', 'dloco-sync-public')['spec']['ports'][0]['port']" \
  Service dloco-sync-public spec.ports[0].port schema.required "required field missing (V1ServicePort)"
refused "memory: 4GB (not a quantity)" "C($LA)['resources']['requests']['memory'] = '4GB'" \
  Deployment dloco-learner-site-a-0 "$CT.resources.requests.memory" quantity.syntax "got string '4GB'"
refused "a selector that misses the template's labels" "${LB}['spec']['selector']['matchLabels']['dloco/learner'] = 'site-b-1'" \
  Deployment dloco-learner-site-b-0 spec.selector selector.matches-template "does not select the template's labels"
refused "a volumeMount naming no volume" "C($SS)['volumeMounts'][0]['name'] = 'stor'" \
  StatefulSet dloco-sync "$CT.volumeMounts[0].name" volumemount.volume-exists "'stor' names no volume of the pod"
refused "a name in upper case" "${LA}['metadata']['name'] = 'Dloco-Learner-Site-A-0'" \
  Deployment Dloco-Learner-Site-A-0 metadata.name name.dns-1123-subdomain "is not a DNS-1123 subdomain"
refused "a Service name of 64 characters" "O('Service', 'dloco-sync-public')['metadata']['name'] = 's' * 64" \
  Service "$(printf 's%.0s' {1..64})" metadata.name name.dns-1035-label "64 characters, more than 63"
refused "an unknown kind (Deploymnet)" "${LA}['kind'] = 'Deploymnet'" \
  Deploymnet dloco-learner-site-a-0 kind kind.unknown "unknown apiVersion/kind apps/v1 Deploymnet"
refused "a Secret that is not in the bundle" "P($SS)['volumes'][1]['secret']['secretName'] = 'dloco-sync-keyz'" \
  StatefulSet dloco-sync spec.template.spec.volumes[1].secret.secretName ref.same-bundle "Secret 'dloco-sync-keyz' is not in this input"
refused "serviceName of a Service that is not headless" "del O('Service', 'dloco-sync')['spec']['clusterIP']" \
  StatefulSet dloco-sync spec.serviceName statefulset.headless-service "without clusterIP: None"

# legal spellings the generated types do not show: a Quantity as a number, an IntOrString as an int
rc=none
edit "$T/numbers.yaml" "C($SS)['resources']['requests']['cpu'] = 2; O('Service', 'dloco-sync')['spec']['ports'][0]['targetPort'] = 5555" \
  && { "$PY" "$V" "$T/numbers.yaml" > /dev/null 2> "$T/numbers.err"; rc=$?; }
check "cpu: 2 and targetPort: 5555 are accepted (exit 0, got $rc)" [ "$rc" = 0 ]

# input errors: exit 2, nothing on stdout
sed '0,/^spec:$/s//spec: [/' "$B" > "$T/syntax.yaml"
printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n  name: b\n' > "$T/dup.yaml"
for f in syntax dup; do
  "$PY" "$V" "$T/$f.yaml" > "$T/$f.jsonl" 2> "$T/$f.err"; rc=$?
  both "$f.yaml: exit 2 (got $rc), no JSON lines, says: $(head -n 1 "$T/$f.err" | cut -c1-80)" \
    "$rc" = 2 "$(wc -c < "$T/$f.jsonl")" = 0
done
rc=$("$PY" "$V" "$T/no-such-file" > /dev/null 2>&1; echo $?)
check "an unreadable file: exit 2 (got $rc)" [ "$rc" = 2 ]

[ "$fail" = 0 ] || { echo "FAIL: k8s validate"; exit 1; }
echo "PASS: k8s validate"
