"""The GPU check (`make bench-gpu`, tests/benchmarks/gpu.py) exercised here on the CPU: its dry run end to end with
tiny sizes (bundle made by the preprocess step, records repeated without TensorFlow, the training step in a child
process per phase, the figures it prints), the FLOPs count it divides by, and the card peaks."""

import json

from tests.benchmarks import gpu
from tests.conftest import require_framework


def test_peak_is_the_datasheet_bf16_dense_figure():
    assert gpu.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu.peak_tflops("NVIDIA H200") == 989.0
    assert gpu.peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert gpu.peak_tflops("Tesla T4") is None
    assert gpu.peak_tflops(None) is None


def test_resnet50_forward_flops_match_its_published_count():
    """ResNet-50 at 224x224: 3.8 x 10^9 multiply-adds per image (He et al., 2015, table 1, which calls them FLOPs),
    for the original network that Keras builds (the stride on the first 1x1 of a block; torchvision's v1.5, strided
    on the 3x3, is 4.1); a multiply-add is 2 FLOPs here, and this model has a 10-class head."""
    from components.train import models
    from tests.benchmarks.frameworks import model_flops

    model = models.build("resnet50", [224, 224, 3], 10, "float32")
    assert 2 * 3.8e9 < model_flops(model) < 2 * 3.95e9


def test_repeated_records_are_read_back_as_copies(tmp_path):
    from components.dataio import data
    from components.preprocess import preprocess

    dataset = tmp_path / "fashion"
    preprocess("/usr/share/datasets/fashion-mnist", str(dataset), limit=40)
    images, labels = data.load_split_arrays(str(dataset), "train")
    gpu.repeat_training_records(str(dataset), 3)
    manifest = data.read_manifest(str(dataset))
    repeated_images, repeated_labels = data.load_split_arrays(str(dataset), "train")
    assert manifest["splits"]["train"]["count"] == 3 * len(labels) == len(repeated_labels)
    assert sum(manifest["splits"]["train"]["class_counts"].values()) == 3 * len(labels)
    assert sorted(repeated_labels.tolist()) == sorted(3 * labels.tolist())
    assert {image.tobytes() for image in repeated_images} == {image.tobytes() for image in images}


def test_dry_run_trains_every_phase_and_reports_its_figures(food_photos, tmp_path, capsys):
    require_framework("torch")
    out = tmp_path / "bench-gpu.json"
    # Budgets far beyond the phases' length: what is checked is that each phase trains and reports, not how fast
    # (a shared or loaded machine would otherwise stop a phase at its budget).
    gpu.main(["dry-run", "--workdir", str(tmp_path), "--photos", food_photos, "--frameworks", "torch", "--models",
              "reference-cnn,mobilenet-v3-small", "--budget-scale", "30", "--total-budget", "36000",
              "--json", str(out)])
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert [r["phase"] for r in report["results"]] == ["reference-cnn on torch", "mobilenet-v3-small on torch"]
    for result in report["results"]:
        assert "error" not in result, result.get("error")
        assert result["epochs_done"] == result["epochs_planned"] == 2
        assert result["images_per_second"] > 0 and result["flops_per_image"] > 0
        assert 0 <= result["input_wait_share"] <= 1
        assert result["gpu_utilization"] is None and "mfu" not in result  # no GPU here
    assert report["results"][1]["precision"] == "float32"  # the dry run's; the GPU run's is mixed_bfloat16
    assert "images/s" in printed and "no GPU found" in printed
