"""A candidate: the computation written out in float32 (your own goes beside it, listed in magpie.toml)."""

import torch


def rmsnorm(x, weight):
    h = x.to(torch.float32)
    inverse_rms = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return weight * (h * inverse_rms).to(x.dtype)


def forward(self, hidden_states):
    return rmsnorm(hidden_states, self.weight)
