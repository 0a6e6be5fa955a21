"""Admission plugins of the Kubernetes API server that change the pods the stand-in's controllers create.

Source: the plugin's Go code in kubernetes/kubernetes (below), on the core/v1 Pod and Toleration API definitions.

- ExtendedResourceToleration (kubernetes plugin/pkg/admission/extendedresourcetoleration/admission.go, `Admit`;
  read at the indexed commit 143ac994fd76, lines 59-97, the plugin as added by kubernetes/kubernetes#55839): for
  every extended resource a container or init container requests (helper.IsExtendedResourceName: a name with a
  domain, outside `kubernetes.io/` and the `requests.` prefix), sorted, it adds the toleration `{key: <resource>,
  operator: Exists, effect: NoSchedule}` with helper.AddOrUpdateTolerationInPod (a toleration matching on key,
  operator, value and effect is replaced, else it is appended). The pod's requests include its limits by then: for
  a pod, SetDefaults_Pod (pkg/apis/core/v1/defaults.go) copies each limit without a request into the requests.
  GKE runs it: "GKE automatically applies the corresponding tolerations to Pods requesting GPUs by running the
  ExtendedResourceToleration admission controller" (cloud.google.com/kubernetes-engine/docs/how-to/gpus). The
  API server does not enable it by default; `KubernetesStandIn(admission_plugins=...)` says whether it runs.
"""

from __future__ import annotations

EXTENDED_RESOURCE_TOLERATION = "ExtendedResourceToleration"


def is_extended_resource_name(name: str) -> bool:
    """pkg/apis/core/helper IsExtendedResourceName: not a native resource (no domain, or under kubernetes.io/)
    and not a quota `requests.` name."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _matches(a: dict, b: dict) -> bool:
    """core.Toleration.MatchToleration: the same key, operator, value and effect."""
    return all(a.get(field, "") == b.get(field, "") for field in ("key", "operator", "value", "effect"))


def extended_resource_toleration(pod_spec: dict) -> None:
    """The plugin's Admit on a pod's spec, in place."""
    requested: set[str] = set()
    for container in [*pod_spec.get("containers", []), *pod_spec.get("initContainers", [])]:
        resources = container.get("resources") or {}
        names = {*(resources.get("limits") or {}), *(resources.get("requests") or {})}
        requested |= {name for name in names if is_extended_resource_name(name)}
    for name in sorted(requested):
        toleration = {"key": name, "operator": "Exists", "effect": "NoSchedule"}
        current = pod_spec.get("tolerations") or []
        if any(t == toleration for t in current):
            continue
        replaced = [toleration if _matches(toleration, t) else t for t in current]
        pod_spec["tolerations"] = replaced if replaced != current else [*current, toleration]


PLUGINS = {EXTENDED_RESOURCE_TOLERATION: extended_resource_toleration}


def admit_pod(plugins: tuple[str, ...], pod_spec: dict) -> None:
    """Runs the named mutating plugins on a pod spec about to be created, in order."""
    for name in plugins:
        PLUGINS[name](pod_spec)
