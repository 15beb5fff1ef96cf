"""Reference spec for row-wise softmax: inputs for a declared shape and dtype, and the answer."""

import torch


def make_inputs(shape, dtype, generator):
    x = torch.randn(shape, generator=generator, dtype=torch.float32) * 4.0
    return (x.to(dtype),)


def reference(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)
