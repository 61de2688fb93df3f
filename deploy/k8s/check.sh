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
if ! "$py" -c 'import kubernetes_validate, yaml, jsonschema' 2>/dev/null; then
  echo "== installing kubernetes-validate (PyPI; ships the Kubernetes JSON schemas)"
  PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --quiet --disable-pip-version-check \
    'kubernetes-validate==1.37.0' pyyaml
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
echo "k8s: ${#rendered[@]} renders OK"
