"""Which image runs training, evaluation and batch prediction, for a run's framework.

The compiled pipeline pins every image (pipelines/config.py); the framework is a run-time parameter, so a small step
picks the three images of the run from the pinned ones, and the KFP driver starts those steps' pods on them (an image
from another step's output: kubeflow/pipelines backend/src/v2/driver/driver.go:449 at 2.17.0,
resolvePodSpecInputRuntimeParameter in resolve.go:818). TensorFlow and JAX keep the CPU image for evaluation and
the TensorFlow GPU image for training and batch prediction, as before; PyTorch runs all three in the PyTorch image,
which has no TensorFlow: its training writes what only torch (TorchScript) or Keras on torch loads, and evaluation
and batch prediction read the test split and the images there with the TensorFlow-free readers.
"""

from __future__ import annotations

import dataclasses

from components.params import FRAMEWORKS


@dataclasses.dataclass(frozen=True)
class StepImages:
    train: str
    evaluate: str
    predict: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def step_images(framework: str, images: dict[str, str]) -> StepImages:
    """The images of a run on `framework`, from the pipeline's pinned `images` ({"cpu", "gpu", "torch"}); ValueError
    (in one line) for an unknown framework, or torch in a pipeline compiled without the PyTorch image."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    if framework == "torch":
        torch_image = images.get("torch", "")
        if not torch_image:
            raise ValueError("framework torch trains, evaluates and predicts in the PyTorch image, and this pipeline "
                             "was compiled without one: compile it with --torch-image REPO/torch@sha256:... (or "
                             "--image-repo/--image-tag, which name REPO/torch:TAG)")
        return StepImages(train=torch_image, evaluate=torch_image, predict=torch_image)
    return StepImages(train=images["gpu"], evaluate=images["cpu"], predict=images["gpu"])


def main(argv: list[str] | None = None) -> int:
    import argparse

    from components import stepcli

    parser = argparse.ArgumentParser(description="The images of training, evaluation and batch prediction for a "
                                                 "framework, from the pipeline's pinned images.")
    parser.add_argument("--framework", required=True, choices=FRAMEWORKS)
    parser.add_argument("--cpu-image", required=True)
    parser.add_argument("--gpu-image", required=True)
    parser.add_argument("--torch-image", default="", help="the PyTorch image (empty: runs on torch are refused)")
    args = parser.parse_args(argv)
    return stepcli.run(lambda: step_images(args.framework, {"cpu": args.cpu_image, "gpu": args.gpu_image,
                                                            "torch": args.torch_image}), prog="step_images")


if __name__ == "__main__":
    raise SystemExit(main())
