#!/usr/bin/env python3
"""Offline checks of rendered manifests (see ../check.sh).

    validate.py REPO_ROOT NAME=RENDERED.yaml ...

1. Every document against the Kubernetes JSON schemas of K8S_VERSION, strict (unknown
   fields rejected), from the kubernetes-validate package (schemas ship in the wheel; no
   network). CRDs: validated with a schema shipped in ../schemas/<group>-<version>-<Kind>.json,
   or skipped with a printed note when there is none.
2. Every container of a streamgate image runs a binary the Dockerfile builds and
   installs, and every workspace binary is installed.
3. Every STREAMGATE_* variable the manifests set (env, the streamgate ConfigMap, the keys
   of Secrets they load with envFrom) is one the binaries read (`env = "STREAMGATE_…"` in
   services/*/src and crates/*/src); other variables are RUST_LOG/OTEL_* or only feed a
   $(VAR) expansion.
4. Pod Security "restricted" fields, grpc startup/readiness/liveness probes on a declared
   port for the streamgate services, and autoscalers that agree with the partitions
   (one trigger per sg-<group>-pNN consumer, max replicas <= STREAMGATE_PARTITIONS).
"""
import glob
import json
import os
import re
import sys
import tomllib

import jsonschema
import kubernetes_validate
import yaml

K8S_VERSION = os.environ.get("K8S_VERSION", "1.30.0")
HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.path.join(HERE, "..", "schemas")
BUILTIN_GROUPS = {"", "v1", "apps", "batch", "policy", "autoscaling", "networking.k8s.io",
                  "rbac.authorization.k8s.io", "storage.k8s.io", "scheduling.k8s.io"}
PARTITIONED = {"normalizer": ("SG_RAW", "sg-normalizer")}  # + projector-<channel>

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


def ident(d):
    return f"{d.get('kind')}/{d.get('metadata', {}).get('name')}"


# ---------------------------------------------------------------- 1. schemas
def check_schema(name, d, notes):
    group = d["apiVersion"].split("/")[0] if "/" in d["apiVersion"] else ""
    if group in BUILTIN_GROUPS:
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path)
            err(f"{name} {ident(d)}", f"schema (k8s {K8S_VERSION}, strict): {e.message} at /{path}")
        except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as e:
            err(f"{name} {ident(d)}", f"no Kubernetes {K8S_VERSION} schema: {e}")
        return
    g, v = d["apiVersion"].split("/")
    path = os.path.join(SCHEMAS, f"{g}-{v}-{d['kind']}.json")
    if not os.path.exists(path):
        notes.add(f"note: {d['apiVersion']} {d['kind']} is a CRD without a shipped schema: not validated")
        return
    with open(path) as f:
        schema = json.load(f)
    for e in jsonschema.Draft202012Validator(schema).iter_errors(d):
        p = "/".join(str(x) for x in e.absolute_path)
        err(f"{name} {ident(d)}", f"schema ({os.path.basename(path)}): {e.message} at /{p}")
    notes.add(f"note: {d['apiVersion']} {d['kind']} validated with the shipped subset schema schemas/{os.path.basename(path)}")


# ---------------------------------------------------------------- 2. binaries
def dockerfile_binaries(root):
    text = open(os.path.join(root, "deploy", "Dockerfile")).read().replace("\\\n", " ")
    built, installed, entry = set(), {}, None
    for line in text.splitlines():
        line = line.strip()
        if re.match(r"RUN\b.*\bcargo build\b", line):
            built |= set(re.findall(r"(?:-p|--package)\s+([\w-]+)", line))
        m = re.match(r"COPY\s+--from=\S+\s+(.*)$", line)
        if m:
            *srcs, dest = m.group(1).split()
            for s in srcs:
                if "/target/release/" in s:
                    installed[os.path.join(dest, os.path.basename(s))] = os.path.basename(s)
        m = re.match(r"ENTRYPOINT\s+(\[.*\])", line)
        if m:
            entry = json.loads(m.group(1))
    return built, installed, entry


def workspace_bins(root):
    """{binary: package} over the workspace members."""
    ws = tomllib.load(open(os.path.join(root, "Cargo.toml"), "rb"))["workspace"]
    out = {}
    for member in ws["members"]:
        d = os.path.join(root, member)
        c = tomllib.load(open(os.path.join(d, "Cargo.toml"), "rb"))
        pkg = c["package"]["name"]
        bins = [b["name"] for b in c.get("bin", [])]
        if not bins and os.path.exists(os.path.join(d, "src", "main.rs")):
            bins = [pkg]
        bins += [os.path.basename(p)[:-3] for p in glob.glob(os.path.join(d, "src", "bin", "*.rs"))]
        for b in bins:
            out[b] = pkg
    return out


def check_binaries(root, rendered):
    built, installed, entry = dockerfile_binaries(root)
    bins = workspace_bins(root)
    for path, b in installed.items():
        if b not in bins:
            err("deploy/Dockerfile", f"installs {b}, which no workspace package builds")
        elif bins[b] not in built:
            err("deploy/Dockerfile", f"installs {b} but does not build its package {bins[b]} (-p {bins[b]})")
    for b, pkg in sorted(bins.items()):
        if b not in installed.values():
            err("deploy/Dockerfile", f"does not install workspace binary {b} (package {pkg})")
    for name, d, c in containers(rendered):
        if not c["image"].split("/")[-1].startswith("streamgate"):
            continue
        cmd = c.get("command") or entry or []
        exe = cmd[0] if cmd else None
        if exe not in installed:
            err(f"{name} {ident(d)} container {c['name']}",
                f"runs {exe!r}, not a binary the Dockerfile installs ({', '.join(sorted(installed))})")


# ---------------------------------------------------------------- 3. env vars
def read_env_names(root):
    names = set()
    for f in glob.glob(os.path.join(root, "services", "*", "src", "**", "*.rs"), recursive=True) + \
            glob.glob(os.path.join(root, "crates", "*", "src", "**", "*.rs"), recursive=True):
        names |= set(re.findall(r'env\s*=\s*"(STREAMGATE_[A-Z0-9_]+)"', open(f).read()))
    return names


def check_env(root, rendered):
    known = read_env_names(root)
    by_kind = {}
    for _, d in rendered:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    for name, d, c in containers(rendered):
        if not c["image"].split("/")[-1].startswith("streamgate"):
            continue
        where = f"{name} {ident(d)} container {c['name']}"
        env = c.get("env", [])
        expanded = {v for e in env for v in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", e.get("value", ""))}
        seen = []
        for e in env:
            seen.append(e["name"])
        for ef in c.get("envFrom", []):
            ref = ef.get("configMapRef") or ef.get("secretRef")
            kind = "ConfigMap" if "configMapRef" in ef else "Secret"
            obj = by_kind.get(kind, {}).get(ref["name"])
            if obj is None:
                err(where, f"envFrom {kind} {ref['name']} is not in the rendered manifests")
                continue
            seen += list((obj.get("data") or {}).keys()) + list((obj.get("stringData") or {}).keys())
        for n in seen:
            if n.startswith("STREAMGATE_"):
                if n not in known:
                    err(where, f"sets {n}, which no streamgate binary reads")
            elif not (n == "RUST_LOG" or n.startswith("OTEL_") or n in expanded):
                err(where, f"sets {n}, which is neither read by streamgate nor used in a $(...) expansion")
        for n in expanded:
            if n not in seen:
                err(where, f"$({n}) is expanded but not defined before")


# ---------------------------------------------------------------- 4. policy
def containers(rendered):
    for name, d in rendered:
        spec = pod_spec(d)
        if spec:
            for c in spec.get("initContainers", []) + spec.get("containers", []):
                yield name, d, c


def pod_spec(d):
    if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        return d["spec"]["template"]["spec"]
    return None


def check_policy(rendered):
    partitions = None
    for _, d in rendered:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "streamgate":
            partitions = int(d["data"]["STREAMGATE_PARTITIONS"])
    for name, d in rendered:
        spec = pod_spec(d)
        if not spec:
            continue
        psc = spec.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True:
            err(f"{name} {ident(d)}", "pod securityContext.runAsNonRoot must be true")
        if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            err(f"{name} {ident(d)}", "pod seccompProfile must be RuntimeDefault")
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            where = f"{name} {ident(d)} container {c['name']}"
            sc = c.get("securityContext", {})
            if sc.get("allowPrivilegeEscalation") is not False:
                err(where, "allowPrivilegeEscalation must be false")
            if sc.get("capabilities", {}).get("drop") != ["ALL"]:
                err(where, "capabilities.drop must be [ALL]")
            if sc.get("readOnlyRootFilesystem") is not True:
                err(where, "readOnlyRootFilesystem should be true")
            if "resources" not in c:
                err(where, "no resources")
            if c["image"].split("/")[-1].startswith("streamgate"):
                ports = {p["containerPort"] for p in c.get("ports", [])}
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    g = c.get(probe, {}).get("grpc")
                    if not g:
                        err(where, f"{probe} must be a grpc: probe")
                    elif g["port"] not in ports:
                        err(where, f"{probe} probes port {g['port']}, which the container does not declare")
    # Autoscalers against the partitions.
    for name, d in rendered:
        if d["kind"] == "ScaledObject":
            target, mx = d["spec"]["scaleTargetRef"]["name"], d["spec"].get("maxReplicaCount", 100)
            consumers = {trigger_consumer(t) for t in d["spec"]["triggers"]}
        elif d["kind"] == "HorizontalPodAutoscaler":
            target, mx, consumers = d["spec"]["scaleTargetRef"]["name"], d["spec"]["maxReplicas"], None
        else:
            continue
        if target == "normalizer":
            prefix = "sg-normalizer"
        elif target.startswith("projector-"):
            prefix = "sg-projector-" + target[len("projector-"):]
        else:
            continue
        if partitions is None:
            err(f"{name} {ident(d)}", "no STREAMGATE_PARTITIONS in ConfigMap streamgate")
            continue
        if mx > partitions:
            err(f"{name} {ident(d)}", f"max replicas {mx} > STREAMGATE_PARTITIONS {partitions}: the extra replicas hold no partition")
        if consumers is not None:
            width = len(str(max(partitions - 1, 10)))
            want = {f"{prefix}-p{i:0{width}d}" for i in range(partitions)}
            if consumers != want:
                err(f"{name} {ident(d)}", f"triggers must cover exactly the consumers {sorted(want)}; "
                    f"missing {sorted(want - consumers)}, extra {sorted(consumers - want)}")


def trigger_consumer(trigger):
    """The partition consumer a KEDA trigger scales on: nats-jetstream names it, a
    prometheus trigger selects streamgate_consumer_pending_messages by its label."""
    meta = trigger["metadata"]
    if trigger["type"] == "prometheus":
        query = meta.get("query", "")
        m = re.search(r'consumer="([^"]+)"', query)
        lag = "streamgate_consumer_pending_messages{" in query and 'stream="SG_RAW"' in query
        return m.group(1) if m and lag else None
    return meta.get("consumer")


def main():
    root, outputs = sys.argv[1], sys.argv[2:]
    notes = set()
    for spec in outputs:
        name, path = spec.split("=", 1)
        rendered = [(name, d) for d in yaml.safe_load_all(open(path)) if d]
        for _, d in rendered:
            check_schema(name, d, notes)
        check_binaries(root, rendered)
        check_env(root, rendered)
        check_policy(rendered)
        print(f"  {name}: {len(rendered)} objects")
    for n in sorted(notes):
        print("  " + n)
    if errors:
        for e in dict.fromkeys(errors):
            print("FAIL " + e)
        sys.exit(1)


if __name__ == "__main__":
    main()
