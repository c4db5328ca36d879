"""``playbook checkpoint inspect DIR``: what a checkpoint holds, read from its DCP metadata alone.

Per tensor: its global shape, dtype, how many chunks, which ranks wrote them, bytes; per rank: the
chunks and tensor bytes in its file (``dcp_io.written_bytes``) and the file's size on disk.
"""

from __future__ import annotations

from pathlib import Path

from playbook.parallel.checkpoint.dcp_io import file_bytes, metadata
from playbook.parallel.checkpoint.session import read_meta, resolve


def inspect(path: str | Path) -> dict:
    """{"meta": playbook.json, "tensors": [row per tensor], "ranks": [row per rank]} of the checkpoint ``path`` names."""
    path = resolve(path)
    md = metadata(path)
    writer = {idx: int(Path(info.relative_path).name.split("_")[2]) for idx, info in md.storage_data.items()}
    tensors, ranks = [], {}
    for fqn, t in sorted(md.state_dict_metadata.items()):
        size = t.properties.dtype.itemsize
        by = sorted({r for idx, r in writer.items() if idx.fqn == fqn})
        nbytes = sum(c.sizes.numel() * size for c in t.chunks)
        tensors.append(
            {
                "tensor": fqn,
                "shape": tuple(t.size),
                "dtype": str(t.properties.dtype).replace("torch.", ""),
                "chunks": len(t.chunks),
                "ranks": by,
                "bytes": nbytes,
            }
        )
        for c in t.chunks:
            r = next(r for idx, r in writer.items() if idx.fqn == fqn and tuple(idx.offset) == tuple(c.offsets))
            row = ranks.setdefault(r, {"rank": r, "chunks": 0, "tensor_bytes": 0})
            row["chunks"] += 1
            row["tensor_bytes"] += c.sizes.numel() * size
    files = file_bytes(path)
    per_rank = [ranks[r] | {"file_bytes": files.get(r, 0)} for r in sorted(ranks)]
    return {"path": str(path), "meta": read_meta(path), "tensors": tensors, "ranks": per_rank}


def table(info: dict, *, all_steps: bool = False) -> str:
    """``inspect``'s answer as text tables (AdamW's per-parameter steps folded into one row unless ``all_steps``)."""
    meta = info["meta"]
    layout = meta["layout"]
    w = max([len(r["tensor"]) for r in info["tensors"]] + [34])
    lines = [
        f"{info['path']}: {meta['model']} after step {meta['step']}, saved by {meta['world']} rank(s) "
        f"(dp{layout['dp']} tp{layout['tp']} pp{layout['pp']} cp{layout['cp']} ep{layout['ep']} zero {layout.get('zero', 0)})",
        f"{'tensor':<{w}} {'global shape':<14} {'dtype':<8} {'chunks':>6}  {'written by ranks':<18} {'bytes':>10}",
    ]
    rows = info["tensors"]
    steps = [r for r in rows if r["tensor"].startswith("optim/step/")]
    if not all_steps and steps:
        rows = [r for r in rows if r not in steps]
    for r in rows:
        shape = "×".join(map(str, r["shape"])) or "scalar"
        lines.append(
            f"{r['tensor']:<{w}} {shape:<14} {r['dtype']:<8} {r['chunks']:>6}  {_ranks(r['ranks']):<18} {r['bytes']:>10,}"
        )
    if not all_steps and steps:
        writers = sorted({x for r in steps for x in r["ranks"]})
        total = sum(r["bytes"] for r in steps)
        lines.append(
            f"{'optim/step/* (one per parameter)':<{w}} {'scalar':<14} {'float32':<8} {len(steps):>6}  {_ranks(writers):<18} {total:>10,}"
        )
    lines.append(f"{'rank':>4} {'chunks':>7} {'tensor bytes':>13} {'file bytes':>11}")
    for r in info["ranks"]:
        lines.append(f"{r['rank']:>4} {r['chunks']:>7} {r['tensor_bytes']:>13,} {r['file_bytes']:>11,}")
    total = sum(r["tensor_bytes"] for r in info["ranks"])
    lines.append(
        f"{'all':>4} {sum(r['chunks'] for r in info['ranks']):>7} {total:>13,} {sum(r['file_bytes'] for r in info['ranks']):>11,}"
    )
    return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> "0-3, 5"."""
    out, run = [], []
    for r in ranks:
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)
