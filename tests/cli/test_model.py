"""The example model and training step (audiobuffer/cli/_model.py), shared by the demo and scripts/train_audio.py."""

import importlib.util

import pytest
import torch
from helpers import REPO

from audiobuffer.cli import _model, demo
from audiobuffer.cli._model import SpeechCNN, evaluate, make_optimizer, train_step


def _batches(n=4, classes=3):
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(n) % classes
    # Each class a tone of its own frequency: a few steps are enough to learn it.
    t = torch.arange(4000) / 8000
    audio = torch.stack([torch.sin(2 * torch.pi * (300 + 700 * int(k)) * t) for k in labels])
    audio = audio + 0.01 * torch.randn(audio.shape, generator=generator)
    return [{"audio": audio, "label": labels}]


def test_demo_and_train_audio_share_one_model_and_step():
    spec = importlib.util.spec_from_file_location("train_audio", REPO / "scripts" / "train_audio.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for name in ("SpeechCNN", "evaluate", "make_optimizer", "train_step"):
        assert getattr(script, name) is getattr(_model, name), name
    for name in ("SpeechCNN", "evaluate", "make_optimizer", "train_step"):
        assert getattr(demo, name) is getattr(_model, name), name


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
