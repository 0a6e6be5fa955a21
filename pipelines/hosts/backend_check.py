"""Is a KFP host's backend new enough for the compiled pipeline? Its API server says which release it runs.

`GET /apis/v2beta1/healthz` answers `{"commit_sha", "tag_name", "multi_user", "pipeline_store"}` (kubeflow/pipelines
2.17.0, backend/src/apiserver/main.go:465-491; the same keys since 2.0, main.go:231-234 at 2.4.1), `tag_name`
being the TAG_NAME the release images are built with (backend/Dockerfile:65-66), "unknown" when a build did not
set it. kfp.Client's generated model keeps only `multi_user` and `pipeline_store`, so the raw answer is read.
The features and their first releases are pipelines/backend/kfp_driver.py's FEATURES.
"""

from __future__ import annotations

import json
import logging

from pipelines.backend import kfp_driver

log = logging.getLogger(__name__)


class BackendTooOld(ValueError):
    """The host's KFP backend lacks a feature the pipeline needs; the message says which and what to do."""


def backend_release(client) -> str | None:
    """The release the host's KFP API server reports, or None when it does not say (an unset TAG_NAME)."""
    response = client.healthzs.healthz_service_get_healthz(_preload_content=False)
    try:
        tag = str(json.loads(response.data or b"{}").get("tag_name") or "")
        kfp_driver.release_tuple(tag)
    except ValueError:  # not JSON, or "unknown"/a development tag
        return None
    return tag


def package_features(package_path: str) -> list[kfp_driver.Feature]:
    spec, executors = kfp_driver.read_package(package_path)
    return kfp_driver.required_release(spec, executors)


def check_backend(client, features: list[kfp_driver.Feature], *, host: str, allow_older: bool = False) -> str | None:
    """Refuses (BackendTooOld) when the host reports a release older than a feature needs, or with `allow_older`
    only warns; warns when the host does not report its release. Returns the reported release."""
    if not features:
        return None
    release = backend_release(client)
    needed = max(features, key=lambda f: kfp_driver.release_tuple(f.first_release)).first_release
    if release is None:
        log.warning("KFP at %s does not report its release; this pipeline needs KFP %s or newer (%s)", host, needed,
                    "; ".join(f.description for f in features))
        return None
    missing = [f for f in features if not kfp_driver.has(release, f.name)]
    if missing:
        message = (f"KFP at {host} runs backend {release}, but this pipeline needs {needed} or newer for: "
                   + "; ".join(f"{f.description} (since {f.first_release})" for f in missing)
                   + ". Upgrade the KFP backend (docs/kfp-compatibility.md says what runs where)")
        if any(f.name == "recurring_latest" for f in missing):
            message += ", or schedule a pinned version (--version NAME)"
        else:
            message += f"; `pipectl compile --explain --backend-release {release}` shows what that release would run"
        if not allow_older:
            raise BackendTooOld(message + "; --allow-older-backend goes ahead anyway")
        log.warning("%s", message)
    return release


def schedule_features(version: str) -> list[kfp_driver.Feature]:
    """A schedule on "latest" needs recurring runs that pick the newest version at each trigger."""
    return [kfp_driver.FEATURES["recurring_latest"]] if version == "latest" else []
