"""The learner's model for the end-to-end training benchmark
(gear-py/bench/train.py): a decision-transformer-style causal transformer
over windows of L steps of Atari-like trajectories.

Each step is one token: the frame (84x84 u8, or a flat u8 observation)
through a strided convolution (or a linear layer) and a projection, plus
the embedding of the previous action, a projection of the reward and a
learned position. A causal transformer (pre-norm blocks, PyTorch's fused
scaled-dot-product attention) predicts each step's action; the loss is the
cross entropy per step, averaged over each row's real steps and weighted by
the replay system's importance weights; each row's mean loss is its new
priority.

Sizes: "S" about 1 M parameters (d 128, 4 blocks), "M" about 10 M (d 256,
12 blocks); "0" is no model (the learner only receives the batch and
updates priorities).
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

ACTIONS = 18
"""Atari's full action set."""

SIZES: Dict[str, Tuple[int, int, int]] = {"S": (128, 4, 4), "M": (256, 12, 8)}
"""Model size -> (width, blocks, heads)."""


class Block(nn.Module):
    """A pre-norm causal self-attention block with a 4x MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class DecisionTransformer(nn.Module):
    """Predicts each step's action from the frames, previous actions and
    rewards up to that step."""

    def __init__(self, size: str, obs_shape: Tuple[int, ...], max_window: int) -> None:
        super().__init__()
        d, blocks, heads = SIZES[size]
        if len(obs_shape) == 2:
            # 84x84 -> 16 x 10 x 10 with one 8x8/8 convolution: the frame
            # encoder stays a small share of the model, as in DT-Atari's
            # which is small beside its transformer.
            self.conv = nn.Conv2d(1, 16, kernel_size=8, stride=8)
            h, w = (obs_shape[0] - 8) // 8 + 1, (obs_shape[1] - 8) // 8 + 1
            self.frame = nn.Linear(16 * h * w, d)
        else:
            self.conv = None
            self.frame = nn.Linear(math.prod(obs_shape), d)
        self.action = nn.Embedding(ACTIONS + 1, d)  # + "no previous action"
        self.reward = nn.Linear(1, d)
        self.position = nn.Parameter(torch.zeros(max_window, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(blocks))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, ACTIONS)

    def forward(self, obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, L, ACTIONS]`` from ``obs`` ``[B, L, *obs_shape]`` u8,
        ``action`` ``[B, L]`` integers and ``reward`` ``[B, L]``."""
        b, t = action.shape
        x = obs.reshape(b * t, *obs.shape[2:]).float().mul_(1.0 / 255.0)
        if self.conv is not None:
            x = F.relu(self.conv(x.unsqueeze(1))).flatten(1)
        tokens = self.frame(x).view(b, t, -1)
        previous = torch.full_like(action, ACTIONS)
        previous[:, 1:] = action[:, :-1]
        tokens = tokens + self.action(previous) + self.reward(reward.unsqueeze(-1)) + self.position[:t]
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.ln(tokens))


class Learner:
    """A model, its Adam optimiser and one training step."""

    def __init__(self, size: str, obs_shape: Tuple[int, ...], max_window: int, seed: int = 0,
                 device: torch.device | str = "cpu") -> None:
        torch.manual_seed(seed)
        self.model = DecisionTransformer(size, obs_shape, max_window).to(device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def step(self, obs: torch.Tensor, action: torch.Tensor, reward: torch.Tensor,
             mask: torch.Tensor | None, weights: torch.Tensor | None) -> torch.Tensor:
        """One Adam step; returns each row's mean loss (its new priority)."""
        logits = self.model(obs, action, reward)
        per_step = F.cross_entropy(logits.flatten(0, 1), action.flatten().long(), reduction="none").view(action.shape)
        if mask is not None:
            m = mask.to(per_step.dtype)
            per_row = (per_step * m).sum(1) / m.sum(1).clamp_min(1.0)
        else:
            per_row = per_step.mean(1)
        loss = (per_row * weights.to(per_row.dtype)).mean() if weights is not None else per_row.mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return per_row.detach()
