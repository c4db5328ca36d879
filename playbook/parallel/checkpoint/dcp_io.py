"""Our pieces, as PyTorch's distributed checkpoint (DCP) reads and writes them.

A tensor that a rank holds as several rectangles of the whole (a ZeRO flat slice cut at parameter
boundaries, a tensor-parallel shard, nothing at all) is a :class:`Chunks`: the full shape and a
list of (global offsets, local tensor). DCP asks each state-dict value for its write items and its
chunk list (the ``__create_write_items__`` / ``__create_chunk_list__`` protocol DTensor uses), so a
``Chunks`` is written piece by piece, each under its offsets, and read back by any other set of
rectangles: DCP's planner intersects what a rank asks for with what the checkpoint holds
(``create_read_items_for_chunk_list``) and copies each overlap into a view of the rank's own
tensors. Resharding is DCP's job, as in torchtitan (Liang et al. 2024, arXiv:2410.06511, §3.4).

Every key appears on exactly one writer (``theory.checkpoint.writes``), so DCP's own deduplication
never chooses a rank; its global plan check then refuses any overlap or gap in what was written.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.utils import find_state_dict_object


class Chunks:
    """Tensor pieces of one global tensor of ``shape``: [(offsets, tensor)], each tensor the piece's
    storage (a view into a rank's flat buffer, optimizer state, or parameter: DCP reads into it in place)."""

    def __init__(self, shape, pieces):
        self.shape = torch.Size(shape)
        self.pieces = [(torch.Size(o), t) for o, t in pieces]

    def __create_write_items__(self, fqn: str, _obj) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, o),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=o, sizes=t.shape),
                    properties=TensorProperties.create_from_tensor(t),
                    size=self.shape,
                ),
            )
            for o, t in self.pieces
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=o, sizes=t.shape) for o, t in self.pieces]

    def find(self, offset) -> torch.Tensor:
        offset = torch.Size(offset)
        return next(t for o, t in self.pieces if o == offset)

    def snapshot(self) -> "Chunks":
        """The same pieces copied (what an asynchronous save writes while training moves on)."""
        return Chunks(self.shape, [(o, t.detach().clone()) for o, t in self.pieces])


def _lookup(state: dict, index: MetadataIndex):
    """The local tensor of a write or read item: a piece of a ``Chunks``, or (a DTensor's shard, a
    plain tensor) what DCP's own planners find (``checkpoint.native``'s state dicts)."""
    obj = state[index.fqn]
    return obj.find(index.offset) if isinstance(obj, Chunks) else find_state_dict_object(state, index)


class _Save(DefaultSavePlanner):
    def __init__(self):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def lookup_object(self, index):
        return _lookup(self.state_dict, index)


class _Load(DefaultLoadPlanner):
    def __init__(self):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        # DefaultLoadPlanner's meta-tensor pass would drop objects it does not know (our Chunks)
        self.original_state_dict = self.state_dict = state_dict
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def lookup_tensor(self, index):
        return _lookup(self.state_dict, index)


class _Staged:
    """An async stager for a state dict that is already a snapshot (``Chunks.snapshot``)."""

    _synchronize_after_execute = False
    should_synchronize_after_execute = False

    def stage(self, state_dict):
        return state_dict

    def synchronize_staging(self):
        pass

    def close(self):
        pass


def write(state: dict, path: str | Path, group=None) -> float:
    """Write ``state`` ({key: Chunks}) to the folder ``path`` with DCP; returns the seconds it took."""
    t0 = time.perf_counter()
    dcp.save(state, storage_writer=FileSystemWriter(str(path)), planner=_Save(), process_group=group)
    return time.perf_counter() - t0


def write_async(state: dict, path: str | Path, group):
    """Start writing a snapshot of ``state`` with ``dcp.async_save`` on ``group`` (its own gloo
    group, so that its collectives never meet training's): (future, seconds the caller was blocked)."""
    t0 = time.perf_counter()
    snap = {k: v.snapshot() for k, v in state.items()}
    future = dcp.async_save(
        snap, storage_writer=FileSystemWriter(str(path)), planner=_Save(), process_group=group, async_stager=_Staged()
    )
    return future, time.perf_counter() - t0


class CountingReader(FileSystemReader):
    """DCP's file-system reader, counting what this rank's load plan reads (measured, per rank):
    ``asked`` the bytes copied into the rank's tensors (each read item's overlap), ``read`` the tensor
    bytes of the stored chunks read (the reader loads each item's chunk whole, then narrows it),
    ``file`` the bytes of the file read for them (``torch.save`` framing included), ``items``."""

    def __init__(self, path):
        super().__init__(str(path))
        self.counts = {"asked": 0, "read": 0, "file": 0, "items": 0}

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.md = metadata
        return super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    def read_data(self, plan, planner):
        c = self.counts
        for item in plan.items:
            meta = self.md.state_dict_metadata[item.dest_index.fqn]
            size = getattr(meta, "properties", None)
            itemsize = size.dtype.itemsize if size is not None else 1
            stored = next(ch for ch in meta.chunks if ch.offsets == item.storage_index.offset)
            c["asked"] += _prod(item.lengths) * itemsize
            c["read"] += _prod(stored.sizes) * itemsize
            c["file"] += self.storage_data[item.storage_index].length
            c["items"] += 1
        return super().read_data(plan, planner)


def _prod(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def read(state: dict, path: str | Path, group=None) -> tuple[float, dict]:
    """Read the checkpoint at ``path`` into ``state``'s tensors, in place: (seconds it took, this
    rank's ``CountingReader.counts``)."""
    t0 = time.perf_counter()
    reader = CountingReader(path)
    dcp.load(state, storage_reader=reader, planner=_Load(), process_group=group)
    return time.perf_counter() - t0, reader.counts


def metadata(path: str | Path):
    """The checkpoint's DCP metadata: every key's global size and chunks, and where each chunk lies."""
    return FileSystemReader(str(path)).read_metadata()


def written_bytes(path: str | Path) -> dict[int, int]:
    """Measured: per rank, the tensor bytes its file holds, from the sizes DCP recorded for each chunk
    it stored there (the file itself adds torch.save's framing per chunk, ``file_bytes``)."""
    md = metadata(path)
    out: dict[int, int] = {}
    for index, info in md.storage_data.items():
        tensor = md.state_dict_metadata[index.fqn]
        chunk = next(c for c in tensor.chunks if c.offsets == index.offset)
        rank = int(Path(info.relative_path).name.split("_")[2])  # "__{rank}_0.distcp"
        out[rank] = out.get(rank, 0) + chunk.sizes.numel() * tensor.properties.dtype.itemsize
    return out


def file_bytes(path: str | Path) -> dict[int, int]:
    """Per rank, the size of its file on disk."""
    return {int(f.name.split("_")[2]): f.stat().st_size for f in Path(path).glob("__*_*.distcp")}
