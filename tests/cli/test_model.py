"""The example models and training step (audiobuffer/cli/_model.py), shared by the demo and the
scripts."""

import importlib.util

import pytest
import torch
from helpers import REPO

from audiobuffer.cli import _model, _training, demo
from audiobuffer.cli._model import ImageCNN, SpeechCNN, evaluate, make_optimizer, train_step


def _batches(n=4, classes=3):
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(n) % classes
    # Each class a tone of its own frequency: a few steps are enough to learn it.
    t = torch.arange(4000) / 8000
    audio = torch.stack([torch.sin(2 * torch.pi * (300 + 700 * int(k)) * t) for k in labels])
    audio = audio + 0.01 * torch.randn(audio.shape, generator=generator)
    return [{"audio": audio, "label": labels}]


def _script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_demo_and_the_training_scripts_share_one_model_step_and_loop():
    assert _script("train_audio").SpeechCNN is _model.SpeechCNN
    assert _script("train_image").ImageCNN is _model.ImageCNN
    for name in ("evaluate", "make_optimizer", "train_step"):  # the scripts' loop, and the demo's
        assert getattr(_training, name) is getattr(_model, name), name
    for name in ("SpeechCNN", "evaluate", "make_optimizer", "train_step"):
        assert getattr(demo, name) is getattr(_model, name), name


def test_image_model_takes_uint8_images_and_keeps_no_normalisation_state():
    model = ImageCNN(5, channels=4)
    assert model(torch.zeros(2, 3, 40, 48, dtype=torch.uint8)).shape == (2, 5)
    assert not any(key.startswith("normalize") for key in model.state_dict())


@pytest.mark.slow
def test_train_step_lowers_the_loss_and_evaluate_counts_right():
    torch.manual_seed(0)
    model = SpeechCNN(3, 8000, n_fft=256, hop_length=80, n_mels=20, channels=4)
    optimizer, schedule = make_optimizer(model, lr=1e-2, weight_decay=0.0, epochs=1, steps_per_epoch=30)
    batch = _batches()[0]
    model.train()
    first = train_step(model, batch, optimizer, schedule)
    for _ in range(25):
        last = train_step(model, batch, optimizer, schedule)
    assert isinstance(first, float) and last < first
    assert evaluate(model, _batches(), torch.device("cpu")) >= 0.75  # 4 examples, 3 classes: chance is 1/3
    assert not model.training  # evaluate leaves the model in eval mode


def test_evaluate_reduces_the_counts_before_dividing():
    model = SpeechCNN(3, 8000, n_fft=256, hop_length=80, n_mels=20, channels=4)
    seen = []

    def reduce(counts):
        seen.append(counts.clone())
        return counts + torch.tensor([0.0, 4.0], dtype=torch.float64)  # another rank's 4 wrong answers

    accuracy = evaluate(model, _batches(), torch.device("cpu"), reduce=reduce)
    (counts,) = seen
    assert counts[1] == 4 and accuracy == pytest.approx(float(counts[0]) / 8)
