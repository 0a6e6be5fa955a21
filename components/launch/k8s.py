"""Kubernetes plumbing for the launchers: the API client, the pod-log follower, and `CustomResourceLauncher`,
which runs any job that is a namespaced custom resource (a Kubeflow TFJob here; a Trainer v2 TrainJob is the
same with another group/version/plural, manifest and status reader).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from typing import Callable, Iterator

from components import gcp
from components.launch.job import LaunchError, Launcher
from components.launch.placement import KUEUE_QUEUE_LABEL

log = logging.getLogger(__name__)

# Kueue's Workload (kubernetes-sigs/kueue v0.19.2): one per queued job, labelled with the job's uid
# (pkg/controller/constants/constants.go:43, set in pkg/controller/jobframework/reconciler.go:1618-1621); while
# the queue cannot admit the job, its QuotaReserved condition is False with the scheduler's reason (e.g. the
# quota it lacks).
KUEUE_GROUP, KUEUE_VERSION, WORKLOAD_PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"
WORKLOAD_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def kubernetes_client(api_server: str | None = None):
    """An ApiClient: for `api_server` when given, else in-cluster credentials, else the local kubeconfig."""
    from kubernetes import client, config

    if api_server:
        configuration = client.Configuration()
        configuration.host = api_server
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def api_reason(e) -> str:
    """The Kubernetes API's own message from an ApiException (its Status body), else status and reason."""
    try:
        return json.loads(e.body).get("message") or str(e.reason)
    except (TypeError, ValueError, AttributeError):
        return f"{e.status} {e.reason}"


def terminated(pod, container: str):
    """`container`'s terminated state in `pod` (a V1Pod), None while it waits or runs."""
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.name == container and status.state and status.state.terminated:
            return status.state.terminated
    return None


def exit_code(pod, container: str) -> int:
    """`container`'s exit code once it ended, else 0."""
    ended = terminated(pod, container)
    return int(ended.exit_code or 0) if ended else 0


def failed_pods(pods: list, container: str) -> list[tuple[object, int]]:
    """The pods whose `container` failed by itself (a non-zero exit code, the pod not being deleted by its
    controller), each with its exit code, the first to fail first."""
    codes = [(pod, exit_code(pod, container)) for pod in pods if not pod.metadata.deletion_timestamp]
    return sorted(((pod, code) for pod, code in codes if code),
                  key=lambda failure: str(terminated(failure[0], container).finished_at))


class CustomResourceLauncher(Launcher):
    """Creates a namespaced custom resource, follows it to the end, deletes it when stopped.

    `api_client` is a `kubernetes.client.ApiClient` (in a pod: `kubernetes.config.load_incluster_config()`
    then `ApiClient()`; the step's service account needs create/get/delete on the resource and get on pods/log).
    A subclass sets `group`, `version`, `plural`, `kind`, and says which pod's log to stream (`log_pod`) and how
    to read the resource's status (`status`). A resource deleted by someone else ends the follow as cancelled.
    """

    group = version = plural = ""
    container = ""  # the container whose log is streamed

    def __init__(self, api_client, namespace: str, *, poll_seconds: float = 10.0,
                 echo: Callable[[str], None] | None = None, timeout_seconds: float | None = None):
        from kubernetes import client

        super().__init__(poll_seconds=poll_seconds, timeout_seconds=timeout_seconds)
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.echo = echo or (lambda line: print(line, flush=True))
        self._follower: LogFollower | None = None
        self._queue_reasons: dict[str, str] = {}  # the last reason Kueue gave for holding each job

    def log_pod(self, name: str) -> str:
        raise NotImplementedError

    def _api(self, verb: str, **kwargs):
        method = getattr(self.custom, f"{verb}_namespaced_custom_object")
        return method(group=self.group, version=self.version, namespace=self.namespace, plural=self.plural, **kwargs)

    def what(self, name: str) -> str:
        return f"{self.kind} {self.namespace}/{name}"

    def create(self, manifest: dict) -> str:
        """Creates the resource; when it already exists (a retried launcher), follows the existing one."""
        from kubernetes.client.rest import ApiException

        name = manifest["metadata"]["name"]
        try:
            # Strict: a field the cluster's CRD lacks (an older Trainer, JobSet or operator) is refused by name;
            # the API server's default (Warn) drops it and only says so in a response header the client discards
            self._api("create", body=manifest, field_validation="Strict")
            log.info("launch: created %s", self.what(name))
        except ApiException as e:
            if e.status != 409:
                raise LaunchError(f"Could not create {self.what(name)}: {api_reason(e)}") from None
            log.info("launch: %s exists (an earlier attempt created it): following it", self.what(name))
        return name

    def get(self, name: str) -> dict | None:
        """The resource, or None when it is gone (deleted by someone else)."""
        from kubernetes.client.rest import ApiException

        try:
            return self._api("get", name=name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def cancel(self, name: str) -> None:
        self.delete(name)

    def delete(self, name: str) -> bool:
        from kubernetes.client.rest import ApiException

        try:
            self._api("delete", name=name, body={"propagationPolicy": "Foreground"})
            log.info("launch: deleted %s", self.what(name))
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def status(self, resource: dict | None) -> gcp.JobStatus:
        if resource is None:
            return gcp.JobStatus("Deleted", gcp.Phase.CANCELLED, "deleted by someone else")
        status = self.resource_status(resource)
        if status.state == "Suspended":
            self.report_queue(resource)
        return status

    def report_queue(self, resource: dict) -> None:
        """For a suspended job in a Kueue queue: logs why Kueue holds it (its Workload's QuotaReserved message),
        once per reason, where the job's own status only says that it is suspended. Says nothing when the
        Workload is not there yet or may not be read (the step's service account needs list on workloads)."""
        from kubernetes.client.rest import ApiException

        queue = (resource["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL)
        if not queue:
            return
        try:
            workloads = self.custom.list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, self.namespace, WORKLOAD_PLURAL,
                label_selector=f"{WORKLOAD_JOB_UID_LABEL}={resource['metadata']['uid']}")["items"]
        except ApiException as e:
            if e.status not in (403, 404):
                raise
            return
        for workload in workloads:
            reserved = next((c for c in (workload.get("status") or {}).get("conditions", [])
                             if c.get("type") == "QuotaReserved"), None)
            if reserved and reserved.get("status") == "False" and reserved.get("message"):
                reason = reserved["message"]
                if self._queue_reasons.get(resource["metadata"]["name"]) != reason:
                    self._queue_reasons[resource["metadata"]["name"]] = reason
                    log.info("launch: %s waits in Kueue queue %s: %s", self.what(resource["metadata"]["name"]),
                             queue, reason)

    def resource_status(self, resource: dict) -> gcp.JobStatus:
        raise NotImplementedError

    @contextlib.contextmanager
    def watching(self, name: str) -> Iterator[None]:
        self._follower = LogFollower(self.core, self.namespace, self.log_pod(name), self.container, self.echo)
        self._follower.start()
        try:
            yield
        finally:
            self._follower.stop()

    def on_done(self, name: str) -> None:
        self._follower.stop(wait=True)  # the stream ends by itself once the pod has exited

    def failure_detail(self, name: str) -> str:
        return self._follower.tail_text() if self._follower else ""


class LogFollower(threading.Thread):
    """Streams a pod's log (kubectl logs -f) into the launcher's output, re-attaching after restarts.

    Lines are read with their timestamps, so re-attaching (the stream ends when the container exits, and the
    restarted container starts a new log) shows only lines not yet shown. `pod` is the pod's name, or a function
    that finds it (None while there is none): a JobSet recreates its pods under new names when it restarts, and
    the follower moves on to the new one.
    """

    def __init__(self, core_api, namespace: str, pod: str | Callable[[], str | None], container: str,
                 echo: Callable[[str], None]):
        super().__init__(daemon=True, name=f"logs-{pod if isinstance(pod, str) else 'node-0'}")
        self.find_pod = pod if callable(pod) else (lambda: pod)
        self.pod = pod if isinstance(pod, str) else ""
        self.core, self.namespace, self.container, self.echo = core_api, namespace, container, echo
        self.stopped = threading.Event()
        self.drained = threading.Event()  # a stream (or an attempt at one) has just ended
        self.tail: list[str] = []
        self.last_seen: tuple = ()

    def run(self) -> None:
        from kubernetes.client.rest import ApiException

        while not self.stopped.is_set():
            try:
                pod = self.find_pod()
                if not pod:  # none yet, or gone: nothing to drain
                    self.drained.set()
                    self.stopped.wait(1.0)
                    continue
                if pod != self.pod:
                    if self.pod:
                        log.info("launch: following the log of %s (was %s)", pod, self.pod)
                    self.pod = pod
                response = self.core.read_namespaced_pod_log(self.pod, self.namespace, container=self.container,
                                                             follow=True, timestamps=True, _preload_content=False)
                pending = b""
                for chunk in response.stream(4096):
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        self._emit(line.decode(errors="replace"))
                if pending:
                    self._emit(pending.decode(errors="replace"))
                response.release_conn()
            except ApiException as e:
                if e.status not in (400, 404):  # 400/404: the pod is not there or not started yet
                    log.warning("launch: cannot read the log of %s: %s", self.pod, api_reason(e))
            except Exception as e:  # the log is a convenience; never fail the launch over it
                log.debug("launch: log stream of %s ended: %s", self.pod, e)
            self.drained.set()
            self.stopped.wait(1.0)

    def _emit(self, stamped: str) -> None:
        stamp, _, line = stamped.partition(" ")
        seen = _log_time(stamp)
        if seen <= self.last_seen:
            return
        self.last_seen = seen
        self.tail = (self.tail + [line])[-20:]
        self.echo(f"[{self.pod}] {line}")

    def tail_text(self) -> str:
        return ("\nLast lines of the chief's log:\n" + "\n".join(self.tail)) if self.tail else ""

    def stop(self, wait: bool = False) -> None:
        """Stops following; with `wait`, first lets the current stream end (it does once the pod has exited), so
        that the last lines are shown and quoted."""
        if wait and self.is_alive():
            self.drained.clear()
            self.drained.wait(5.0)
        self.stopped.set()


def _log_time(stamp: str) -> tuple:
    """An RFC 3339 timestamp as a sortable tuple (Kubernetes trims trailing zeros of the fraction)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return (whole, fraction.ljust(9, "0"))
