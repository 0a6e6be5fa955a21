"""The JobSet and Job controllers behind the Kubernetes API stand-in (k8s_api.py serves them; trainer.py builds the
JobSets of TrainJobs).

Follows the public definitions:
- JobSet v0.12.0 (kubernetes-sigs/jobset: api/jobset/v1alpha2/jobset_types.go; pkg/controllers/jobset_controller.go
  and failure_policy.go; pkg/webhooks/jobset_webhook.go): Jobs named `{jobset}-{replicated job}-{index}`, pod
  hostnames `{job}-{completion index}` in the subdomain `{jobset}`, the jobset.sigs.k8s.io labels and annotations
  on the pods (restart-attempt among them), the webhook's defaults and pod-name check, the failure policy (rules in
  order against the first failed Job, default action RestartJobSet, maxRestarts, Recreate/BlockingRecreate), the
  success policy, and the Completed/Failed/RestartingJobSet conditions with JobSet's reasons and messages.
- The Kubernetes Job API (batch/v1): Indexed completion (`JOB_COMPLETION_INDEX` and the
  `batch.kubernetes.io/job-completion-index` annotation and label), `backoffLimit`, `podFailurePolicy` (rules in
  order: onExitCodes In/NotIn for a container, onPodConditions; FailJob -> reason PodFailurePolicy, Ignore, Count;
  past the backoff limit -> reason BackoffLimitExceeded), a failed Job's running pods deleted.
Bodies are validated against the vendored CRD and the pod templates against the Kubernetes schema (validation.py).

Pods run as local processes (pods.py). The pods of one JobSet share the machine's loopback network: each pod's DNS
name gets a port of its own on 127.0.0.1, and `{hostname}.{subdomain}[.{namespace}.svc[.cluster.local]]:{port}`
in a container's env is rewritten to that address, which is what the headless Service resolves in a cluster. A
variable that is a pod's DNS name alone becomes 127.0.0.1, and one that is a container port of the pods alone
becomes the first pod's loopback port for it (torchrun's PET_MASTER_ADDR and PET_MASTER_PORT name node 0 so).
Env `valueFrom.fieldRef` (Downward API) resolves metadata.name/namespace/labels['k']/annotations['k']. Pods a
controller deleted (a failed Job's others, a restart's) are no longer listed. `preempt()` does what a Spot VM's
node shutdown does: the pod gets the DisruptionTarget condition and SIGTERM, then SIGKILL after its grace period.

Not simulated: suspension (Kueue admission), restartPolicy other than Never, TTLs.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import signal
import threading
import time
import uuid
from typing import Callable

from tests.standins.admission import admit_pod
from tests.standins.base import ApiError
from tests.standins.pods import Pod, free_port, signal_group
from tests.standins.validation import crd_problems, job_problems

JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_FIELD_REF = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def invalid(kind: str, group: str, name: str, problems: list[str]) -> ApiError:
    """The API server's 422 for a refused body."""
    return ApiError("INVALID_ARGUMENT", f'{kind}.{group} "{name}" is invalid: {"; ".join(problems)}',
                    http_status=422, reason="Invalid")


class JobSetPod(Pod):
    """A pod of a JobSet's Job: a local process (pods.py) with the pod's metadata, conditions and API view."""

    def __init__(self, name: str, hostname: str, index: int, container: dict, env: dict, *, labels: dict,
                 annotations: dict, namespace: str, pod_spec: dict, created: str):
        super().__init__(name, "node", index, container, env)
        self.hostname, self.labels, self.annotations = hostname, labels, annotations
        self.namespace, self.pod_spec, self.created = namespace, pod_spec, created
        self.conditions: list[dict] = []
        self.finished_at: float | None = None  # when the controller saw the container end (orders failures)
        self.finished_wall = ""  # the same, as the container status' finishedAt
        self.terminating = False  # deleted by its controller (a failed Job, a restart, a deleted JobSet)
        self.judged = False  # its failure was taken into account by the Job controller

    @property
    def grace_seconds(self) -> float:
        return float(self.pod_spec.get("terminationGracePeriodSeconds", 30))

    def preempt(self) -> None:
        """Node shutdown: DisruptionTarget, SIGTERM now, SIGKILL after the grace period."""
        self.conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                                "message": "Pod was terminated in response to imminent node shutdown."})
        process = self.process
        if process is None or process.poll() is not None:
            return
        signal_group(process, signal.SIGTERM)

        def kill_later():
            try:
                process.wait(self.grace_seconds)
            except Exception:
                signal_group(process, signal.SIGKILL)

        threading.Thread(target=kill_later, daemon=True).start()

    def terminate(self) -> None:
        self.terminating = True
        self.stop(min(self.grace_seconds, 30.0))

    def to_api(self) -> dict:
        """The pod as core/v1 Pod JSON."""
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": self.name, "namespace": self.namespace, "labels": dict(self.labels),
                             "annotations": dict(self.annotations), "creationTimestamp": self.created,
                             "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, self.name))},
                "spec": {**self.pod_spec, "hostname": self.hostname},
                "status": {**self.api_status(self.created, self.finished_wall), "conditions": list(self.conditions)}}


class Network:
    """One JobSet's pods on loopback: a port per (hostname, port), and env values rewritten to reach them."""

    def __init__(self, subdomain: str, namespace: str):
        self.subdomain, self.namespace = subdomain, namespace
        self.ports: dict[tuple[str, int], int] = {}

    def resolve(self, value: str, hostnames: list[str], ports: set[int] = frozenset()) -> str:
        if not hostnames:
            return value
        if value.isdigit() and int(value) in ports:
            return str(self._port(hostnames[0], int(value)))
        names = "|".join(re.escape(h) for h in sorted(hostnames, key=len, reverse=True))
        host = rf"({names})\.{re.escape(self.subdomain)}(?:\.{re.escape(self.namespace)}\.svc(?:\.cluster\.local)?)?"
        if re.fullmatch(host, value):
            return "127.0.0.1"
        pattern = (rf"\b({names})\.{re.escape(self.subdomain)}"
                   rf"(?:\.{re.escape(self.namespace)}\.svc(?:\.cluster\.local)?)?:(\d+)\b")
        return re.sub(pattern, lambda m: f"127.0.0.1:{self._port(m.group(1), int(m.group(2)))}", value)

    def _port(self, hostname: str, port: int) -> int:
        return self.ports.setdefault((hostname, port), free_port())


class JobRun:
    """One batch/v1 Job of a JobSet: its Indexed pods, its podFailurePolicy and backoff limit, its end."""

    def __init__(self, jobset: "JobSetRun", rjob: dict, job_index: int):
        self.jobset, self.rjob = jobset, rjob
        self.name = f"{jobset.name}-{rjob['name']}-{job_index}"
        self.job_index = job_index
        self.spec = rjob["template"].get("spec", {})
        self.completions = int(self.spec.get("completions", self.spec.get("parallelism", 1)))
        self.failures = 0
        self.failed: dict | None = None  # the Failed condition: reason, message, time
        self.pods: dict[int, JobSetPod] = {}
        self.uid = str(uuid.uuid4())

    @property
    def complete(self) -> bool:
        return self.failed is None and len(self.pods) == self.completions and all(
            pod.exit_code == 0 for pod in self.pods.values())

    @property
    def active(self) -> bool:
        return self.failed is None and any(pod.running for pod in self.pods.values())

    def start(self) -> None:
        for index in range(self.completions):
            self._start_pod(index)

    def _start_pod(self, index: int) -> None:
        js = self.jobset
        template = self.spec.get("template", {})
        hostname = f"{self.name}-{index}"
        labels = {**template.get("metadata", {}).get("labels", {}), **js.pod_labels(self.rjob, self.job_index),
                  "batch.kubernetes.io/job-name": self.name, "job-name": self.name,
                  "batch.kubernetes.io/controller-uid": self.uid, "controller-uid": self.uid,
                  COMPLETION_INDEX: str(index)}
        annotations = {**template.get("metadata", {}).get("annotations", {}),
                       **js.pod_labels(self.rjob, self.job_index), COMPLETION_INDEX: str(index)}
        pod_spec = {**copy.deepcopy(template.get("spec", {})), "subdomain": js.subdomain}
        admit_pod(js.admission_plugins, pod_spec)
        container = pod_spec["containers"][0]
        name = f"{hostname}-{hashlib.sha256(f'{js.uid}{time.time()}{index}'.encode()).hexdigest()[:5]}"
        meta = {"name": name, "namespace": js.namespace, "labels": labels, "annotations": annotations}
        env = {"JOB_COMPLETION_INDEX": str(index)}  # the Job controller's, for Indexed Jobs
        for var in container.get("env", []):
            value = var.get("value", "")
            if "valueFrom" in var:
                value = _field_ref(var["valueFrom"].get("fieldRef", {}).get("fieldPath", ""), meta)
            env[var["name"]] = js.network.resolve(value, js.hostnames(),
                                                  {int(p["containerPort"]) for p in container.get("ports", [])})
        pod = JobSetPod(name, hostname, index, container, env, labels=labels, annotations=annotations,
                        namespace=js.namespace, pod_spec=pod_spec, created=js.now())
        self.pods[index] = pod
        pod.start()
        if js.deleted.is_set():  # deleted while this pod was starting: stop() may have listed the pods before it
            pod.terminate()

    def update(self) -> None:
        """One pass of the Job controller over its pods."""
        if self.failed is not None:
            return
        ended = [pod for pod in self.pods.values() if pod.exit_code is not None and not pod.terminating]
        for pod in ended:
            if pod.finished_at is None:
                pod.finished_at, pod.finished_wall = time.monotonic(), self.jobset.now()
        for pod in sorted((p for p in ended if p.exit_code != 0 and not p.judged), key=lambda p: p.finished_at):
            pod.judged = True
            action, message = self._match_rule(pod)
            if action == "FailJob":
                return self._fail("PodFailurePolicy", message)
            if action == "Ignore":
                self._start_pod(pod.index)
                continue
            self.failures += 1
            if self.failures > int(self.spec.get("backoffLimit", 6)):
                return self._fail("BackoffLimitExceeded", "Job has reached the specified backoff limit")
            self._start_pod(pod.index)

    def _match_rule(self, pod: JobSetPod) -> tuple[str, str]:
        """The first podFailurePolicy rule the failed pod matches: (action, message); ("", "") when none does."""
        for index, rule in enumerate(self.spec.get("podFailurePolicy", {}).get("rules", [])):
            codes = rule.get("onExitCodes")
            if codes is not None:
                container = codes.get("containerName")
                if container and container != pod.container.get("name"):
                    continue
                inside = pod.exit_code in codes.get("values", [])
                if inside == (codes.get("operator") == "In"):
                    return rule["action"], (f"Container {pod.container.get('name')} for pod "
                                            f"{pod.namespace}/{pod.name} failed with exit code {pod.exit_code} "
                                            f"matching {rule['action']} rule at index {index}")
            for pattern in rule.get("onPodConditions", []):
                if any(c["type"] == pattern["type"] and c["status"] == pattern.get("status", "True")
                       for c in pod.conditions):
                    return rule["action"], (f"Pod {pod.namespace}/{pod.name} has condition {pattern['type']} "
                                            f"matching {rule['action']} rule at index {index}")
        return "", ""

    def _fail(self, reason: str, message: str) -> None:
        self.failed = {"reason": reason, "message": message, "time": time.monotonic()}
        for pod in list(self.pods.values()):
            if pod.running:
                pod.terminate()

    def stop(self) -> None:
        # A copy: the operator's thread may still be adding pods (a job deleted as soon as it was created).
        for pod in list(self.pods.values()):
            pod.terminate()


def _field_ref(path: str, meta: dict) -> str:
    """A Downward API fieldRef on the pod's metadata."""
    if path in ("metadata.name", "metadata.namespace"):
        return meta[path.split(".")[1]]
    match = _FIELD_REF.match(path)
    return meta[match.group(1)].get(match.group(2), "") if match else ""


class JobSetRun:
    """One JobSet and its controller loop: Jobs per replicated job, failure and success policies, restarts."""

    def __init__(self, body: dict, namespace: str, run_containers: bool, now: Callable[[], str],
                 admission_plugins: tuple[str, ...] = ()):
        self.body, self.now, self.namespace = body, now, namespace
        self.admission_plugins = admission_plugins  # the API server's, run on each pod created (admission.py)
        self.name = body["metadata"]["name"]
        self.uid = str(uuid.uuid4())
        body["metadata"].update(namespace=namespace, uid=self.uid, creationTimestamp=now(), resourceVersion="1",
                                generation=1)
        default_jobset(body["spec"])
        self.spec = body["spec"]
        self.subdomain = self.spec["network"].get("subdomain") or self.name
        self.network = Network(self.subdomain, namespace)
        self.status = {"restarts": 0, "restartsCountTowardsMax": 0, "conditions": [], "replicatedJobsStatus": []}
        self.jobs: list[JobRun] = []
        self.lock = threading.Lock()
        self.deleted = threading.Event()
        if run_containers:
            threading.Thread(target=self._operate, daemon=True).start()

    def hostnames(self) -> list[str]:
        return [f"{self.name}-{r['name']}-{j}-{k}" for r in self.spec["replicatedJobs"]
                for j in range(int(r.get("replicas", 1)))
                for k in range(int(r["template"]["spec"].get("completions", 1)))]

    def pod_labels(self, rjob: dict, job_index: int) -> dict:
        """What JobSet's labelAndAnnotateObject puts on a Job's pods (labels and annotations alike), the global and
        group counts and indexes as v0.12.0 pkg/controllers/jobset_controller.go:1395-1441 counts them."""
        job = f"{self.name}-{rjob['name']}-{job_index}"
        group = rjob.get("groupName", "default")
        rjobs = self.spec["replicatedJobs"]

        def replicas(jobs) -> int:
            return sum(int(r.get("replicas", 1)) for r in jobs)

        position = [r["name"] for r in rjobs].index(rjob["name"])
        in_group = [r for r in rjobs if r.get("groupName", "default") == group]
        before_in_group = in_group[:[r["name"] for r in in_group].index(rjob["name"])]
        return {"jobset.sigs.k8s.io/global-replicas": str(replicas(rjobs)),
                "jobset.sigs.k8s.io/job-global-index": str(replicas(rjobs[:position]) + job_index),
                "jobset.sigs.k8s.io/group-replicas": str(replicas(in_group)),
                "jobset.sigs.k8s.io/job-group-index": str(replicas(before_in_group) + job_index),
                "jobset.sigs.k8s.io/jobset-name": self.name, "jobset.sigs.k8s.io/jobset-uid": self.uid,
                "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                "jobset.sigs.k8s.io/restart-attempt": str(self.status["restarts"]),
                "jobset.sigs.k8s.io/replicatedjob-replicas": str(rjob.get("replicas", 1)),
                "jobset.sigs.k8s.io/job-index": str(job_index),
                "jobset.sigs.k8s.io/job-key": hashlib.sha1(f"{self.namespace}/{job}".encode()).hexdigest(),
                "jobset.sigs.k8s.io/group-name": rjob.get("groupName", "default")}

    def pods(self) -> list[JobSetPod]:
        """The pods the API lists: those a controller deleted (a failed Job's running pods, a restart's) are gone."""
        with self.lock:
            return [pod for job in self.jobs for pod in job.pods.values() if not pod.terminating]

    def _condition(self, kind: str, reason: str, message: str, status: str = "True") -> None:
        with self.lock:
            conditions = [c for c in self.status["conditions"] if c["type"] != kind]
            conditions.append({"type": kind, "status": status, "reason": reason, "message": message,
                               "lastTransitionTime": self.now()})
            self.status["conditions"] = conditions
            if status == "True" and kind in ("Completed", "Failed"):
                self.status["terminalState"] = kind
            self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)

    def _start_jobs(self) -> None:
        jobs = [JobRun(self, rjob, index) for rjob in self.spec["replicatedJobs"]
                for index in range(int(rjob.get("replicas", 1)))]
        with self.lock:
            self.jobs = jobs
        for job in jobs:
            job.start()

    def _operate(self) -> None:
        self._start_jobs()
        while not self.deleted.is_set():
            time.sleep(0.05)
            for job in list(self.jobs):
                job.update()
            self._update_status()
            failed = [job for job in self.jobs if job.failed]
            if failed:
                if not self._apply_failure_policy(failed):
                    return
                continue
            if self._succeeded():
                self._condition("Completed", "AllJobsCompleted", "jobset completed successfully")
                return

    def _succeeded(self) -> bool:
        policy = self.spec["successPolicy"]
        targets = policy.get("targetReplicatedJobs") or [r["name"] for r in self.spec["replicatedJobs"]]
        jobs = [job for job in self.jobs if job.rjob["name"] in targets]
        done = [job.complete for job in jobs]
        return all(done) if policy.get("operator", "All") == "All" else any(done)

    def _apply_failure_policy(self, failed: list[JobRun]) -> bool:
        """failure_policy.go: the first rule matching a failed Job (the earliest failure) acts; no rule: restart.
        Returns whether the JobSet goes on."""
        policy = self.spec.get("failurePolicy")
        first = min(failed, key=lambda job: job.failed["time"])
        if policy is None:
            return self._fail("FailedJobs", f"jobset failed due to one or more job failures (first failed job: "
                                            f"{first.name})")
        for rule in policy.get("rules", []):
            matching = [job for job in failed if (not rule.get("onJobFailureReasons")
                                                  or job.failed["reason"] in rule["onJobFailureReasons"])
                        and (not rule.get("targetReplicatedJobs") or job.rjob["name"] in rule["targetReplicatedJobs"])
                        and (not rule.get("onJobFailureMessagePatterns")
                             or any(re.search(p, job.failed["message"]) for p in rule["onJobFailureMessagePatterns"]))]
            if matching:
                action, first = rule["action"], min(matching, key=lambda job: job.failed["time"])
                break
        else:
            action, rule = "RestartJobSet", None
        if action == "FailJobSet":
            return self._fail("FailJobSetFailurePolicyAction", f"applying FailJobSet failure policy action (first "
                                                               f"failed job: {first.name})")
        if action in ("RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"):
            counts = action == "RestartJobSet"
            if counts and self.status["restartsCountTowardsMax"] >= int(policy.get("maxRestarts", 0)):
                return self._fail("ReachedMaxRestarts", f"jobset failed due to reaching max number of restarts "
                                                        f"(first failed job: {first.name})")
            reason = f"FailurePolicy_{rule['name']}" if rule else "DefaultFailurePolicy"
            self._restart(counts, reason, f"applying {action} failure policy action (first failed job: "
                                          f"{first.name})", blocking=policy.get("restartStrategy") != "Recreate")
            return True
        return self._fail("FailedJobs", f"the stand-in does not simulate the failure policy action {action}")

    def _restart(self, counts: bool, reason: str, message: str, *, blocking: bool) -> None:
        with self.lock:
            self.status["restarts"] += 1
            self.status["restartsCountTowardsMax"] += int(counts)
        self._condition("RestartingJobSet", reason, message)
        old = self.jobs
        stoppers = [threading.Thread(target=job.stop) for job in old]
        for stopper in stoppers:
            stopper.start()
        if blocking:  # BlockingRecreate: every old pod is gone before a new one starts
            for stopper in stoppers:
                stopper.join()
        if not self.deleted.is_set():
            self._start_jobs()
            self._condition("RestartingJobSet", "JobsReady", "all jobs are ready", status="False")

    def _fail(self, reason: str, message: str) -> bool:
        for job in self.jobs:
            for pod in job.pods.values():
                if pod.running:
                    pod.terminate()
        self._update_status()
        self._condition("Failed", reason, message)
        return False

    def _update_status(self) -> None:
        statuses = []
        for rjob in self.spec["replicatedJobs"]:
            jobs = [job for job in self.jobs if job.rjob is rjob]
            statuses.append({"name": rjob["name"], "ready": sum(job.active for job in jobs),
                             "succeeded": sum(job.complete for job in jobs),
                             "failed": sum(job.failed is not None for job in jobs),
                             "active": sum(job.active for job in jobs), "suspended": 0})
        with self.lock:
            self.status["replicatedJobsStatus"] = statuses

    def delete(self) -> None:
        self.deleted.set()
        for job in list(self.jobs):
            job.stop()

    def snapshot(self) -> dict:
        with self.lock:
            return json.loads(json.dumps({**self.body, "status": self.status}))


def default_jobset(spec: dict) -> None:
    """The JobSet webhook's defaults (v0.12.0 pkg/webhooks/jobset_webhook.go:111-149; replicas and groupName are
    the CRD's)."""
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for index, rule in enumerate(spec.get("failurePolicy", {}).get("rules", [])):
        rule.setdefault("name", f"failurePolicyRule{index}")
    for rjob in spec.get("replicatedJobs", []):
        rjob.setdefault("replicas", 1)
        rjob.setdefault("groupName", "default")
        job_spec = rjob["template"].setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        job_spec["template"].setdefault("spec", {}).setdefault("restartPolicy", "OnFailure")


def jobset_problems(body: dict) -> list[str]:
    """What the JobSet CRD, JobSet's webhook (v0.12.0 pkg/webhooks/jobset_webhook.go:243-255 pod names,
    :464-467 rule names) and the Job API refuse (and what the stand-in cannot run)."""
    problems = crd_problems(body)
    if problems:
        return problems
    name = body["metadata"].get("name", "")
    spec = body.get("spec", {})
    subdomain = spec.get("network", {}).get("subdomain", "")
    if subdomain and not SUBDOMAIN.match(subdomain):
        problems.append(f"spec.network.subdomain: Invalid value: {json.dumps(subdomain)}: a lowercase RFC 1123 "
                        "subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
                        "and end with an alphanumeric character")
    for index, rjob in enumerate(spec.get("replicatedJobs", [])):
        job_spec = rjob.get("template", {}).get("spec", {})
        replicas = int(rjob.get("replicas", 1))
        completions = job_spec.get("completions")
        longest = f"{name}-{rjob['name']}-{replicas - 1}-{max(int(completions or 1) - 1, 0)}-abcde"
        job = f"{name}-{rjob['name']}-{replicas - 1}"
        if len(longest) > 63:
            problems.append(f"spec.replicatedJobs[{index}].name: Invalid value: {json.dumps(job)}: JobSet name is "
                            "too long, pod names generated for this JobSet will exceed 63 characters")
        elif not DNS1035.match(longest):
            problems.append(f"spec.replicatedJobs[{index}].name: Invalid value: {json.dumps(job)}: a DNS-1035 label "
                            "must consist of lower case alphanumeric characters or '-', start with an alphabetic "
                            "character, and end with an alphanumeric character")
        defaulted = copy.deepcopy(rjob.get("template", {}))
        defaulted.setdefault("spec", {}).setdefault("completionMode", "Indexed")
        problems += [f"spec.replicatedJobs[{index}].template.{p}"
                     for p in job_problems(defaulted, f"{name}-{rjob['name']}-0")]
        restart = job_spec.get("template", {}).get("spec", {}).get("restartPolicy")
        if restart != "Never":
            problems.append(f"spec.replicatedJobs[{index}]: the stand-in runs restartPolicy Never only "
                            f"(got {restart!r})")
    for rule in spec.get("failurePolicy", {}).get("rules", []):
        if rule.get("name") and not _RULE_NAME.match(rule["name"]):
            problems.append(f"invalid failure policy rule name '{rule['name']}', a failure policy rule name must "
                            "start with an alphabetic character, optionally followed by a string of alphanumeric "
                            "characters or '_,:', and must end with an alphanumeric character or '_'")
    return problems
