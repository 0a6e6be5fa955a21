"""What is sent to Vertex AI Pipelines, checked before the first request: the compiled pipeline spec, the run's
root, parameters, service account and labels, and this project's run parameters (the registry on Vertex AI).

pipelines/vertexai/vertex.py sends it; everything here is plain data checking, no client.
"""

from __future__ import annotations

import copy
import datetime as _dt
import re
from typing import Any

GCS_URI_RE = re.compile(r"^gs://(?P<bucket>[a-z0-9][a-z0-9._-]{1,221}[a-z0-9])(?:/(?P<path>.*))?$")
SERVICE_ACCOUNT_RE = re.compile(r"^[^@\s]+@[^@\s]+\.gserviceaccount\.com$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")


def check_pipeline_root(pipeline_root: str) -> str:
    """The pipeline root as Vertex AI takes it: a gs:// path (a bucket the pipeline's service account can write)."""
    root = (pipeline_root or "").strip()
    if not GCS_URI_RE.match(root):
        raise ValueError(
            f"The pipeline root must be a Cloud Storage path gs://BUCKET[/PATH] (Vertex AI Pipelines writes every "
            f"artifact there; bucket names are 3-63 characters of a-z, 0-9, '-', '_' and '.'), got "
            f"{pipeline_root!r}. Use a bucket in the run's region that the pipeline's service "
            f"account can write (roles/storage.objectAdmin on the bucket).")
    return root.rstrip("/")


def check_service_account(service_account: str) -> str:
    if not SERVICE_ACCOUNT_RE.match(service_account or ""):
        raise ValueError(f"The service account must be an email such as "
                         f"pipelines@PROJECT.iam.gserviceaccount.com, got {service_account!r}.")
    return service_account


def check_labels(labels: dict | None) -> dict:
    labels = dict(labels or {})
    for key, value in labels.items():
        if not LABEL_KEY_RE.match(str(key)) or not isinstance(value, str) or not LABEL_VALUE_RE.match(value):
            raise ValueError(f"Invalid label {key}={value!r}: keys start with a lowercase letter; keys and values hold "
                             f"at most 63 lowercase letters, digits, '_' and '-'.")
    return labels


def load_pipeline_spec(package_path: str) -> dict:
    """The compiled pipeline (KFP IR YAML or JSON, or a PipelineJob JSON) as the `pipelineSpec` dict to send.

    Refuses a package compiled for KFP on GKE: Vertex AI Pipelines takes no kfp-kubernetes platform config, and
    GPUs must be requested as Vertex AI accelerator types."""
    import yaml

    try:
        with open(package_path) as f:
            # libyaml's loader when PyYAML has it: the pure-Python one takes about a second on this spec.
            documents = [d for d in yaml.load_all(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
                         if d is not None]
    except FileNotFoundError:
        raise ValueError(f"No compiled pipeline at {package_path}; write it with `pipectl compile --target vertex "
                         f"-o {package_path}`.") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{package_path} is not a compiled pipeline (YAML/JSON): {e}") from None
    compile_hint = f"recompile it with `pipectl compile --target vertex -o {package_path}`"
    if len(documents) != 1 or not isinstance(documents[0], dict):
        platforms = [d for d in documents[1:] if isinstance(d, dict) and "platforms" in d]
        if platforms:
            raise ValueError(f"{package_path} carries a Kubernetes platform config (node selectors, tolerations: "
                             f"compiled with --target kfp), which Vertex AI Pipelines does not take; {compile_hint}.")
        raise ValueError(f"{package_path} must hold one pipeline spec document, found {len(documents)}.")
    document = documents[0]
    spec = document.get("pipelineSpec", document)  # a PipelineJob JSON carries the spec under pipelineSpec
    if not isinstance(spec, dict) or not (spec.get("pipelineInfo") or {}).get("name") or "root" not in spec:
        raise ValueError(f"{package_path} is not a compiled KFP pipeline (no pipelineInfo.name / root).")
    from google.cloud.aiplatform_v1.types import AcceleratorType

    vertex_accelerators = {a.name for a in AcceleratorType if a.name != "ACCELERATOR_TYPE_UNSPECIFIED"}
    for name, executor in ((spec.get("deploymentSpec") or {}).get("executors") or {}).items():
        accelerator = (((executor.get("container") or {}).get("resources") or {}).get("accelerator")) or {}
        kind = accelerator.get("resourceType") or accelerator.get("type")
        if kind and kind not in vertex_accelerators:
            raise ValueError(f"Executor {name} in {package_path} asks for accelerator {kind!r}, which is not a Vertex AI "
                             f"accelerator type (NVIDIA_TESLA_T4, NVIDIA_H100_80GB, ...); {compile_hint}.")
    return spec


def pipeline_parameters(spec: dict) -> dict[str, dict]:
    """The pipeline's input parameters: name -> {"parameterType", "defaultValue"?, "isOptional"?}."""
    return dict(((spec.get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {})


def compiled_framework(spec: dict) -> str:
    """The framework a pipeline compiled for Vertex AI trains on, as its training task receives it (a constant:
    pipelines/training.py with_fixed_framework); empty when the run chooses it (a `framework` parameter)."""
    if "framework" in pipeline_parameters(spec):
        return ""
    for task in ((spec.get("root") or {}).get("dag") or {}).get("tasks", {}).values():
        value = ((task.get("inputs") or {}).get("parameters") or {}).get("framework") or {}
        constant = (value.get("runtimeValue") or {}).get("constant")
        if isinstance(constant, str):
            return constant
    return ""


def runtime_config(spec: dict, pipeline_root: str | None, parameter_values: dict | None) -> dict:
    """`runtimeConfig` for the job: the pipeline root and the parameter values, checked against the pipeline's
    inputs (names, types, required ones), as the Vertex AI SDK's runtime-config builder does."""
    root = pipeline_root or spec.get("defaultPipelineRoot")
    if not root:
        raise ValueError("A pipeline root is needed: pass --pipeline-root gs://BUCKET/PATH (a bucket in the run's "
                         "region that the pipeline's service account can write, roles/storage.objectAdmin).")
    root = check_pipeline_root(root)
    declared = pipeline_parameters(spec)
    values = dict(parameter_values or {})
    fixed = compiled_framework(spec)
    if "framework" in values and "framework" not in declared and fixed:
        if values["framework"] != fixed:
            raise ValueError(f"This pipeline was compiled for Vertex AI with framework {fixed} (its train, evaluate "
                             f"and predict images are fixed when compiling), so framework={values['framework']} "
                             f"cannot apply to the run; compile it with `pipectl compile --target vertex --framework "
                             f"{values['framework']}` (pipectl run --vertex --framework {values['framework']} does)")
        del values["framework"]  # what the pipeline already trains on
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise ValueError(f"Unknown pipeline parameter(s) {unknown}; the pipeline takes: {', '.join(declared)}")
    checked: dict[str, Any] = {}
    for name, value in values.items():
        kind = declared[name].get("parameterType", "")
        if kind == "NUMBER_DOUBLE" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok = {"STRING": isinstance(value, str),
              "NUMBER_INTEGER": isinstance(value, int) and not isinstance(value, bool),
              "NUMBER_DOUBLE": isinstance(value, float),
              "BOOLEAN": isinstance(value, bool),
              "LIST": isinstance(value, list),
              "STRUCT": isinstance(value, dict)}.get(kind, True)
        if not ok:
            raise ValueError(f"Pipeline parameter {name} is {kind}, got {value!r} ({type(value).__name__}).")
        checked[name] = value
    missing = sorted(n for n, d in declared.items()
                     if n not in checked and "defaultValue" not in d and not d.get("isOptional"))
    if missing:
        raise ValueError(f"The pipeline needs values for {missing} (they have no defaults).")
    return {"gcsOutputDirectory": root, "parameterValues": checked}


def set_caching(spec: dict, enable_caching: bool | None) -> dict:
    """A copy of `spec` with task caching switched: None keeps what the pipeline compiled; False turns caching off
    for every task (a fresh run); True turns it on for every task that the pipeline does not keep uncached on
    purpose (evaluation and registration read the registry's current state, so they stay uncached)."""
    spec = copy.deepcopy(spec)
    if enable_caching is None:
        return spec
    for component in [spec["root"], *(spec.get("components") or {}).values()]:
        for task in ((component.get("dag") or {}).get("tasks") or {}).values():
            options = task.get("cachingOptions")
            if enable_caching is False:
                task["cachingOptions"] = {"enableCache": False}
            elif options is None or options.get("enableCache"):
                task["cachingOptions"] = {"enableCache": True}
    return spec


# A PipelineJob id "should be less than 128 characters, and valid characters are /[a-z][0-9]-/"
# (googleapis/googleapis, google/cloud/aiplatform/v1/pipeline_service.proto:357-359 at f8291d2b). The Vertex AI
# SDK's own check (`constants/pipeline.py`, `[a-z][-a-z0-9]{0,127}`) lets 128 through; the service's word wins.
JOB_ID_MAX_CHARS = 127
JOB_ID_RE = re.compile(rf"^[a-z][-a-z0-9]{{0,{JOB_ID_MAX_CHARS - 1}}}$")


def make_job_id(pipeline_name: str, now: _dt.datetime | None = None) -> str:
    """`{pipeline-name}-{YYYYMMDDHHMMSS}` (UTC), the id the Vertex AI SDK gives a run, with the name cut so that
    the id stays under 128 characters."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    base = re.sub(r"[^-0-9a-z]+", "-", pipeline_name.lower()).strip("-") or "pipeline"
    if not base[0].isalpha():
        base = "p-" + base
    stamp = now.strftime("%Y%m%d%H%M%S")
    return f"{base[:JOB_ID_MAX_CHARS - len(stamp) - 1].rstrip('-')}-{stamp}"


def vertex_run_parameters(parameter_values: dict | None, *, project: str, location: str) -> dict:
    """This project's pipeline on Vertex AI: the model registry is Vertex AI's, in the run's project and region,
    unless the parameters say otherwise. The local registry is a directory on one machine, and every Vertex AI
    Pipelines step runs on a VM of its own, so it is refused. The framework is fixed when the pipeline is
    compiled for Vertex AI (`runtime_config` refuses one that contradicts it)."""
    params = dict(parameter_values or {})
    params.setdefault("registry", "vertex")
    if params["registry"] == "local":
        raise ValueError("registry=local keeps the model registry in a directory of one machine; on Vertex AI "
                         "Pipelines every step runs on its own VM, so registrations would be lost. Use "
                         "--registry vertex (the Vertex AI Model Registry).")
    if params["registry"] == "vertex":
        params.setdefault("project", project)
        params.setdefault("location", location)
    return params
