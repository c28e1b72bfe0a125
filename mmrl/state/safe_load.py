"""Reading checkpoint files without running code from them.

A pickle can call any importable function while it loads, so a checkpoint someone else wrote must never
reach `pickle.load` or `torch.load(weights_only=False)`. Every file a checkpoint load opens goes through
one of three readers: safetensors (weights), `load_pt` (torch's weights-only unpickler: tensors and plain
containers; optimizer, scheduler and RNG states) and `SafeReader` (the metadata of a sharded
`torch.distributed.checkpoint` folder, which torch itself reads with plain `pickle.load`, through an
unpickler that admits only the checkpoint metadata's own classes). A file that needs anything else
raises `UnsafeCheckpoint` naming the file and what it asked to import.
"""

from __future__ import annotations

import io
import os
import pickle

import torch

from mmrl.errors import ConfigError


class UnsafeCheckpoint(ConfigError):
    """A checkpoint file asks to import something a weights-only loader refuses (exit code 2)."""


def _refuse(path: str, what: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(f"checkpoint file {path!r} is not a plain weights file: {what}. mmrl never unpickles "
                            "code from a checkpoint; if you wrote this file with mmrl, it is damaged; otherwise do "
                            "not load it")


def _legacy_numpy_globals() -> list:
    """numpy's pieces of an RNG state pickled by mmrl before its RNG file held plain containers."""
    import numpy as np

    found = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            found.append(getattr(__import__(mod, fromlist=["_reconstruct"]), "_reconstruct"))
        except (ImportError, AttributeError):
            continue
    return found


def load_pt(path: str, *, legacy_numpy: bool = False):
    """`torch.load(path, weights_only=True)` on CPU; `legacy_numpy` also admits numpy arrays (RNG files of older
    mmrl checkpoints). A file the weights-only unpickler refuses raises UnsafeCheckpoint naming it."""
    allowed = _legacy_numpy_globals() if legacy_numpy else []
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if "Unsupported" in ln or "unpickler error" in ln.lower()]
        raise _refuse(path, (lines[0] if lines else " ".join(str(e).split()))[:300]) from None


# module prefixes and names a torch.distributed.checkpoint `.metadata` pickle may import
_DCP_MODULES = ("torch.distributed.checkpoint.",)
_DCP_NAMES = {("torch", "Size"), ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
              ("builtins", "slice"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
              ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath")}
_DTYPES = {str(t).removeprefix("torch.") for t in vars(torch).values() if isinstance(t, torch.dtype)}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: str):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        ok = (module.startswith(_DCP_MODULES) or (module, name) in _DCP_NAMES
              or (module == "torch" and (name in _DTYPES or name.endswith("_format") or name == "layout")))
        if not ok:
            raise _refuse(self.path, f"its metadata imports {module}.{name}")
        return super().find_class(module, name)


def read_dcp_metadata(path: str):
    """The `Metadata` object of a `.metadata` file, unpickled with only checkpoint-metadata classes allowed."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return _MetadataUnpickler(io.BytesIO(data), path).load()
    except UnsafeCheckpoint:
        raise
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError) as e:
        raise _refuse(path, f"its metadata does not unpickle ({e})") from None


def safe_reader(folder: str):
    """A `FileSystemReader` of `folder` whose metadata goes through `read_dcp_metadata` (tensor data is read
    as raw bytes, other items with torch's weights-only loader, as torch does); a refused `.metadata` raises
    UnsafeCheckpoint here."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            rank = kwargs.get("rank")
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            metadata = read_dcp_metadata(os.path.join(str(self.path), name))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    metadata = os.path.join(folder, ".metadata")
    if os.path.isfile(metadata):
        read_dcp_metadata(metadata)  # refused here, by name (torch's loader would wrap the error in its own)
    return SafeReader(folder)
