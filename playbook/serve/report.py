"""The report of ``playbook run serve --pp N`` and ``--ep N``: pipeline or expert-parallel decoding
on real ranks against the single process (``serve.pipeline.serve_pp``, ``serve.experts.serve_ep``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass
class ParallelDecodeReport:
    """Tokens and logits against one process, and bytes per generated token measured beside predicted."""

    strategy: str  # "serve pp" or "serve ep"
    world_size: int
    degree: int
    result: dict

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

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
