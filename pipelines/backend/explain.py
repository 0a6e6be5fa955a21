"""`pipectl explain`: the pod a KFP backend release creates for each step of the compiled pipeline, for given
parameter values, before anything is uploaded; for a cluster job, the nodes the training step's launcher creates;
and what each pod's launcher downloads on that release (pipelines/backend/kfp_launcher.py).

The pods follow the driver model in pipelines/backend/kfp_driver.py. The steps whose outputs place another task (the GPU
check, the images of the run's framework) run here, with the run's parameters, as they would on the cluster; a
training step that launches a job gets its TaskConfig the way kfp's executor hands it over, and the launcher's own
code builds the nodes from it.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import yaml

from components import ops
from components.dataio import datadir
from components.launch.network import INTERFACES_ANNOTATION
from pipelines.backend import kfp_driver, kfp_launcher

# Steps whose outputs another task's pod depends on: run here, with the run's parameters.
PRODUCERS = {ops.placement_op.name: ops.placement_op, ops.step_images_op.name: ops.step_images_op}


def producer_outputs(spec: dict, parameters: dict) -> dict[str, dict]:
    """The outputs of the producer steps of the root DAG for these parameters; their errors are the run's."""
    outputs = {}
    for name, task in spec["root"]["dag"]["tasks"].items():
        component = spec["components"][task["componentRef"]["name"]]
        step = PRODUCERS.get(component.get("executorLabel", "")[len("exec-"):])
        if step is not None:
            result = step.python_func(**kfp_driver.producer_inputs(spec, name, parameters))
            outputs[name] = result._asdict()
    return outputs


def task_config_as_step_reads_it(task_config: dict):
    """The `dsl.TaskConfig` a step's function receives for the driver's TaskConfig value: kfp's own executor
    (kfp/dsl/executor.py) builds it, as in the step's pod."""
    from kfp import dsl
    from kfp.dsl.executor import Executor

    received = []

    def step(task_config):
        received.append(task_config)

    step.__annotations__ = {"task_config": dsl.TaskConfig}  # a class, not this module's postponed string

    with tempfile.TemporaryDirectory() as tmp:
        Executor({"inputs": {"parameterValues": {"task_config": task_config}},
                  "outputs": {"outputFile": os.path.join(tmp, "executor_output.json")}}, step).execute()
    return received[0]


def cluster_nodes(pod: kfp_driver.TaskPod) -> list[dict]:
    """The nodes a training step's launcher creates (one entry per replica group: count, resources, node selector,
    tolerations, or the Vertex AI machine, and the image and command each node runs for the step's framework, and
    where the data is staged with train_stage_data), from the step's resolved inputs and TaskConfig; [] for other
    steps."""
    nodes = _cluster_nodes(pod)
    if nodes and pod.inputs.get("stage_data") is True:
        from components.launch import local_ssd

        launcher = pod.inputs["launcher"]
        room = (f"a {local_ssd.VERTEX_BOOT_DISK_GB} GB pd-ssd boot disk plus the datasets' size"
                if launcher == "vertex-job" else
                f"emptyDir {local_ssd.VOLUME} with a sizeLimit and an {local_ssd.EPHEMERAL_STORAGE} request of the "
                "datasets' size")
        staged = {"stage_dir": local_ssd.stage_dir(launcher), "room": room,
                  "size": "the datasets' bytes + 5% + 1 GiB, in whole GiB, measured when the job starts"}
        nodes = [{**node, "staged": staged} for node in nodes]
    return nodes


def _cluster_nodes(pod: kfp_driver.TaskPod) -> list[dict]:
    from components.gcp.accelerators import ACCELERATORS
    from components.launch import LaunchSettings, custom_job, job_manifests, node_resources, training_job

    inputs = pod.inputs
    if "launcher" not in inputs or "workers" not in inputs:
        return []
    launcher, command = inputs["launcher"], ["python", "-m", "components.train"]
    common = dict(image=inputs["image"], workers=int(inputs["workers"]), kueue_queue=inputs.get("kueue_queue", ""),
                  namespace=inputs.get("namespace", "kubeflow"), framework=inputs.get("framework", "tensorflow"))
    if launcher == "vertex-job":
        launch = LaunchSettings(launcher, **common, accelerator=inputs["accelerator"], gpus=int(inputs["gpus"]),
                                spot=bool(inputs["spot"]), node_pool=inputs["node_pool"],
                                project=inputs.get("project") or "PROJECT", location=inputs.get("location", ""))
        job = custom_job(training_job(launch, command, run_id="RUN", task_name=pod.task),
                         vertex_accelerators=ACCELERATORS, spot=launch.spot)
        return [{"replicas": p.replica_count, "machine": {
            "machineType": p.machine_spec.machine_type, "acceleratorType": p.machine_spec.accelerator_type.name,
            "acceleratorCount": p.machine_spec.accelerator_count}, "scheduling": job.job_spec.scheduling.strategy.name,
            "image": p.container_spec.image_uri, "command": list(p.container_spec.command)}
            for p in job.job_spec.worker_pool_specs]
    config = task_config_as_step_reads_it(pod.task_config or {})
    sizes = node_resources(inputs.get("node_cpu", ""), inputs.get("node_memory", ""), inputs.get("node_gpus", "")) \
        if "node_cpu" in inputs else None
    launch = LaunchSettings(launcher, **common, runtime=inputs["runtime"], task_config=dataclasses.asdict(config),
                            node_resources=sizes, network=inputs.get("gpudirect", ""))
    *runtimes, manifest = job_manifests(launcher, training_job(launch, command, run_id="RUN", task_name=pod.task),
                                        launch.namespace, runtime=launch.runtime)
    return node_pods(manifest, runtimes[0] if runtimes else None)


# The variables a GPUDirect network gives the node container (network.py's PodNetwork.env).
NETWORK_ENV = ("LD_LIBRARY_PATH", "NCCL_LIB_DIR", "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY")


def node_network(template: dict, container: dict, env: list | None = None) -> dict:
    """A node pod's GPUDirect fields (components/launch/network.py), from its template and its node container:
    the networks' annotations, the volumes and where the node mounts them, the sidecars, and the network's
    variables of `env` (the container's when None); {} on the pod network."""
    annotations = template.get("metadata", {}).get("annotations", {})
    if INTERFACES_ANNOTATION not in annotations:
        return {}
    spec = template.get("spec", {})
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    volumes = [{"name": v["name"], "from": (v.get("hostPath") or {}).get("path") or "emptyDir (memory)",
                **({"mountPath": mounts[v["name"]]} if v["name"] in mounts else {})} for v in spec.get("volumes", [])]
    sidecars = [{"name": c["name"], "image": c["image"]} for c in spec.get("initContainers", [])
                if c.get("restartPolicy") == "Always"]
    values = {e["name"]: e["value"] for e in (container.get("env", []) if env is None else env) if "value" in e}
    # A multi-line annotation (the interfaces' JSON list, TCPXO's device list) is shown as the data it holds.
    shown = {key: yaml.safe_load(value) if "\n" in value else value for key, value in annotations.items()}
    return {"annotations": shown, "volumes": volumes, **({"sidecars": sidecars} if sidecars else {}),
            "env": {name: values[name] for name in NETWORK_ENV if name in values}}


def node_pods(manifest: dict, runtime: dict | None = None) -> list[dict]:
    """Each replica group's count, pod placement, image and command in a TrainJob, JobSet, TFJob or PyTorchJob
    manifest, and a GPUDirect network's pod fields (a TrainJob's from its runtime patch, or from `runtime`, the
    shipped ClusterTrainingRuntime it runs on, when that carries them)."""
    def placement(count: int, pod: dict, network: dict | None = None) -> dict:
        container = pod["containers"][0] if pod.get("containers") else {}
        placed = {"replicas": count, "resources": container.get("resources", {}),
                  "nodeSelector": pod.get("nodeSelector"), "tolerations": pod.get("tolerations"),
                  "image": container.get("image"), "command": container.get("command")}
        placed.update({"network": network} if network else {})
        return {**placed, "hostIPC": True} if pod.get("hostIPC") else placed

    spec = manifest["spec"]
    if manifest["kind"] in ("TFJob", "PyTorchJob"):
        replicas = spec["tfReplicaSpecs" if manifest["kind"] == "TFJob" else "pytorchReplicaSpecs"]
        return [placement(r["replicas"], r["template"]["spec"]) for r in replicas.values()]
    if manifest["kind"] == "JobSet":
        return [placement(r["replicas"] * r["template"]["spec"].get("parallelism", 1),
                          r["template"]["spec"]["template"]["spec"],
                          node_network(r["template"]["spec"]["template"], r["template"]["spec"]["template"]["spec"]
                                       ["containers"][0])) for r in spec["replicatedJobs"]]
    # TrainJob: the trainer's numNodes and resourcesPerNode, placed by the runtime patch of its pods.
    pod_templates = []
    for patch in spec.get("runtimePatches", []):
        for rjob in patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", []):
            pod_templates.append(rjob.get("template", {}).get("spec", {}).get("template", {}))
    pod = {}
    for template in pod_templates:
        pod.update(template.get("spec", {}))
    if runtime is not None:  # the shipped runtime's own node pod comes first; the patches go over it
        for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
            pod_templates.insert(0, rjob["template"]["spec"]["template"])
    trainer, network = spec["trainer"], {}
    for template in pod_templates:  # the node container's env is the trainer's (a patch may not set it)
        containers = template.get("spec", {}).get("containers", [])
        network = node_network(template, containers[0] if containers else {}, trainer.get("env", [])) or network
    nodes = {"replicas": trainer["numNodes"], "resources": trainer.get("resourcesPerNode", {}),
             "nodeSelector": pod.get("nodeSelector"), "tolerations": pod.get("tolerations"),
             "image": trainer.get("image"), "command": trainer.get("command")}
    return [{**nodes, "network": network} if network else nodes]


# Where explain puts the run's artifacts: a gs:// pipeline root, as docs/data-by-reference.md sets up.
PIPELINE_ROOT = "gs://BUCKET/pipeline-root"


def all_tasks(spec: dict) -> dict[str, dict]:
    """Every task of the compiled pipeline, those of sub-DAGs (dsl.If groups) included, by name."""
    tasks = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    return tasks


def run_layout(spec: dict, parameters: dict, pipeline_root: str = PIPELINE_ROOT,
               bulk_dir=datadir.bulk_dir) -> dict[str, int]:
    """The run's objects as the steps write them, {URI: size}: each artifact at its KFP URI, and the bulk of the
    outputs written by reference where `bulk_dir` puts it for the run's `data_root` (a mounted path is not in the
    pipeline root's listing)."""
    tasks, defaults = all_tasks(spec), spec["root"].get("inputDefinitions", {}).get("parameters", {})
    data_root = parameters.get("data_root", defaults.get("data_root", {}).get("defaultValue", ""))
    pipeline = spec["pipelineInfo"]["name"]

    def uri(task: str, output: str) -> str:
        return kfp_launcher.output_uri(pipeline_root, pipeline, "RUN_ID", task, "UUID", output)

    objects = {}
    for task, artifacts in kfp_launcher.task_artifacts(spec).items():
        component = spec["components"][tasks[task]["componentRef"]["name"]]
        bulk_output = ops.BY_REFERENCE.get(component.get("executorLabel", "")[len("exec-"):])
        by_reference = tasks[task].get("inputs", {}).get("parameters", {}).get("by_reference", {})
        for output in artifacts["outputs"]:
            objects[f"{uri(task, output)}/{output}.json"] = 1
            if output == bulk_output:
                where = bulk_dir(uri(task, output), uri(task, output), data_root=data_root,
                                 by_reference=by_reference.get("runtimeValue", {}).get("constant", False))
                objects[f"{where.rstrip('/')}/train/train-00000-of-00001.tfrecord"] = 1
    return objects


def pod_downloads(spec: dict, parameters: dict, release: str, pipeline_root: str = PIPELINE_ROOT,
                  bulk_dir=datadir.bulk_dir) -> dict[str, list[dict]]:
    """Per task, what its pod's launcher downloads on `release` (pipelines/backend/kfp_launcher.py): each input
    artifact, and anything beside it that the release's prefix listing also brings, from the run laid out as the steps
    write it (run_layout)."""
    pipeline = spec["pipelineInfo"]["name"]

    def uri(task: str, output: str) -> str:
        return kfp_launcher.output_uri(pipeline_root, pipeline, "RUN_ID", task, "UUID", output)

    objects = run_layout(spec, parameters, pipeline_root, bulk_dir)
    store = kfp_launcher.Listing(objects)
    moved = kfp_launcher.pod_transfers(spec, uri, uri, store, release)
    result = {}
    for task, pod in moved.items():
        result[task] = []
        for transfer in pod.downloads:
            entry = {"input": transfer.artifact, "uri": transfer.uri,
                     "copies": "the artifact" if transfer.note == "copied whole" else f"nothing: {transfer.note}"}
            if transfer.beside:  # objects of other artifacts or bulk data, which only share the key's start
                entry["also_copies"] = transfer.beside_folders()
            result[task].append(entry)
    return result


def explain(package_path: str, parameters: dict, release: str = kfp_driver.PINNED_RELEASE) -> dict:
    """Per step, the pod `release` creates for these parameter values (and a cluster job's nodes), or why the
    driver or the API server would fail it (`fails`), and the features the pipeline needs with their first
    releases."""
    spec, executors = kfp_driver.read_package(package_path)
    failures: list = []
    pods = kfp_driver.resolve_pods(spec, executors, parameters, producer_outputs(spec, parameters), release, failures)
    downloads = pod_downloads(spec, parameters, release)
    steps = []
    for index, pod in enumerate([*pods, None]):
        steps += [{"task": task, "display_name": name, "fails": why} for task, name, why, before in failures
                  if before == index]
        if pod is None:
            break
        entry = {k: v for k, v in pod.to_json().items() if v not in (None, {}, [])}
        nodes = cluster_nodes(pod) if kfp_driver.has(release, "task_config_passthrough") or \
            pod.inputs.get("launcher") == "vertex-job" else []
        if nodes:
            entry["nodes"] = nodes
        if downloads.get(pod.task):
            entry["downloads"] = downloads[pod.task]
        steps.append(entry)
    needs = [{"feature": f.description, "first_release": f.first_release}
             for f in kfp_driver.required_release(spec, executors)]
    return {"backend_release": release, "model": kfp_driver.PINNED,
            "checked_against": checked_against(release), "launcher": launcher_rule(release),
            "needs": needs, "steps": steps}


def checked_against(release: str) -> str:
    """Whether this answer was compared with the release's own compiler and driver, run on the same pipeline."""
    checked = ", ".join(kfp_driver.CHECKED_AGAINST)
    if release in kfp_driver.CHECKED_AGAINST:
        return (f"the real KFP {release} compiler and driver give these pods (tests/test_kfp_backend.py; "
                f"checked: {checked})")
    return f"the model only: KFP {release}'s own driver is not run in the tests (checked: {checked})"


def launcher_rule(release: str) -> str:
    """How `release`'s launcher picks the objects of an input artifact (pipelines/backend/kfp_launcher.py)."""
    if kfp_launcher.downloads_siblings(release):
        return (f"downloads every object whose key starts with an input artifact's key (objectstore.DownloadBlob "
                f"before {kfp_launcher.UNDER_PREFIX_ONLY}, object_store.go:127-154 at 2.16.1); artifacts at "
                f"{PIPELINE_ROOT}")
    return (f"downloads an input artifact's key and the keys below it (isBlobKeyUnderPrefix, object_store.go:171-174 "
            f"at {kfp_launcher.UNDER_PREFIX_ONLY}); artifacts at {PIPELINE_ROOT}")


def render(report: dict) -> str:
    return yaml.safe_dump(report, sort_keys=False, width=118)
