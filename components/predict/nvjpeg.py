"""JPEG decoding on the GPU for batch prediction: nvJPEG, through `torchvision.io.decode_jpeg(device="cuda")`, where
the process has torch and torchvision with a CUDA device (the GPU pool's images carry PyTorch). Elsewhere
`gpu_jpeg_decoder` returns None and the CPU decoders (`decode.Decoder`) do all the work, as before.

Unmeasured: no GPU was lent while this was built; `make bench BENCH=accelerator` on a GPU machine is where to measure
it. What it gives is the readers' rule (`data.decode_to_shape`) approximately, not exactly: nvJPEG decodes every pixel
(libjpeg's DCT scaling has no GPU equivalent), so the rule's scaling by 1/2, 1/4 or 1/8 is an average over the same
blocks of pixels (the scaled inverse DCT averages them, up to rounding), then the rule's bilinear resize, antialiased
where it antialiases. Pixels may differ from the CPU rule's by a few levels; a model that must see exactly the pixels
evaluation saw predicts with `gpu_decode=False`.
"""

from __future__ import annotations

import logging

import numpy as np

from components.dataio import data

log = logging.getLogger(__name__)


def gpu_jpeg_decoder(image_shape: list[int] | tuple[int, ...], device: str = "cuda") -> GpuJpegDecoder | None:
    """A decoder of JPEG batches on `device` when torchvision can decode JPEGs there, else None (why: at debug)."""
    try:
        import torch
        import torchvision.io  # noqa: F401
    except ImportError as e:
        log.debug("predict: no GPU JPEG decoding (%s)", e)
        return None
    if device.startswith("cuda") and not torch.cuda.is_available():
        log.debug("predict: no GPU JPEG decoding (torch sees no CUDA device)")
        return None
    return GpuJpegDecoder(image_shape, device)


def rule_ratio(height: int, width: int, target_height: int, target_width: int) -> int:
    """The DCT scale divisor the readers' rule decodes a height x width JPEG at (data.DCT_RATIOS): the largest that
    keeps both sides at least the target's (libjpeg's scaled size is ceil(side / ratio))."""
    ratio = 1
    for candidate in data.DCT_RATIOS[1:]:
        if -(-height // candidate) >= target_height and -(-width // candidate) >= target_width:
            ratio = candidate
    return ratio


class GpuJpegDecoder:
    """JPEG file bytes -> uint8 N x H x W x C at the model's size, decoded and resized on `device`."""

    def __init__(self, image_shape: list[int] | tuple[int, ...], device: str = "cuda"):
        import torch
        import torchvision

        self.height, self.width, self.channels = (int(n) for n in image_shape)
        self.device = torch.device(device)
        self.description = f"nvJPEG (torchvision {torchvision.__version__}) on {self.device}" \
            if self.device.type == "cuda" else f"torchvision {torchvision.__version__} on {self.device}"

    def __call__(self, contents: list[bytes], shapes: list[tuple[int, int, int]]) -> np.ndarray:
        """`shapes`: each file's (height, width, components) from its header (decode.jpeg_shape). Raises
        RuntimeError for a file the decoder rejects (the caller decodes that batch on the CPU instead)."""
        import torch
        import torch.nn.functional as F
        from torchvision.io import ImageReadMode, decode_jpeg

        mode = ImageReadMode.GRAY if self.channels == 1 else ImageReadMode.RGB
        encoded = [torch.frombuffer(bytearray(c), dtype=torch.uint8) for c in contents]
        decoded = decode_jpeg(encoded, mode=mode, device=self.device)
        out = torch.empty((len(contents), self.channels, self.height, self.width), dtype=torch.uint8,
                          device=self.device)
        for index, (image, (height, width, _)) in enumerate(zip(decoded, shapes)):
            pixels = image.unsqueeze(0).float()
            ratio = rule_ratio(height, width, self.height, self.width)
            if ratio > 1:  # the rule's DCT scaling: ceil(side / ratio) blocks, each the mean of its pixels
                pixels = F.avg_pool2d(pixels, ratio, ceil_mode=True)
            size = pixels.shape[-2:]
            if tuple(size) != (self.height, self.width):
                far = size[0] >= data.ANTIALIAS_FROM * self.height or size[1] >= data.ANTIALIAS_FROM * self.width
                pixels = F.interpolate(pixels, size=(self.height, self.width), mode="bilinear", align_corners=False,
                                       antialias=bool(far))
            out[index] = pixels.round().clamp(0, 255).to(torch.uint8)[0]
        return out.permute(0, 2, 3, 1).cpu().numpy()
