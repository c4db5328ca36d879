"""One way to check what comes from a file: read it as one JSON object, then check each field
against a range table (kind, lowest, highest, example), as ``cli.checks.LIMITS`` does for the flags.

A bad file or field is refused with one ``ValueError`` line naming the file, the field, the
constraint and a value that works; nothing reaches a constructor, a float conversion or a loop
with a value it cannot take (a 401-digit integer, a string for a bandwidth, a list for a number).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Range:
    """``kind`` "int" (not bool) or "number" (int or finite float); ``low`` inclusive unless
    ``open_low``; ``nullable``: None is allowed (the field's own meaning of "absent")."""

    kind: str
    low: float
    high: float
    example: str
    open_low: bool = False
    nullable: bool = False

    def describe(self) -> str:
        noun = "an integer" if self.kind == "int" else "a number"
        if self.open_low and self.low == 0:
            low = "greater than 0"
        elif self.kind == "int" and self.low == 1:
            noun, low = "a positive integer", ""
        else:
            low = f"at least {self.low:g}"
        high = (
            ""
            if not math.isfinite(self.high)
            else f"at most {self.high:,}"
            if self.kind == "int"
            else f"at most {self.high:g}"
        )
        return f"{noun} {' and '.join(x for x in (low, high) if x)}".strip()

    def ok(self, value) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, int if self.kind == "int" else (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.low if self.open_low else value >= self.low
        return above and value <= self.high


def shown(value) -> str:
    """A value as the user wrote it, cut short (a 401-digit integer is not echoed whole)."""
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


def check_fields(where: str, values: dict, table: dict[str, Range], *, sep: str = "=") -> None:
    """Refuse the first field of ``values`` that ``table`` lists and that is out of its range."""
    for name, rule in table.items():
        if name in values and not rule.ok(values[name]):
            raise ValueError(
                f"{where}: {name} must be {rule.describe()}, got {shown(values[name])}; e.g. {name}{sep}{rule.example}"
            )


def read_json_object(path: Path, what: str) -> dict:
    """The JSON object in ``path``, or one line saying why not (unreadable, not JSON, nested too
    deep, a number Python refuses, or a JSON list/string instead of an object)."""
    try:
        text = path.read_text()
    except IsADirectoryError:
        raise ValueError(f"{what} {str(path)!r} is a folder; give the .json file in it") from None
    except OSError as e:
        raise ValueError(f"cannot read {what} {str(path)!r}: {e.strerror or e}; check its permissions") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {str(path)!r} is not text (UTF-8); a {what} is one JSON object") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} {str(path)!r} is not JSON ({e.msg}, line {e.lineno})") from None
    except RecursionError:
        raise ValueError(f"{what} {str(path)!r} nests too deep to read; a {what} is one JSON object") from None
    except ValueError as e:  # e.g. an integer past Python's digit limit
        raise ValueError(f"{what} {str(path)!r} holds a value Python cannot read ({str(e)[:80]})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{what} {str(path)!r} holds a JSON {type(raw).__name__}; a {what} is one JSON object")
    return raw


def require_keys(where: str, raw: dict, keys: list[str], kind: str) -> None:
    missing = [k for k in keys if k not in raw]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}; a {kind} needs {', '.join(keys)}")


_BIG = 10**7  # far above any published model's width or vocabulary
# ModelConfig: every field a file can set. n_layers is bounded so that a planner's loops over layers
# and stages stay short (DeepSeek-V3 has 61, Llama-3.1-405B 126).
MODEL_LIMITS = {
    "vocab_size": Range("int", 1, _BIG, "32000"),
    "hidden": Range("int", 1, 10**6, "4096"),
    "n_layers": Range("int", 1, 10_000, "32"),
    "n_heads": Range("int", 1, 10**5, "32"),
    "ffn_hidden": Range("int", 1, _BIG, "14336"),
    "max_seq_len": Range("int", 1, 10**8, "8192"),
    "n_kv_heads": Range("int", 1, 10**5, "8", nullable=True),
    "head_dim": Range("int", 1, 10**5, "128", nullable=True),
    "rope_theta": Range("number", 0, 1e15, "500000", open_low=True),
    "norm_eps": Range("number", 0, 1, "1e-5", open_low=True),
    "n_experts": Range("int", 0, 10**5, "8"),
    "top_k": Range("int", 0, 10**5, "2"),
    "expert_ffn_hidden": Range("int", 0, _BIG, "14336"),
    "n_shared_experts": Range("int", 0, 10**4, "1"),
    "n_dense_layers": Range("int", 0, 10_000, "1"),
    "q_lora_rank": Range("int", 0, 10**6, "1536"),
    "kv_lora_rank": Range("int", 0, 10**6, "512"),
    "qk_rope_head_dim": Range("int", 0, 10**5, "64"),
    "qk_nope_head_dim": Range("int", 0, 10**5, "128"),
    "v_head_dim": Range("int", 0, 10**5, "128"),
}

# Hardware: bytes, FLOP/s, bytes/s, seconds (an H100 is 8e10 B, 9.9e14 FLOP/s, 3.35e12 B/s).
HARDWARE_REQUIRED = [
    "memory_bytes",
    "peak_bf16_flops",
    "memory_bandwidth",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
]
HARDWARE_LIMITS = {
    "memory_bytes": Range("number", 0, 1e15, "80e9", open_low=True),
    "peak_bf16_flops": Range("number", 0, 1e18, "989.4e12", open_low=True),
    "memory_bandwidth": Range("number", 0, 1e15, "3.35e12", open_low=True),
    "intra_node_bandwidth": Range("number", 0, 1e15, "450e9", open_low=True),
    "inter_node_bandwidth": Range("number", 0, 1e15, "50e9", open_low=True),
    "devices_per_node": Range("int", 1, 1024, "8"),
    "intra_node_latency": Range("number", 0, 1, "3e-6"),
    "inter_node_latency": Range("number", 0, 1, "1e-5"),
    "achievable_flops_fraction": Range("number", 0, 1, "0.5", open_low=True),
}


_JSON_NAMES = {dict: "object", str: "string", bool: "true or false", type(None): "null", list: "list"}


def check_types(where: str, values: dict, types: dict) -> None:
    """Refuse a field of the wrong JSON type (``types``: name -> a type or a tuple of them)."""
    for name, kind in types.items():
        if name in values and not isinstance(values[name], kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            what = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
            raise ValueError(f"{where}: {name} must be a JSON {what}, got {shown(values[name])}")
