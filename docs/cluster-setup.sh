#!/usr/bin/env bash
# The cluster-side (kubectl) steps of docs/cluster-setup.md (steps 3, 4 and 6) and of docs/multi-node-training.md's
# set-up on GKE (Kubeflow Trainer v2, our runtimes and RBAC, Kueue and its queues), in the docs' order. The gcloud
# steps (cluster, node pools, bucket, service accounts, Artifact Registry, Cloud Build) stay in the docs: run them
# first. The docs quote this file's `# >>>` blocks verbatim (tests/test_docs.py checks it), and
# tests/test_cluster_setup.py runs it against a real kube-apiserver with KFP's and Trainer's manifests rendered at
# these releases. Safe to run again (an upgrade puts kfp-launcher's empty root back; this patches it again).
#
#   PROJECT_ID=my-project docs/cluster-setup.sh
#
# Environment:
#   PROJECT_ID        required: the pipeline root is gs://$PROJECT_ID-kfp/pipeline-root and the pipeline's pods act
#                     as kfp-runner@$PROJECT_ID.iam.gserviceaccount.com (cluster-setup.md step 4)
#   SKIP_WAIT=1       do not wait for Deployments to become available (a cluster with no nodes or controllers; each
#                     skipped wait is printed)
#   SKIP_KUEUE=1      leave out Kueue and its queues
#   KFP_CLUSTER_SCOPED, KFP_PLATFORM_AGNOSTIC, TRAINER_MANAGER, KUEUE_MANIFESTS
#                     where the manifests come from (`kubectl apply -k` targets, Kueue's a file or URL); by default
#                     the upstream releases below
set -euo pipefail
cd "$(dirname "$0")/.."
: "${PROJECT_ID:?set PROJECT_ID (docs/cluster-setup.md, "All commands assume")}"

# Waits for what controllers do; SKIP_WAIT=1 prints the wait instead.
await() {
  if [ "${SKIP_WAIT:-0}" = 1 ]; then echo "skipped (SKIP_WAIT=1): $*"; else "$@"; fi
}

# >>> cluster-setup.md: 3. Kubeflow Pipelines
export PIPELINE_VERSION=2.17.0
: "${KFP_CLUSTER_SCOPED:=github.com/kubeflow/pipelines/manifests/kustomize/cluster-scoped-resources?ref=$PIPELINE_VERSION}"
: "${KFP_PLATFORM_AGNOSTIC:=github.com/kubeflow/pipelines/manifests/kustomize/env/platform-agnostic?ref=$PIPELINE_VERSION}"
kubectl apply -k "$KFP_CLUSTER_SCOPED"
kubectl wait --for condition=established --timeout=60s crd/applications.app.k8s.io
kubectl apply -k "$KFP_PLATFORM_AGNOSTIC"
await kubectl -n kubeflow wait --for=condition=available --timeout=600s deployment --all
# <<<

RUNNER=kfp-runner@$PROJECT_ID.iam.gserviceaccount.com   # as in the doc's gcloud block before this one
# >>> cluster-setup.md: 4. Storage and Workload Identity
kubectl -n kubeflow annotate serviceaccount pipeline-runner --overwrite iam.gke.io/gcp-service-account=$RUNNER
# Artifacts and training checkpoints on GCS instead of the in-cluster object store (SeaweedFS). KFP's manifests
# already made the ConfigMap, with an empty root: patch it (`create` fails with AlreadyExists).
kubectl -n kubeflow patch configmap kfp-launcher --type merge \
  -p "{\"data\":{\"defaultPipelineRoot\":\"gs://$PROJECT_ID-kfp/pipeline-root\"}}"
kubectl -n kubeflow get configmap kfp-launcher -o jsonpath='{.data.defaultPipelineRoot}'   # the gs:// root
# <<<
echo

# >>> cluster-setup.md: 6. Let Cloud Build reach the KFP API privately
kubectl -n kubeflow patch svc ml-pipeline-ui -p \
  '{"metadata":{"annotations":{"networking.gke.io/load-balancer-type":"Internal"}},"spec":{"type":"LoadBalancer"}}'
# <<<

# >>> multi-node-training.md: Kubeflow Trainer v2
: "${TRAINER_MANAGER:=https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0}"
kubectl apply --server-side -k "$TRAINER_MANAGER"
await kubectl -n kubeflow-system wait --for=condition=available --timeout=300s deployment --all
kubectl apply --server-side -f manifests/trainer/tensorflow-multiworker.yaml   # the plain TensorFlow runtime
kubectl apply --server-side -f manifests/trainer/torch-multinode.yaml          # PyTorch: torchrun, PET_* env
kubectl apply --server-side -f manifests/trainer/jax-multinode.yaml            # JAX: jax.distributed, JAX_* env
kubectl apply --server-side -f manifests/trainer/launcher-rbac.yaml            # what the Train step may do
# <<<

if [ "${SKIP_KUEUE:-0}" = 1 ]; then echo "skipped (SKIP_KUEUE=1): Kueue and its queues"; exit 0; fi

# >>> multi-node-training.md: Kueue
: "${KUEUE_MANIFESTS:=https://github.com/kubernetes-sigs/kueue/releases/download/v0.19.2/manifests.yaml}"
kubectl apply --server-side -f "$KUEUE_MANIFESTS"
await kubectl -n kueue-system wait --for=condition=available --timeout=300s deployment --all
kubectl apply -f - <<'YAML'
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: t4
spec:
  nodeLabels:
    cloud.google.com/gke-accelerator: nvidia-tesla-t4
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: gpu
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: ["cpu", "memory", "nvidia.com/gpu"]
    flavors:
    - name: t4
      resources:
      - name: cpu
        nominalQuota: 16
      - name: memory
        nominalQuota: 64Gi
      - name: nvidia.com/gpu
        nominalQuota: 2
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: team-gpu
  namespace: kubeflow
spec:
  clusterQueue: gpu
YAML
# <<<
