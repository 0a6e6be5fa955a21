"""Which image runs training, evaluation and batch prediction, for a run's framework.

The compiled pipeline pins every image (pipelines/config.py); on a KFP backend the framework is a run-time parameter,
so a small step picks the three images of the run from the pinned ones, and the KFP driver starts those steps' pods
on them (an image from another step's output: kubeflow/pipelines backend/src/v2/driver/driver.go:449 at 2.17.0,
resolvePodSpecInputRuntimeParameter in resolve.go:818). Vertex AI Pipelines runs the images fixed at compile time,
so there the pipeline calls the same rule when it is compiled, for the framework chosen then. TensorFlow keeps the CPU image for evaluation and the
TensorFlow GPU image for training and batch prediction, as before. PyTorch and JAX run all three in the
TensorFlow-free image (images/Dockerfile's torch target, named REPO/torch: torch and JAX, both for CUDA 13, and
Keras; no TensorFlow):
their training writes what only torch (TorchScript) or Keras on its own backend loads, and evaluation and batch
prediction read the test split and the images there with the TensorFlow-free readers, model.keras on Keras' backend
of that image.
"""

from __future__ import annotations

import dataclasses

from components.params import FRAMEWORKS

# The frameworks whose three steps run in the TensorFlow-free image (images/Dockerfile's torch target), which
# carries both.
TENSORFLOW_FREE = ("torch", "jax")


@dataclasses.dataclass(frozen=True)
class StepImages:
    train: str
    evaluate: str
    predict: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def step_images(framework: str, images: dict[str, str]) -> StepImages:
    """The images of a run on `framework`, from the pipeline's pinned `images` ({"cpu", "gpu", "torch"}); ValueError
    (in one line) for an unknown framework, or torch or jax in a pipeline compiled without the TensorFlow-free
    (PyTorch and JAX) image."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    if framework in TENSORFLOW_FREE:
        torch_image = images.get("torch", "")
        if not torch_image:
            raise ValueError(f"framework {framework} trains, evaluates and predicts in the PyTorch image (torch and "
                             "JAX, no TensorFlow), and this pipeline was compiled without one: compile it with "
                             "--torch-image REPO/torch@sha256:... (or --image-repo/--image-tag, which name "
                             "REPO/torch:TAG)")
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
    parser.add_argument("--torch-image", default="", help="the TensorFlow-free image, torch and JAX (empty: runs on torch "
                                                         "or jax are refused)")
    args = parser.parse_args(argv)
    return stepcli.run(lambda: step_images(args.framework, {"cpu": args.cpu_image, "gpu": args.gpu_image,
                                                            "torch": args.torch_image}), prog="step_images")


if __name__ == "__main__":
    raise SystemExit(main())
