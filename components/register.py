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
- `champion` points at the blessed version that evaluation compares against, and moves, never copies;
- with `gate` (what evaluation compared against), `champion` moves only if it is still that version: the check
  and the move are one step under the local registry's lock, and on Vertex the alias is read right before it
  is moved. If another run moved it in between (two runs at once: a schedule's and a commit's), the gate is
  applied again against the new champion (`Gate.rejudge`); a model it does not prefer is registered without the
  alias, and `Registration.promotion` says which happened.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from typing import Callable

from components import stepcli
from components.params import FRAMEWORK_NAMES
from components.registry import (CHAMPION, ChampionChanged, LocalRegistry, ModelVersion, Registry, model_digest,
                                 model_lineage)

log = logging.getLogger(__name__)

# How many times registration follows a champion that keeps changing before it registers without the alias.
MOVE_ATTEMPTS = 5


@dataclasses.dataclass
class Gate:
    """What evaluation compared the model against, for registration.

    compared_with: the champion's version at evaluation, or None when there was none.
    rejudge: the gate again against another champion (None: there is none now) -> (blessed, decision line);
        blessed None when it cannot be compared (components/evaluate.py's `rejudge`). Without it, a changed
        champion means registering without the alias.
    """

    compared_with: str | None
    rejudge: Callable[[ModelVersion | None], tuple[bool | None, str]] | None = None


@dataclasses.dataclass
class Registration:
    version: ModelVersion
    new_version: bool  # False when the same digest was already registered (a retried task)
    promotion: str = ""  # what happened to the champion alias, one line
    champion_changed: bool = False  # the champion was no longer the one the gate compared against
    champion: str | None = None  # the champion's version after this registration, as far as it saw (None: none)

    def to_json(self) -> dict:
        return {**self.version.to_json(), "new_version": self.new_version, "promotion": self.promotion,
                "champion_changed": self.champion_changed, "champion": self.champion}


def register(model_dir: str, registry: Registry, *, model_name: str, metrics: dict | None = None,
             labels: dict | None = None, promote: bool = True, artifact_uri: str | None = None,
             gate: Gate | None = None) -> Registration:
    """Registers `model_dir` as a new version of `model_name` (or finds the version that already holds it).

    `model_dir` is read locally (for the digest); `artifact_uri` says where a remote registry finds the same
    files (the artifact's gs:// URI on a cluster). With `promote`, the `champion` alias moves to this version:
    with `gate`, only if the champion is still the one the gate compared against (see the module docstring);
    without, unconditionally (a person promoting a model by hand).
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
    if not promote:
        return Registration(version, new_version, f"v{version.version} registered without the {CHAMPION} alias "
                                                  "(not promoted)")
    if gate is None:
        if CHAMPION in version.aliases:
            return Registration(version, new_version, f"v{version.version} is already the {CHAMPION}",
                                champion=version.version)
        version = registry.set_alias(model_name, version.version, CHAMPION)
        return Registration(version, new_version, f"{CHAMPION} moved to v{version.version}",
                            champion=version.version)
    version, promotion, changed, champion = promote_checked(registry, model_name, version, gate)
    (log.warning if changed else log.info)("register: %s", promotion)
    return Registration(version, new_version, promotion, changed, champion)


def _named(version: str | None) -> str:
    return f"v{version}" if version else "none"


def promote_checked(registry: Registry, model_name: str, version: ModelVersion, gate: Gate,
                    attempts: int = MOVE_ATTEMPTS) -> tuple[ModelVersion, str, bool, str | None]:
    """Moves the champion to `version` if it is still `gate.compared_with`; if another run moved it, applies the
    gate again against the new one. Returns the version as registered, what happened, whether the champion had
    changed, and the champion's version now (None: none)."""
    expected, notes = gate.compared_with, []
    for _ in range(attempts):
        try:
            moved = registry.move_champion(model_name, version.version, expected=expected)
        except ChampionChanged as changed:
            current = changed.current.version if changed.current else None
            notes.append(f"the {CHAMPION} became {_named(current)} after evaluation (which "
                         f"{'compared with v' + expected if expected else 'found none'})"
                         if not notes else f"then it became {_named(current)}")
            verdict, line = gate.rejudge(changed.current) if gate.rejudge else (None, "")
            if line:
                notes.append(line if verdict is None else f"with no champion: {line}" if current is None
                             else f"against v{current} on the same test set: {line}")
            if not verdict:
                notes.append(f"registered v{version.version} without the {CHAMPION} alias"
                             + (f" (the gate never compared it with {_named(current)})" if verdict is None else ""))
                return version, "; ".join(notes), True, current
            expected = current
            continue
        if not notes:
            if CHAMPION in version.aliases:
                return moved, f"v{version.version} is already the {CHAMPION}", False, moved.version
            still = (f"v{expected}, the one the gate compared with, was still the {CHAMPION}" if expected
                     else "no champion, as at evaluation")
            return moved, f"{CHAMPION} moved to v{version.version} ({still})", False, moved.version
        notes.append(f"{CHAMPION} moved to v{version.version}")
        return moved, "; ".join(notes), True, moved.version
    notes.append(f"the {CHAMPION} kept changing: registered v{version.version} without the {CHAMPION} alias")
    return version, "; ".join(notes), True, expected


def describe_lineage(lineage: dict) -> str:
    """One line for people: `network mobilenet-v3-small, pretrained imagenet (sha256 0123abcd...)`."""
    pretrained = lineage.get("pretrained") or {}
    text = f"network {lineage.get('name')}, pretrained {pretrained.get('source') or 'none'}"
    if pretrained.get("sha256"):
        text += f" (sha256 {str(pretrained['sha256']).split(':')[-1][:12]}...)"
    if lineage.get("framework"):
        text += f", trained on {FRAMEWORK_NAMES.get(lineage['framework'], lineage['framework'])}"
    if lineage.get("serving_format"):
        text += f", serving format {lineage['serving_format']}"
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
    parser.add_argument("--evaluation", help="the evaluate step's evaluation.json: move the champion only if it is "
                                             "still the one evaluation compared against (else apply the gate again)")
    args = parser.parse_args(argv)

    def step() -> Registration:
        metrics, gate = json.loads(args.metrics), None
        if args.evaluation:
            with open(args.evaluation) as f:
                evaluation = json.load(f)
            metrics = {**evaluation_metrics(evaluation), **metrics}
            gate = gate_from_evaluation(evaluation)
        return register(args.model_dir, LocalRegistry(args.registry_root), model_name=args.model_name,
                        metrics=metrics, promote=not args.no_promote, gate=gate)

    return stepcli.run(step)


def evaluation_metrics(evaluation: dict) -> dict:
    """What a version records from its evaluation: the test metrics, and the test set they were measured on."""
    return {**evaluation["metrics"], **({"test_set": evaluation["test_set"]} if evaluation.get("test_set") else {})}


def gate_from_evaluation(evaluation: dict) -> Gate:
    """The Gate of an evaluation's JSON (components/evaluate.py), rejudging with evaluate.rejudge."""
    from components.evaluate import rejudge

    return Gate(evaluation.get("compared_with"),
                lambda champion: rejudge(evaluation, champion.version if champion else None,
                                         champion.metrics if champion else None))


if __name__ == "__main__":
    raise SystemExit(main())
