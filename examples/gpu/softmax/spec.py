"""Row-wise softmax reference for the GPU example."""

import torch


def make_inputs(shape, dtype, generator):
    x = torch.randn(shape, generator=generator, dtype=torch.float32) * 4.0
    return (x.to(dtype),)


def reference(x):
    return torch.softmax(x.double(), dim=-1).to(x.dtype)
