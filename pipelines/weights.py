"""`pipectl weights`: stage backbones' ImageNet weights in a cache (a folder or gs:// prefix) where internet exists,
for training steps that have none (private GKE clusters often have no route out): train with pretrained=imagenet
and weights_cache=CACHE, and the step reads them from there and records the file and its sha256 in the lineage.

    pipectl weights --model mobilenet-v3-small --model efficientnet-v2-b0 --cache gs://BUCKET/weights
    pipectl weights --model resnet50 --cache /mnt/weights --origin https://mirror.example/resnet50_notop.h5

A file already in the cache is kept as it is (never replaced); the command prints what is there and its digest.
"""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    from components.train.models import BACKBONES

    p = sub.add_parser("weights", help="stage backbones' ImageNet weights in a cache for clusters without internet",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True, choices=sorted(BACKBONES),
                   help="a backbone (repeat for several)")
    p.add_argument("--cache", required=True, help="folder or gs:// prefix (the pipeline's weights_cache)")
    p.add_argument("--origin", help="where to download one backbone's Keras notop weights file from instead of "
                   "Keras' own address (a mirror's URL, a path or gs:// URI)")
    p.set_defaults(func=cmd_weights)


def cmd_weights(args: argparse.Namespace) -> int:
    from components.train import pretrained

    if args.origin and len(args.model) > 1:
        raise ValueError("--origin names one backbone's file: give one --model with it")
    for model in args.model:
        try:
            staged = pretrained.stage_imagenet(model, args.cache, origin=args.origin)
        except pretrained.models.ModelError as e:
            raise ValueError(str(e)) from e
        print(json.dumps(staged))
    return 0
