"""One training loop, shared by the single-process reference and every parallel strategy.

Every chapter checks its strategy against :func:`train` run in one process on the same global
batch: same model (``GPT(cfg, seed)``), same data (``SyntheticTask``), same AdamW settings.
A strategy plugs in where it differs: how gradients are synchronised (``sync_grads``), and
which rows of the global batch this rank sees (``rank``/``world_size``).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from playbook.config import ModelConfig, require_positive
from playbook.data import SyntheticTask, rows_per_rank
from playbook.cluster.trace import tracer as trace
from playbook.measure.memory import measure_training_step
from playbook.model.gpt import GPT
from playbook.theory.inventory.model_state import TrainingMemory
from playbook.theory.hybrid.memory import training_memory


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

    def predicted_memory(self, world_size: int = 1, *, precision: str = "fp32") -> TrainingMemory:
        """Exact bytes for our model on one rank: AdamW (with its step counters) in ``precision``
        ("fp32", or "mixed": bf16 model, fp32 masters), and the activations of this rank's micro-batch."""
        cfg = self.config()
        return training_memory(
            cfg,
            seq_len=self.seq_len,
            micro_batch=self.local_batch(world_size),
            precision=precision,
            n_tensors=cfg.num_param_tensors(),
        )

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
    grad_norms: list[float] = field(
        default_factory=list
    )  # clipped runs: the global norm of every step, before clipping


def train(
    setup: TrainSetup,
    *,
    rank: int = 0,
    world_size: int = 1,
    device: torch.device | str = "cpu",
    model: torch.nn.Module | None = None,
    optimizer=None,
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None,
    forward_backward: Callable | None = None,
    sync_grads: Callable[[torch.nn.Module], None] | None = None,
    sync_loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
    collect: Callable[[torch.Tensor], torch.Tensor] | None = None,
    context: Callable = nullcontext,
    measure: bool = True,
    progress: Callable[[int, int], None] | None = None,
    start: int = 0,
    global_tokens: int | None = None,
) -> TrainResult:
    """The one training loop: ``setup.steps`` AdamW steps, for the reference and every strategy.

    Without hooks it is the single-process reference on rows ``rank/world_size`` of each global
    batch. A strategy plugs in where it differs:

    - ``model``: the (parallelized) model; default ``GPT(setup.config(), setup.seed)``;
    - ``optimizer``: anything with ``zero_grad`` and ``step`` (ZeRO's sharded one); default AdamW;
    - ``batch(step) -> (tokens, targets)``: which rows and tokens this rank sees;
    - ``forward_backward(model, tokens, targets) -> loss``: forward and backward (a pipeline
      executor replaces it); default ``model(tokens, targets)`` then ``loss.backward()``;
    - ``sync_grads(model)``: where gradients are reduced (after every backward);
    - ``sync_loss(loss)``: the global batch's loss, for reporting;
    - ``collect(tensor)``: what is returned for a parameter or gradient (default a CPU copy);
    - ``context()``: wraps each step (DTensor's ``loss_parallel``);
    - ``start``: the first step to run (a run resumed from a checkpoint: steps ``start`` .. ``steps − 1``);
    - ``global_tokens``: the default forward's loss divisor, the global batch's token count where this
      rank reads only part of it (``model.gpt.lm_loss``: every rank's loss its share, gradients summed).

    Step 0 is measured by category (``measure``) when the default forward is used; gradients are
    taken after the first synchronised backward, parameters after the last step.
    """
    model = model if model is not None else GPT(setup.config(), seed=setup.seed).to(device)
    optimizer = optimizer if optimizer is not None else torch.optim.AdamW(model.parameters(), lr=setup.lr)
    collect = collect or (lambda x: x.detach().cpu().clone())
    if batch is None:
        task = setup.task()

        def batch(step):
            return task.batch(step, setup.global_batch, setup.seq_len, rank, world_size, device=device)

    tracer = trace.current()
    losses, grads, memory = [], {}, {}
    for step in range(start, setup.steps):
        tokens, targets = batch(step)
        with context(), tracer.span(f"step {step}") if tracer else nullcontext():
            if step == 0 and measure and forward_backward is None:  # the first step, measured by category
                snapshot = measure_training_step(
                    model, optimizer, tokens, targets, after_backward=sync_grads, global_tokens=global_tokens
                )
                loss, memory = snapshot.loss, snapshot.as_dict()
                grads = {n: collect(p.grad) for n, p in model.named_parameters() if p.grad is not None}
            else:
                optimizer.zero_grad(set_to_none=True)
                if forward_backward is None:
                    _, loss = model(
                        tokens, targets, **({} if global_tokens is None else {"global_tokens": global_tokens})
                    )
                    loss.backward()
                else:
                    loss = forward_backward(model, tokens, targets)
                if sync_grads is not None:
                    sync_grads(model)
                if step == 0:
                    grads = {n: collect(p.grad) for n, p in model.named_parameters() if p.grad is not None}
                optimizer.step()
        loss = loss.detach()
        losses.append(float(sync_loss(loss) if sync_loss else _full(loss)))
        if progress is not None:
            progress(step + 1, setup.steps)
    params = {n: collect(p) for n, p in model.named_parameters()}
    return TrainResult(losses, grads, params, memory)


def _full(loss):
    return loss.full_tensor() if hasattr(loss, "full_tensor") else loss  # a DTensor loss (loss_parallel)
