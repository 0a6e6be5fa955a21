"""Bring-your-own PyTorch models for the tests (`--model tests.byo_torch:build --framework torch`): builders that
return a torch.nn.Module taking float32 N x C x H x W pixels (0-255) and returning N x classes logits, and ones
that get it wrong."""

import torch
from torch import nn


class SmallNet(nn.Module):
    """Two convolutions, BatchNorm (buffers: running statistics), dropout (torch's random generator), a linear
    head; the pixel scaling is inside, as the contract gives it raw pixels."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(32 * 4, num_classes)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.features(pixels / 255.0)))


def build(image_shape, num_classes):
    height, width, channels = image_shape
    return SmallNet(channels, num_classes)


class Unscriptable(nn.Module):
    """Not scriptable (TorchScript has no try statement): its TorchScript is traced."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(channels, num_classes)

    def forward(self, pixels):
        try:
            mean = pixels.mean(dim=(2, 3)) / 255.0
        except RuntimeError:
            raise
        return self.linear(mean)


def build_traced(image_shape, num_classes):
    return Unscriptable(image_shape[2], num_classes)


def build_wrong_output(image_shape, num_classes):
    return SmallNet(image_shape[2], num_classes + 1)


def build_channels_last(image_shape, num_classes):
    """Expects N x H x W x C, as a Keras model would: the first convolution refuses the N x C x H x W batch."""
    return nn.Sequential(nn.Conv2d(image_shape[0], 8, 3), nn.Flatten(), nn.LazyLinear(num_classes))


def build_not_a_model(image_shape, num_classes):
    return {"layers": [16, 32]}
