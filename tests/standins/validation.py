"""Schema checks the Kubernetes API server makes, for the stand-in (k8s_api.py, jobsets.py) and the tests.

- `crd_problems`: a custom resource against the `openAPIV3Schema` of its CustomResourceDefinition, vendored under
  tests/schemas/ (source and release in tests/schemas/README.md). Unknown fields are refused, as
  `kubectl apply` (field validation Strict) refuses them, unless the schema preserves unknown fields. CEL rules
  (`x-kubernetes-validations`) are not evaluated; the stand-in writes the few it relies on by hand.
- `resource_problems`: a built-in resource (Pod, PersistentVolume, PersistentVolumeClaim...) against the Kubernetes
  OpenAPI schema of KUBERNETES_VERSION, with the `kubernetes-validate` package (offline, strict).
- `job_problems`: a Job template (what a JobSet's replicated job holds) as a `batch/v1` Job, against the Kubernetes
  OpenAPI schema of KUBERNETES_VERSION, with the `kubernetes-validate` package (offline, strict), plus the
  podFailurePolicy rules the Job API validates in code (k8s.io/kubernetes pkg/apis/batch/validation).
"""

from __future__ import annotations

import copy
import functools
import os

SCHEMAS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schemas")
KUBERNETES_VERSION = "1.34"  # a GKE version in support when Trainer v2.3.0 shipped (it builds on k8s.io/api 0.36)
CRD_FILES = {
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "JobSet": "jobset.x-k8s.io_jobsets.yaml",
    "PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
}


def _strict(schema):
    """The schema with unknown fields refused wherever it lists the known ones."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@functools.lru_cache(maxsize=None)
def crd(kind: str) -> dict:
    """The vendored CustomResourceDefinition of `kind`."""
    import yaml

    with open(os.path.join(SCHEMAS, CRD_FILES[kind])) as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.lru_cache(maxsize=None)
def _validator(kind: str, version: str):
    import jsonschema

    served = [v for v in crd(kind)["spec"]["versions"] if v["name"] == version and v.get("served")]
    if not served:
        return None
    return jsonschema.Draft7Validator(_strict(copy.deepcopy(served[0]["schema"]["openAPIV3Schema"])))


def _path(parts) -> str:
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in parts).replace(".[", "[")


def crd_problems(body: dict) -> list[str]:
    """What the API server would refuse in `body` (a TrainJob, ClusterTrainingRuntime, JobSet or PyTorchJob), per
    its CRD."""
    kind = body.get("kind", "")
    if kind not in CRD_FILES:
        return [f"no CRD for kind {kind!r} (known: {', '.join(CRD_FILES)})"]
    group = crd(kind)["spec"]["group"]
    api_group, _, version = body.get("apiVersion", "").partition("/")
    validator = _validator(kind, version) if api_group == group else None
    if validator is None:
        return [f"apiVersion {body.get('apiVersion')!r} is not served for {kind} ({group})"]
    problems = []
    for error in sorted(validator.iter_errors(body), key=lambda e: list(map(str, e.absolute_path))):
        where = _path(error.absolute_path)
        if error.validator == "additionalProperties":
            known = set(error.schema.get("properties", {}))
            for field in sorted(set(error.instance) - known):
                problems.append(f'unknown field "{_path([*error.absolute_path, field])}"')
        else:
            problems.append(f"{where or '<root>'}: {error.message}")
    return problems


def resource_problems(resource: dict) -> list[str]:
    """What the API server would refuse in a built-in resource (a Pod, PersistentVolume, Job...) against the
    Kubernetes OpenAPI schema of KUBERNETES_VERSION (kubernetes-validate, strict: unknown fields refused)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{_path(e.path) or '<root>'}: {e.message}"]
    return []


def job_problems(job_template: dict, name: str = "job") -> list[str]:
    """What the API server would refuse in a Job made from `job_template` ({metadata, spec})."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {**job_template.get("metadata", {}), "name": name},
           "spec": job_template.get("spec", {})}
    problems = resource_problems(job)
    spec = job["spec"]
    policy = spec.get("podFailurePolicy")
    if policy is not None:
        if spec.get("template", {}).get("spec", {}).get("restartPolicy") != "Never":
            problems.append("spec.podFailurePolicy: only restartPolicy Never is supported with a podFailurePolicy")
        for index, rule in enumerate(policy.get("rules", [])):
            codes = rule.get("onExitCodes")
            if codes is None:
                continue
            values = codes.get("values", [])
            where = f"spec.podFailurePolicy.rules[{index}].onExitCodes.values"
            if values != sorted(set(values)):
                problems.append(f"{where}: must be ordered and without duplicates")
            if len(values) > 255:
                problems.append(f"{where}: must have at most 255 items")
            if codes.get("operator") == "In" and 0 in values:
                problems.append(f"{where}: 0 is not allowed for the In operator")
    if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
        problems.append("spec.completions: Required value: when completion mode is Indexed")
    return problems
