"""`pipectl explain`: the pod a KFP backend release creates for each step of the compiled pipeline, for given
parameter values, before anything is uploaded; for a cluster job, the nodes the training step's launcher creates.

The pods follow the driver model in pipelines/kfp_driver.py. The steps whose outputs place another task (the GPU
check) run here, with the run's parameters, as they would on the cluster; a training step that launches a job gets
its TaskConfig the way kfp's executor hands it over, and the launcher's own code builds the nodes from it.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import yaml

from components import ops
from pipelines import kfp_driver

# Steps whose outputs another task's pod depends on: run here, with the run's parameters.
PRODUCERS = {ops.placement_op.name: ops.placement_op}


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
    tolerations, or the Vertex AI machine), from the step's resolved inputs and TaskConfig; [] for other steps."""
    from components.gcp.accelerators import ACCELERATORS
    from components.launch import LaunchSettings, custom_job, job_manifests, node_resources, training_job

    inputs = pod.inputs
    if "launcher" not in inputs or "workers" not in inputs:
        return []
    launcher, command = inputs["launcher"], ["python", "-m", "components.train"]
    common = dict(image=inputs["image"], workers=int(inputs["workers"]), kueue_queue=inputs.get("kueue_queue", ""),
                  namespace=inputs.get("namespace", "kubeflow"))
    if launcher == "vertex-job":
        launch = LaunchSettings(launcher, **common, accelerator=inputs["accelerator"], gpus=int(inputs["gpus"]),
                                spot=bool(inputs["spot"]), node_pool=inputs["node_pool"],
                                project=inputs.get("project") or "PROJECT", location=inputs.get("location", ""))
        job = custom_job(training_job(launch, command, run_id="RUN", task_name=pod.task),
                         vertex_accelerators=ACCELERATORS, spot=launch.spot)
        return [{"replicas": p.replica_count, "machine": {
            "machineType": p.machine_spec.machine_type, "acceleratorType": p.machine_spec.accelerator_type.name,
            "acceleratorCount": p.machine_spec.accelerator_count}, "scheduling": job.job_spec.scheduling.strategy.name}
            for p in job.job_spec.worker_pool_specs]
    config = task_config_as_step_reads_it(pod.task_config or {})
    sizes = node_resources(inputs.get("node_cpu", ""), inputs.get("node_memory", ""), inputs.get("node_gpus", "")) \
        if "node_cpu" in inputs else None
    launch = LaunchSettings(launcher, **common, runtime=inputs["runtime"], task_config=dataclasses.asdict(config),
                            node_resources=sizes)
    manifest = job_manifests(launcher, training_job(launch, command, run_id="RUN", task_name=pod.task),
                             launch.namespace, runtime=launch.runtime)[-1]
    return node_pods(manifest)


def node_pods(manifest: dict) -> list[dict]:
    """Each replica group's count and pod placement in a TrainJob, JobSet or TFJob manifest."""
    def placement(count: int, pod: dict) -> dict:
        container = pod["containers"][0] if pod.get("containers") else {}
        return {"replicas": count, "resources": container.get("resources", {}),
                "nodeSelector": pod.get("nodeSelector"), "tolerations": pod.get("tolerations")}

    spec = manifest["spec"]
    if manifest["kind"] == "TFJob":
        return [placement(r["replicas"], r["template"]["spec"]) for r in spec["tfReplicaSpecs"].values()]
    if manifest["kind"] == "JobSet":
        return [placement(r["replicas"] * r["template"]["spec"].get("parallelism", 1),
                          r["template"]["spec"]["template"]["spec"]) for r in spec["replicatedJobs"]]
    # TrainJob: the trainer's numNodes and resourcesPerNode, placed by the runtime patch of its pods.
    pod = {}
    for patch in spec.get("runtimePatches", []):
        for rjob in patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", []):
            pod.update(rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {}))
    trainer = spec["trainer"]
    return [{"replicas": trainer["numNodes"], "resources": trainer.get("resourcesPerNode", {}),
             "nodeSelector": pod.get("nodeSelector"), "tolerations": pod.get("tolerations")}]


def explain(package_path: str, parameters: dict, release: str = kfp_driver.PINNED_RELEASE) -> dict:
    """Per step, the pod `release` creates for these parameter values (and a cluster job's nodes), or why the
    driver or the API server would fail it (`fails`), and the features the pipeline needs with their first
    releases."""
    spec, executors = kfp_driver.read_package(package_path)
    failures: list = []
    pods = kfp_driver.resolve_pods(spec, executors, parameters, producer_outputs(spec, parameters), release, failures)
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
        steps.append(entry)
    needs = [{"feature": f.description, "first_release": f.first_release}
             for f in kfp_driver.required_release(spec, executors)]
    return {"backend_release": release, "model": kfp_driver.PINNED, "needs": needs, "steps": steps}


def render(report: dict) -> str:
    return yaml.safe_dump(report, sort_keys=False, width=118)
