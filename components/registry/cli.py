"""`python -m components.registry`: what a registry holds for a model (its versions and its champion), as JSON."""

from __future__ import annotations

import argparse

from components import stepcli
from components.registry import CHAMPION, REGISTRIES, open_registry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Show the versions and the champion of a registered model.")
    parser.add_argument("--registry", choices=REGISTRIES, default="local")
    parser.add_argument("--registry-root", default="", help="registry=local: the registry directory")
    parser.add_argument("--project", default="", help="registry=vertex: the Google Cloud project")
    parser.add_argument("--location", default="", help="registry=vertex: the region, e.g. us-central1")
    parser.add_argument("--model-name", default="image-classifier")
    args = parser.parse_args(argv)

    def show() -> dict:
        registry = open_registry(args.registry, root=args.registry_root, project=args.project,
                                 location=args.location)
        versions = registry.versions(args.model_name)
        champion = next((v.version for v in versions if CHAMPION in v.aliases), None)
        return {"registry": registry.kind, "model": args.model_name, "champion": champion,
                "versions": [v.to_json() for v in versions]}

    return stepcli.run(show)
