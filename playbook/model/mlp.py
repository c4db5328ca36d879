"""The dense MLP of our GPT: SwiGLU (Shazeer 2020), on its own so that the MoE layer's experts
(``playbook.model.moe``) and the blocks (``playbook.model.gpt``) share it without importing each other."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (Shazeer 2020). Tensor parallelism splits ffn_hidden:
    gate/up column-wise, down row-wise."""

    def __init__(self, hidden: int, ffn_hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn_hidden, bias=False)
        self.up_proj = nn.Linear(hidden, ffn_hidden, bias=False)
        self.down_proj = nn.Linear(ffn_hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.silu(self.gate_proj(x))  # [batch, seq, ffn_hidden]
        up = self.up_proj(x)  # [batch, seq, ffn_hidden]
        return self.down_proj(gate * up)  # [batch, seq, hidden]
