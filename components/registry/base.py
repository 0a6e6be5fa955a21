"""What every model registry is: versions of a named model, found by content digest, with a movable champion.

The digest and the lineage a version records are computed in identity.py."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from components.registry.identity import model_digest, model_lineage  # noqa: F401 (re-exported)

CHAMPION = "champion"


@dataclasses.dataclass
class ModelVersion:
    """One version of a registered model, as any registry reports it."""

    registry: str
    model: str
    version: str
    aliases: list[str]
    uri: str
    digest: str
    metrics: dict = dataclasses.field(default_factory=dict)
    labels: dict = dataclasses.field(default_factory=dict)
    created: str = ""
    resource_name: str = ""
    # The network and the pretrained weights it started from (identity.model_lineage); {} when unknown.
    lineage: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class ChampionChanged(Exception):
    """`move_champion` refused: the champion is not the version the caller's gate compared against.

    `current` is the champion the registry holds now (None: there is none)."""

    def __init__(self, model: str, expected: str | None, current: ModelVersion | None):
        self.model, self.expected, self.current = model, expected, current
        super().__init__(f"the {CHAMPION} of {model} is {describe_champion(current)}, not "
                         f"{'v' + expected if expected else 'none'} as expected")


def describe_champion(version: ModelVersion | None) -> str:
    return f"v{version.version}" if version is not None else "none"


class Registry(Protocol):
    """What the register and evaluate steps need from a model registry."""

    kind: str

    def find_by_digest(self, model: str, digest: str) -> ModelVersion | None: ...

    def champion(self, model: str) -> ModelVersion | None: ...

    def upload(self, model: str, model_dir: str, *, digest: str, metrics: dict, labels: dict,
               description: str, artifact_uri: str | None = None, lineage: dict | None = None) -> ModelVersion: ...

    def set_alias(self, model: str, version: str, alias: str) -> ModelVersion: ...

    def move_champion(self, model: str, version: str, *, expected: str | None) -> ModelVersion:
        """Moves `champion` to `version` only if the champion is still `expected` (a version; None: no
        champion), else raises ChampionChanged with the current one. A version that is already the champion
        is returned as it is."""
        ...

    def versions(self, model: str) -> list[ModelVersion]: ...
