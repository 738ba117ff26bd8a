#!/usr/bin/python3
# Validates Kubernetes manifests offline against the API's schema, for when no
# API server answers `kubectl apply --dry-run`. Usage:
#   kubectl kustomize deploy/k8s | deploy/k8s/validate.py -      (or: validate.py FILE)
#
# The schema is the one in Debian's python3-kubernetes (22.6.0, API ~1.22):
# its model classes are generated from the Kubernetes OpenAPI spec and carry
# each field's JSON name and type (openapi_types, attribute_map); the client
# itself maps apiVersion + kind to the model (the `body` type of its
# create_[namespaced_]<kind> call), so an unknown apiVersion or kind is refused.
#
# Checked, per document:
#   - every key is a field of its model (a 1.22 server drops unknown fields
#     silently, so a typo would otherwise be lost); fields added after 1.22
#     are refused as unknown too;
#   - every value has its declared type, as the server's JSON decoder reads it:
#     str, int (not bool, not 2.0), number, bool, maps, lists, nested models;
#     null counts as absent. Two exceptions the generated types lose:
#     IntOrString fields (typed `object` here: ports, targetPort, maxSurge,
#     ...) take an int or a string (a port number 1..65535 or an IANA port
#     name; a count or "N%"); resource Quantity fields (typed `str` here) take
#     a number or a quantity string such as 500m, 4Gi, 1e3 (not 4GB);
#   - required fields are present (those whose generated setter refuses None
#     when client-side validation is on), byte fields are base64 (the setters'
#     own patterns);
#   - then, on the documents that passed the above, some of the API server's
#     rules and common mistakes, each named by `rule` in the output: names
#     (DNS-1123 subdomain; DNS-1123 label for Namespace, containers, volumes,
#     Service ports and StatefulSet, whose pods' hostnames are NAME-N;
#     DNS-1035 label for Service), label keys and values, ConfigMap/Secret
#     keys and base64 data, a workload's selector matches its template's
#     labels, a StatefulSet's serviceName is a headless Service, ports in
#     1..65535 and port names unique, container and volume names unique in a
#     pod, every volumeMount names a volume or volumeClaimTemplate, mount
#     paths unique, probes on named ports name a port of their container (the
#     kubelet's rule), and every ConfigMap/Secret a pod refers to (volumes,
#     projected sources, env valueFrom with its key, envFrom) is in the same
#     input and namespace unless `optional: true`: a same-bundle check, it
#     cannot see objects that are created by hand in the cluster.
# Not checked: server-side defaulting and the rest of the server's
# validation, admission (webhooks, pod security, quotas, limit ranges), CRDs
# and their kinds, RBAC, anything cluster-specific (namespaces or objects
# already in the cluster, the storage class, node labels, the node port
# range, the image existing and being pullable), immutable-field updates.
#
# Output on stdout, one JSON object a line: {"kind","name","ok":true} per valid
# document, {"kind","name","ok":false,"path","error","rule"} per problem;
# a summary on stderr. Exit 0: all valid; 1: any problem; 2: usage, an
# unreadable input, a YAML error (duplicate keys included), no python3-kubernetes.
import base64
import functools
import json
import re
import sys

try:
    import yaml
    import kubernetes
    from kubernetes import client as k8s
except ImportError as e:
    print(f"validate.py: {e} (Debian: apt-get install python3-kubernetes python3-yaml)", file=sys.stderr)
    sys.exit(2)

M = k8s.models
CFG = k8s.Configuration()
CFG.client_side_validation = True  # the setters refuse None for required fields

# the `object` fields of this client that are IntOrString (every other
# `object` field is free-form JSON: RawExtension, JSONSchemaProps, ...)
PORT_INT_OR_STRING = {("V1ServicePort", "target_port"), ("V1HTTPGetAction", "port"),
                      ("V1TCPSocketAction", "port"), ("V1NetworkPolicyPort", "port")}
COUNT_INT_OR_STRING = {(c, a) for c in ("V1RollingUpdateDeployment", "V1RollingUpdateDaemonSet")
                       for a in ("max_surge", "max_unavailable")} | \
    {("V1PodDisruptionBudgetSpec", "min_available"), ("V1PodDisruptionBudgetSpec", "max_unavailable")}
# the resource.Quantity fields of core/v1 (the client types them `str`)
QUANTITY = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
            ("V1EmptyDirVolumeSource", "size_limit"), ("V1ResourceFieldSelector", "divisor"),
            ("V1PersistentVolumeSpec", "capacity"), ("V1PersistentVolumeClaimStatus", "capacity"),
            ("V1ResourceQuotaSpec", "hard"), ("V1ResourceQuotaStatus", "hard"), ("V1ResourceQuotaStatus", "used"),
            ("V1LimitRangeItem", "default"), ("V1LimitRangeItem", "default_request"), ("V1LimitRangeItem", "max"),
            ("V1LimitRangeItem", "min"), ("V1LimitRangeItem", "max_limit_request_ratio"),
            ("V1NodeStatus", "allocatable"), ("V1NodeStatus", "capacity"), ("V1PodSpec", "overhead")}
for _c, _a in PORT_INT_OR_STRING | COUNT_INT_OR_STRING | QUANTITY:  # the tables must follow the client
    assert _a in getattr(M, _c).openapi_types, f"{_c}.{_a} is not in this kubernetes client"

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
QUANTITY_RE = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?")
PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "datetime": (str,), "date": (str,)}


def dns_problem(s, kind):
    """None if s is a valid `kind` name ('subdomain', 'label', 'dns-1035'), else why not"""
    rx, cap, what = {"subdomain": (DNS1123_SUBDOMAIN, 253, "DNS-1123 subdomain: lower case alphanumerics, '-', '.'"),
                     "label": (DNS1123_LABEL, 63, "DNS-1123 label: lower case alphanumerics and '-'"),
                     "dns-1035": (DNS1035_LABEL, 63, "DNS-1035 label: a letter, then lower case alphanumerics and '-'")
                     }[kind]
    if not isinstance(s, str) or not rx.fullmatch(s):
        return f"{s!r} is not a {what}, alphanumeric at both ends"
    return f"{s!r} is {len(s)} characters, more than {cap}" if len(s) > cap else None


def iana_port_name_problem(s):
    ok = len(s) <= 15 and re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", s) and "--" not in s and re.search("[a-z]", s)
    return None if ok else f"{s!r} is not an IANA port name: 1-15 lower case alphanumerics and '-', a letter, no '--'"


def label_problem(key, value):
    prefix, _, name = key.rpartition("/")
    if prefix and dns_problem(prefix, "subdomain") or not (len(name) <= 63 and LABEL_NAME.fullmatch(name)):
        return f"label key {key!r} is not [DNS-subdomain/]name (name: 1-63 alphanumerics, '-', '_', '.')"
    if value is not None and value != "" and not (len(value) <= 63 and LABEL_NAME.fullmatch(value)):
        return f"label value {value!r} is not 0-63 alphanumerics, '-', '_', '.' (alphanumeric at both ends)"
    return None


@functools.lru_cache(maxsize=None)
def model_for(api_version, kind):
    """the model class the client sends as the body of a create call for this apiVersion + kind, or None"""
    group, _, version = api_version.rpartition("/")
    if not re.fullmatch(r"[a-z0-9.-]*", group) or not re.fullmatch(r"v\d+((alpha|beta)\d+)?", version):
        return None
    api = "".join(p.capitalize() for p in group.removesuffix(".k8s.io").split(".")) if group else "Core"
    api_cls = getattr(k8s, f"{api}{version.capitalize()}Api", None)
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", kind)).lower()
    for call in (f"create_namespaced_{snake}", f"create_{snake}"):
        m = re.search(r":param (\w+) body:", getattr(getattr(api_cls, call, None), "__doc__", None) or "")
        if m and hasattr(M, m.group(1)):
            return getattr(M, m.group(1))
    return None


@functools.lru_cache(maxsize=None)
def required(cls):
    """the attributes whose setter refuses None, found by constructing the model until it stops refusing"""
    req = {}
    while True:
        try:
            cls(local_vars_configuration=CFG, **req)
            return tuple(req)
        except ValueError as e:
            m = re.search(r"Invalid value for `(\w+)`, must not be `None`", str(e))
            if not m or m.group(1) in req:
                raise
            req[m.group(1)] = ""  # a placeholder: the setters do not check types ("" is valid base64 too)


def sub(path, key):
    """path of a list item (int key) or map entry: a.b[0].c, a.labels["x/y"]"""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def kind_of(v):
    return "null" if v is None else {bool: "bool", int: "int", float: "number", str: "string", list: "list",
                                     dict: "map"}.get(type(v), type(v).__name__)


def walk(v, typ, path, owner, bad):
    """check value v against the client's type string typ; owner is (model name, attribute) for the tables"""
    if v is None:
        return
    m = re.fullmatch(r"list\[(.+)\]", typ)
    if m:
        if not isinstance(v, list):
            return bad(path, f"expected a list, got {kind_of(v)}", "schema.type")
        for i, x in enumerate(v):
            walk(x, m.group(1), sub(path, i), owner, bad)
        return
    m = re.fullmatch(r"dict\(str, (.+)\)", typ)
    if m:
        if not isinstance(v, dict):
            return bad(path, f"expected a map, got {kind_of(v)}", "schema.type")
        for k, x in v.items():
            if not isinstance(k, str):
                bad(sub(path, str(k)), f"a map key must be a string, got {kind_of(k)}", "schema.type")
            else:
                walk(x, m.group(1), sub(path, k), owner, bad)
        return
    if owner in QUANTITY:
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not number and not (isinstance(v, str) and QUANTITY_RE.fullmatch(v)):
            bad(path, f"expected a quantity (a number or a string such as 500m, 4Gi, 1e3), got {kind_of(v)} {v!r}",
                "quantity.syntax")
    elif owner in PORT_INT_OR_STRING:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            bad(path, f"expected a port number or name (IntOrString), got {kind_of(v)}", "schema.type")
        elif isinstance(v, int) and not 1 <= v <= 65535:
            bad(path, f"port {v} is not in 1..65535", "port.range")
        elif isinstance(v, str) and iana_port_name_problem(v):
            bad(path, iana_port_name_problem(v), "port.name")
    elif owner in COUNT_INT_OR_STRING:
        count = isinstance(v, int) and not isinstance(v, bool) and v >= 0
        if not count and not (isinstance(v, str) and re.fullmatch(r"\d+%", v)):
            bad(path, f"expected a count >= 0 or 'N%' (IntOrString), got {kind_of(v)} {v!r}", "schema.type")
    elif typ in PRIMITIVES:
        if isinstance(v, bool) and typ != "bool" or not isinstance(v, PRIMITIVES[typ]):
            shown = json.dumps(v, default=str)[:40]
            bad(path, f"expected {'number' if typ == 'float' else typ}, got {kind_of(v)} {shown}", "schema.type")
    elif typ != "object":  # object: free-form JSON
        walk_model(v, getattr(M, typ), path, bad)


def walk_model(v, cls, path, bad):
    if not isinstance(v, dict):
        return bad(path, f"expected a map ({cls.__name__}), got {kind_of(v)}", "schema.type")
    fields = {j: a for a, j in cls.attribute_map.items()}
    for k, x in v.items():
        if k not in fields:
            bad(sub(path, str(k)), f"unknown field; allowed: {', '.join(sorted(fields))}", "schema.unknown-field")
        else:
            walk(x, cls.openapi_types[fields[k]], sub(path, k), (cls.__name__, fields[k]), bad)
    present = {a: v[j] for j, a in fields.items() if v.get(j) is not None}
    for a in required(cls):
        if a not in present:
            bad(sub(path, cls.attribute_map[a]), f"required field missing ({cls.__name__})", "schema.required")
            present[a] = ""
    try:  # the setters' own checks beyond None (base64 patterns of byte fields)
        cls(local_vars_configuration=CFG, **present)
    except ValueError as e:
        bad(path, str(e), "schema.pattern")


# ---- the server's rules and common mistakes, on documents that passed the schema

TEMPLATE = ("spec", "template", "spec")
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController", "Job")
POD_SPEC = {"Pod": ("spec",), "PodTemplate": ("template", "spec"), "CronJob": ("spec", "jobTemplate") + TEMPLATE,
            **{k: TEMPLATE for k in WORKLOADS}}  # where each kind keeps its PodSpec
NAME_RULE = {"Namespace": "label", "StatefulSet": "label", "Service": "dns-1035"}  # others: subdomain


def dig(d, keys):
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def selects(sel, labels):
    """a LabelSelector (matchLabels + matchExpressions) against a label map"""
    if any(labels.get(k) != v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    for e in sel.get("matchExpressions") or []:
        has, vals = e["key"] in labels, e.get("values") or []
        ok = {"In": has and labels[e["key"]] in vals, "NotIn": not has or labels[e["key"]] not in vals,
              "Exists": has, "DoesNotExist": not has}.get(e["operator"], False)
        if not ok:
            return False
    return True


def semantics(doc, index, bad):
    kind, meta, spec = doc["kind"], doc.get("metadata") or {}, doc.get("spec") or {}
    ns = meta.get("namespace")
    if meta.get("name") is None and meta.get("generateName") is None:
        bad("metadata.name", "required field missing (or metadata.generateName)", "name.required")
    elif meta.get("name") is not None:
        rule = NAME_RULE.get(kind, "subdomain")
        if dns_problem(meta["name"], rule):
            bad("metadata.name", dns_problem(meta["name"], rule),
                "name.dns-1035-label" if rule == "dns-1035" else f"name.dns-1123-{rule}")
    if ns is not None and dns_problem(ns, "label"):
        bad("metadata.namespace", dns_problem(ns, "label"), "name.dns-1123-label")
    label_maps = {"metadata.labels": meta.get("labels"),
                  "spec.selector.matchLabels": dig(spec, ("selector", "matchLabels")),
                  "spec.template.metadata.labels": dig(spec, ("template", "metadata", "labels"))}
    if kind == "Service":
        label_maps["spec.selector"] = spec.get("selector")
    for path, labels in label_maps.items():
        for k, v in labels.items() if isinstance(labels, dict) else ():
            if label_problem(k, v):
                bad(sub(path, k), label_problem(k, v), "label.syntax")
    for f in ("data", "stringData", "binaryData") if kind in ("ConfigMap", "Secret") else ():
        for k, v in (doc.get(f) or {}).items():
            if not (len(k) <= 253 and re.fullmatch(r"[-._a-zA-Z0-9]+", k)):
                bad(sub(f, k), f"key {k!r} is not 1-253 alphanumerics, '-', '_', '.'", "data.key")
            if f == "binaryData" or kind == "Secret" and f == "data":
                try:  # the server decodes []byte with Go's strict base64, which skips newlines
                    base64.b64decode(re.sub(r"[\r\n]", "", v), validate=True)
                except ValueError:
                    bad(sub(f, k), "not base64 (use stringData for plain text)", "data.base64")
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
        sel, tl = spec.get("selector") or {}, dig(spec, ("template", "metadata", "labels")) or {}
        if not sel.get("matchLabels") and not sel.get("matchExpressions"):
            bad("spec.selector", "an empty selector is invalid", "selector.matches-template")
        elif not selects(sel, tl):
            bad("spec.selector", f"does not select the template's labels {json.dumps(tl, sort_keys=True)}",
                "selector.matches-template")
    if kind == "StatefulSet":
        svc = index.get(("Service", ns, spec.get("serviceName")))
        if svc is None or dig(svc, ("spec", "clusterIP")) != "None":
            what = "is not a Service in this input" if svc is None else "is a Service without clusterIP: None"
            bad("spec.serviceName", f"{spec.get('serviceName')!r} {what}: a StatefulSet's pods get their DNS names "
                "from a headless Service (same-bundle check)", "statefulset.headless-service")
        for i, c in enumerate(spec.get("volumeClaimTemplates") or []):
            if dns_problem((c.get("metadata") or {}).get("name"), "label"):
                bad(f"spec.volumeClaimTemplates[{i}].metadata.name", dns_problem(c["metadata"].get("name"), "label"),
                    "name.dns-1123-label")
    if kind == "Service":
        ports, seen = spec.get("ports") or [], set()
        for i, p in enumerate(ports):
            for f in ("port", "nodePort"):
                if p.get(f) is not None and not 1 <= p[f] <= 65535:
                    bad(f"spec.ports[{i}].{f}", f"port {p[f]} is not in 1..65535", "port.range")
            if p.get("name") is None and len(ports) > 1:
                bad(f"spec.ports[{i}].name", "required when a Service has more than one port", "port.name")
            elif p.get("name") is not None:
                why = dns_problem(p["name"], "label") or ("duplicate port name" if p["name"] in seen else None)
                if why:
                    bad(f"spec.ports[{i}].name", why, "port.name")
                seen.add(p["name"])
    if kind in POD_SPEC and isinstance(dig(doc, POD_SPEC[kind]), dict):
        claims = {(c.get("metadata") or {}).get("name") for c in spec.get("volumeClaimTemplates") or []}
        pod_semantics(dig(doc, POD_SPEC[kind]), ".".join(POD_SPEC[kind]), claims, ns, index, bad)


def pod_semantics(pod, pp, claims, ns, index, bad):
    def ref(path, kind, name, optional, key=None):
        """a ConfigMap or Secret (and a key of it) that the pod needs"""
        obj = index.get((kind, ns, name))
        keys = {k for f in ("data", "stringData", "binaryData") for k in (obj or {}).get(f) or {}}
        if optional:
            return
        if obj is None:
            bad(path, f"{kind} {name!r} is not in this input (same-bundle check; namespace {ns})", "ref.same-bundle")
        elif key is not None and key not in keys:
            bad(path, f"{kind} {name!r} has no key {key!r} (same-bundle check)", "ref.same-bundle")

    vols = {}
    for i, v in enumerate(pod.get("volumes") or []):
        vp = f"{pp}.volumes[{i}]"
        if dns_problem(v["name"], "label"):
            bad(f"{vp}.name", dns_problem(v["name"], "label"), "name.dns-1123-label")
        elif v["name"] in vols:
            bad(f"{vp}.name", f"duplicate volume name {v['name']!r}", "volume.unique-name")
        vols[v["name"]] = v
        if v.get("configMap"):
            ref(f"{vp}.configMap.name", "ConfigMap", v["configMap"].get("name"), v["configMap"].get("optional"))
        if v.get("secret"):
            ref(f"{vp}.secret.secretName", "Secret", v["secret"].get("secretName"), v["secret"].get("optional"))
        for j, s in enumerate(dig(v, ("projected", "sources")) or []):
            for f, kind in (("configMap", "ConfigMap"), ("secret", "Secret")):
                if s.get(f):
                    ref(f"{vp}.projected.sources[{j}].{f}.name", kind, s[f].get("name"), s[f].get("optional"))
    names = set()
    for group in ("initContainers", "containers"):
        for i, c in enumerate(pod.get(group) or []):
            cp = f"{pp}.{group}[{i}]"
            if dns_problem(c["name"], "label"):
                bad(f"{cp}.name", dns_problem(c["name"], "label"), "name.dns-1123-label")
            elif c["name"] in names:
                bad(f"{cp}.name", f"duplicate container name {c['name']!r} in the pod", "container.unique-name")
            names.add(c["name"])
            container_semantics(c, cp, vols, claims, ref, bad)


def container_semantics(c, cp, vols, claims, ref, bad):
    port_names = set()
    for j, p in enumerate(c.get("ports") or []):
        for f in ("containerPort", "hostPort"):
            if p.get(f) is not None and not 1 <= p[f] <= 65535:
                bad(f"{cp}.ports[{j}].{f}", f"port {p[f]} is not in 1..65535", "port.range")
        if p.get("name") is not None:
            why = iana_port_name_problem(p["name"]) or ("duplicate port name" if p["name"] in port_names else None)
            if why:
                bad(f"{cp}.ports[{j}].name", why, "port.name")
            port_names.add(p["name"])
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        for act in ("httpGet", "tcpSocket"):
            port = dig(c, (probe, act, "port"))
            if isinstance(port, str) and port not in port_names:
                bad(f"{cp}.{probe}.{act}.port", f"names no port of this container "
                    f"({', '.join(sorted(port_names)) or 'none'}); the kubelet fails the probe", "probe.named-port")
    paths = set()
    for j, m in enumerate(c.get("volumeMounts") or []):
        if m["name"] not in vols and m["name"] not in claims:
            bad(f"{cp}.volumeMounts[{j}].name", f"{m['name']!r} names no volume of the pod "
                f"({', '.join(sorted(set(vols) | claims)) or 'none'})", "volumemount.volume-exists")
        if m["mountPath"] in paths:
            bad(f"{cp}.volumeMounts[{j}].mountPath", f"{m['mountPath']!r} is mounted twice", "volumemount.unique-path")
        paths.add(m["mountPath"])
    for j, e in enumerate(c.get("env") or []):
        for f, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")):
            r = dig(e, ("valueFrom", f))
            if r:
                ref(f"{cp}.env[{j}].valueFrom.{f}", kind, r.get("name"), r.get("optional"), r["key"])
    for j, e in enumerate(c.get("envFrom") or []):
        for f, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            if e.get(f):
                ref(f"{cp}.envFrom[{j}].{f}.name", kind, e[f].get("name"), e[f].get("optional"))


# ---- input: YAML as kubectl reads it (no timestamp type, duplicate keys refused)

class Loader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        seen = set()
        for k, _ in node.value:
            key = self.construct_object(k, deep=True)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", k.start_mark)
            seen.add(key if isinstance(key, (str, int, float, bool)) else id(k))
        return super().construct_mapping(node, deep)


Loader.yaml_implicit_resolvers = {c: [r for r in rs if r[0] != "tag:yaml.org,2002:timestamp"]
                                  for c, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def check(d, index):
    """the problems of one document: a list of {path, error, rule}"""
    probs = []
    bad = lambda path, error, rule: probs.append({"path": path, "error": error, "rule": rule})  # noqa: E731
    if not isinstance(d, dict):
        bad("", f"a document must be a map, got {kind_of(d)}", "schema.type")
    elif not isinstance(d.get("apiVersion"), str) or not isinstance(d.get("kind"), str):
        bad("kind" if isinstance(d.get("apiVersion"), str) else "apiVersion", "required: a string", "schema.required")
    elif model_for(d["apiVersion"], d["kind"]) is None:
        bad("kind", f"unknown apiVersion/kind {d['apiVersion']} {d['kind']} (not in the Kubernetes "
            f"{kubernetes.__version__} client's API; CRDs are not checked)", "kind.unknown")
    else:
        walk_model(d, model_for(d["apiVersion"], d["kind"]), "", bad)
        if not probs:
            semantics(d, index, bad)
    return probs


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print("usage: validate.py FILE|-   (multi-document YAML such as `kubectl kustomize deploy/k8s` writes)",
              file=sys.stderr)
        return 0 if len(argv) == 2 else 2
    try:
        text = sys.stdin.read() if argv[1] == "-" else open(argv[1], encoding="utf-8").read()
        docs = [d for d in yaml.load_all(text, Loader=Loader) if d is not None]
    except (OSError, UnicodeDecodeError) as e:
        print(f"validate.py: cannot read {argv[1]}: {e}", file=sys.stderr)
        return 2
    except yaml.YAMLError as e:
        print(f"validate.py: {argv[1]}: YAML error: {e}", file=sys.stderr)
        return 2
    index = {}  # (kind, namespace, name) -> document, for the same-bundle checks
    for d in docs:
        if isinstance(d, dict) and isinstance(d.get("metadata"), dict):
            index.setdefault((d.get("kind"), d["metadata"].get("namespace"), d["metadata"].get("name")), d)
    nbad = nprob = 0
    for d in docs:
        kind, name = (d.get("kind") if isinstance(d, dict) else None), dig(d, ("metadata", "name"))
        probs = check(d, index)
        for p in probs:
            print(json.dumps({"kind": kind, "name": name, "ok": False, **p}))
            print(f"  {kind}/{name}: {p['path'] or '(document)'}: {p['error']} [{p['rule']}]", file=sys.stderr)
        if not probs:
            print(json.dumps({"kind": kind, "name": name, "ok": True}))
        nbad, nprob = nbad + bool(probs), nprob + len(probs)
    print(f"validate.py: {len(docs)} objects, {len(docs) - nbad} valid, {nprob} problems (schema: python3-kubernetes "
          f"{kubernetes.__version__}; ConfigMap/Secret/Service references checked within this input only)",
          file=sys.stderr)
    return 1 if nbad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
