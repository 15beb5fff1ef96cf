import torch


def softmax(x):
    return torch.softmax(x, dim=-1)
