"""Split GGUF sets (llama.cpp's gguf-split): several files that load as one model.

A set is named `<prefix>-00001-of-0000N.gguf` ... `<prefix>-0000N-of-0000N.gguf`. Every file is
a complete GGUF; the first holds all the metadata and some tensors, the others hold only the
`split.*` keys and their tensors. Each file carries

    split.no (u16)             its index, 0-based
    split.count (u16)          N
    split.tensors.count (i32)  tensors in the whole set

`open_gguf(path)` opens a plain file as GGUFFile and a set (given its first file) as one
SplitGGUFFile: the first file's metadata, every file's tensors, one map per file. Each file is
validated by GGUFFile like any other; the checks here follow llama.cpp's llama_model_loader
(load from the first file, every part present, indices and counts consistent, no tensor twice).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from .errors import GGUFError
from .gguf_file import GGUFFile, closing_on_error

KEY_SPLIT_NO = "split.no"
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS = "split.tensors.count"

_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def split_name(prefix: str, index: int, count: int) -> str:
    """llama.cpp's llama_split_path: part `index` (0-based) of `count`."""
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf"


def parse_split_name(name: str) -> tuple[str, int, int] | None:
    """(prefix, index 0-based, count) of a split file name, None for any other name."""
    m = _SPLIT_NAME.match(name)
    if m is None or int(m["count"]) < 1 or not 1 <= int(m["no"]) <= int(m["count"]):
        return None
    return m["prefix"], int(m["no"]) - 1, int(m["count"])


def split_paths(path: str | os.PathLike) -> list[Path]:
    """Every file of the set `path` belongs to (just `path` when its name is not a split name)."""
    p = Path(path)
    parsed = parse_split_name(p.name)
    if parsed is None:
        return [p]
    prefix, _, count = parsed
    return [p.with_name(split_name(prefix, i, count)) for i in range(count)]


class SplitGGUFFile(GGUFFile):
    """A split set as one GGUFFile: the first file's metadata, the tensors of every file.

    `path` is the first file's, `paths` all of them; tensor views point into each file's own
    map, so nothing is copied. `close()` closes every file.
    """

    def __init__(self, path: str | os.PathLike):
        self.shards: list[GGUFFile] = []  # before the base opens: its failure path calls close()
        super().__init__(path)
        self.paths = [Path(self.path)]
        with closing_on_error(self):
            self._open_set()

    def _open_set(self) -> None:
        count = self.get_int(KEY_SPLIT_COUNT, 1)
        no = self.get_int(KEY_SPLIT_NO, 0)
        if no != 0:
            first = split_paths(self.path)[0].name
            raise GGUFError(
                f"{self.path}: this is part {no + 1} of a {count}-part split model; "
                f"load it from its first part ({first})"
            )
        if count > 1:
            self._open_shards(count)

    def _open_shards(self, count: int) -> None:
        parsed = parse_split_name(Path(self.path).name)
        if parsed is None or parsed[2] != count:
            raise GGUFError(
                f"{self.path}: {KEY_SPLIT_COUNT} is {count}, but the file name does not follow the "
                f"split naming <prefix>-00001-of-{count:05d}.gguf, so the other parts cannot be found"
            )
        prefix = parsed[0]
        for i in range(1, count):
            shard_path = Path(self.path).with_name(split_name(prefix, i, count))
            if not shard_path.is_file():
                raise GGUFError(f"{self.path}: part {i + 1} of {count} is missing: {shard_path}")
            shard = _Shard(shard_path, self.arch)
            self.shards.append(shard)
            self.paths.append(shard_path)
            _check_shard(shard, i, count)
            for name, info in shard.tensors.items():
                if name in self.tensors:
                    raise GGUFError(
                        f"{shard_path}: tensor '{name}' is also in another part of the set"
                    )
                self.tensors[name] = info
        expected = self.get_int(KEY_SPLIT_TENSORS, None)
        if expected is not None and expected != len(self.tensors):
            raise GGUFError(
                f"{self.path}: the set holds {len(self.tensors)} tensors, {KEY_SPLIT_TENSORS} says {expected}"
            )

    @property
    def total_size(self) -> int:
        return self.file_size + sum(s.file_size for s in self.shards)

    def maps(self) -> list[np.ndarray]:
        return super().maps() + [m for s in self.shards for m in s.maps()]

    def close(self) -> None:
        for shard in self.shards:
            shard.close()
        super().close()

    def __repr__(self) -> str:
        return f"SplitGGUFFile({self.path!r}, {len(self.paths)} files, {len(self.tensors)} tensors)"


class _Shard(GGUFFile):
    """A part after the first: it holds only the split.* keys besides its tensors, so it has no
    general.architecture, which GGUFFile requires of a model file; the set's is lent to it."""

    def __init__(self, path: Path, arch: str):
        self._set_arch = arch
        super().__init__(path)

    def _parse_kv(self, cur, n_kv):
        out = super()._parse_kv(cur, n_kv)
        values = out[0] if isinstance(out, tuple) else out  # (values, value types) or values
        if "general.architecture" not in values:
            values["general.architecture"] = self._set_arch
            if isinstance(out, tuple):
                from gguf import GGUFValueType

                out[1]["general.architecture"] = (GGUFValueType.STRING, None)
        return out


def _check_shard(shard: GGUFFile, index: int, count: int) -> None:
    no = shard.get_int(KEY_SPLIT_NO, None)
    n = shard.get_int(KEY_SPLIT_COUNT, None)
    if no != index or n != count:
        raise GGUFError(
            f"{shard.path}: expected part {index + 1} of {count}, the file says "
            f"{KEY_SPLIT_NO}={no}, {KEY_SPLIT_COUNT}={n}"
        )


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """GGUFFile for a plain file, SplitGGUFFile for the first file of a split set.

    Raises:
        GGUFError: any file is bad, a part is missing, or `path` is not the set's first file
            (llama.cpp's rule: a split model is loaded from its first file).
    """
    parsed = parse_split_name(Path(path).name)
    if parsed is not None and parsed[1] > 0:
        raise GGUFError(
            f"{os.fspath(path)}: part {parsed[1] + 1} of a {parsed[2]}-part split model; "
            f"load it from its first part ({split_paths(path)[0].name})"
        )
    if parsed is not None:
        return SplitGGUFFile(path)
    f = GGUFFile(path)
    count = f.get_int(KEY_SPLIT_COUNT, 1)
    if count > 1:
        f.close()
        raise GGUFError(
            f"{f.path}: part of a {count}-part split model, but the file was renamed: the parts "
            "are found by their names, <prefix>-00001-of-0000N.gguf ..."
        )
    return f


def files_size(f: GGUFFile) -> int:
    """Bytes on disk of `f` and, for a split set, of all its parts."""
    return f.total_size if isinstance(f, SplitGGUFFile) else f.file_size
