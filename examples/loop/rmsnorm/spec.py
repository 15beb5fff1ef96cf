"""RMSNorm over the last dimension, as the tiny model's LlamaRMSNorm computes it (rms_norm_eps 1e-6)."""

import torch

EPS = 1e-6


def make_inputs(shape, dtype, generator):
    x = torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)
    weight = (1.0 + 0.1 * torch.randn(shape[-1:], generator=generator, dtype=torch.float32)).to(dtype)
    return (x, weight)


def reference(x, weight):
    squared_mean = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(squared_mean + EPS)).to(x.dtype)
