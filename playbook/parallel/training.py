"""One training loop, shared by the single-process reference and every parallel strategy.

Every chapter checks its strategy against :func:`train` run in one process on the same global
batch: same model (``GPT(cfg, seed)``), same data (``SyntheticTask``), same AdamW settings.
A strategy plugs in where it differs: how gradients are synchronised (``sync_grads``), and
which rows of the global batch this rank sees (``rank``/``world_size``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from playbook.config import ModelConfig, require_positive
from playbook.data import SyntheticTask, rows_per_rank
from playbook.measure.memory import measure_training_step
from playbook.model import GPT
from playbook.theory.memory import TrainingMemory, training_memory


@dataclass(frozen=True)
class TrainSetup:
    """What to train and for how long. Small defaults keep every chapter well under a minute."""

    model: str = "gpt-tiny"
    steps: int = 3
    global_batch: int = 8
    seq_len: int = 32
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self) -> None:
        require_positive(steps=self.steps, global_batch=self.global_batch, seq_len=self.seq_len)
        if self.seq_len > self.config().max_seq_len:
            raise ValueError(f"seq_len={self.seq_len} exceeds {self.model}'s max_seq_len={self.config().max_seq_len}")

    def config(self) -> ModelConfig:
        return ModelConfig.preset(self.model)

    def task(self) -> SyntheticTask:
        return SyntheticTask(self.config().vocab_size, seed=self.seed)

    def local_batch(self, world_size: int) -> int:
        """Rows per rank when the global batch is split over ``world_size`` data-parallel ranks."""
        return rows_per_rank(self.global_batch, world_size)

    def predicted_memory(self, world_size: int = 1) -> TrainingMemory:
        """Exact bytes for our model on one rank: fp32 AdamW (with its step counters), and the
        activations of this rank's micro-batch."""
        cfg = self.config()
        return training_memory(
            cfg, seq_len=self.seq_len, micro_batch=self.local_batch(world_size),
            precision="fp32", n_tensors=cfg.num_param_tensors(),
        )  # fmt: skip

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainResult:
    """What one rank saw: loss per step (of the global batch), gradients after the first backward
    (already synchronised), parameters after the last step, memory by category at the first step."""

    losses: list[float]
    grads: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]
    memory: dict[str, int | None] = field(default_factory=dict)


def train(
    setup: TrainSetup,
    *,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | str = "cpu",
    sync_grads: Callable[[torch.nn.Module], None] | None = None,
    sync_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TrainResult:
    """Train ``setup.steps`` AdamW steps on this rank's slice of each global batch.

    ``sync_grads(model)`` runs after each backward (data parallelism averages gradients there);
    ``sync_loss(loss)`` turns the local loss into the global batch's loss for reporting.
    """
    cfg = setup.config()
    model = GPT(cfg, seed=setup.seed).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr)
    task = setup.task()
    losses, grads, memory = [], {}, {}
    for step in range(setup.steps):
        tokens, targets = task.batch(step, setup.global_batch, setup.seq_len, rank, world_size, device=device)
        if step == 0:  # the first step is measured by category
            snapshot = measure_training_step(model, optimizer, tokens, targets, after_backward=sync_grads)
            loss, memory = snapshot.loss, snapshot.as_dict()
            grads = {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}
        else:
            optimizer.zero_grad(set_to_none=True)
            _, loss = model(tokens, targets)
            loss.backward()
            if sync_grads is not None:
                sync_grads(model)
            optimizer.step()
        losses.append(float(sync_loss(loss.detach()) if sync_loss else loss.detach()))
        if progress is not None:
            progress(step + 1, setup.steps)
    params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    return TrainResult(losses, grads, params, memory)

