#!/usr/bin/env bash
# Renders the upstream manifests that docs/cluster-setup.sh applies into this folder (README.md names each source),
# with `kubectl kustomize` (the kustomize that kubectl v1.36.3 embeds; `python -m tests.control_plane build` builds
# kubectl into ~/.cache/control-plane/), from local git clones of the four repositories:
#
#   tests/cluster_setup/render.sh PIPELINES_REPO TRAINER_REPO JOBSET_REPO ARGO_WORKFLOWS_REPO KUEUE_REPO
#
# Kueue's manifests.yaml is a release asset too: its `make artifacts` sets the manager's image to the tag
# (IMAGE_TAG, `kustomize edit set image controller=...`) and runs `kustomize build config/default`; so does this.
#
# KFP's Argo folders take Argo Workflows' manifests as remote kustomize targets
# (github.com/argoproj/argo-workflows/manifests/...?ref=v4.0.5): the same folders of a local checkout of that tag
# take their place.
# Trainer's overlay takes JobSet from a release asset (manifests/third-party/jobset: .../v0.12.0/manifests.yaml),
# which JobSet's `make artifacts` builds as `kustomize build config/default`: that is rendered from JobSet's tag and
# put in its place.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pipelines=$1 trainer=$2 jobset=$3 argo=$4 kueue=$5
KFP=2.17.0 TRAINER=v2.3.0 JOBSET=v0.12.0 ARGO=v4.0.5 KUEUE=v0.19.2
kubectl=${KUBECTL:-$HOME/.cache/control-plane/k8s-v1.36.3-etcd-v3.6.8/kubectl}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/kfp" "$work/trainer" "$work/jobset" "$work/argo" "$work/kueue"
git -C "$pipelines" archive "$KFP" manifests/kustomize | tar -x -C "$work/kfp"
git -C "$trainer" archive "$TRAINER" manifests | tar -x -C "$work/trainer"
git -C "$jobset" archive "$JOBSET" config | tar -x -C "$work/jobset"
git -C "$argo" archive "$ARGO" manifests/base manifests/namespace-install manifests/cluster-install-no-crds | tar -x -C "$work/argo"
for file in $(grep -rl "github.com/argoproj/argo-workflows/manifests" "$work/kfp"); do
  up=$(realpath --relative-to="$(dirname "$file")" "$work/argo")   # kustomize takes relative folders only
  sed -i -E "s#https://github.com/argoproj/argo-workflows/(manifests/[^?]*)\\?ref=$ARGO[^ ]*#$up/\\1#" "$file"
done
! grep -rn "https://github.com/argoproj" "$work/kfp" --include=kustomization.yaml

"$kubectl" kustomize "$work/kfp/manifests/kustomize/cluster-scoped-resources" \
  > "$here/kfp-$KFP-cluster-scoped-resources.yaml"
"$kubectl" kustomize "$work/kfp/manifests/kustomize/env/platform-agnostic" \
  > "$here/kfp-$KFP-platform-agnostic.yaml"

"$kubectl" kustomize "$work/jobset/config/default" > "$work/trainer/manifests/third-party/jobset/manifests.yaml"
sed -i "s|https://github.com/kubernetes-sigs/jobset/releases/download/$JOBSET/manifests.yaml|manifests.yaml|" \
  "$work/trainer/manifests/third-party/jobset/kustomization.yaml"
grep -q '^  - manifests.yaml$' "$work/trainer/manifests/third-party/jobset/kustomization.yaml"
"$kubectl" kustomize "$work/trainer/manifests/overlays/manager" > "$here/trainer-$TRAINER-manager.yaml"

git -C "$kueue" archive "$KUEUE" config | tar -x -C "$work/kueue"
sed -i "s|^  newTag: main$|  newTag: $KUEUE|" "$work/kueue/config/components/manager/kustomization.yaml"
grep -q "^  newTag: $KUEUE$" "$work/kueue/config/components/manager/kustomization.yaml"
"$kubectl" kustomize "$work/kueue/config/default" > "$here/kueue-$KUEUE-manifests.yaml"

cd "$here" && sha256sum kfp-*.yaml trainer-*.yaml kueue-*.yaml
