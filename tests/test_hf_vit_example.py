"""examples/hf/vit_shapes.py at a tiny size, in this process: the images it
draws carry their label, HNAS trains its u, the saved model is read back with
its scheme and u, and bad settings stop with one line."""

import importlib.util
import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("vit_shapes", os.path.join(ROOT, "examples", "hf", "vit_shapes.py"))
vit_shapes = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vit_shapes)


def test_images_show_their_class():
    """Without noise, the bar's pixels lie on one row, one column or one (anti-)diagonal."""
    g = torch.Generator().manual_seed(0)
    images, labels = vit_shapes.draw(64, 16, g)
    assert set(labels.tolist()) == set(range(4))
    for image, label in zip(images, labels.tolist()):
        bar = (image.min(0).values > 0.45).nonzero()  # every channel of the bar is >= 0.5 above the noise-free 0
        rows, cols = bar[:, 0], bar[:, 1]
        # along its direction one coordinate (or their difference / sum) varies least
        spread = [rows.float().std(), cols.float().std(), (rows - cols).float().std(), (rows + cols).float().std()]
        assert int(torch.stack(spread).argmin()) == label


def test_vit_example_trains_hnas_and_reloads(tmp_path):
    from transformers import ViTForImageClassification

    from fairseq_dnas import hf

    out, saved = tmp_path / "run.json", tmp_path / "model"
    vit_shapes.main(["--scheme", "hnas", "--steps", "3", "--batch-size", "8", "--train-images", "32",
                     "--test-images", "16", "--image-size", "16", "--patch-size", "4", "--hidden", "16",
                     "--heads", "2", "--lr", "0.01", "--threads", "1", "--save-dir", str(saved), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["scheme"] == "hnas" and result["steps"] == 3 and 0 <= result["test_accuracy"] <= 1
    assert len(result["u"]) == 2 and all(len(layer) == 2 for layer in result["u"])
    assert all(abs(u - 0.5) > 1e-4 for layer in result["u"] for u in layer)  # u trains
    loaded = hf.from_pretrained(ViTForImageClassification, str(saved))
    assert loaded.config._attn_implementation == "hnas"
    assert hf.callback.layer_weights(loaded) == result["u"]


@pytest.mark.parametrize("argv,message", [(["--image-size", "30"], "multiple of --patch-size"),
                                          (["--steps", "0"], "--steps must be > 0")])
def test_bad_settings_one_line(argv, message):
    with pytest.raises(SystemExit) as e:
        vit_shapes.parse_args(argv)
    assert message in str(e.value.code) and "\n" not in str(e.value.code)
