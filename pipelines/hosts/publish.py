"""Publish compiled pipelines to Kubeflow Pipelines (KFP v2): upload versions, start runs, keep schedules.

Every function takes a ready ``kfp.Client`` (build one with :func:`make_client`), so the CLI owns
argument parsing and tests drive the real client against a local API stand-in. Failures the user
can act on raise :class:`PublishError` with a message saying what to do; server errors are reduced
to status and server message (never the raw exception, whose text carries response headers such
as session cookies).

KFP facts this module is built around (checked against kfp 2.17 and the KFP 2.x API server):

- ``upload_pipeline`` names the first version after the *pipeline*. To get a first version named
  exactly VERSION we create the pipeline without a version (``POST /pipelines``) and upload VERSION
  into it; if the second step fails, the next call finds the empty pipeline and fills it in.
- Names are unique (pipeline names globally or per namespace, version names per pipeline); the
  server answers 409 to duplicates and nothing is ever overwritten here.
- ``kfp.Client.run_pipeline``/``create_recurring_run`` ignore ``enable_caching`` for uploaded
  versions (they only rewrite a local package). To honour it we submit the stored spec of the
  chosen version as a package, with caching overridden the way kfp does it (top-level tasks).
- A recurring run whose ``pipeline_version_reference`` has no version id runs the pipeline's
  newest version at every trigger (KFP backend >= 2.5); ``kfp.Client.create_recurring_run``
  refuses that combination, so "latest" schedules go through the generated API client.
- KFP has no update for recurring runs, cron has six fields with seconds first, and a standard
  five-field cron is *accepted* by the server but read as "sec min hour dom month" — hence
  :func:`to_kfp_cron` (the fields are checked by pipelines/cron.py, the validator Vertex AI schedules use).
- ``kfp.Client.wait_for_run_completion`` never stops on CANCELED and, on a 401, swaps the caller's token for a
  gcloud access token, so runs are followed with the project's own loop (components/gcp/jobs.py). The run is
  watched, never cancelled: it belongs to the server, not to the terminal that started it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
import urllib.parse
import warnings
from typing import Any, Iterator, Literal

import kfp
import yaml
from kfp_server_api import (ApiException, RecurringRunMode, V2beta1CronSchedule, V2beta1Experiment, V2beta1Pipeline,
                            V2beta1PipelineVersionReference, V2beta1RecurringRun, V2beta1RuntimeConfig,
                            V2beta1Trigger)
from urllib3.exceptions import HTTPError as TransportError

from components import gcp
from pipelines.cron import parse_cron

log = logging.getLogger(__name__)

LATEST = "latest"
# KFP run states by phase; the others (PENDING, RUNNING, PAUSED, CANCELING, ...) are still going.
RUN_PHASES = {"SUCCEEDED": gcp.Phase.SUCCEEDED, "FAILED": gcp.Phase.FAILED, "CANCELED": gcp.Phase.CANCELLED,
              "SKIPPED": gcp.Phase.CANCELLED}
_FILTER_EQUALS = 1  # v2beta1 Predicate.Operation.EQUALS, sent as a number like kfp.Client does


class PublishError(Exception):
    """A publish step failed; the message says what happened and what to do about it."""


# --- client ----------------------------------------------------------------------------------------
def make_client(host: str, *, token: str | None = None, namespace: str | None = None,
                iap_client_id: str | None = None) -> kfp.Client:
    """Build a ``kfp.Client`` for ``host`` authenticated by a bearer token or, behind IAP, a Google ID token.

    ``token`` is sent as ``Authorization: Bearer``; with ``iap_client_id`` an ID token for that
    audience is minted from the ambient Google service-account credentials. Neither is logged or
    put into an exception. Without ``namespace`` the kfp constructor probes ``/healthz`` first
    (and retries 5 times, 5 s apart, on HTTP errors) — that is kfp's behaviour, not ours.
    """
    if not host:
        raise PublishError("no KFP host given: pass the API endpoint, e.g. https://kfp.example.com/pipeline")
    if token and iap_client_id:
        raise PublishError("give either a bearer token or an IAP client id, not both")
    if iap_client_id:
        token = _iap_id_token(iap_client_id)
    kwargs: dict[str, Any] = {"host": host, "existing_token": token or None}
    if namespace:
        kwargs["namespace"] = namespace
    with warnings.catch_warnings():
        # kfp warns on every construction that it needs a >= 2.0.0-beta.2 backend; noise for a CLI.
        warnings.simplefilter("ignore", FutureWarning)
        try:
            return kfp.Client(**kwargs)
        except ApiException as exc:
            raise _api_failure(f"connecting to KFP at {host}", exc) from None
        except (TransportError, TimeoutError) as exc:
            raise PublishError(f"cannot reach KFP at {host}: {type(exc).__name__}; check the URL, "
                               f"the network path and the credentials") from None


def _iap_id_token(audience: str) -> str:
    """An OIDC ID token for the IAP OAuth client ``audience``, from service-account credentials."""
    try:
        import google.auth.transport.requests
        import google.oauth2.id_token
    except ImportError:
        raise PublishError("IAP authentication needs google-auth: pip install google-auth requests") from None
    try:
        return google.oauth2.id_token.fetch_id_token(google.auth.transport.requests.Request(), audience)
    except Exception as exc:  # google-auth raises several unrelated types (credentials, transport, refresh)
        raise PublishError(
            f"could not get a Google ID token for IAP client id {audience}: {type(exc).__name__}: {exc}. "
            "IAP needs service-account credentials (GOOGLE_APPLICATION_CREDENTIALS or the metadata "
            "server); user credentials from `gcloud auth application-default login` cannot mint them"
        ) from None


# --- pipelines and versions --------------------------------------------------------------------------
def upload_version(client: kfp.Client, package_path: str, *, name: str, version: str, description: str = "",
                   if_exists: Literal["error", "skip"] = "error") -> dict:
    """Upload ``package_path`` as version ``version`` of pipeline ``name``, creating the pipeline if needed.

    The first version of a new pipeline is named ``version`` too (not after the pipeline, as
    ``kfp.Client.upload_pipeline`` would). An existing version name is an error, or with
    ``if_exists="skip"`` returns that version unchanged: versions are immutable, never overwritten.
    Returns ``pipeline_id, pipeline_name, version_id, version_name, created, url``.
    """
    if if_exists not in ("error", "skip"):
        raise ValueError(f"if_exists must be 'error' or 'skip', not {if_exists!r}")
    _require(name, "pipeline name")
    _require(version, "version name")
    if version == LATEST:
        raise PublishError(f"{LATEST!r} is reserved for 'the newest version'; pick another version name")
    if not os.path.isfile(package_path):
        raise PublishError(f"pipeline package not found: {package_path}")

    with _calling(f"uploading version {version!r} of pipeline {name!r}"):
        pipeline, existing = _find_pipeline(client, name), None
        if pipeline is None:
            pipeline = _create_pipeline(client, name, description)
        else:
            existing = _find_version(client, pipeline.pipeline_id, version)
        if existing is None:
            try:
                uploaded = client.upload_pipeline_version(
                    package_path, pipeline_version_name=version, pipeline_id=pipeline.pipeline_id,
                    description=description or None)
            except ApiException as exc:  # 409: someone else uploaded that name since we looked
                existing = _find_version(client, pipeline.pipeline_id, version) if exc.status == 409 else None
                if existing is None:
                    raise
            else:
                log.info("uploaded version %r of pipeline %r", version, name)
                return _version_info(client, name, uploaded, created=True)
    if if_exists == "skip":
        log.info("version %r of pipeline %r already exists; skipped", version, name)
        return _version_info(client, name, existing, created=False)
    raise PublishError(f"pipeline {name!r} already has a version named {version!r}; versions are never "
                       f"overwritten: choose a new version name, or skip existing versions "
                       f"(if_exists='skip', pipectl --if-exists skip)")


def _create_pipeline(client: kfp.Client, name: str, description: str) -> Any:
    """Create an empty pipeline (no version) so the first uploaded version keeps its own name."""
    # display_name only: KFP < 2.5 has no `name` field and rejects unknown ones; newer servers copy it.
    body = V2beta1Pipeline(display_name=name, description=description or None, namespace=_namespace(client))
    try:
        pipeline = client.pipelines.pipeline_service_create_pipeline(pipeline=body)
    except ApiException as exc:
        if exc.status == 409 and (found := _find_pipeline(client, name)):  # created concurrently
            return found
        raise
    log.info("created pipeline %r (%s)", name, pipeline.pipeline_id)
    return pipeline


def _find_pipeline(client: kfp.Client, name: str) -> Any | None:
    # Filter on `name`, the unique column (`display_name` is free text on KFP >= 2.5); KFP < 2.5
    # only reports display_name, which there is the same column.
    resp = client.list_pipelines(filter=_equals("name", name), page_size=2, namespace=_namespace(client))
    found = [p for p in resp.pipelines or [] if (p.name or p.display_name) == name]
    return found[0] if found else None


def _get_pipeline(client: kfp.Client, name: str) -> Any:
    pipeline = _find_pipeline(client, name)
    if pipeline is None:
        raise PublishError(f"no pipeline named {name!r} on the server; upload a version first")
    return pipeline


def _find_version(client: kfp.Client, pipeline_id: str, version: str) -> Any | None:
    resp = client.list_pipeline_versions(pipeline_id, filter=_equals("name", version), page_size=2)
    found = [v for v in resp.pipeline_versions or [] if (v.name or v.display_name) == version]
    return found[0] if found else None


def _resolve_version(client: kfp.Client, pipeline: Any, version: str) -> Any:
    """The version called ``version`` of ``pipeline``, or its newest one for ``"latest"``."""
    pipeline_name = pipeline.name or pipeline.display_name
    if version != LATEST:
        found = _find_version(client, pipeline.pipeline_id, version)
        if found is None:
            raise PublishError(f"pipeline {pipeline_name!r} has no version named {version!r}")
        return found
    resp = client.list_pipeline_versions(pipeline.pipeline_id, sort_by="created_at desc", page_size=2)
    newest = resp.pipeline_versions or []
    if not newest:
        raise PublishError(f"pipeline {pipeline_name!r} has no versions yet; upload one first")
    if len(newest) == 2 and newest[0].created_at == newest[1].created_at:
        # KFP keeps whole seconds; within one second its order is by random id.
        log.warning("versions %r and %r of %r were created in the same second, so 'latest' is ambiguous; "
                    "pin a version name", newest[0].name or newest[0].display_name,
                    newest[1].name or newest[1].display_name, pipeline_name)
    return newest[0]


def _version_info(client: kfp.Client, pipeline_name: str, version: Any, *, created: bool) -> dict:
    return {"pipeline_id": version.pipeline_id, "pipeline_name": pipeline_name,
            "version_id": version.pipeline_version_id, "version_name": version.name or version.display_name,
            "created": created,
            "url": f"{_ui(client)}/#/pipelines/details/{version.pipeline_id}/version/{version.pipeline_version_id}"}


# --- runs ---------------------------------------------------------------------------------------------
def start_run(client: kfp.Client, *, pipeline_name: str, run_name: str, version: str = LATEST,
              experiment: str = "Default", params: dict | None = None, enable_caching: bool | None = None,
              wait: bool = False, timeout_seconds: float = 24 * 3600, poll_seconds: float = 30) -> dict:
    """Start a run of a pipeline version (``"latest"`` = newest) in ``experiment``, created if missing.

    ``enable_caching`` None keeps the compiled caching settings. With ``wait`` it polls until the
    run ends and raises :class:`PublishError` unless it SUCCEEDED (or ``timeout_seconds`` passes — the run
    keeps going on the server). Returns ``run_id, run_name, url, experiment_id, pipeline_id,
    version_id, version_name`` and, with ``wait``, ``state``.
    """
    _require(run_name, "run name")
    with _calling(f"starting run {run_name!r} of pipeline {pipeline_name!r}"):
        pipeline = _get_pipeline(client, pipeline_name)
        chosen = _resolve_version(client, pipeline, version)
        experiment_id = _ensure_experiment(client, experiment)
        with _package_with_caching(client, chosen, enable_caching) as package:
            if package:
                run = client.run_pipeline(experiment_id, run_name, pipeline_package_path=package,
                                          params=params or {})
            else:
                run = client.run_pipeline(experiment_id, run_name, params=params or {},
                                          pipeline_id=pipeline.pipeline_id, version_id=chosen.pipeline_version_id)
    info = {"run_id": run.run_id, "run_name": run_name, "url": f"{_ui(client)}/#/runs/details/{run.run_id}",
            "experiment": experiment, "experiment_id": experiment_id, "pipeline_id": pipeline.pipeline_id,
            "version_id": chosen.pipeline_version_id, "version_name": chosen.name or chosen.display_name}
    log.info("started run %r (%s) of %s@%s: %s", run_name, run.run_id, pipeline_name, info["version_name"],
             info["url"])
    if wait:
        info["state"] = _wait_for_run(client, info, timeout_seconds=timeout_seconds, poll_seconds=poll_seconds)
    return info


def _run_status(run: Any) -> gcp.JobStatus:
    state = run.state or "RUNTIME_STATE_UNSPECIFIED"
    message = run.error.message if run.error and run.error.message else ""
    return gcp.JobStatus(state, RUN_PHASES.get(state, gcp.Phase.RUNNING), message)


def _wait_for_run(client: kfp.Client, info: dict, *, timeout_seconds: float, poll_seconds: float) -> str:
    """Follow the run until it ends, riding out transient errors; never cancels it."""
    with _calling(f"following run {info['run_name']!r}"):
        try:
            followed = gcp.follow_job(lambda: client.get_run(info["run_id"]), None, status=_run_status,
                                      what=f"run {info['run_name']!r}", poll_seconds=poll_seconds,
                                      timeout_seconds=timeout_seconds, where=info["url"])
        except gcp.JobError as exc:
            raise PublishError(str(exc)) from None
    return followed.status.state


def _ensure_experiment(client: kfp.Client, name: str) -> str:
    """The id of experiment ``name``, created when there is none. (Not ``kfp.Client.create_experiment``: its
    look-up sends the name unescaped, so a ``+`` or ``%`` in it is misread by the server, see ``_equals``.)"""
    _require(name, "experiment name")
    found = _find_experiments(client, name)
    if found:
        return _one_experiment(name, found)
    body = V2beta1Experiment(display_name=name, namespace=_namespace(client))
    try:
        return client.experiments.experiment_service_create_experiment(experiment=body).experiment_id
    except ApiException as exc:
        if exc.status != 409:  # 409: created concurrently; look it up
            raise
        return _get_experiment(client, name)


def _get_experiment(client: kfp.Client, name: str) -> str:
    found = _find_experiments(client, name)
    if not found:
        raise PublishError(f"experiment {name!r}: there is no experiment with that name")
    return _one_experiment(name, found)


def _one_experiment(name: str, found: list) -> str:
    if len(found) > 1:
        raise PublishError(f"experiment {name!r}: {len(found)} experiments have that name "
                           f"({', '.join(e.experiment_id for e in found)}); rename all but one")
    return found[0].experiment_id


def _find_experiments(client: kfp.Client, name: str) -> list:
    """All experiments called exactly ``name``."""
    return _all_named(name, "experiments", lambda token: client.list_experiments(
        filter=_equals("display_name", name), page_size=100, page_token=token, namespace=_namespace(client)))


@contextlib.contextmanager
def _package_with_caching(client: kfp.Client, version: Any, enable_caching: bool | None) -> Iterator[str | None]:
    """Yield None, or for ``enable_caching=False`` the version's stored spec with caching off everywhere.

    Only "off" needs a rewrite: the compiled pipeline already caches every deterministic step and keeps
    caching off for the steps that must never be served from the cache (evaluation and registration read
    the registry), so "on" means exactly the compiled per-step settings. kfp's own ``enable_caching``
    override is not used because it would switch those two steps on as well.
    """
    if enable_caching is not False:
        yield None
        return
    spec = version.pipeline_spec or client.get_pipeline_version(
        version.pipeline_id, version.pipeline_version_id).pipeline_spec
    if not spec:
        raise PublishError(f"the server returned no pipeline spec for version {version.pipeline_version_id}")
    docs = [spec["pipeline_spec"], spec["platform_spec"]] if "pipeline_spec" in spec else [spec]
    pipeline_spec = docs[0]
    dags = [pipeline_spec.get("root", {}).get("dag", {})]
    dags += [c.get("dag", {}) for c in pipeline_spec.get("components", {}).values()]
    for dag in dags:
        for task in dag.get("tasks", {}).values():
            task["cachingOptions"] = {"enableCache": False}
    with tempfile.TemporaryDirectory(prefix="pipectl-") as tmp:
        path = os.path.join(tmp, "pipeline.yaml")
        with open(path, "w") as f:
            yaml.safe_dump_all(docs, f, sort_keys=False)
        yield path


# --- schedules ----------------------------------------------------------------------------------------
def to_kfp_cron(expr: str) -> str:
    """Turn a standard 5-field cron (``min hour dom month dow``) into KFP's 6-field, seconds-first form.

    Checked and converted here because the server also accepts 5 fields but reads them as
    ``sec min hour dom month``: ``0 3 * * *`` would fire at minute 3 of every hour, not daily at 03:00.
    Day of week is 0-6 (Sunday 0) or SUN-SAT, as KFP's cron library has no 7, and there is no time zone
    prefix: times are in the server's time zone (UTC unless configured otherwise).
    """
    try:
        cron = parse_cron(expr, allow_zone=False, sunday_is_7=False)
    except ValueError as exc:
        raise PublishError(str(exc)) from None
    return "0 " + " ".join(cron.fields)


def schedule(client: kfp.Client, *, name: str, pipeline_name: str, cron: str, version: str = LATEST,
             experiment: str = "Default", max_concurrency: int = 1, catchup: bool = True,
             params: dict | None = None, enable_caching: bool | None = None, enabled: bool = True) -> dict:
    """Create or replace the recurring run ``name`` in ``experiment``; there is never more than one.

    ``version="latest"`` makes every triggered run use the pipeline's newest version at that time
    (KFP backend >= 2.5); a version name pins it. KFP cannot update a recurring run, so an
    existing one is replaced: the new one is created FIRST and the old one(s) deleted after, so a
    failure never leaves zero schedules. The worst case (a crash between the two steps) leaves two
    with this name for a moment; the next call deletes every older one, so it heals itself.
    Returns ``recurring_run_id, name, experiment_id, pipeline_id, version, version_id, cron,
    enabled, replaced, url``.
    """
    kfp_cron = to_kfp_cron(cron)  # before any request: a bad cron must not touch the server
    _require(name, "schedule name")
    if not 1 <= max_concurrency <= 10:
        raise PublishError(f"max_concurrency must be between 1 and 10 (KFP's limit), not {max_concurrency}")
    if enable_caching is False and version == LATEST:
        raise PublishError("--no-cache needs a pinned version (--version NAME): KFP can only switch caching off "
                           "by embedding a fixed pipeline spec, which cannot follow the newest version")

    with _calling(f"scheduling {name!r}"):
        pipeline = _get_pipeline(client, pipeline_name)
        chosen = None if version == LATEST else _resolve_version(client, pipeline, version)
        experiment_id = _ensure_experiment(client, experiment)
        old = _find_schedules(client, experiment_id, name)
        common = dict(experiment_id=experiment_id, job_name=name, cron_expression=kfp_cron,
                      max_concurrency=max_concurrency, no_catchup=not catchup, params=params or {},
                      enabled=enabled)
        if chosen is None:
            body = V2beta1RecurringRun(
                display_name=name, experiment_id=experiment_id, max_concurrency=str(max_concurrency),
                mode=RecurringRunMode.ENABLE if enabled else RecurringRunMode.DISABLE, no_catchup=not catchup,
                trigger=V2beta1Trigger(cron_schedule=V2beta1CronSchedule(cron=kfp_cron)),
                pipeline_version_reference=V2beta1PipelineVersionReference(pipeline_id=pipeline.pipeline_id),
                runtime_config=V2beta1RuntimeConfig(parameters=params or {}))
            created = client.recurring_runs.recurring_run_service_create_recurring_run(recurring_run=body)
        else:
            with _package_with_caching(client, chosen, enable_caching) as package:
                if package:
                    created = client.create_recurring_run(pipeline_package_path=package, **common)
                else:
                    created = client.create_recurring_run(pipeline_id=pipeline.pipeline_id,
                                                          version_id=chosen.pipeline_version_id, **common)
        log.info("created schedule %r (%s): %s", name, created.recurring_run_id, kfp_cron)
        for stale in old:
            client.delete_recurring_run(stale.recurring_run_id)
            log.info("deleted the schedule it replaces (%s)", stale.recurring_run_id)
    return {"recurring_run_id": created.recurring_run_id, "name": name, "experiment": experiment,
            "experiment_id": experiment_id, "pipeline_id": pipeline.pipeline_id,
            "version": version, "version_id": chosen.pipeline_version_id if chosen else None,
            "cron": kfp_cron, "enabled": enabled, "replaced": [r.recurring_run_id for r in old],
            "url": f"{_ui(client)}/#/recurringrun/details/{created.recurring_run_id}"}


def disable_schedule(client: kfp.Client, *, name: str, experiment: str = "Default") -> dict:
    """Pause the recurring run ``name`` in ``experiment`` (it stays, and can be re-created/enabled)."""
    return _for_each_schedule(client, name, experiment, ("disabling", "disabled"), client.disable_recurring_run)


def delete_schedule(client: kfp.Client, *, name: str, experiment: str = "Default") -> dict:
    """Delete the recurring run ``name`` in ``experiment``; runs it already started are kept."""
    return _for_each_schedule(client, name, experiment, ("deleting", "deleted"), client.delete_recurring_run)


def _for_each_schedule(client: kfp.Client, name: str, experiment: str, verbs: tuple[str, str], action: Any) -> dict:
    """Applies ``action`` to every recurring run called ``name`` in ``experiment`` (there may be several)."""
    doing, done = verbs
    with _calling(f"{doing} schedule {name!r}"):
        ids = [r.recurring_run_id for r in _existing_schedules(client, name, experiment)]
        for recurring_run_id in ids:
            action(recurring_run_id)
    log.info("%s schedule %r (%s)", done, name, ", ".join(ids))
    return {"name": name, "experiment": experiment, "recurring_run_ids": ids}


def _existing_schedules(client: kfp.Client, name: str, experiment: str) -> list:
    found = _find_schedules(client, _get_experiment(client, experiment), name)
    if not found:
        raise PublishError(f"no schedule named {name!r} in experiment {experiment!r}")
    return found


def _find_schedules(client: kfp.Client, experiment_id: str, name: str) -> list:
    """All recurring runs called exactly ``name`` in the experiment."""
    return _all_named(name, "recurring_runs", lambda token: client.list_recurring_runs(
        experiment_id=experiment_id, filter=_equals("display_name", name), page_size=100, page_token=token))


def _all_named(name: str, items: str, list_page: Any) -> list:
    """The ``items`` called exactly ``name`` over every page of ``list_page(page_token)`` (KFP's filter matches
    names case-insensitively, so the server's answer is narrowed here)."""
    found, token = [], ""
    while True:
        resp = list_page(token)
        found += [item for item in getattr(resp, items) or [] if item.display_name == name]
        token = resp.next_page_token
        if not token:
            return found


# --- helpers ------------------------------------------------------------------------------------------
def _equals(key: str, value: str) -> str:
    """A v2beta1 filter "``key`` equals ``value``", URL-encoded once: the API server URL-unescapes the filter
    after the query string is decoded (kubeflow/pipelines 2.17.0, backend/src/apiserver/server/
    list_request_util.go:143 ``url.QueryUnescape``; pipeline_server.go:555 for pipelines), as the KFP UI expects
    (frontend/src/components/CustomTable.tsx:569 ``encodeURIComponent(JSON.stringify(filter))``). Unencoded, a
    ``+`` in a name turns into a space and a ``%`` makes the request fail."""
    return urllib.parse.quote(json.dumps({"predicates": [{"operation": _FILTER_EQUALS, "key": key,
                                                          "stringValue": value}]}), safe="")


def _namespace(client: kfp.Client) -> str | None:
    return client.get_user_namespace() or None


def _ui(client: kfp.Client) -> str:
    # kfp's own link base: honours ui_host and KF_PIPELINES_UI_ENDPOINT; there is no public accessor.
    return client._get_url_prefix().rstrip("/")


def _require(value: str, what: str) -> None:
    if not value or not value.strip():
        raise PublishError(f"the {what} must not be empty")


_BEARER = re.compile(r"(?i)(bearer\s+)[^\s\"',]+")


def _api_failure(action: str, exc: ApiException) -> PublishError:
    """A PublishError with the HTTP status and the server's own message, and nothing else."""
    message = ""
    try:
        body = json.loads(exc.body)
        message = body.get("message") or body.get("error_message") or ""
    except (TypeError, ValueError, AttributeError):
        message = exc.body.decode(errors="replace")[:300] if isinstance(exc.body, bytes) else str(exc.body or "")[:300]
    message = _BEARER.sub(r"\1***", message)  # in case a proxy echoes credentials back
    hint = {401: " (check the token or IAP client id)", 403: " (the identity lacks permission)"}.get(exc.status, "")
    return PublishError(f"{action} failed: HTTP {exc.status} {exc.reason or ''}".rstrip()
                        + (f": {message}" if message else "") + hint)


@contextlib.contextmanager
def _calling(action: str) -> Iterator[None]:
    """Turn API and transport errors inside the block into PublishError naming ``action``."""
    try:
        yield
    except ApiException as exc:
        raise _api_failure(action, exc) from None
    except TransportError as exc:
        raise PublishError(f"{action} failed: cannot reach the KFP API ({type(exc).__name__})") from None
