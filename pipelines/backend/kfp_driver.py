"""What a KFP backend makes of the compiled pipeline: the pod, and the TaskConfig, its driver creates for each step.

A model of the KFP v2 driver's pod-spec resolution (`initPodSpecPatch`, `extendPodSpecPatch`) for the fields this
pipeline uses: the container's image and resources (CPU, memory, accelerator limit), the node selector and
tolerations (fixed, and the `_json` forms fed by parameters or task outputs), pod labels, and the TaskConfig
passthrough (`dsl.TaskConfig` inputs, with and without `apply_to_task`). Each rule cites the file and line it follows
in kubeflow/pipelines at the tag `PINNED_RELEASE` (paths under backend/src/v2/); what older releases lack is gated
by `FEATURES`, the first release of each (checked against the release tags): a release that does not know a
compiled field drops it (2.4.1 and newer) or fails the task on it (2.4.0 and older), and `DriverError` says which.
PVC mounts and pod annotations are modelled too; environment variables and affinity are not: the pipeline sets none.
tests/test_kfp_backend.py runs the real compiler and driver (CHECKED_AGAINST) on every compiled variant and compares
each pod with this model; tests/test_kfp_driver_upstream.py runs the driver's own driver_test.go and k8s_test.go
cases at 2.17.0 through the model.

Values keep their protobuf kinds as Python types (str: string_value, int/float: number_value, bool, dict: struct,
list: list, None: null), since the driver reads a placeholder with `GetStringValue()`, which is "" for a number.
"""

from __future__ import annotations

import dataclasses
import json
import re
from decimal import ROUND_CEILING, Decimal
from typing import Any

import yaml

PINNED_RELEASE = "2.17.0"
PINNED = f"kubeflow/pipelines {PINNED_RELEASE}"
# The releases whose own compiler and driver (tests/kfp_backend, a Go program built from each release's commit) the
# model is compared with, field by field, for every pipeline variant: tests/test_kfp_backend.py.
CHECKED_AGAINST = ("2.17.0", "2.16.1", "2.15.0")


@dataclasses.dataclass(frozen=True)
class Feature:
    """A backend feature the compiled pipeline may use, the first KFP backend release that has it, and why."""

    name: str
    description: str
    first_release: str
    evidence: str


FEATURES = {f.name: f for f in [
    Feature("pod_labels", "pod labels from kfp-kubernetes (the Kueue queue label)", "2.1.0",
            "compiler/argocompiler/container.go extendPodMetadata; first tag with GetPodMetadata: 2.1.0"),
    Feature("resource_placeholders", "accelerator type/count, CPU and memory from placeholders "
            "(resourceType, resourceCount, resourceCpuRequest, ...)", "2.4.0",
            "commit 7c931ae201 (#11501), driver/driver.go initPodSpecPatch"),
    Feature("dynamic_images", "a step's image from a parameter or another step's output (the image step)", "2.4.0",
            "commit 22e85de2bc (#11404), driver/driver.go initPodSpecPatch resolvePodSpecInputRuntimeParameter; "
            "first tag with it: 2.4.0"),
    Feature("lenient_config", "the driver reads its specs allowing fields it does not know", "2.4.1",
            "backend/src/common/util/json.go:70-75 UnmarshalString (AllowUnknownFields), used by "
            "cmd/driver/main.go:203 at 2.4.1; 2.4.0 and older: jsonpb.UnmarshalString (cmd/driver/main.go:138), "
            "which fails on an unknown field"),
    Feature("k8s_json_inputs", "nodeSelectorJson / tolerationJson from parameters and task outputs, "
            "tolerationJson as a list", "2.5.0",
            "commits fd1b48b471 (#11770) and 90909fc0ef, driver/k8s.go extendPodSpecPatch"),
    Feature("recurring_latest", "recurring runs on the pipeline's latest version (no version id)", "2.5.0",
            "commit 9c5b72c2d0 (#11560), scheduled workflow controller"),
    Feature("task_config_passthrough", "TaskConfig passthrough (dsl.TaskConfig inputs, apply_to_task)", "2.15.0",
            "commit a6f7fb6e84 (#12185), driver/driver.go getTaskConfigOptions, driver/container.go"),
    Feature("pvc_sub_path", "a PVC mounted at a sub-path (kfp-kubernetes mount_pvc(sub_path=...))", "2.16.0",
            "commit 5bb3454c0d (#12595), driver/k8s.go makeVolumeMountPatch `SubPath: pvcMount.GetSubPath()` "
            "(2.16.1:1085); 2.15.0's kubernetes_platform PvcMount has no sub_path, and its API server's compiler "
            "reads the Kubernetes config strictly (argocompiler: failed to unmarshal kubernetes config: unknown field "
            "subPath), so it refuses the run"),
]}

# The TaskConfig fields kfp's executor reads (kfp/dsl/executor.py) by the driver's JSON names (driver/driver.go:112).
TASK_CONFIG_FIELDS = ("affinity", "tolerations", "nodeSelector", "env", "volumes", "volumeMounts", "resources")
# driver/util.go:41 at 2.17.0: a placeholder the driver resolves from the task's input parameters.
_INPUT_CHANNEL = re.compile(r"\$.inputs.parameters\['(.+?)'\]")


class DriverError(ValueError):
    """The driver would fail the task (or the model cannot resolve it): the message says which and why."""


@dataclasses.dataclass(frozen=True)
class Unresolved:
    """An input fed by a task output that was not given: fine unless a pod field needs it."""

    why: str

    def need(self) -> None:
        raise DriverError(self.why)


def release_tuple(release: str) -> tuple[int, int, int]:
    """(2, 15, 0) from "2.15.0", "v2.15.0" or "2.15.0-rc.1"; ValueError for anything else."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?", release.strip())
    if not match:
        raise ValueError(f"{release!r} is not a KFP release (e.g. 2.15.0)")
    return int(match[1]), int(match[2]), int(match[3])


def has(release: str, feature: str) -> bool:
    return release_tuple(release) >= release_tuple(FEATURES[feature].first_release)


# --- Kubernetes quantities ----------------------------------------------------------------------------------
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?")


def canonical_quantity(text: str) -> str:
    """A Kubernetes quantity as the API writes it back: `k8s.io/apimachinery` v0.35.2 (KFP 2.17.0's go.mod:66),
    pkg/api/resource/quantity.go: ParseQuantity (:278) keeps the format of the suffix (binary, decimal SI, or
    exponent `e3`: suffix.go interpret), then String/MarshalJSON (:680, :694) write the canonical form of
    CanonicalizeBytes (:425): an integer mantissa with the largest power-of-1000 suffix in that format (0.5 ->
    500m, 0.512G -> 512M, 1000e0 -> 1e3), rounded up to 1n; binary suffixes stay binary only for a whole number of
    at least 1024 (else decimal SI). The rows of quantity_test.go that pin this: tests/test_kfp_driver_upstream.py."""
    match = _QUANTITY.fullmatch(text.strip()) if text else None
    if not match:
        raise DriverError(f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?"
                          f"[0-9]*)$' (ParseQuantity): {text!r}")
    number, exponent, suffix = Decimal(match[1]), match[2], match[3] or ""
    if number == 0:
        return "0"
    if suffix in _BINARY:
        value = number * (Decimal(2) ** _BINARY[suffix])
        if abs(value) >= 1024 and value == value.to_integral_value():
            bits = max(b for b in (0, *_BINARY.values()) if value % (Decimal(2) ** b) == 0)
            unit = {v: k for k, v in _BINARY.items()}.get(bits, "")
            return f"{int(value / (Decimal(2) ** bits))}{unit}"
    elif exponent:
        value = number * Decimal(10) ** int(exponent[1:])
    else:
        value = number * Decimal(10) ** _DECIMAL[suffix]
    nanos = (value * Decimal(10) ** 9).to_integral_value(rounding=ROUND_CEILING)
    power = -9
    while nanos % (Decimal(10) ** (power + 12)) == 0 and (exponent or power + 3 <= 18):
        power += 3
    mantissa = int(nanos / Decimal(10) ** (power + 9))
    if exponent:  # DecimalExponent: "e<power>", nothing for 10^0 (suffix.go constructBytes)
        return f"{mantissa}e{power}" if power else str(mantissa)
    unit = {v: k for k, v in _DECIMAL.items()}[power]
    return f"{mantissa}{unit}"


def _go_float(value: float) -> str:
    """Go's %v of a float64 (16 -> "16", 0.512 -> "0.512"), as the driver formats the old numeric fields."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


# --- the pod ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class TaskPod:
    """The pod the driver creates for one task (its `main` container's fields), and the TaskConfig it hands to
    the task's `dsl.TaskConfig` input (None when the component takes none)."""

    task: str
    display_name: str
    image: str
    resources: dict
    node_selector: dict | None
    tolerations: list | None
    labels: dict
    task_config: dict | None
    notes: list[str] = dataclasses.field(default_factory=list)
    annotations: dict = dataclasses.field(default_factory=dict)
    volumes: list | None = None
    volume_mounts: list | None = None
    inputs: dict = dataclasses.field(default_factory=dict, repr=False)  # the task's resolved parameter inputs

    @property
    def gpus(self) -> int:
        return gpu_count(self.resources)

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "inputs"}


def gpu_count(resources: dict | None, resource: str = "nvidia.com/gpu") -> int:
    """The GPUs a container's resources (Kubernetes ResourceRequirements JSON) ask for; 0 when none."""
    limit = ((resources or {}).get("limits") or {}).get(resource)
    return int(Decimal(str(limit))) if limit not in (None, "") else 0


def read_package(path: str) -> tuple[dict, dict]:
    """A compiled pipeline: its PipelineSpec and its Kubernetes executors (the platform spec; {} when none)."""
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    if not docs or "root" not in docs[0]:
        raise DriverError(f"{path} is not a compiled KFP pipeline (no PipelineSpec root)")
    platform = docs[1] if len(docs) > 1 else {}
    executors = platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})
    return docs[0], executors


def pipeline_parameters(spec: dict, given: dict) -> dict:
    """The run's pipeline parameters: `given` over the compiled defaults, each of the kind KFP stores it as."""
    values = {name: p["defaultValue"] for name, p in spec["root"].get("inputDefinitions", {})
              .get("parameters", {}).items() if "defaultValue" in p}
    kinds = {name: p.get("parameterType") for name, p in spec["root"].get("inputDefinitions", {})
             .get("parameters", {}).items()}
    unknown = sorted(set(given) - set(kinds))
    if unknown:
        raise DriverError(f"Unknown pipeline parameter(s) {unknown}")
    # A NUMBER_INTEGER parameter travels as a number (structpb has no integers), whether given or defaulted.
    return values | dict(given)


def resolve_input(spec: dict, dag_inputs: dict, task_outputs: dict, what: str) -> Any:
    """One TaskInputsSpec.InputParameterSpec: a DAG input, a producer task's output, or a constant."""
    if "componentInputParameter" in spec:
        name = spec["componentInputParameter"]
        if name not in dag_inputs:
            raise DriverError(f"{what}: the DAG has no input {name!r}")
        return dag_inputs[name]
    if "taskOutputParameter" in spec:
        producer, key = spec["taskOutputParameter"]["producerTask"], spec["taskOutputParameter"]["outputParameterKey"]
        if key not in task_outputs.get(producer, {}):
            return Unresolved(f"{what} needs output {key!r} of task {producer!r}, which was not given")
        return task_outputs[producer][key]
    if "runtimeValue" in spec:
        return spec["runtimeValue"].get("constant")
    raise DriverError(f"{what}: input kind {sorted(spec)} is not modelled")


# The run id explain shows (a run's is its KFP run UUID).
RUN_ID = "RUN_ID"


def run_placeholder(value: Any, task_name: str) -> Any:
    """driver/resolve.go:435-452 at 2.17.0: a constant input that is exactly the run's or the task's placeholder
    becomes its value (the run id, the task's name); any other value stays as it is."""
    return {"{{$.pipeline_job_uuid}}": RUN_ID, "{{$.pipeline_task_name}}": task_name}.get(value, value) \
        if isinstance(value, str) else value


def resolve_placeholder(value: str, inputs: dict, what: str) -> str:
    """driver/resolve.go:818 resolvePodSpecInputRuntimeParameter: a `{{$.inputs.parameters['x']}}` placeholder
    becomes the input's GetStringValue() (:825): "" for anything but a string (a number included)."""
    match = _INPUT_CHANNEL.search(value or "")
    if not match:
        return value
    if match[1] not in inputs:
        raise DriverError(f"{what}: executorInput did not contain container Image input parameter")  # :827
    resolved = inputs[match[1]]
    if isinstance(resolved, Unresolved):
        resolved.need()
    return resolved if isinstance(resolved, str) else ""


def task_config_options(component: dict, release: str) -> tuple[set, set]:
    """driver/driver.go:205-240 getTaskConfigOptions (2.15.0:182-217): (fields passed through, fields set on the
    pod). Every field is set on the pod (:212-219); a component's passthrough list only adds the fields it names to
    the TaskConfig (:235) and sets each of them on the pod only with apply_to_task (:236). Fields it does not name
    stay on the pod."""
    fields = {"RESOURCES", "ENV", "KUBERNETES_AFFINITY", "KUBERNETES_TOLERATIONS", "KUBERNETES_NODE_SELECTOR",
              "KUBERNETES_VOLUMES"}
    passthroughs = component.get("taskConfigPassthroughs") or []
    if not passthroughs or not has(release, "task_config_passthrough"):
        return set(), fields
    passed = {p["field"] for p in passthroughs}
    kept_off = {p["field"] for p in passthroughs if not p.get("applyToTask")}
    return passed, fields - kept_off


def container_resources(container: dict, inputs: dict, release: str) -> dict:
    """driver/driver.go:358-447 at 2.17.0: CPU and memory from the placeholder fields (getPodResource, :173: the new
    field when set, else the old number, "%vG" for memory), then the accelerator limit (:415-447): its type and count
    resolved from placeholders, set only when both are non-empty (:440) and parsed as a quantity (:441)."""
    resources = container.get("resources") or {}
    limits, requests = {}, {}
    new_fields = has(release, "resource_placeholders")
    if not new_fields:  # the SDK writes them beside the old numbers; a driver before 2.4.0 fails on them
        for key in [k for k in resources if k.startswith("resource")] + \
                   [k for k in resources.get("accelerator") or {} if k.startswith("resource")]:
            unknown_field(release, key, "container spec")
    for target, name, old, unit in ((limits, "memory", "memoryLimit", "G"), (requests, "memory", "memoryRequest", "G"),
                                    (limits, "cpu", "cpuLimit", ""), (requests, "cpu", "cpuRequest", "")):
        placeholder = resources.get("resource" + old[0].upper() + old[1:]) if new_fields else None
        if placeholder:
            text = resolve_placeholder(placeholder, inputs, f"{name} {old}")
        elif resources.get(old):
            text = _go_float(resources[old]) + unit
        else:
            continue
        target[name] = canonical_quantity(text)
    accelerator = resources.get("accelerator")
    if accelerator:
        if new_fields:
            kind = (resolve_placeholder(accelerator["resourceType"], inputs, "accelerator type")
                    if accelerator.get("resourceType") else accelerator.get("type", ""))
            count = (resolve_placeholder(accelerator["resourceCount"], inputs, "accelerator count")
                     if accelerator.get("resourceCount") else
                     str(int(accelerator["count"])) if int(accelerator.get("count") or 0) > 0 else "")
        else:  # before 2.4.0: only the fixed type and a count above 0 (driver/driver.go:445 at 2.3.0)
            kind = accelerator.get("type", "")
            count = str(int(accelerator["count"])) if int(accelerator.get("count") or 0) > 0 else ""
        if kind and count:
            limits[kind] = canonical_quantity(count)
    return {key: value for key, value in (("limits", limits), ("requests", requests)) if value}


def unknown_field(release: str, field: str, message: str) -> None:
    """A compiled field the driver's protos do not know: before 2.4.1 jsonpb.UnmarshalString fails the driver
    (cmd/driver/main.go:123 and :138 at 2.4.0: "failed to unmarshal ..."); from 2.4.1 it is dropped
    (common/util/json.go:70-75, AllowUnknownFields)."""
    if not has(release, "lenient_config"):
        needs = FEATURES["k8s_json_inputs" if field.endswith("Json") else "resource_placeholders"].first_release
        raise DriverError(f"KFP {release}'s driver fails the task: failed to unmarshal {message}: unknown field "
                          f"{field!r} (jsonpb.UnmarshalString, backend/src/v2/cmd/driver/main.go at {release}; "
                          f"the field needs {needs})")


def node_selector(config: dict, dag_inputs: dict, task_outputs: dict, release: str) -> dict | None:
    """driver/k8s.go:193-222: fixed labels, or nodeSelectorJson resolved (resolveK8sJsonParameter, resolve.go:840-865)
    and read as a struct (:855: a value that is not a struct, a task output's null included, reads as {}); a
    null pipeline input sets none (ErrResolvedParameterNull, resolve.go:399-403; k8s.go:203). Before 2.5.0 the
    json form is an unknown field: 2.4.0 fails, 2.4.1 reads an empty NodeSelector and sets no labels
    (driver.go:591-592 at 2.4.1)."""
    if "nodeSelector" not in config:
        return None
    spec = config["nodeSelector"]
    if "nodeSelectorJson" not in spec:
        return dict(spec.get("labels") or {})
    if not has(release, "k8s_json_inputs"):
        unknown_field(release, "nodeSelectorJson", "Kubernetes config")
        return None
    value = resolve_input(spec["nodeSelectorJson"], dag_inputs, task_outputs, "nodeSelectorJson")
    if isinstance(value, Unresolved):
        value.need()
    if value is None and "componentInputParameter" in spec["nodeSelectorJson"]:
        return None
    value = value if isinstance(value, dict) else {}
    if any(not isinstance(v, str) for v in value.values()):
        raise DriverError(f"failed to unmarshal k8s Resource json: node selector values must be strings: {value}")
    return dict(value)


def k8s_toleration(value: dict) -> dict:
    """A toleration as the driver's json.Unmarshal into core/v1 Toleration reads it (k8s.go:255-258, :270-273)
    and the pod carries it: unknown keys dropped, null and empty fields left out (omitempty), tolerationSeconds an
    int64 (a proto number, or the string a compiled int64 is written as)."""
    toleration = {}
    for key in ("key", "operator", "value", "effect"):
        field = value.get(key)
        if field is not None and not isinstance(field, str):
            raise DriverError(f"failed to marshal single toleration to json: json: cannot unmarshal {field!r} into "
                              f"Go struct field Toleration.{key} of type string")
        if field:
            toleration[key] = field
    seconds = value.get("tolerationSeconds")
    if seconds not in (None, ""):
        try:
            toleration["tolerationSeconds"] = int(Decimal(str(seconds)))
        except ArithmeticError:
            raise DriverError(f"failed to marshal single toleration to json: tolerationSeconds {seconds!r} is not "
                              "an int64") from None
    return toleration


def tolerations(config: dict, dag_inputs: dict, task_outputs: dict, release: str) -> list | None:
    """driver/k8s.go:224-299: each toleration fixed, or tolerationJson resolved: one struct or a list of them
    (:242-274), appended in order. Empty ones are skipped (:261, :276), and so is a null pipeline input
    (ErrResolvedParameterNull, resolve.go:399-403; k8s.go:236-237); any other value, a task output's null
    included, fails the task (:279). Before 2.5.0 the json form is an unknown field: 2.4.0 fails, 2.4.1 makes it
    an empty Toleration{} (driver.go:595-614 at 2.4.1), which the API server refuses (kubernetes
    pkg/apis/core/validation/validation.go ValidateTolerations: "operator must be Exists when `key` is empty")."""
    if "tolerations" not in config:
        return None
    result: list[dict] = []
    for toleration in config["tolerations"]:
        if "tolerationJson" not in toleration:  # k8s.go:281-287
            result.append(k8s_toleration(toleration))
            continue
        if not has(release, "k8s_json_inputs"):
            unknown_field(release, "tolerationJson", "Kubernetes config")
            raise DriverError(f"KFP {release} turns tolerationJson into an empty toleration, and the API server "
                              f"refuses the pod: spec.tolerations[{len(result)}].operator: Invalid value: \"\": "
                              f"operator must be Exists when `key` is empty, which means \"match all values and "
                              f"all keys\"")
        spec = toleration["tolerationJson"]
        value = resolve_input(spec, dag_inputs, task_outputs, "tolerationJson")
        if isinstance(value, Unresolved):
            value.need()
        if value is None and "componentInputParameter" in spec:
            continue
        if value == {} or value == []:
            continue
        if isinstance(value, dict):
            result.append(k8s_toleration(value))
        elif isinstance(value, list):
            if any(not isinstance(t, dict) for t in value):
                raise DriverError(f"failed to marshal list toleration to json: json: cannot unmarshal {value!r} into "
                                  "Go value of type []v1.Toleration")
            result.extend(k8s_toleration(t) for t in value)
        else:
            raise DriverError("failed to resolve toleration: encountered unexpected toleration proto value, must "
                              f"be either struct or list type (got {value!r})")
    return result or None


def pvc_mounts(config: dict, dag_inputs: dict, task_outputs: dict,
               release: str = PINNED_RELEASE) -> tuple[list, list] | None:
    """driver/k8s.go:1111-1165 makeVolumeMountPatch at 2.17.0: each `pvcMount` of the task's Kubernetes config as a
    volume mount (name: the claim, mountPath, subPath) and a PersistentVolumeClaim volume of that name, appended to
    the pod (k8s.go:156-175); the claim's name comes from `pvcNameParameter`, else the deprecated `constant`,
    `taskOutputParameter` or `componentInputParameter`. None when the task mounts none. Before 2.16.0 a mount's
    subPath is a field the API server's compiler does not know, and it refuses the run (FEATURES["pvc_sub_path"])."""
    if not config.get("pvcMount"):
        return None
    mounts, volumes = [], []
    for mount in config["pvcMount"]:
        if "pvcNameParameter" in mount:
            param = mount["pvcNameParameter"]
        elif mount.get("constant"):
            param = {"runtimeValue": {"constant": mount["constant"]}}
        elif "taskOutputParameter" in mount:
            param = {"taskOutputParameter": mount["taskOutputParameter"]}
        elif mount.get("componentInputParameter"):
            param = {"componentInputParameter": mount["componentInputParameter"]}
        else:
            raise DriverError("failed to make podSpecPatch: volume mount: volume name not provided")
        name = resolve_input(param, dag_inputs, task_outputs, "pvc name")
        if isinstance(name, Unresolved):
            name.need()
        if not name or not mount.get("mountPath"):
            raise DriverError("failed to mount volume, missing mountpath or pvc name")
        if mount.get("subPath") and not has(release, "pvc_sub_path"):
            raise DriverError(f"KFP {release}'s API server refuses the run: argocompiler.Compile fails to unmarshal "
                              f"the kubernetes config: unknown field \"subPath\" (the field needs "
                              f"{FEATURES['pvc_sub_path'].first_release})")
        mounts.append({"name": name, "mountPath": mount["mountPath"]} |
                      ({"subPath": mount["subPath"]} if mount.get("subPath") else {}))
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": name}})
    return mounts, volumes


def empty_dir_mounts(config: dict) -> tuple[list, list]:
    """driver/k8s.go:589-613 at 2.17.0: each `emptyDirMounts` entry of the task's Kubernetes config as an emptyDir
    volume (medium, sizeLimit) and its mount on the main container, appended after the claims' (and whether or not
    the task passes its volumes through: the driver applies them either way, k8s.go:611)."""
    mounts, volumes = [], []
    for mount in config.get("emptyDirMounts") or []:
        source = {key: mount[field] for key, field in (("medium", "medium"), ("sizeLimit", "sizeLimit"))
                  if mount.get(field)}
        volumes.append({"name": mount["volumeName"], "emptyDir": source})
        mounts.append({"name": mount["volumeName"], "mountPath": mount["mountPath"]})
    return mounts, volumes


def resolve_task(spec: dict, k8s_executors: dict, task_name: str, task: dict, dag_inputs: dict,
                 task_outputs: dict, release: str = PINNED_RELEASE) -> TaskPod:
    """The pod (and TaskConfig) the driver creates for one container task of a DAG whose inputs are `dag_inputs`."""
    component = spec["components"][task["componentRef"]["name"]]
    executor = component["executorLabel"]
    container = spec["deploymentSpec"]["executors"][executor]["container"]
    inputs = {name: run_placeholder(resolve_input(p, dag_inputs, task_outputs, f"{task_name} input {name!r}"),
                                    task_name)
              for name, p in (task.get("inputs", {}).get("parameters") or {}).items()}
    passed, on_pod = task_config_options(component, release)
    config = k8s_executors.get(executor, {})
    notes = []
    resources = container_resources(container, inputs, release)
    accelerator = (container.get("resources") or {}).get("accelerator") or {}
    if accelerator and not any(k != "cpu" and k != "memory" for k in resources.get("limits", {})):
        notes.append("no accelerator limit: the accelerator count resolved to nothing")
    selector = node_selector(config, dag_inputs, task_outputs, release)
    tolerated = tolerations(config, dag_inputs, task_outputs, release)
    takes_config = [name for name, p in component.get("inputDefinitions", {}).get("parameters", {}).items()
                    if p.get("parameterType") == "TASK_CONFIG"]
    task_config = None
    if takes_config:
        if not has(release, "task_config_passthrough"):
            notes.append(f"KFP {release} has no TaskConfig passthrough: the task's config input stays empty")
        # driver/container.go:283-310 (taskConfig made at :245): json.Marshal of the driver's TaskConfig
        # (driver.go:112; resources' limits/requests omitted when empty), set as the value of every TASK_CONFIG input.
        task_config = {name: None for name in TASK_CONFIG_FIELDS} | {"resources": {}}
        if "RESOURCES" in passed:  # driver.go:471
            task_config["resources"] = resources
        if "KUBERNETES_NODE_SELECTOR" in passed and selector is not None:  # k8s.go:214
            task_config["nodeSelector"] = selector
        if "KUBERNETES_TOLERATIONS" in passed and "tolerations" in config:  # k8s.go:292
            task_config["tolerations"] = tolerated
        if not has(release, "task_config_passthrough"):
            task_config = {}
    labels = dict((config.get("podMetadata") or {}).get("labels") or {}) if has(release, "pod_labels") else {}
    annotations = dict((config.get("podMetadata") or {}).get("annotations") or {}) \
        if has(release, "pod_labels") else {}
    mounted = pvc_mounts(config, dag_inputs, task_outputs, release) if "KUBERNETES_VOLUMES" in on_pod else None
    empty_dirs = empty_dir_mounts(config)
    if empty_dirs[0]:
        mounted = ((mounted or ([], []))[0] + empty_dirs[0], (mounted or ([], []))[1] + empty_dirs[1])
    return TaskPod(
        task=task_name, display_name=task.get("taskInfo", {}).get("name", task_name),
        image=resolve_placeholder(container["image"], inputs, "image"),  # driver.go:449
        resources=resources if "RESOURCES" in on_pod else {},  # driver.go:475
        node_selector=selector if "KUBERNETES_NODE_SELECTOR" in on_pod else None,  # k8s.go:218
        tolerations=tolerated if "KUBERNETES_TOLERATIONS" in on_pod else None,  # k8s.go:296
        # compiler/argocompiler/container.go:744-787 extendPodMetadata, called at :590-592: the executor template's
        # pod metadata carries the labels (and annotations).
        labels=labels, annotations=annotations,  # the same extendPodMetadata (container.go:768-786)
        volume_mounts=mounted[0] if mounted else None, volumes=mounted[1] if mounted else None,
        task_config=task_config, notes=notes, inputs=inputs)


def resolve_pods(spec: dict, k8s_executors: dict, parameters: dict, task_outputs: dict,
                 release: str = PINNED_RELEASE, failures: list | None = None) -> list[TaskPod]:
    """The pod of every container task, through nested DAGs (a condition's tasks as if it were true), for the
    run's `parameters` (over the compiled defaults) and the given outputs of producer tasks. A task the driver
    would fail raises DriverError; with `failures`, it is appended there as (task, display name, why, how many
    pods came before it) instead and the other tasks are still resolved."""
    pods: list[TaskPod] = []

    def resolve(name: str, task: dict, dag_inputs: dict) -> None:
        try:
            pods.append(resolve_task(spec, k8s_executors, name, task, dag_inputs, task_outputs, release))
        except DriverError as e:
            if failures is None:
                raise
            failures.append((name, task.get("taskInfo", {}).get("name", name), str(e), len(pods)))

    def walk(dag: dict, dag_inputs: dict) -> None:
        for name, task in in_run_order(dag.get("tasks", {})):
            component = spec["components"][task["componentRef"]["name"]]
            if "dag" in component:
                inner = {key: resolve_input(p, dag_inputs, task_outputs, f"{name} input {key!r}")
                         for key, p in (task.get("inputs", {}).get("parameters") or {}).items()}
                walk(component["dag"], inner)
            else:
                resolve(name, task, dag_inputs)

    walk(spec["root"]["dag"], pipeline_parameters(spec, parameters))
    return pods


def in_run_order(tasks: dict) -> list[tuple[str, dict]]:
    """A DAG's tasks, each after the tasks it depends on (`dependentTasks`), ties by name: the order a run
    starts them in, which the compiled YAML's order (alphabetical) is not."""
    ordered: list[tuple[str, dict]] = []
    done: set[str] = set()
    waiting = dict(sorted(tasks.items()))
    while waiting:
        ready = [name for name, task in waiting.items()
                 if all(d in done or d not in tasks for d in task.get("dependentTasks", []))]
        for name in ready or list(waiting)[:1]:  # a cycle cannot compile; never loop on one all the same
            ordered.append((name, waiting.pop(name)))
            done.add(name)
    return ordered


def producer_inputs(spec: dict, task_name: str, parameters: dict) -> dict:
    """The parameter inputs of a root-DAG task fed by pipeline parameters and constants only (e.g. a check step
    whose outputs place another task), typed as kfp's executor hands them to the step's function (a
    NUMBER_INTEGER as int), so that the step's own code can compute those outputs."""
    task = spec["root"]["dag"]["tasks"][task_name]
    kinds = {name: p.get("parameterType") for name, p in spec["components"][task["componentRef"]["name"]]
             .get("inputDefinitions", {}).get("parameters", {}).items()}
    values = pipeline_parameters(spec, parameters)
    inputs = {name: resolve_input(p, values, {}, f"{task_name} input {name!r}")
              for name, p in (task.get("inputs", {}).get("parameters") or {}).items()}
    return {name: int(v) if kinds.get(name) == "NUMBER_INTEGER" and isinstance(v, float) else v
            for name, v in inputs.items()}


def required_release(spec: dict, k8s_executors: dict) -> list[Feature]:
    """The backend features the compiled pipeline uses, newest first release first."""
    used = {"pod_labels": any("podMetadata" in c for c in k8s_executors.values()),
            "k8s_json_inputs": any("nodeSelectorJson" in c.get("nodeSelector", {})
                                   or any("tolerationJson" in t for t in c.get("tolerations", []))
                                   for c in k8s_executors.values()),
            "task_config_passthrough": any(c.get("taskConfigPassthroughs") for c in spec["components"].values()),
            "pvc_sub_path": any(m.get("subPath") for c in k8s_executors.values() for m in c.get("pvcMount", []))}
    used["resource_placeholders"] = any(
        _INPUT_CHANNEL.search(json.dumps(e.get("container", {}).get("resources", {})))
        for e in spec["deploymentSpec"]["executors"].values())
    used["dynamic_images"] = any(_INPUT_CHANNEL.search(e.get("container", {}).get("image", ""))
                                 for e in spec["deploymentSpec"]["executors"].values())
    features = [FEATURES[name] for name, yes in used.items() if yes]
    return sorted(features, key=lambda f: release_tuple(f.first_release), reverse=True)
