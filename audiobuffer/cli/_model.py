"""The example classifier and its training step, shared by ``audiobuffer demo`` and ``scripts/train_audio.py``.

One model (:class:`SpeechCNN`: batched log-mel features on the training device, four conv blocks, a
linear head), one optimiser and schedule (:func:`make_optimizer`), one step (:func:`train_step`) and
one evaluation (:func:`evaluate`). Batches are ``pad_collate`` batches on the model's device: ``audio``
``(B, T)`` and integer ``label`` ``(B,)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ..features import LogMel
from ..loaders.device import DevicePrefetcher

__all__ = ["SpeechCNN", "evaluate", "make_optimizer", "train_step"]


class SpeechCNN(nn.Module):
    """Log-mel in, class scores out: four conv blocks, average and max pooling over time and frequency.

    Example:
        >>> model = SpeechCNN(10, 8000, n_fft=256, hop_length=80, n_mels=40, channels=8)
        >>> model(torch.zeros(2, 8000)).shape
        torch.Size([2, 10])

    Args:
        classes: outputs of the linear head.
        sample_rate: of the audio the model is given.
        n_fft, hop_length, n_mels: of the log-mel features (:class:`~audiobuffer.features.LogMel`).
        channels: of the first conv block; the others have 2, 4 and 4 times as many.
    """

    def __init__(self, classes: int, sample_rate: int, *, n_fft: int, hop_length: int, n_mels: int,
                 channels: int) -> None:
        super().__init__()
        self.features = LogMel(sample_rate, n_fft, hop_length=hop_length, n_mels=n_mels, top_db=80.0)
        self.norm = nn.BatchNorm2d(1)
        layers: list[nn.Module] = []
        c_in = 1
        for c_out in (channels, channels * 2, channels * 4, channels * 4):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
                       nn.MaxPool2d(2, ceil_mode=True)]
            c_in = c_out
        self.body = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(2 * c_in, classes))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        spec, _ = self.features(audio)
        x = self.body(self.norm(spec.unsqueeze(1)))
        return self.head(torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], dim=1))


def make_optimizer(model: nn.Module, *, lr: float, weight_decay: float, epochs: int, steps_per_epoch: int
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.OneCycleLR]:
    """AdamW and a one-cycle learning-rate schedule peaking at ``lr``, stepped once per batch."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, epochs=epochs,
                                                   steps_per_epoch=max(1, steps_per_epoch))
    return optimizer, schedule


def train_step(model: nn.Module, batch: dict[str, Any], optimizer: torch.optim.Optimizer,
               schedule: torch.optim.lr_scheduler.LRScheduler) -> float:
    """One optimiser step on ``batch`` (cross-entropy of ``audio`` against ``label``); returns the loss."""
    loss = nn.functional.cross_entropy(model(batch["audio"]), batch["label"])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    schedule.step()
    return loss.item()


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[dict[str, Any]], device: torch.device, *,
             reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> float:
    """The accuracy of ``model`` over ``loader``'s batches, copied to ``device``.

    Args:
        reduce: applied to the ``(correct, total)`` counts (float64) before they are divided: under
            ``torch.distributed``, a sum across ranks.
    """
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64)
    for batch in DevicePrefetcher(loader, device):
        predicted = model(batch["audio"]).argmax(dim=1)
        counts += torch.tensor([float((predicted == batch["label"]).sum()), len(batch["label"])], dtype=torch.float64)
    if reduce is not None:
        counts = reduce(counts)
    return float(counts[0] / max(1.0, float(counts[1])))
