"""The driver model (pipelines/backend/kfp_driver.py) against the driver's own tests, with their expected values.

Ported from kubeflow/pipelines 2.17.0, backend/src/v2/driver/driver_test.go (initPodSpecPatch: accelerators :36,
placeholder resources :307, old-style resources :428, requests :682, TaskConfig :820, :1444, :1505, :1608) and
k8s_test.go (extendPodSpecPatch: node selector :128, tolerations :1533, TaskConfig :3104), and the quantity rows of
k8s.io/apimachinery v0.35.2 (the release KFP 2.17.0 builds with, go.mod:66), pkg/api/resource/quantity_test.go
(TestQuantityString :696-787, TestQuantityParseEmit :789-828). Each upstream case is one parametrized row, named as
upstream names it; what the model does not cover (env, affinity, volumes, secrets: the pipeline sets none) is left
out of the rows, and said where a case has it.

The model is driven the way the driver is: a container spec, a component spec, a Kubernetes executor config, the
executor input's parameter values (here constant task inputs) and the DAG's input parameters (upstream's
`inputParams`), resolved by `resolve_task`.
"""

import pytest

from pipelines.backend import explain, kfp_driver

GPU = "nvidia.com/gpu"
EVERY_FIELD = {"RESOURCES", "ENV", "KUBERNETES_AFFINITY", "KUBERNETES_TOLERATIONS", "KUBERNETES_NODE_SELECTOR",
               "KUBERNETES_VOLUMES"}


def run_driver(container: dict, component: dict | None = None, k8s_config: dict | None = None,
               executor_inputs: dict | None = None, dag_inputs: dict | None = None, task_outputs: dict | None = None,
               k8s_inputs: dict | None = None, release: str = kfp_driver.PINNED_RELEASE) -> kfp_driver.TaskPod:
    """initPodSpecPatch + extendPodSpecPatch for one task, with a TASK_CONFIG input so that the TaskConfig the
    driver fills (upstream's `taskCfg`) can be read back. `k8s_inputs` are task input specs for the executor
    config's `_json` fields: {"param_1": {"componentInputParameter": "param_1"}} and the like."""
    component = dict(component or {}) | {"executorLabel": "exec-add"}
    component["inputDefinitions"] = {"parameters": {"task_config": {"parameterType": "TASK_CONFIG"}}}
    spec = {"components": {"comp-add": component},
            "deploymentSpec": {"executors": {"exec-add": {"container": {"image": "python:3.11", **container}}}}}
    task = {"componentRef": {"name": "comp-add"}, "taskInfo": {"name": "add"},
            "inputs": {"parameters": {name: {"runtimeValue": {"constant": value}}
                                      for name, value in (executor_inputs or {}).items()}}}
    return kfp_driver.resolve_task(spec, {"exec-add": k8s_config or {}}, "add", task, dag_inputs or {},
                                   task_outputs or {}, release)


def passthroughs(*fields: tuple[str, bool]) -> dict:
    return {"taskConfigPassthroughs": [{"field": field, "applyToTask": apply} for field, apply in fields]}


def component_input(name: str) -> dict:
    """k8s_test.go inputParamComponent: a DAG input parameter."""
    return {"componentInputParameter": name}


def constant(value) -> dict:
    """k8s_test.go structInputParamConstant: a constant struct."""
    return {"runtimeValue": {"constant": value}}


# --- driver_test.go -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("accelerator", ["nvidia.com/gpu", "amd.com/gpu", "cloud-tpus.google.com/v3",
                                         "cloud-tpus.google.com/v2", "custom.example.com/accelerator-v1"])
def test_initPodSpecPatch_acceleratorConfig(accelerator):
    """driver_test.go:36-305: the old fields (cpuLimit 1.0, memoryLimit 0.65, accelerator type and count 1): the
    pod's JSON contains `"<type>":"1"`; nothing is passed through."""
    pod = run_driver({"resources": {"cpuLimit": 1.0, "memoryLimit": 0.65,
                                    "accelerator": {"type": accelerator, "count": 1}}})
    assert pod.resources["limits"][accelerator] == "1"
    assert pod.resources == {"limits": {"cpu": "1", "memory": "650M", accelerator: "1"}}
    assert pod.task_config["resources"] == {}


def test_initPodSpecPatch_resource_placeholders():
    """driver_test.go:307-426: every resource from a string placeholder."""
    channel = "{{$.inputs.parameters['pipelinechannel--%s']}}"
    container = {"resources": {
        "resourceCpuRequest": channel % "cpu_request", "resourceCpuLimit": channel % "cpu_limit",
        "resourceMemoryRequest": channel % "memory_request", "resourceMemoryLimit": channel % "memory_limit",
        "accelerator": {"resourceType": channel % "accelerator_type", "resourceCount": channel % "accelerator_count"}}}
    values = {"cpu_request": "200m", "cpu_limit": "400m", "memory_request": "100Mi", "memory_limit": "500Mi",
              "accelerator_type": GPU, "accelerator_count": "1"}
    inputs = {f"pipelinechannel--{k}": v for k, v in values.items()} | {k: channel % k for k in values}
    pod = run_driver(container, {}, executor_inputs=inputs)
    assert pod.resources == {"limits": {"memory": "500Mi", "cpu": "400m", GPU: "1"},
                             "requests": {"memory": "100Mi", "cpu": "200m"}}
    assert pod.task_config["resources"] == {}


def test_initPodSpecPatch_legacy_resources():
    """driver_test.go:428-481: old CPU numbers (200, 400) beside new memory strings, and the old accelerator."""
    pod = run_driver({"resources": {"cpuRequest": 200, "cpuLimit": 400, "resourceMemoryRequest": "100Mi",
                                    "resourceMemoryLimit": "500Mi", "accelerator": {"type": GPU, "count": 1}}}, {})
    assert pod.resources == {"limits": {"memory": "500Mi", "cpu": "400", GPU: "1"},
                             "requests": {"memory": "100Mi", "cpu": "200"}}
    assert pod.task_config["resources"] == {}


@pytest.mark.parametrize("name,resources,expected", [
    ("Valid - with requests", {"cpuLimit": 2.0, "memoryLimit": 1.5, "cpuRequest": 1.0, "memoryRequest": 0.65},
     {"limits": {"cpu": "2", "memory": "1500M"}, "requests": {"cpu": "1", "memory": "650M"}}),
    ("Valid - zero requests", {"cpuLimit": 2.0, "memoryLimit": 1.5, "cpuRequest": 0, "memoryRequest": 0},
     {"limits": {"cpu": "2", "memory": "1500M"}}),  # notWant: "requests"
])
def test_initPodSpecPatch_resourceRequests(name, resources, expected):
    """driver_test.go:682-818."""
    pod = run_driver({"resources": resources})
    assert pod.resources == expected
    assert pod.task_config["resources"] == {}


# :820's container: new fields with constant values (not placeholders), passed through and not applied.
FORWARDED_CONTAINER = {"resources": {"resourceCpuLimit": "2.0", "resourceMemoryLimit": "1.5",
                                     "resourceCpuRequest": "1.0", "resourceMemoryRequest": "0.65G"}}


def test_initPodSpecPatch_TaskConfig_ForwardsResourcesOnly():
    """driver_test.go:820-879: RESOURCES passed through without apply_to_task: the pod gets none, the TaskConfig
    gets them (cpu 1 and 2, memory 0.65G and 1.5, compared with Quantity.Equal)."""
    pod = run_driver(FORWARDED_CONTAINER, passthroughs(("RESOURCES", False)))
    assert pod.resources == {}
    assert pod.task_config["resources"] == {"limits": {"memory": "1500m", "cpu": "2"},
                                            "requests": {"memory": "650M", "cpu": "1"}}


def test_the_forwarded_container_through_the_whole_model(tmp_path):
    """:820's values through every layer: the SDK's compiled form (a component that takes a dsl.TaskConfig; the
    SDK takes "1.5" and "0.65G" only from pipeline parameters, as placeholders), the driver model, kfp's executor
    handing the TaskConfig to the step, and the launcher sizing its nodes."""
    from kfp import compiler, dsl

    from components.launch import placement_from_task_config

    @dsl.component(base_image="python:3.11", task_config_passthroughs=[dsl.TaskConfigField.RESOURCES])
    def launch(task_config: dsl.TaskConfig):
        pass

    @dsl.pipeline
    def pipeline(cpu_limit: str = "2.0", memory_limit: str = "1.5", cpu_request: str = "1.0",
                 memory_request: str = "0.65G"):
        launch().set_cpu_limit(cpu_limit).set_memory_limit(memory_limit).set_cpu_request(
            cpu_request).set_memory_request(memory_request)

    path = str(tmp_path / "p.yaml")
    compiler.Compiler().compile(pipeline, path)
    spec, executors = kfp_driver.read_package(path)
    resources = spec["deploymentSpec"]["executors"]["exec-launch"]["container"]["resources"]
    assert sorted(resources) == sorted(FORWARDED_CONTAINER["resources"])
    given = {"cpu_limit": "2.0", "memory_limit": "1.5", "cpu_request": "1.0", "memory_request": "0.65G"}
    (pod,) = kfp_driver.resolve_pods(spec, executors, given, {})
    assert pod.resources == {} and pod.node_selector is None and pod.tolerations is None
    assert pod.task_config["resources"] == {"limits": {"memory": "1500m", "cpu": "2"},
                                            "requests": {"memory": "650M", "cpu": "1"}}
    received = explain.task_config_as_step_reads_it(pod.task_config)
    assert received.resources == pod.task_config["resources"] and received.node_selector is None
    import dataclasses

    placement, sizes = placement_from_task_config(dataclasses.asdict(received))
    assert sizes == {"cpu": "1", "memory": "650M"} and placement.gpus == 0 and placement.tolerations == []


def test_initPodSpecPatch_TaskConfig_Resources_Passthrough_ApplyAndCapture():
    """driver_test.go:1444-1503: RESOURCES with apply_to_task: on the pod and in the TaskConfig (1, 2, 0.65G,
    1.5G)."""
    pod = run_driver({"resources": {"cpuLimit": 2.0, "memoryLimit": 1.5, "cpuRequest": 1.0, "memoryRequest": 0.65}},
                     passthroughs(("RESOURCES", True)))
    expected = {"limits": {"memory": "1500M", "cpu": "2"}, "requests": {"memory": "650M", "cpu": "1"}}
    assert pod.resources == expected and pod.task_config["resources"] == expected


SSD = {"nodeSelector": {"labels": {"disktype": "ssd"}},
       "tolerations": [{"key": "example-key", "operator": "Exists", "effect": "NoExecute",
                        "tolerationSeconds": "3600"}]}  # an int64: a string in the compiled (proto JSON) form
SSD_TOLERATION = {"key": "example-key", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3600}
PLACEMENT = ("KUBERNETES_AFFINITY", "KUBERNETES_NODE_SELECTOR", "KUBERNETES_TOLERATIONS")


def test_initPodSpecPatch_TaskConfig_Affinity_NodeSelector_Tolerations_Passthrough():
    """driver_test.go:1505-1606 (its affinity is not modelled): captured only, none on the pod."""
    pod = run_driver({}, passthroughs(*[(f, False) for f in PLACEMENT]), SSD)
    assert pod.node_selector is None and pod.tolerations is None
    assert pod.task_config["nodeSelector"] == {"disktype": "ssd"}
    assert pod.task_config["tolerations"] == [SSD_TOLERATION]


def test_initPodSpecPatch_TaskConfig_Affinity_NodeSelector_Tolerations_ApplyAndCapture():
    """driver_test.go:1608-1729 (its affinity is not modelled): on the pod and captured."""
    pod = run_driver({}, passthroughs(*[(f, True) for f in PLACEMENT]), SSD)
    assert pod.node_selector == pod.task_config["nodeSelector"] == {"disktype": "ssd"}
    assert pod.tolerations == pod.task_config["tolerations"] == [SSD_TOLERATION]


def test_fields_a_component_does_not_list_stay_on_the_pod():
    """driver.go:212-236: the passthrough list decides what is also handed to the task; a listed field leaves the
    pod only without apply_to_task; the node selector and tolerations this component does not list are set."""
    pod = run_driver({"resources": {"cpuRequest": 1.0}}, passthroughs(("RESOURCES", False)), SSD)
    assert pod.resources == {} and pod.task_config["resources"] == {"requests": {"cpu": "1"}}
    assert pod.node_selector == {"disktype": "ssd"} and pod.tolerations == [SSD_TOLERATION]
    assert pod.task_config["nodeSelector"] is None and pod.task_config["tolerations"] is None
    passed, on_pod = kfp_driver.task_config_options(passthroughs(("RESOURCES", False)), "2.17.0")
    assert (passed, on_pod) == ({"RESOURCES"}, EVERY_FIELD - {"RESOURCES"})
    assert kfp_driver.task_config_options(passthroughs(("RESOURCES", False)), "2.14.0") == (set(), EVERY_FIELD)


# --- k8s_test.go ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,config,dag_inputs,expected", [
    ("Valid - NVIDIA GPU on GKE",
     {"nodeSelector": {"labels": {"cloud.google.com/gke-accelerator": "nvidia-tesla-k80"}}}, {},
     {"cloud.google.com/gke-accelerator": "nvidia-tesla-k80"}),
    ("Valid - operating system and arch",
     {"nodeSelector": {"labels": {"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}}}, {},
     {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux"}),
    ("Valid - Json Parameter", {"nodeSelector": {"nodeSelectorJson": component_input("param_1")}},
     {"param_1": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux"}},
     {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux"}),
    ("Valid - empty", {}, {}, None),
    ("Valid - empty json", {"nodeSelector": {"nodeSelectorJson": component_input("param_1")}}, {"param_1": {}}, {}),
])
def test_makePodSpecPatch_nodeSelector(name, config, dag_inputs, expected):
    """k8s_test.go:128-256: the pod's nodeSelector; the TaskConfig's stays empty (no passthrough)."""
    pod = run_driver({}, {}, config, dag_inputs=dag_inputs)
    assert pod.node_selector == expected
    assert not pod.task_config["nodeSelector"]


def toleration(n: int, seconds: bool = True) -> dict:
    return {"key": f"key{n}", "operator": "Equal", "value": f"value{n}", "effect": "NoSchedule"} | (
        {"tolerationSeconds": 3600 + n} if seconds else {})


@pytest.mark.parametrize("name,tolerations,dag_inputs,expected", [
    ("Valid - toleration", [toleration(1, False)], {}, [toleration(1, False)]),
    ("Valid - no tolerations", None, {}, None),
    ("Valid - only pass operator", [{"operator": "Contains"}], {}, [{"operator": "Contains"}]),
    ("Valid - toleration json - constant",
     [{"tolerationJson": constant(toleration(1, False) | {"tolerationSeconds": None})}], {}, [toleration(1, False)]),
    ("Valid - toleration json - component input", [{"tolerationJson": component_input("param_1")}],
     {"param_1": toleration(1) | {"tolerationSeconds": 3600}}, [toleration(1) | {"tolerationSeconds": 3600}]),
    ("Valid - toleration json - empty component input", [{"tolerationJson": component_input("param_1")}],
     {"param_1": {}}, None),
    ("Valid - toleration json - multiple input types",
     [{"tolerationJson": component_input("param_1")},
      {"tolerationJson": constant(toleration(2)), "key": "key3", "value": "value3"},  # the json wins
      toleration(4) | {"tolerationSeconds": "3604"}],
     {"param_1": toleration(1)}, [toleration(1), toleration(2), toleration(4)]),
    ("Valid - toleration json - toleration list", [{"tolerationJson": component_input("param_1")}],
     {"param_1": [toleration(1), toleration(2), toleration(3)]}, [toleration(1), toleration(2), toleration(3)]),
    ("Valid - toleration json - list toleration & single toleration & constant toleration",
     [{"tolerationJson": component_input("param_1")}, {"tolerationJson": component_input("param_2")},
      toleration(5, False)],
     {"param_1": [toleration(1), toleration(2), toleration(3)], "param_2": toleration(4)},
     [toleration(1), toleration(2), toleration(3), toleration(4), toleration(5, False)]),
    ("Valid - toleration json - empty toleration list", [{"tolerationJson": component_input("param_1")}],
     {"param_1": []}, None),
])
def test_extendPodSpecPatch_Tolerations(name, tolerations, dag_inputs, expected):
    """k8s_test.go:1533-1972 (numbers as structpb holds them: floats): the pod's tolerations, in order; the
    TaskConfig's stay empty."""
    config = {} if tolerations is None else {"tolerations": tolerations}
    dag_inputs = {k: ([{**t, "tolerationSeconds": float(t["tolerationSeconds"])} for t in v] if isinstance(v, list)
                      else {**v, **({"tolerationSeconds": float(v["tolerationSeconds"])}
                                    if "tolerationSeconds" in v else {})})
                  for k, v in dag_inputs.items()}
    pod = run_driver({}, {}, config, dag_inputs=dag_inputs)
    assert pod.tolerations == expected
    assert not pod.task_config["tolerations"]


def test_extendPodSpecPatch_TaskConfig_CapturesAndApplies():
    """k8s_test.go:3104-3250, the node selector and tolerations of it (its volumes, env and affinity are not
    modelled): captured only, the pod keeps none, and no resources."""
    pod = run_driver({}, passthroughs(("KUBERNETES_VOLUMES", True), ("ENV", True), *[(f, False) for f in PLACEMENT]),
                     {"nodeSelector": {"labels": {"disktype": "ssd"}},
                      "tolerations": [{"key": "example-key", "operator": "Exists", "effect": "NoExecute",
                                       "tolerationSeconds": "3600"}]})
    assert pod.node_selector is None and pod.tolerations is None and pod.resources == {}
    assert pod.task_config["nodeSelector"] == {"disktype": "ssd"}
    assert pod.task_config["tolerations"] == [SSD_TOLERATION]


# --- nulls, and what the upstream tests leave out (k8s.go and resolve.go at 2.17.0) --------------------------
def test_a_null_from_a_pipeline_input_sets_nothing_but_a_null_task_output_fails_the_toleration():
    """resolve.go:399-403 returns ErrResolvedParameterNull only for a component input (an optional pipeline
    parameter); k8s.go:236-237 skips it. A task output's null is a NullValue: neither struct nor list, so k8s.go:279
    fails the task. A node selector reads either null as no labels (k8s.go:203; resolve.go:855)."""
    from_input = {"tolerations": [{"tolerationJson": component_input("p")}],
                  "nodeSelector": {"nodeSelectorJson": component_input("p")}}
    pod = run_driver({}, {}, from_input, dag_inputs={"p": None})
    assert pod.tolerations is None and pod.node_selector is None
    output = {"taskOutputParameter": {"producerTask": "check", "outputParameterKey": "tolerations"}}
    with pytest.raises(kfp_driver.DriverError, match="must be either struct or list type"):
        run_driver({}, {}, {"tolerations": [{"tolerationJson": output}]}, task_outputs={"check": {"tolerations": None}})
    selector = {"taskOutputParameter": {"producerTask": "check", "outputParameterKey": "node_selector"}}
    pod = run_driver({}, {}, {"nodeSelector": {"nodeSelectorJson": selector}},
                     task_outputs={"check": {"node_selector": None}})
    assert pod.node_selector == {}
    with pytest.raises(kfp_driver.DriverError, match="must be either struct or list type"):
        run_driver({}, {}, {"tolerations": [{"tolerationJson": component_input("p")}]}, dag_inputs={"p": "gpu"})


@pytest.mark.parametrize("release,fails", [
    ("2.5.0", None),
    ("2.4.1", "operator must be Exists when `key` is empty"),  # Toleration{} from the unknown field
    ("2.4.0", "unknown field 'tolerationJson'"),  # jsonpb.UnmarshalString
    ("2.3.0", "unknown field 'tolerationJson'"),
])
def test_older_drivers_fail_on_a_json_toleration(release, fails):
    config = {"tolerations": [{"tolerationJson": constant(toleration(1))}]}
    if fails is None:
        assert run_driver({}, {}, config, release=release).tolerations == [toleration(1)]
        return
    with pytest.raises(kfp_driver.DriverError, match=fails):
        run_driver({}, {}, config, release=release)


def test_a_json_node_selector_alone_is_dropped_by_2_4_1_and_fails_2_4_0():
    config = {"nodeSelector": {"nodeSelectorJson": constant({"pool": "gpu"})}}
    assert run_driver({}, {}, config, release="2.4.1").node_selector is None  # driver.go:591-592 at 2.4.1
    with pytest.raises(kfp_driver.DriverError, match="unknown field 'nodeSelectorJson'"):
        run_driver({}, {}, config, release="2.4.0")


# --- apimachinery v0.35.2 quantity_test.go ---------------------------------------------------------------------
# TestQuantityString (:696-787): each row's canonical string parses back to itself, and its alternate form
# (where it has one) is written as the canonical string. decQuantity-only rows have no string to parse.
QUANTITY_STRING = [("1Gi", "1024Mi"), ("300Mi", "307200Ki"), ("6Ki", ""), ("1001Gi", "1025024Mi"), ("1Ti", "1024Gi"),
                   ("5", "5000m"), ("500m", "0.5"), ("1G", "1000M"), ("1G", "0.001T"), ("1G", ""), ("1m", "1000u"),
                   ("80m", ""), ("1080m", "1.08"), ("1080m", "1080000000n"), ("300M", ""), ("1T", ""),
                   ("1234567M", ""), ("1234567m", ""), ("3k", ""), ("1025", ""), ("0", ""), ("1e9", ".001e12"),
                   ("1e-3", "0.001e0"), ("1e-9", "1000e-12"), ("80e-3", ""), ("300e6", ""), ("1e12", ""),
                   ("1e3", ""), ("3e3", ""), ("0", "00"), ("1n", ""), ("80n", ""), ("1080n", ""), ("1u", ""),
                   ("80u", ""), ("1080u", "")]
# TestQuantityParseEmit (:789-828): input -> String().
QUANTITY_PARSE_EMIT = [("1Ki", "1Ki"), ("1Mi", "1Mi"), ("1Gi", "1Gi"), ("1024Mi", "1Gi"), ("1000M", "1G"),
                       (".001Ki", "1024m"), (".000001Ki", "1024u"), (".000000001Ki", "1024n"),
                       (".000000000001Ki", "2n")]


@pytest.mark.parametrize("canonical,alternate", QUANTITY_STRING)
def test_quantity_string(canonical, alternate):
    assert kfp_driver.canonical_quantity(canonical) == canonical
    if alternate:
        assert kfp_driver.canonical_quantity(alternate) == canonical


@pytest.mark.parametrize("text,emitted", QUANTITY_PARSE_EMIT)
def test_quantity_parse_emit(text, emitted):
    assert kfp_driver.canonical_quantity(text) == emitted
