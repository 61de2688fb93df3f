#!/usr/bin/env python3
"""A tiny kustomize for the subset deploy/k8s uses, so the manifests render offline
without kustomize/kubectl: `resources` (files, or folders with a kustomization.yaml),
`namespace`, `replicas` (name/count) and `patches` with an inline JSON 6902 patch and a
kind/name target. Anything else in a kustomization.yaml is an error, so the subset
cannot grow silently. check.sh compares this against `kubectl kustomize` when one is
installed.

    render.py DIR  ->  the rendered multi-document YAML on stdout
"""
import copy
import os
import sys

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "replicas", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "StorageClass", "PriorityClass"}
SCALABLE = {"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController"}


def fail(msg):
    raise SystemExit(f"render.py: {msg}")


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def pointer(path):
    if not path.startswith("/"):
        fail(f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def walk(doc, parts):
    for p in parts:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc


def apply_op(doc, op):
    parts = pointer(op["path"])
    parent, last = walk(doc, parts[:-1]), parts[-1]
    kind = op["op"]
    if kind in ("add", "replace"):
        value = copy.deepcopy(op["value"])
        if isinstance(parent, list):
            if last == "-":
                parent.append(value)
            elif kind == "add":
                parent.insert(int(last), value)
            else:
                parent[int(last)] = value
        else:
            if kind == "replace" and last not in parent:
                fail(f"replace of missing path {op['path']}")
            parent[last] = value
    elif kind == "remove":
        del parent[int(last) if isinstance(parent, list) else last]
    else:
        fail(f"unsupported patch op {kind!r}")


def render(folder):
    kpath = os.path.join(folder, "kustomization.yaml")
    if not os.path.exists(kpath):
        fail(f"no kustomization.yaml in {folder}")
    k = load_docs(kpath)[0]
    extra = set(k) - SUPPORTED
    if extra:
        fail(f"{kpath}: unsupported fields {sorted(extra)} (extend render.py or avoid them)")
    docs = []
    for r in k.get("resources", []):
        p = os.path.normpath(os.path.join(folder, r))
        docs += render(p) if os.path.isdir(p) else load_docs(p)
    ns = k.get("namespace")
    if ns:
        for d in docs:
            if d["kind"] not in CLUSTER_SCOPED:
                d.setdefault("metadata", {})["namespace"] = ns
    for rep in k.get("replicas", []):
        hits = [d for d in docs if d["kind"] in SCALABLE and d["metadata"]["name"] == rep["name"]]
        if not hits:
            fail(f"{kpath}: replicas: no workload named {rep['name']}")
        for d in hits:
            d["spec"]["replicas"] = rep["count"]
    for patch in k.get("patches", []):
        t = patch.get("target") or fail(f"{kpath}: a patch needs a target")
        if set(patch) - {"target", "patch"} or set(t) - {"kind", "name"}:
            fail(f"{kpath}: only inline JSON 6902 patches with a kind/name target")
        ops = yaml.safe_load(patch["patch"])
        if not isinstance(ops, list):
            fail(f"{kpath}: only JSON 6902 (list of ops) patches")
        hits = [d for d in docs if d["kind"] == t["kind"] and d["metadata"]["name"] == t["name"]]
        if not hits:
            fail(f"{kpath}: patch target {t} matches nothing")
        for d in hits:
            for op in ops:
                apply_op(d, op)
    return docs


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("usage: render.py DIR")
    yaml.safe_dump_all(render(sys.argv[1]), sys.stdout, sort_keys=False)
