"""The reports of ``playbook run serve`` against the single process.

TP × DP serving (``serve.run``): greedy decoding of every request by the reference GPT without a
cache (``reference``), the ranks' answers compared with it (``merge``: tokens, logits within
``LOGIT_TOLERANCE``, TP all-reduce bytes per token per layer against
``theory.serving.serving.tp_allreduce_bytes``, KV bytes against the paged prediction), and the
:class:`ServeReport` that prints them. Pipeline and expert-parallel decoding (``serve --pp N``,
``--ep N``: ``serve.pipeline.serve_pp``, ``serve.experts.serve_ep``): :class:`ParallelDecodeReport`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from playbook.config import ModelConfig
from playbook.dims import ParallelDims
from playbook.model.gpt import GPT
from playbook.parallel.report import Report
from playbook.serve.batching import Request
from playbook.serve.generate import greedy_without_cache
from playbook.theory.serving.serving import tp_allreduce_bytes

LOGIT_TOLERANCE = 1e-5


def reference(cfg: ModelConfig, seed: int, requests: list[Request]) -> dict[int, tuple[list[int], torch.Tensor]]:
    """Greedy decoding of each request by the reference GPT in this process, without a cache."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = GPT(cfg, seed=seed).eval()
        out = {}
        for r in requests:
            tokens, logits = greedy_without_cache(model, torch.tensor([r.prompt]), r.max_new)
            out[r.id] = (tokens[0].tolist(), logits[0])
        return out
    finally:
        torch.set_num_threads(threads)


def merge(answers: list[dict], cfg: ModelConfig, dims: ParallelDims, want: dict) -> dict:
    """Rank results against the reference: token agreement, worst logit difference, all-reduce bytes
    per token per layer measured (every rank, over every step's tokens) and predicted, KV bytes per step."""
    per_layer = tp_allreduce_bytes(cfg, tokens=1, tp=dims.tp, act_bytes=4)
    mismatched, worst, kv = [], 0.0, []
    for a in answers:
        for rid, tokens in a["tokens"].items():
            if tokens != want[rid][0]:
                mismatched.append(rid)
            worst = max(worst, float((a["logits"][rid] - want[rid][1]).abs().max()))
        for s in a["steps"]:
            kv.append(s["kv_predicted"] is None or s["kv_bytes"] == s["kv_predicted"])
    measured = [a["layer_bytes"] / max(a["computed"], 1) / cfg.n_layers for a in answers]
    return {
        "requests": len(want),
        "tokens_identical": not mismatched,
        "mismatched_requests": sorted(set(mismatched)),
        "max_abs_logit_diff": worst,
        "tp_bytes_per_token_per_layer": {"predicted": per_layer, "measured": measured},
        "kv_bytes_match_every_step": all(kv),
        "steps": max(len(a["steps"]) for a in answers),
    }


@dataclass
class ServeReport(Report):
    """What ``playbook run serve --json`` prints."""

    backend: str
    layout: str
    parity: dict
    setup: dict = field(default_factory=dict)
    replicas: list = field(default_factory=list)
    speculative: dict | None = None  # ``serve.speculative.acceptance`` of every replica's verifies

    def problem(self) -> str | None:
        p = self.parity
        if not p["tokens_identical"]:
            return f"requests {p['mismatched_requests']} generated other tokens than the reference"
        tolerance = p.get("logit_tolerance", LOGIT_TOLERANCE)  # a rounded KV cache: serve.quant_ref
        if not p["max_abs_logit_diff"] <= tolerance:
            return f"logits differ by {p['max_abs_logit_diff']:.2e} > {tolerance:g}"
        if not p["kv_bytes_match_every_step"]:
            return "KV bytes held differ from the paged prediction at some step"
        if not p.get("bytes_match", True):  # a quantized run (serve.quant_ref)
            return f"weight or KV block bytes differ from the prediction: {p['weight_bytes']}, {p['kv_block_bytes']}"
        return None

    def summary(self) -> str:
        p, b = self.parity, self.parity["tp_bytes_per_token_per_layer"]
        lines = [
            f"serve {self.layout} on {self.world_size} rank(s), backend {self.backend}: {p['requests']} requests "
            f"in {p['steps']} scheduler steps",
            f"  tokens identical to the reference (greedy, no cache): {p['tokens_identical']}; "
            f"max |logit diff| {p['max_abs_logit_diff']:.2e}",
            f"  TP all-reduce bytes per token per layer: predicted {b['predicted']:,.0f}, measured "
            + ", ".join(f"{x:,.0f}" for x in b["measured"]),
            f"  KV bytes held == paged prediction at every step: {p['kv_bytes_match_every_step']}",
        ]
        if "weight_bytes" in p:  # a quantized run: against one process running the same quantized model
            w, k = p["weight_bytes"], p["kv_block_bytes"]
            lines[1] = lines[1].replace(
                "the reference (greedy, no cache)", "one process with the same weights and KV format"
            )
            lines.append(
                f"  weights {self.setup.get('quantize') or 'fp32'}, KV {self.setup.get('kv_dtype')}: bytes per rank "
                f"predicted {w['predicted']:,.0f}, measured {', '.join(f'{x:,}' for x in w['measured'])}; "
                f"a KV block predicted {k['predicted']:,.0f}, measured {', '.join(f'{x:,}' for x in k['measured'])}"
            )
        if self.speculative:
            sp = self.speculative
            lines.append(
                f"  speculative k={self.setup['speculative']} draft {self.setup['draft']}: {sp['accepted']} of "
                f"{sp['drafted']} drafts accepted ({sp['acceptance_rate']:.0%}; per-token α {sp['alpha']:.2f}), "
                f"{sp['tokens_per_verify']:.2f} tokens per verify over {sp['verifies']} verifies"
            )
        for r in self.replicas:
            lines.append(
                f"  replica {r['dp']}: requests {r['requests']}, {r['decoded']} tokens decoded, "
                f"{r['cached']} prompt tokens found cached"
            )
        if self.problem():
            lines.insert(1, f"  PARITY FAILED: {self.problem()}")
        return "\n".join(lines)


@dataclass
class ParallelDecodeReport(Report):
    """Tokens and logits against one process, and bytes per generated token measured beside predicted
    (``strategy``: "serve pp" or "serve ep")."""

    degree: int
    result: dict

    def _bytes(self) -> dict:
        r = self.result
        return r.get("bytes_per_token") or r["alltoall_bytes_per_token"]

    def problem(self) -> str | None:
        """Why parity failed (None when tokens are identical, logits within 1e-5, bytes as predicted)."""
        r, b = self.result, self._bytes()
        if not r["tokens_identical"]:
            return "generated tokens differ from the single process"
        if not r["max_abs_logit_diff"] <= 1e-5:
            return f"logits differ by {r['max_abs_logit_diff']:.2e} (> 1e-5)"
        if any(abs(m - p) > 1e-6 * max(1.0, abs(p)) for m, p in zip(b["measured"], b["predicted"])):
            return f"bytes per token measured {b['measured']} != predicted {b['predicted']}"
        return None

    def summary(self) -> str:
        r, b = self.result, self._bytes()
        what = (
            "bytes sent per token per stage" if self.strategy == "serve pp" else "all-to-all bytes per token per rank"
        )
        lines = [
            f"{self.strategy}{self.degree} on {self.world_size} rank(s): tokens identical to one process: "
            f"{r['tokens_identical']}, max |logit diff| {r['max_abs_logit_diff']:.2e}",
            f"  {what}: predicted {[round(x, 1) for x in b['predicted']]}, measured {[round(x, 1) for x in b['measured']]}",
        ]
        if "bubble" in r:
            lines.append(
                f"  decode bubble: ideal {r['bubble']['predicted']:.3f}, measured {r['bubble']['measured']:.3f}"
            )
        if r.get("tokens_per_second"):
            lines.append(
                f"  {r['tokens_per_second']:.0f} tokens/s on this machine (timings mean little on shared cores)"
            )
        if self.problem():
            lines.append(f"  PARITY FAILED: {self.problem()}")
        return "\n".join(lines)
