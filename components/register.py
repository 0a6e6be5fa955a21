"""Register a trained model in a model registry with versions and a `champion` alias.

The step talks to a registry through the narrow `Registry` interface of components/registry/ (the local
directory registry and the Vertex AI Model Registry behave the same), so a local run behaves like a Vertex run:

- every registration of a new model digest is a new version of one model; the digest covers the architecture,
  the weights and the class names, not timestamps or timings (components/registry/identity.py), so a retrain
  that produced bit-identical weights is the same version;
- registering the same digest again returns the existing version (a retried task creates nothing);
- each new version records its lineage: the network (`reference-cnn`, a Keras Applications backbone, or the
  `module:function` of a bring-your-own builder) and the pretrained weights it started from (source and sha256),
  from training.json's `model` key;
- `champion` points at the blessed version that evaluation compares against, and moves, never copies.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from components import stepcli
from components.registry import CHAMPION, LocalRegistry, ModelVersion, Registry, model_digest, model_lineage


@dataclasses.dataclass
class Registration:
    version: ModelVersion
    new_version: bool  # False when the same digest was already registered (a retried task)

    def to_json(self) -> dict:
        return {**self.version.to_json(), "new_version": self.new_version}


def register(model_dir: str, registry: Registry, *, model_name: str, metrics: dict | None = None,
             labels: dict | None = None, promote: bool = True, artifact_uri: str | None = None) -> Registration:
    """Registers `model_dir` as a new version of `model_name` (or finds the version that already holds it).

    `model_dir` is read locally (for the digest); `artifact_uri` says where a remote registry finds the same
    files (the artifact's gs:// URI on a cluster). With `promote`, the `champion` alias moves to this version.
    """
    digest = model_digest(model_dir)
    lineage = model_lineage(model_dir)
    metrics = dict(metrics or {})
    existing = registry.find_by_digest(model_name, digest)
    if existing is not None:
        version, new_version = existing, False
    else:
        description = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items()))
        if lineage:
            description += ("; " if description else "") + describe_lineage(lineage)
        version = registry.upload(model_name, model_dir, digest=digest, metrics=metrics, labels=dict(labels or {}),
                                  description=description, artifact_uri=artifact_uri, lineage=lineage)
        new_version = True
    if promote and CHAMPION not in version.aliases:
        version = registry.set_alias(model_name, version.version, CHAMPION)
    return Registration(version=version, new_version=new_version)


def describe_lineage(lineage: dict) -> str:
    """One line for people: `network mobilenet-v3-small, pretrained imagenet (sha256 0123abcd...)`."""
    pretrained = lineage.get("pretrained") or {}
    text = f"network {lineage.get('name')}, pretrained {pretrained.get('source') or 'none'}"
    if pretrained.get("sha256"):
        text += f" (sha256 {str(pretrained['sha256']).split(':')[-1][:12]}...)"
    if lineage.get("framework"):
        text += f", trained on {lineage['framework']}"
    source_model = pretrained.get("source_model") or {}
    if pretrained.get("loaded", "").startswith("backbone") and source_model.get("num_classes"):
        text += (f", its backbone only (trained as {source_model.get('name') or 'a classifier'} on "
                 f"{source_model['num_classes']} classes; a new head)")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="the exported model directory to register")
    parser.add_argument("--registry-root", required=True, help="local registry directory")
    parser.add_argument("--model-name", default="image-classifier")
    parser.add_argument("--metrics", default="{}", help="JSON object of evaluation metrics to record")
    parser.add_argument("--no-promote", action="store_true", help="do not move the champion alias")
    args = parser.parse_args(argv)
    return stepcli.run(lambda: register(args.model_dir, LocalRegistry(args.registry_root), model_name=args.model_name,
                                        metrics=json.loads(args.metrics), promote=not args.no_promote))


if __name__ == "__main__":
    raise SystemExit(main())
