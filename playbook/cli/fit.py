"""``playbook memory``'s model (a preset or a Hugging Face config.json) and its verdict on a device:
whether the most loaded rank's bytes fit the share of the device's memory the planner allows
(``theory.plan.planner.MEM_UTIL`` of ``Hardware.capacity_bytes``, what the driver reports)."""

from __future__ import annotations

from playbook.cli.checks import BadInput
from playbook.config import ModelConfig
from playbook.hardware import Hardware

DEFAULT_MODEL = "llama-3.1-8b"


def memory_model(args) -> ModelConfig:
    """``--model`` or ``--hf-config`` (not both); neither: the default preset."""
    if args.model and args.hf_config:
        raise BadInput(f"--model {args.model} and --hf-config {args.hf_config} both name the model; give one of them")
    if args.hf_config:
        return ModelConfig.from_hf_config(args.hf_config)
    return ModelConfig.preset(args.model or DEFAULT_MODEL)


def device_fit(hardware: str, totals: dict[str, float], mem_util: float) -> dict:
    """For each of ``totals`` (bytes on the most loaded rank), whether it fits ``mem_util`` of the
    device ``hardware`` and by what margin (negative: over); ``mem_util`` is in range
    (``cli.checks.LIMITS``, checked before any command runs)."""
    hw = Hardware.preset(hardware)
    allowed = mem_util * hw.capacity_bytes
    out = {"hardware": hw.name, "capacity_bytes": hw.capacity_bytes, "mem_util": mem_util, "allowed_bytes": allowed}
    for what, total in totals.items():
        out[what] = {"fits": total <= allowed, "margin_bytes": allowed - total}
    return out
