"""Student factories for the distillation tests (imported by path as module:factory)."""

import torch
from torch import nn


def small_student() -> nn.Module:
    """A small MLP that predicts the digits' 10 classes."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def five_class_student() -> nn.Module:
    """Predicts 5 classes: its output shape does not match a 10-class teacher."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 5))


def not_a_module():
    return torch.zeros(1)
