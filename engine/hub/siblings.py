"""Which companion GGUF goes with a model: llama.cpp's pairing rule, as pure functions on names.

A repository (or a folder) holding `gemma-3-4b-it-Q4_K_M.gguf` may also hold projectors
(`mmproj-F16.gguf`, `mmproj-Q8_0.gguf`) or draft heads. llama.cpp's -hf picks one of them with
common/download.cpp find_best_sibling; the engine (engine/hub/client.py, for -hf) and the app
(app/vision_files.py, for a model's folder) both pair with `best_sibling` below, so they agree.

The rule, over the `.gguf` paths whose text contains `keyword` (case-sensitive, as llama.cpp's):
  1. the sibling's directory must be the model's or one above it; the deepest wins;
  2. then, with a tag ("Q4_K_M", from -hf user/repo:Q4_K_M), a name holding "-<TAG>." wins;
  3. then the quantisation bits closest to the tag's, or without a tag to the model file's;
  4. then the first listed.
llama.cpp asks for the mmproj without the tag (find_best_mmproj): the model's own name decides,
so `best_mmproj` does the same.

The quantisation tag is the name's last `-`/`.`-separated word (llama.cpp get_gguf_split_info's
re_tag) once `.gguf` and a split suffix (`-00001-of-00003`) are taken off; its bits are the number
the tag's first digit starts (Q4_K_M -> 4, F16 -> 16, IQ4_XS -> 4, BF16 -> 16), 0 without one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MMPROJ = "mmproj"

_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)  # llama.cpp's re_tag
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)  # its re_split
_BITS = re.compile(r"\d+")


def quant_tag(path: str) -> str:
    """The quantisation tag of a GGUF name ("Q4_K_M", "F16"), upper case; '' when there is none
    or the name is not a .gguf."""
    if not path.lower().endswith(".gguf"):
        return ""
    stem = path[: -len(".gguf")]
    split = _SPLIT.match(stem)
    m = _TAG.search(split.group(1) if split else stem)
    return m.group(1).upper() if m else ""


def tag_bits(tag: str) -> int:
    """The number the tag's first digit starts: Q4_K_M -> 4, F16 -> 16, 0 without a digit."""
    m = _BITS.search(tag)
    return int(m.group()) if m else 0


def quant_bits(path: str) -> int:
    """`tag_bits` of the name's quantisation tag (llama.cpp extract_quant_bits)."""
    return tag_bits(quant_tag(path))


def is_sibling(path: str, keyword: str = MMPROJ) -> bool:
    """Whether `path` is a `keyword` GGUF, a candidate of best_sibling (before the directory
    rule)."""
    return path.endswith(".gguf") and keyword in path


def _dirs(path: str) -> list[str]:
    return path.split("/")[:-1]


def best_sibling(
    files: Sequence[str], model_path: str, keyword: str = MMPROJ, tag: str = ""
) -> str | None:
    """Of `files` (paths in a repository, '/'-separated), the `keyword` GGUF llama.cpp's
    find_best_sibling pairs with the model at `model_path` (rule in the module docstring);
    None when no file qualifies."""
    tag = tag.upper()
    model_bits = tag_bits(tag) if tag else quant_bits(model_path)
    model_dirs = _dirs(model_path)
    best: str | None = None
    best_key: tuple[int, bool, int] | None = None  # (depth, exact, -diff): larger is better
    for f in files:
        if not is_sibling(f, keyword):
            continue
        sib_dirs = _dirs(f)
        if model_dirs[: len(sib_dirs)] != sib_dirs:
            continue  # not in the model's directory nor one above it
        exact = bool(tag) and f"-{tag}." in f.upper()
        key = (len(sib_dirs), exact, -abs(quant_bits(f) - model_bits))
        if best_key is None or key > best_key:  # strictly better: the first listed keeps a tie
            best, best_key = f, key
    return best


def best_mmproj(files: Sequence[str], model_path: str) -> str | None:
    """The projector llama.cpp's -hf downloads for `model_path` (find_best_mmproj: no tag, the
    model's own quantisation decides)."""
    return best_sibling(files, model_path, MMPROJ)
