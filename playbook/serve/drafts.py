"""Drafts for speculative decoding (``serve.speculative``): who proposes the k tokens the target checks.

- ``self:E`` — the target's own first E layers and its own final norm and head (self-speculation
  by early exit: LayerSkip, Elhoushi et al. 2024, "LayerSkip: Enabling Early Exit Inference and
  Self-Speculative Decoding", §4; Draft & Verify, Zhang et al. 2023, arXiv:2309.08168, drafts by
  skipping layers instead). No second set of weights; with TP the draft runs on the target's own
  shards, its collectives included. It is the draft that gives a meaningful acceptance rate with the
  book's random weights: the residual stream is mostly the token's embedding (the projections that
  write into it start 1/√(2L) smaller, ``model.gpt``), so the first layers already predict much of
  what all of them do.
- a preset name — a separate, smaller model with the **same vocabulary** (Leviathan et al. 2023's
  setting, e.g. a Llama 3.1 8B drafting for the 70B), built from the same seed and run whole on every
  rank of a replica so that every rank proposes the same tokens. With random weights two models share
  nothing, so it is accepted about 1/V of the time: the case where speculation is slower than plain
  decoding.
"""

from __future__ import annotations

from playbook.config import ModelConfig


def parse_draft(spec: str, cfg: ModelConfig) -> tuple[str, int | ModelConfig]:
    """("self", E) or ("model", its config) for ``--draft``; one ``ValueError`` naming what would work."""
    if spec.startswith("self:"):
        layers = spec[5:]
        if not layers.isdigit() or not 1 <= int(layers) < cfg.n_layers:
            raise ValueError(
                f"--draft {spec}: self:E drafts with the target's first E layers, 1 <= E < {cfg.n_layers} "
                f"({cfg.name} has {cfg.n_layers}); try --draft self:{max(1, cfg.n_layers // 2)}"
            )
        return "self", int(layers)
    if spec not in ModelConfig.presets():
        raise ValueError(
            f"--draft {spec} is neither self:E (the target's first E layers) nor a model preset "
            f"({', '.join(ModelConfig.presets())}); try --draft self:{max(1, cfg.n_layers // 2)}"
        )
    draft = ModelConfig.preset(spec)
    if draft.vocab_size != cfg.vocab_size:
        same = [n for n in ModelConfig.presets() if n != cfg.name and _fits(ModelConfig.preset(n), cfg)]
        raise ValueError(
            f"--draft {spec} has a vocabulary of {draft.vocab_size} tokens, {cfg.name} of {cfg.vocab_size}: a draft "
            f"must propose the target's tokens; try --draft self:{max(1, cfg.n_layers // 2)}"
            + (f" or --draft {same[0]}" if same else "")
        )
    if not _fits(draft, cfg):
        raise ValueError(
            f"--draft {spec}: a separate draft here is a dense GQA model holding at least {cfg.max_seq_len} "
            f"positions; try --draft self:{max(1, cfg.n_layers // 2)}"
        )
    return "model", draft


def _fits(draft: ModelConfig, cfg: ModelConfig) -> bool:
    """A separate draft here: the target's vocabulary, dense GQA, at least its positions."""
    return (
        draft.vocab_size == cfg.vocab_size
        and not draft.is_moe
        and draft.attention == "gqa"
        and draft.max_seq_len >= cfg.max_seq_len
    )


class EarlyExit:
    """The target's first ``layers`` blocks, then its own final norm and head: what ``forward_packed``
    needs of a model (``embed``, ``blocks``, ``head``, ``cfg``, and a ``TPGPT``'s ``group``)."""

    shares_target = True  # its layers are the target's: under TP their all-reduces are the target's too

    def __init__(self, model, layers: int):
        self.cfg, self.blocks = model.cfg, model.blocks[:layers]
        self.embed, self.head = model.embed, model.head
        self.group = getattr(model, "group", None)


def make_draft(spec: str, target, *, seed: int):
    """The draft ``spec`` names for ``target`` (a ``GPT`` or this rank's ``TPGPT`` shard)."""
    kind, what = parse_draft(spec, target.cfg)
    if kind == "self":
        return EarlyExit(target, what)
    from playbook.model.gpt import GPT

    return GPT(what, seed=seed).eval()


MAX_SPECULATIVE = 16  # draft tokens per step accepted by the command line (engines use 1..~8)


def default_draft(cfg: ModelConfig) -> str:
    """``--draft`` when left out: the target's first half of its layers."""
    return f"self:{max(1, cfg.n_layers // 2)}"


def check_speculative(
    cfg: ModelConfig, speculative: int, draft: str | None, *, max_batch: int, token_budget: int | None
) -> str | None:
    """``--speculative K --draft D`` before any rank starts: the draft's name (``default_draft`` when
    left out), or None without speculation; one ``ValueError`` naming the constraint otherwise."""
    if not speculative:
        if draft is not None:
            raise ValueError(f"--draft {draft} drafts for speculative decoding; add --speculative 4 (tokens per step)")
        return None
    if not 1 <= speculative <= MAX_SPECULATIVE:
        raise ValueError(
            f"--speculative {speculative} must be 1..{MAX_SPECULATIVE} draft tokens per step; try --speculative 4"
        )
    draft = draft or default_draft(cfg)
    parse_draft(draft, cfg)
    if token_budget is not None and token_budget <= max_batch * (speculative + 1):
        raise ValueError(
            f"--token-budget {token_budget} must exceed --max-batch {max_batch} × (--speculative {speculative} + 1) "
            f"= {max_batch * (speculative + 1)} (each decoding request verifies k + 1 tokens a step); "
            f"try --token-budget {max_batch * (speculative + 1) + 8}"
        )
    return draft
