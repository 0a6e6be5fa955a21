"""Model registries: versions of a named model, found by content digest, with a `champion` alias.

- base.py: what every registry is (`Registry`, `ModelVersion`, `CHAMPION`, `ChampionChanged`).
- identity.py: `model_digest` (architecture + weights + class names, not timestamps) and `model_lineage`
  (the network and its pretrained weights, from training.json).
- local.py: `LocalRegistry`, a directory (local runs and tests).
- vertex.py: `VertexRegistry`, the Vertex AI Model Registry, with the same behaviour.
- `open_registry`: the registry a pipeline's parameters name.
- cli.py: `python -m components.registry` shows what a registry holds for a model.

The register step (components/register.py) writes to a registry; the evaluate step reads its champion. Nothing
here imports a step.
"""

from __future__ import annotations

from components.registry.base import (CHAMPION, ChampionChanged, ModelVersion, Registry, describe_champion,
                                      model_digest, model_lineage)
from components.registry.local import LocalRegistry

REGISTRIES = ("local", "vertex")


def open_registry(kind: str, *, root: str = "", project: str = "", location: str = "",
                  serving_image: str = "") -> Registry:
    """The registry named by pipeline parameters: `local` (a directory) or `vertex` (Vertex AI Model Registry,
    whose versions are served by `serving_image`; empty: its default, see components/registry/vertex.py)."""
    if kind == "local":
        if not root:
            raise ValueError("registry=local needs a registry root directory (registry_root)")
        return LocalRegistry(root)
    if kind == "vertex":
        if not project or not location:
            raise ValueError("registry=vertex needs a project and a location (region)")
        from components.registry.vertex import VertexRegistry

        return VertexRegistry(project=project, location=location, serving_image=serving_image or None)
    raise ValueError(f"Unknown registry {kind!r}; known: {', '.join(REGISTRIES)}")


def main(argv: list[str] | None = None) -> int:
    """`python -m components.registry` (cli.py), imported when called: cli.py imports this package."""
    from components.registry.cli import main as cli_main

    return cli_main(argv)


__all__ = ["CHAMPION", "ChampionChanged", "LocalRegistry", "ModelVersion", "REGISTRIES", "Registry",
           "describe_champion", "main", "model_digest", "model_lineage", "open_registry"]
