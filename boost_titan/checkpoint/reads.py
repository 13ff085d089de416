"""DCP's own loads through the checkpoint allowlist, without patching torch: a storage reader
and a load planner, passed to each `dcp.load`.

- `GuardedReader(path, metadata)`: `FileSystemReader` whose `.metadata` is the one already
  read and checked (`files.check_readable`: parsed once per load), or read through the
  allowlist when none is given.
- `GuardedPlanner`: `DefaultLoadPlanner` whose byte items (`torch.save` archives) unpickle
  through the allowlist, and whose every bytes value inside one (TorchTitan's dataloader
  state, which its loader later hands to `pickle.loads`) is unpickled through it first.
"""

from __future__ import annotations

import io
from typing import Any

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from .safe_load import MAX_PICKLE_BYTES, UnsafeCheckpoint, load_saved, unpickle, vet_value


class GuardedReader(FileSystemReader):
    """`FileSystemReader` that reads no pickle outside the allowlist: its `.metadata` is
    `metadata` when given (already read through it), else read through it here."""

    def __init__(self, path: str, metadata: Metadata | None = None) -> None:
        super().__init__(path)
        self.known = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = self.known
        if metadata is None:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as file:
                try:
                    metadata = unpickle(file.read(MAX_PICKLE_BYTES + 1))
                except UnsafeCheckpoint as e:
                    raise e.at(str(path)) from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class GuardedPlanner(DefaultLoadPlanner):
    """`DefaultLoadPlanner` whose byte items, and the pickle in every bytes value of one,
    go through the allowlist before anything receives them."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            loaded = load_saved(value)
            vet_value(loaded)
        except UnsafeCheckpoint as e:
            raise e.at(f"item {fqn}") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
