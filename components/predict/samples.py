"""Sample inputs for a run that has no images to predict: test images of each class, as PNG files."""

from __future__ import annotations

import io

from components.dataio import data


def export_samples(dataset_dir: str, output_dir: str, per_class: int = 10) -> int:
    """Writes `per_class` test images of each class as PNG files (for a local run with no folder to predict)."""
    from PIL import Image

    manifest = data.read_manifest(dataset_dir)
    class_names = manifest["class_names"]
    taken = {c: 0 for c in range(len(class_names))}
    data.gfile().makedirs(output_dir)
    written = 0
    for image, label in data.iter_split(dataset_dir, "test"):
        if taken[label] >= per_class:
            if all(v >= per_class for v in taken.values()):
                break
            continue
        taken[label] += 1
        buffer = io.BytesIO()
        Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(buffer, format="PNG")
        with data.gfile().GFile(data.join(output_dir, f"{written:04d}.png"), "wb") as f:
            f.write(buffer.getvalue())
        written += 1
    return written
