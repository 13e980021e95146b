"""Normalize: uint8 images to normalised float, batched, on the batch's device."""

import pytest
import torch

from audiobuffer import Normalize
from audiobuffer.normalize import IMAGENET_MEAN, IMAGENET_STD


def reference(images, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """torchvision's ToTensor() then Normalize(mean, std), per image, in float64."""
    x = images.to(torch.float64) / 255
    return (x - torch.tensor(mean, dtype=torch.float64).view(-1, 1, 1)) / torch.tensor(
        std, dtype=torch.float64).view(-1, 1, 1)


@pytest.fixture
def batch():
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (4, 3, 9, 7), dtype=torch.uint8, generator=generator)


def test_matches_to_tensor_then_normalize(batch):
    out = Normalize()(batch)
    assert out.dtype == torch.float32 and out.shape == batch.shape
    torch.testing.assert_close(out, reference(batch).float(), rtol=1e-6, atol=1e-5)
    one = Normalize()(batch[1])
    torch.testing.assert_close(one, out[1])


def test_other_mean_std_and_channels():
    images = torch.randint(0, 256, (2, 1, 5, 5), dtype=torch.uint8)
    out = Normalize([0.5], [0.25], dtype=torch.float64)(images)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, reference(images, [0.5], [0.25]))


def test_channels_last_input_gives_the_same_values_in_channels_last_memory(batch):
    hwc = batch.permute(0, 2, 3, 1).contiguous()  # as ImageDecoder(layout="hwc") batches
    out = Normalize(layout="hwc")(hwc)
    assert out.shape == batch.shape
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, Normalize()(batch))
    torch.testing.assert_close(Normalize(layout="hwc")(hwc[0]), out[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(batch, dtype):
    out = Normalize(dtype=dtype)(batch)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), reference(batch).float(), rtol=1e-2, atol=2e-2)


def test_moves_with_the_module_and_follows_the_batch(batch):
    norm = Normalize().to(torch.float64)  # a module-wide cast does not change the output dtype
    assert norm(batch).dtype == torch.float32
    assert norm.scale.device == batch.device and not list(norm.parameters())
    assert "channels=3" in repr(norm)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_cuda(batch):
    norm = Normalize(layout="hwc").to("cuda")
    hwc = batch.permute(0, 2, 3, 1).contiguous().cuda()
    out = norm(hwc)
    assert out.device.type == "cuda" and out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out.cpu(), Normalize()(batch))
    torch.testing.assert_close(Normalize()(batch.cuda()).cpu(), Normalize()(batch))  # CPU buffers


@pytest.mark.parametrize("kwargs, error, match", [
    ({"mean": (0.5, 0.5), "std": (0.2, 0.2, 0.2)}, ValueError, r"2 means and 3 standard"),
    ({"std": (0.2, 0, 0.2)}, ValueError, r"std must be > 0 for every channel, got \(0\.2, 0, 0"),
    ({"mean": "rgb"}, TypeError, r"mean must be a sequence of numbers, one per channel, got 'rgb'"),
    ({"mean": (0.5, float("nan"), 0.5)}, ValueError, r"mean must be finite"),
    ({"layout": "nchw"}, ValueError, r"layout must be one of 'chw', 'hwc', got 'nchw'"),
    ({"dtype": torch.int32}, TypeError, r"dtype must be a floating-point .* got torch\.int32"),
])
def test_option_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        Normalize(**kwargs)


def test_input_errors(batch):
    with pytest.raises(TypeError, match=r"uint8 tensor .* got torch\.float32"):
        Normalize()(batch.float())
    with pytest.raises(ValueError, match=r"got shape \(9, 7\)"):
        Normalize()(batch[0, 0])
    with pytest.raises(ValueError, match=r"have 7 \(shape \(4, 3, 9, 7\), layout='hwc'\)"):
        Normalize(layout="hwc")(batch)
