"""The example classifiers and their training step, shared by ``audiobuffer demo`` and the scripts.

Two models (:class:`SpeechCNN`: batched log-mel features on the training device, four conv blocks, a
linear head; :class:`ImageCNN`: the same blocks on normalised images), one optimiser and schedule
(:func:`make_optimizer`), one step (:func:`train_step`) and one evaluation (:func:`evaluate`).
Batches are on the model's device: the input under ``key`` (``pad_collate``'s ``audio`` ``(B, T)``,
``image_collate``'s uint8 ``image`` ``(B, 3, H, W)``) and integer ``label`` ``(B,)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ..features import LogMel
from ..loaders.device import DevicePrefetcher
from ..normalize import Normalize

__all__ = ["ImageCNN", "SpeechCNN", "evaluate", "make_optimizer", "train_step"]


def conv_blocks(c_in: int, channels: int) -> tuple[nn.Sequential, int]:
    """Four blocks of 3x3 conv, batch norm, ReLU and 2x2 max pooling, with ``channels``, 2, 4 and 4
    times as many output channels; and the last block's channel count."""
    layers: list[nn.Module] = []
    for c_out in (channels, channels * 2, channels * 4, channels * 4):
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                   nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True)]
        c_in = c_out
    return nn.Sequential(*layers), c_in


def pooled_head(x: torch.Tensor, head: nn.Module) -> torch.Tensor:
    """``head`` on the average and the maximum of the feature maps ``x`` ``(B, C, H, W)``."""
    return head(torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], dim=1))


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
        self.body, c_out = conv_blocks(1, channels)
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(2 * c_out, classes))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        spec, _ = self.features(audio)
        return pooled_head(self.body(self.norm(spec.unsqueeze(1))), self.head)


class ImageCNN(nn.Module):
    """uint8 images in, class scores out: normalised on their device
    (:class:`~audiobuffer.Normalize`, ImageNet's mean and std), then the four conv blocks of
    :class:`SpeechCNN` and its head.

    Example:
        >>> model = ImageCNN(3, channels=8)
        >>> model(torch.zeros(2, 3, 64, 64, dtype=torch.uint8)).shape
        torch.Size([2, 3])

    Args:
        classes: outputs of the linear head.
        channels: of the first conv block; the others have 2, 4 and 4 times as many.
    """

    def __init__(self, classes: int, *, channels: int) -> None:
        super().__init__()
        self.normalize = Normalize()  # no state of its own: checkpoints hold the layers after it
        self.body, c_out = conv_blocks(3, channels)
        self.head = nn.Sequential(nn.Dropout(0.2), nn.Linear(2 * c_out, classes))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return pooled_head(self.body(self.normalize(images)), self.head)


def make_optimizer(model: nn.Module, *, lr: float, weight_decay: float, epochs: int, steps_per_epoch: int
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.OneCycleLR]:
    """AdamW and a one-cycle learning-rate schedule peaking at ``lr``, stepped once per batch."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, epochs=epochs,
                                                   steps_per_epoch=max(1, steps_per_epoch))
    return optimizer, schedule


def train_step(model: nn.Module, batch: dict[str, Any], optimizer: torch.optim.Optimizer,
               schedule: torch.optim.lr_scheduler.LRScheduler, *, key: str = "audio") -> float:
    """One optimiser step on ``batch`` (cross-entropy of ``batch[key]`` against ``label``); returns
    the loss."""
    loss = nn.functional.cross_entropy(model(batch[key]), batch["label"])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    schedule.step()
    return loss.item()


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[dict[str, Any]], device: torch.device, *,
             key: str = "audio", reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
             ) -> float:
    """The accuracy of ``model`` over ``loader``'s batches, copied to ``device``.

    Args:
        key: the batches' input to the model.
        reduce: applied to the ``(correct, total)`` counts (float64) before they are divided: under
            ``torch.distributed``, a sum across ranks.
    """
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64)
    for batch in DevicePrefetcher(loader, device):
        predicted = model(batch[key]).argmax(dim=1)
        counts += torch.tensor([float((predicted == batch["label"]).sum()), len(batch["label"])], dtype=torch.float64)
    if reduce is not None:
        counts = reduce(counts)
    return float(counts[0] / max(1.0, float(counts[1])))
