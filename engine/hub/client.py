"""GGUF models from the Hugging Face Hub: search, pick a quant, download into the HF cache.

    search(text, limit=20, token=None) -> list[HubRepo]        one API call; file sizes unknown
    repo(repo_id, token=None, revision="main") -> HubRepo      one API call; sizes, sha256, commit
    resolve("user/repo[:quant]", filename=None, token=None) -> HubFile
    resolve_with_mmproj(same) -> (HubFile, HubFile | None)    the model and the repo's projector
    download(file, token=None, progress=None, cancel=None) -> Path   (first part of the set)
    cached_models() -> list[HubFile]                           complete GGUFs in the HF cache
    remove_cached(file) -> bool                                its links and blobs out of the cache

Quant choice follows llama.cpp (common/download.cpp find_best_model): the tag is matched
case-insensitively as `<tag>[.-]` in the file's path; without a tag Q4_K_M, then Q8_0, then the
first model file. mmproj/imatrix/draft files are not models: a listing keeps them apart as
`HubRepo.companions`, and the projector that goes with a model is llama.cpp's pick
(engine/hub/siblings.py). A split set (`-00001-of-0000N.gguf`) is one file, chosen by its first
part.

Whether a file would load here, from its header alone before any download, is engine/hub/fit.py's
remote_fit, on top of this module; what every request shares (endpoint, timeout, errors) is
engine/hub/session.py's.

The cache is huggingface_hub's (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub;
read at each call): `models--user--repo/blobs/<sha256>`, `snapshots/<commit>/<path>` symlinks,
`refs/main`. Files already there are used in place. With HF_HUB_OFFLINE=1, or when the Hub
cannot be reached, names resolve from the cached snapshot.

huggingface_hub does the API calls, the HTTP session (proxies, user agent, token lookup:
HF_TOKEN or `hf auth login`) and the error classification. The transfer itself is ours, as in
llama.cpp: hf_hub_download (2.x) deletes a partial file when a download fails and has no cancel
hook, while a model of several GB must survive a dropped connection, a cancel and a restart.
So each blob streams into `blobs/<sha256>.incomplete`, resumes from its length with a Range
request, is checked against the Hub's size and sha256, and only then is renamed into place and
linked from the snapshot: a model path never names a partial file.

Every name from a listing or a request is a path under the cache, so none is trusted: a repo id
follows the Hub's rules, a commit is 40 hex digits, a file name is a relative POSIX path without
'..' (check_filename); a listing that breaks them is refused whole. Before anything is created
or deleted, its directory is resolved, links followed, and must stay inside the repository's
directory of the cache; a cached link counts only when it leads into that repository's blobs/.
So a hostile listing or a link planted in the cache never writes, lists or deletes outside it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path, PureWindowsPath
from typing import Any

from ..errors import HubError
from ..gguf_split import parse_split_name
from .session import (
    TIMEOUT_S,
    cache_dir,
    endpoint,
    hub_errors,
    offline,
    transport_errors,
    unreachable,
)
from .siblings import best_mmproj

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (bytes done, bytes total) over all parts

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")  # llama.cpp's order when no tag is given
# basename markers of GGUFs that are not a model to chat with (llama.cpp gguf_filename_is_model)
NOT_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")

_CHUNK = 1 << 20
_RETRIES = 5  # reconnects within one download() when the transfer breaks off
_RETRY_PAUSE_S = 0.5
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"  # the Hub's: 1-96 chars, no '-'/'.' at the ends
_REPO_ID = re.compile(f"{_NAME}/{_NAME}")
_COMMIT = re.compile(r"[0-9a-fA-F]{40}")
_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")  # a branch or tag the cache keeps in refs/
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")  # control characters and backslashes


@dataclass(frozen=True)
class HubPart:
    """One file of a model in a repository."""

    filename: str  # path in the repository
    size: int | None  # bytes; None when the listing did not say (search results)
    sha256: str | None = None  # LFS files: the content's sha256, which names the cached blob
    blob_id: str | None = None  # git blob id (names the blob of a non-LFS file)


@dataclass(frozen=True)
class HubFile:
    """A model in a repository: one GGUF, or a split set that loads as one model.

    Attributes:
        repo_id: "user/repo".
        filename: path in the repository of the file, or of a split set's first part.
        quant: the quant tag from the name ("Q4_K_M"), upper case; None when there is none.
        parts: every file of the model in order; one for an unsplit GGUF.
        revision: the commit the listing came from ("main" before one is known).
        local_path: the first part in the HF cache, when every part is there.
    """

    repo_id: str
    filename: str
    quant: str | None
    parts: tuple[HubPart, ...]
    revision: str = "main"
    local_path: Path | None = None

    @property
    def size(self) -> int | None:
        """Bytes of all parts together; None when a size is unknown."""
        sizes = [p.size for p in self.parts]
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)

    @property
    def is_split(self) -> bool:
        return len(self.parts) > 1

    @property
    def spec(self) -> str:
        """What -hf takes to name this file: "user/repo:QUANT" (or just the repo, which is
        also what a companion such as an mmproj shows: -hf names models only)."""
        named = self.quant and is_model_file(self.filename)
        return f"{self.repo_id}:{self.quant}" if named else self.repo_id


@dataclass(frozen=True)
class HubRepo:
    """A model repository and its GGUF model files (split sets grouped)."""

    repo_id: str
    downloads: int = 0
    likes: int = 0
    last_modified: datetime | None = None
    gated: bool = False
    files: list[HubFile] = field(default_factory=list)
    commit: str | None = None  # None in search results
    # the GGUFs that are not models (mmproj, imatrix, draft heads), grouped as `files` are:
    # what -hf downloads beside a model (resolve_with_mmproj)
    companions: list[HubFile] = field(default_factory=list)


# -- names ------------------------------------------------------------------------------------


def parse_spec(spec: str) -> tuple[str, str | None]:
    """ "user/repo[:quant]" -> (repo_id, quant or None), as llama.cpp splits -hf.

    Raises:
        HubError: not of that form.
    """
    repo_id, _, tag = spec.strip().partition(":")
    if not is_repo_id(repo_id):
        raise HubError(
            f"invalid Hugging Face repo '{_shown(spec)}': expected <user>/<model>[:quant] "
            "(letters, digits, '-', '_', '.'; at most 96 each)",
            HubError.NOT_FOUND,
        )
    return repo_id, (tag.strip() or None)


def is_repo_id(repo_id: str) -> bool:
    """ "user/repo" by the Hub's rules (huggingface_hub validate_repo_id), with the namespace."""
    return (
        isinstance(repo_id, str)
        and bool(_REPO_ID.fullmatch(repo_id))
        and "--" not in repo_id
        and ".." not in repo_id
        and not repo_id.endswith(".git")
    )


def check_filename(name: str) -> str:
    """`name` when it is a safe path in a repository: relative, POSIX, no empty, '.' or '..'
    component, no backslash, control character or drive. Every name from a listing goes
    through here before it is joined to a cache path.

    Raises:
        HubError: HUB, naming it.
    """
    if (
        not isinstance(name, str)
        or not name
        or name.startswith("/")
        or _UNSAFE.search(name)
        or any(c in ("", ".", "..") for c in name.split("/"))
        or PureWindowsPath(name).drive
    ):
        raise HubError(
            f"unsafe file name '{_shown(name)}' (a path in a repository is relative, without '..')",
            HubError.HUB,
        )
    return name


def _shown(name: object) -> str:
    """`name` for a one-line message: escaped when it holds control characters."""
    text = str(name)
    return text if text.isprintable() else repr(text)[1:-1]


def split_info(path: str) -> tuple[str, str | None, int, int] | None:
    """(prefix, tag, index 1-based, count) of a .gguf path; None for other files
    (llama.cpp get_gguf_split_info)."""
    if not path.lower().endswith(".gguf"):
        return None
    parsed = parse_split_name(path)
    if parsed is not None:
        prefix, index, count = parsed[0], parsed[1] + 1, parsed[2]
    else:
        prefix, index, count = path[: -len(".gguf")], 1, 1
    m = _TAG.search(prefix)
    return prefix, (m.group(1).upper() if m else None), index, count


def is_model_file(path: str) -> bool:
    """A .gguf that is a model, not a projector, importance matrix or draft head."""
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(k in name for k in NOT_MODEL)


def group_files(
    repo_id: str, parts: list[HubPart], revision: str = "main", *, models: bool = True
) -> list[HubFile]:
    """The model files of a listing (with models=False: its other GGUFs, the companions), split
    sets grouped under their first part, in listing order. A set with a part missing from the
    listing is left out."""
    by_set: dict[tuple[str, int], dict[int, HubPart]] = {}
    for p in parts:
        info = split_info(p.filename)
        if info is None or is_model_file(p.filename) != models:
            continue
        prefix, _tag, index, count = info
        by_set.setdefault((prefix, count), {})[index] = p
    out = []
    for (_prefix, count), members in by_set.items():
        if sorted(members) != list(range(1, count + 1)):
            continue
        ordered = tuple(members[i] for i in range(1, count + 1))
        tag = split_info(ordered[0].filename)[1]  # type: ignore[index]
        out.append(HubFile(repo_id, ordered[0].filename, tag, ordered, revision))
    return out


def choose(
    files: list[HubFile], tag: str | None = None, filename: str | None = None, repo_id: str = ""
) -> HubFile:
    """The file -hf repo[:tag] / -hff filename names (llama.cpp's rules, module docstring).

    Raises:
        HubError: NO_GGUF (no model file), QUANT_NOT_FOUND (lists the tags there are),
            NOT_FOUND (no such -hff file).
    """
    repo = repo_id or (files[0].repo_id if files else "the repository")
    if not files:
        raise HubError(f"{repo} has no GGUF model files", HubError.NO_GGUF)
    if filename:
        for f in files:
            if any(p.filename.lower() == filename.lower() for p in f.parts[:1]):
                return f
        names = ", ".join(f.filename for f in files)
        raise HubError(f"{repo} has no file '{filename}' (GGUF files: {names})", HubError.NOT_FOUND)
    for t in [tag] if tag else DEFAULT_TAGS:
        pattern = re.compile(re.escape(t) + "[.-]", re.IGNORECASE)
        for f in files:
            if pattern.search(f.filename):
                return f
    if not tag:
        return files[0]
    tags = tuple(dict.fromkeys(f.quant for f in files if f.quant))
    raise HubError(
        f"{repo} has no '{tag}' file (quants there: {', '.join(tags) or 'none tagged'})",
        HubError.QUANT_NOT_FOUND,
        available=tags,
    )


# -- paths in the cache, checked (where the cache is: session.py) -----------------------------


def _repo_dir(repo_id: str) -> Path:
    """models--user--repo in the cache, checked to stay in it (a planted link may point out).

    Raises:
        HubError: NOT_FOUND for an invalid repo id, HUB when the directory leads out.
    """
    if not is_repo_id(repo_id):
        raise HubError(f"invalid Hugging Face repo '{_shown(repo_id)}'", HubError.NOT_FOUND)
    root = cache_dir()
    return _confined(root / ("models--" + repo_id.replace("/", "--")), root)


def _inside(path: Path, base: Path) -> bool:
    """Whether `path`, with every link on the way followed, is `base` or under it (resolved)."""
    real, top = os.path.realpath(path), os.path.realpath(base)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _confined(path: Path, base: Path) -> Path:
    """`path` when it stays inside `base`; the check before anything is created under it.

    Raises:
        HubError: HUB, it leads outside (a link planted in the cache).
    """
    if not _inside(path, base):
        raise HubError(
            f"{path} leads outside {base} (a link in the Hugging Face cache points out of "
            "it): refused",
            HubError.HUB,
        )
    return path


def _check_commit(commit: object, what: str) -> str:
    """A commit the Hub gave: 40 hex digits, which names a snapshot directory."""
    if not commit:
        raise HubError(f"{what}: the Hub gave no commit for it", HubError.HUB)
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise HubError(
            f"{what}: the Hub gave an invalid commit '{_shown(commit)}': refused", HubError.HUB
        )
    return commit


def _check_revision(revision: str) -> str:
    """A revision asked for: a commit or a branch/tag name that is one safe path component."""
    if not isinstance(revision, str) or not _REF.fullmatch(revision) or ".." in revision:
        raise HubError(f"invalid revision '{_shown(revision)}'", HubError.NOT_FOUND)
    return revision


# -- Hub calls --------------------------------------------------------------------------------


def _api(token: str | None):
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint(), token=token)


def _part(sibling: Any) -> HubPart:
    """One listed file; its name checked (check_filename) and its size a byte count or None."""
    lfs = getattr(sibling, "lfs", None)
    sha = (
        (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None))
        if lfs
        else None
    )
    size = getattr(sibling, "size", None)
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise HubError(
            f"invalid size '{_shown(size)}' for '{_shown(sibling.rfilename)}'", HubError.HUB
        )
    return HubPart(check_filename(sibling.rfilename), size, sha, getattr(sibling, "blob_id", None))


def _repo_from_info(info: Any, commit: str | None) -> HubRepo:
    """A listing as a HubRepo; a listing with an unsafe name (id, commit, file) is refused whole:
    the Hub never gives one, so the listing is not to be trusted.

    Raises:
        HubError: HUB, naming what is wrong.
    """
    if not is_repo_id(info.id):
        raise HubError(
            f"the Hub gave an invalid repository id '{_shown(info.id)}': refused", HubError.HUB
        )
    if commit is not None:
        _check_commit(commit, info.id)
    try:
        parts = [_part(s) for s in (info.siblings or [])]
    except HubError as e:
        raise HubError(f"{info.id}: the Hub listing has an {e}: refused", HubError.HUB) from None
    return HubRepo(
        repo_id=info.id,
        downloads=int(info.downloads or 0),
        likes=int(info.likes or 0),
        last_modified=info.last_modified,
        gated=bool(info.gated),
        files=group_files(info.id, parts, commit or "main"),
        commit=commit,
        companions=group_files(info.id, parts, commit or "main", models=False),
    )


def search(text: str, limit: int = 20, token: str | None = None) -> list[HubRepo]:
    """GGUF repositories matching `text`, most downloaded first: one API call.

    Each repo lists its model files with `size` None; `repo(repo_id)` gives the sizes.

    Raises:
        HubError: OFFLINE, AUTH or HUB.
    """
    if offline():
        raise HubError("cannot search the Hub: offline (HF_HUB_OFFLINE is set)", HubError.OFFLINE)
    from huggingface_hub import ModelInfo
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    # GET /api/models as HfApi.list_models sends it, but one request: list_models retries a
    # refused connection for ~20 s (its pagination backs off), and one page is all we show
    query: dict[str, str | int | list[str]] = {
        "search": text,
        "filter": "gguf",
        "sort": "downloads",
        "limit": limit,
        "expand": ["downloads", "likes", "lastModified", "gated", "siblings"],
    }
    with hub_errors(f"search '{text}'", token):
        r = get_session().get(
            f"{endpoint()}/api/models",
            params=query,
            headers=build_hf_headers(token=token),
            timeout=TIMEOUT_S,
        )
        hf_raise_for_status(r)
        found = [ModelInfo(**{"siblings": None, **item}) for item in r.json()[:limit]]
    out = []
    for m in found:
        try:
            out.append(_repo_from_info(m, None))
        except HubError as e:  # one hostile entry does not hide the others
            log.warning("search '%s': left out: %s", text, e)
    return out


def repo(repo_id: str, token: str | None = None, revision: str = "main") -> HubRepo:
    """A repository's GGUF model files with sizes and checksums, and its commit: one API call.

    Raises:
        HubError: OFFLINE, AUTH, NOT_FOUND or HUB.
    """
    if not is_repo_id(repo_id):
        raise HubError(f"invalid Hugging Face repo '{_shown(repo_id)}'", HubError.NOT_FOUND)
    _check_revision(revision)
    if offline():
        raise HubError(f"{repo_id}: offline (HF_HUB_OFFLINE is set)", HubError.OFFLINE)
    with hub_errors(repo_id, token):
        info = _api(token).model_info(repo_id, revision=revision, files_metadata=True)
        # a listing without its commit is not one to download from (nor is one for huggingface_hub)
        return _repo_from_info(info, info.sha if info.sha is not None else "")


# -- the cache --------------------------------------------------------------------------------


def _cached_snapshot(repo_id: str, revision: str = "main") -> tuple[str, Path] | None:
    """(commit, snapshot dir) of `revision` in the cache: refs/<revision>, else a commit hash.
    None when it is not there, or when a name or a link would lead out of the repository's
    directory (a ref that is not a commit, a snapshot that is a link elsewhere)."""
    try:
        rdir = _repo_dir(repo_id)
        _check_revision(revision)
    except HubError:
        return None
    ref = rdir / "refs" / revision
    commit = revision
    if _inside(ref, rdir / "refs"):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            commit = ref.read_text(encoding="utf-8").strip()
    if not _COMMIT.fullmatch(commit) and commit != revision:
        return None  # a ref holds a commit; anything else was not written by a Hub client
    snap = rdir / "snapshots" / commit
    return (commit, snap) if _inside(snap, rdir / "snapshots") and snap.is_dir() else None


def _cached_part(snap: Path, filename: str) -> Path | None:
    """snapshots/<commit>/<filename> when it is the cache's own: its directory inside the
    snapshot, and either a link into the repository's blobs/ or a plain file (a copy where
    symlinks are not allowed); None otherwise, or when it is not there."""
    try:
        check_filename(filename)
    except HubError:
        return None
    path = snap / filename
    if not _inside(path.parent, snap):
        return None
    blobs = snap.parent.parent / "blobs"
    if path.is_symlink() and not (_inside(blobs, blobs.parent) and _inside(path, blobs)):
        return None
    return path if path.is_file() else None


def _snapshot_ggufs(snap: Path) -> list[str]:
    """Paths of the .gguf entries under a snapshot, without entering linked directories."""
    found = []
    for top, _dirs, files in os.walk(snap):  # followlinks=False: a linked directory is not walked
        rel = Path(top).relative_to(snap)
        found += [(rel / name).as_posix() for name in files if name.endswith(".gguf")]
    return sorted(found, key=lambda name: name.split("/"))


def _local_files(repo_id: str, revision: str = "main", *, models: bool = True) -> list[HubFile]:
    """The model files (models=False: the companions) of a cached snapshot, each with
    local_path when all its parts are there."""
    found = _cached_snapshot(repo_id, revision)
    if found is None:
        return []
    commit, snap = found
    parts = []
    for name in _snapshot_ggufs(snap):
        path = _cached_part(snap, name)
        if path is not None:
            with contextlib.suppress(OSError):
                parts.append(HubPart(name, path.stat().st_size))  # stat follows the link
    return [
        replace(f, local_path=snap / f.filename)
        for f in group_files(repo_id, parts, commit, models=models)
    ]


def with_local_path(f: HubFile) -> HubFile:
    """`f` with local_path set when the cache has every part at the right size."""
    found = _cached_snapshot(f.repo_id, f.revision)
    if found is None:
        return f
    snap = found[1]
    for p in f.parts:
        local = _cached_part(snap, p.filename)
        try:
            if local is None or (p.size is not None and local.stat().st_size != p.size):
                return f
        except OSError:
            return f
    return replace(f, local_path=snap / f.filename)


def cached_models() -> list[HubFile]:
    """Every complete GGUF model in the HF cache (main, else any cached ref), by repo."""
    root = cache_dir()
    out: list[HubFile] = []
    with contextlib.suppress(OSError):
        for rdir in sorted(root.glob("models--*")):
            repo_id = rdir.name[len("models--") :].replace("--", "/")
            if (
                not is_repo_id(repo_id)
                or not _inside(rdir, root)
                or not _inside(rdir / "refs", rdir)
            ):
                continue
            refs = sorted(
                (p.name for p in (rdir / "refs").glob("*") if p.is_file()),
                key=lambda n: n != "main",
            )
            for ref in refs[:1]:
                out.extend(_local_files(repo_id, ref))
    return out


def remove_cached(file: HubFile) -> bool:
    """Deletes `file` from the cache: each part's snapshot link, and the blob it leads to when
    that blob is in the repository's blobs/. Nothing a link leads to elsewhere is deleted, nor
    anything under a linked directory. False when no part was there.
    """
    found = _cached_snapshot(file.repo_id, file.revision)
    if found is None:
        return False
    snap = found[1]
    rdir = snap.parent.parent
    blobs = os.path.realpath(rdir / "blobs") if _inside(rdir / "blobs", rdir) else None
    removed = False
    for part in file.parts:
        try:
            pointer = snap / check_filename(part.filename)
        except HubError:
            continue
        if not _inside(pointer.parent, snap):
            continue  # a linked directory: what is under it is not the cache's
        with contextlib.suppress(OSError):
            if pointer.is_symlink():
                target = os.path.realpath(pointer)
                pointer.unlink()  # the link itself; its target stays
                removed = True
                if (
                    blobs is not None
                    and os.path.dirname(target) == blobs
                    and os.path.isfile(target)
                    and not _still_linked(rdir / "snapshots", target)
                ):
                    os.unlink(target)
            elif pointer.is_file():  # a copy: the file is in the snapshot
                pointer.unlink()
                removed = True
    return removed


def _still_linked(snapshots: Path, blob: str) -> bool:
    """Whether another snapshot entry (another commit, another name) still links to `blob`:
    huggingface_hub shares a blob between the commits that hold the same file."""
    for top, _dirs, files in os.walk(snapshots):  # linked directories are not walked
        for name in files:
            path = os.path.join(top, name)
            if os.path.islink(path) and os.path.realpath(path) == blob:
                return True
    return False


# -- resolve ----------------------------------------------------------------------------------


def resolve(spec: str, filename: str | None = None, token: str | None = None) -> HubFile:
    """The model `user/repo[:quant]` (or -hff `filename`) names, with sizes and commit.

    Online this is one API call; offline (HF_HUB_OFFLINE=1, or the Hub unreachable) the names
    come from the cached snapshot. `local_path` is set when the file is complete in the cache.

    Raises:
        HubError: see `choose()`, plus OFFLINE (nothing cached), AUTH, NOT_FOUND, HUB.
    """
    return _resolve(spec, filename, token)[0]


def resolve_with_mmproj(
    spec: str, filename: str | None = None, token: str | None = None
) -> tuple[HubFile, HubFile | None]:
    """The model `resolve()` gives and, from the same listing, the projector llama.cpp's -hf
    downloads with it (siblings.best_mmproj: in the model's directory or one above, the
    quantisation closest to the model's); None when the repository has none. Offline, both
    come from the cached snapshot, so only a projector downloaded before is found.

    Raises:
        HubError: as resolve().
    """
    model, companions = _resolve(spec, filename, token)
    name = best_mmproj([c.filename for c in companions], model.filename)
    mmproj = next((c for c in companions if c.filename == name), None)
    return model, (with_local_path(mmproj) if mmproj is not None else None)


def _resolve(spec: str, filename: str | None, token: str | None) -> tuple[HubFile, list[HubFile]]:
    """(the model, the repository's companions) from one listing, or the cache's."""
    repo_id, tag = parse_spec(spec)
    if offline():
        return _resolve_cached(repo_id, tag, filename, "HF_HUB_OFFLINE is set")
    try:
        listing = repo(repo_id, token)
    except HubError as e:
        if e.reason != HubError.OFFLINE:
            raise
        return _resolve_cached(repo_id, tag, filename, str(e))
    return with_local_path(choose(listing.files, tag, filename, repo_id)), listing.companions


def _resolve_cached(
    repo_id: str, tag: str | None, filename: str | None, why: str
) -> tuple[HubFile, list[HubFile]]:
    files = _local_files(repo_id)
    if not files:
        raise HubError(
            f"{repo_id}: not in the cache {cache_dir()}, and the Hub cannot be used ({why})",
            HubError.OFFLINE,
        )
    return choose(files, tag, filename, repo_id), _local_files(repo_id, models=False)


# -- download ---------------------------------------------------------------------------------


def discard_partial(file: HubFile) -> None:
    """Deletes what an unfinished download() of `file` kept for resuming (a user's cancel, not
    a pause); complete blobs stay."""
    rdir = _repo_dir(file.repo_id)
    blobs = rdir / "blobs"
    if not _inside(blobs, rdir):
        return  # a linked blobs/: what is there is not the cache's
    for part in file.parts:
        if part.sha256 or part.blob_id:
            (blobs / f"{_blob_name(part)}.incomplete").unlink(missing_ok=True)


def download(
    file: HubFile,
    token: str | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Every part of `file` into the HF cache; returns the first part's path.

    Parts already cached are used in place. A transfer that breaks off reconnects and goes on
    from where it stopped (a few times); a cancel, or an error, keeps the partial blob, and the
    next call resumes it, in this process or another one.

    Args:
        file: from resolve() or repo() (a search result is looked up again for sizes).
        progress: called as progress(done, total) in bytes over all parts.
        cancel: when set, the download stops within a chunk and raises HubError(CANCELLED).

    Raises:
        HubError: OFFLINE, AUTH, NOT_FOUND, DISK_FULL, INTERRUPTED, CANCELLED, CORRUPT, HUB.
    """
    cached = with_local_path(file)
    if cached.local_path is not None:
        return cached.local_path
    if offline():
        raise HubError(f"{file.spec}: not in the cache and HF_HUB_OFFLINE is set", HubError.OFFLINE)
    if (
        file.revision == "main"
        or file.size is None
        or any(p.sha256 is None and p.blob_id is None for p in file.parts)
    ):
        listing = repo(file.repo_id, token, file.revision)
        file = choose(  # a projector is looked up among the companions
            listing.files + listing.companions, filename=file.filename, repo_id=file.repo_id
        )
    return _Downloader(file, token, progress, cancel).run()


class _Downloader:
    """The transfer of one model's parts into the cache (see the module docstring)."""

    def __init__(
        self,
        file: HubFile,
        token: str | None,
        progress: Progress | None,
        cancel: threading.Event | None,
    ):
        self.file = file
        self.token = token
        self.report = progress or (lambda done, total: None)
        self.cancel = cancel or threading.Event()
        self.total = file.size or 0
        self.base = 0  # bytes of the parts finished (or cached) so far
        self.rdir = _repo_dir(file.repo_id)
        self.snap = self.rdir / "snapshots" / _check_commit(file.revision, file.spec)
        # every directory written below, checked before the first byte moves
        for sub in ("blobs", "refs", "snapshots"):
            _confined(self.rdir / sub, self.rdir)
        _confined(self.snap, self.rdir / "snapshots")
        _confined(cache_dir() / ".locks" / self.rdir.name, cache_dir())
        for part in file.parts:
            self._pointer(part)

    def _pointer(self, part: HubPart) -> Path:
        """snapshots/<commit>/<path> of `part`, checked to stay in the snapshot."""
        pointer = self.snap / check_filename(part.filename)
        return _confined(pointer.parent, self.snap) / pointer.name

    def run(self) -> Path:
        todo = [p for p in self.file.parts if not self._pointer_ok(p)]
        self.base = self.total - sum(p.size or 0 for p in todo)
        self._check_space(todo)
        self.report(self.base, self.total)
        for part in todo:
            self._part(part)
            self.base += part.size or 0
        self._write_ref()
        return self.snap / self.file.filename

    def _pointer_ok(self, part: HubPart) -> bool:
        pointer = _cached_part(self.snap, part.filename)
        try:
            return pointer is not None and (
                part.size is None or pointer.stat().st_size == part.size
            )
        except OSError:
            return False

    def _check_space(self, todo: list[HubPart]) -> None:
        blobs = self.rdir / "blobs"
        need = sum(
            max(0, (p.size or 0) - _size_or_zero(blobs / f"{_blob_name(p)}.incomplete"))
            for p in todo
        )
        _mkdirs(blobs)
        free = shutil.disk_usage(blobs).free
        if need > free:
            raise HubError(
                f"{self.file.spec}: not enough disk space in {blobs}: need {_mib(need)}, "
                f"{_mib(free)} free",
                HubError.DISK_FULL,
            )

    def _part(self, part: HubPart) -> None:
        blob = self.rdir / "blobs" / _blob_name(part)
        for planted in (blob, blob.with_name(blob.name + ".incomplete")):
            if (
                planted.is_symlink()
            ):  # never the cache's own (a blob is a file): writing would go through it
                planted.unlink()
        if not _size_matches(blob, part.size):
            with self._lock(part):
                if not _size_matches(blob, part.size):
                    self._fetch(part, blob)
        self.report(self.base + (part.size or 0), self.total)
        self._link(part, blob)

    @contextlib.contextmanager
    def _lock(self, part: HubPart) -> Iterator[None]:
        """huggingface_hub's lock file for this blob, so that two downloads never write one
        partial file; waiting for it still honours cancel."""
        from filelock import FileLock, Timeout

        path = cache_dir() / ".locks" / self.rdir.name / f"{_blob_name(part)}.lock"
        _mkdirs(path.parent)
        lock = FileLock(str(path))
        while True:
            try:
                lock.acquire(timeout=0.5)
                break
            except Timeout:
                self._check_cancel(0)
        try:
            yield
        finally:
            lock.release()

    def _check_cancel(self, have: int) -> None:
        if self.cancel.is_set():
            raise HubError(
                f"{self.file.spec}: download cancelled at {_mib(self.base + have)} of "
                f"{_mib(self.total)}; the partial file is kept and the next download "
                "resumes it",
                HubError.CANCELLED,
            )

    def _fetch(self, part: HubPart, blob: Path) -> None:
        """Stream `part` into blob.incomplete (resuming), check it, rename it to `blob`."""
        from huggingface_hub import hf_hub_url

        url = hf_hub_url(
            self.file.repo_id, part.filename, revision=self.file.revision, endpoint=endpoint()
        )
        tmp = blob.with_name(blob.name + ".incomplete")
        have = _size_or_zero(tmp)
        if part.size is not None and have > part.size:
            have = 0
        digest = _hash_prefix(tmp, have) if part.sha256 else None
        failures, start = 0, have
        while part.size is None or have < part.size:
            self._check_cancel(have)
            try:
                have, digest = self._stream(url, part, tmp, have, digest)
            except transport_errors() as e:
                failures += 1
                have = _size_or_zero(tmp)
                digest = _hash_prefix(tmp, have) if part.sha256 else None
                if failures > _RETRIES and have == start:  # nothing came through at all
                    raise unreachable(f"{self.file.spec} ({part.filename})", e) from None
                if failures > _RETRIES:
                    raise HubError(
                        f"{self.file.spec}: download interrupted ({type(e).__name__}) at "
                        f"{_mib(self.base + have)} of {_mib(self.total)}; the partial file is "
                        "kept: run the same command again to resume",
                        HubError.INTERRUPTED,
                    ) from None
                time.sleep(_RETRY_PAUSE_S * failures)
                continue
            failures = 0
            if part.size is None:
                break
        self._verify(part, tmp, have, digest)
        os.replace(tmp, blob)

    def _stream(self, url: str, part: HubPart, tmp: Path, have: int, digest):
        """One GET from byte `have` on; returns (bytes now in tmp, running sha256)."""
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        headers = build_hf_headers(token=self.token)
        headers["Accept-Encoding"] = "identity"
        if have:
            headers["Range"] = f"bytes={have}-"
        with (
            hub_errors(f"{self.file.spec} ({part.filename})", self.token, network=False),
            get_session().stream(
                "GET", url, headers=headers, timeout=TIMEOUT_S, follow_redirects=True
            ) as r,
        ):
            hf_raise_for_status(r)
            if have and r.status_code != 206:  # the server ignored the range: start over
                have, digest = 0, (hashlib.sha256() if part.sha256 else None)
            try:
                with open(tmp, "r+b" if have else "wb") as out:
                    out.seek(have)
                    out.truncate()
                    for chunk in r.iter_bytes():  # as received: a broken transfer keeps all it got
                        self._check_cancel(have)
                        out.write(chunk)
                        if digest is not None:
                            digest.update(chunk)
                        have += len(chunk)
                        self.report(self.base + have, self.total)
                        if part.size is not None and have > part.size:
                            break
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise HubError(
                        f"{self.file.spec}: disk full while downloading into {tmp.parent}; "
                        "the partial file is kept",
                        HubError.DISK_FULL,
                    ) from None
                raise
        return have, digest

    def _verify(self, part: HubPart, tmp: Path, have: int, digest) -> None:
        """Size and sha256 against the Hub's listing; a mismatch deletes the partial file."""
        problem = None
        if part.size is not None and have != part.size:
            problem = f"{have} bytes, the Hub lists {part.size}"
        elif digest is not None and part.sha256 and digest.hexdigest() != part.sha256.lower():
            problem = f"sha256 {digest.hexdigest()}, the Hub lists {part.sha256}"
        if problem:
            tmp.unlink(missing_ok=True)
            raise HubError(
                f"{self.file.spec} ({part.filename}): downloaded file is corrupt ({problem}); "
                "it was deleted, download again",
                HubError.CORRUPT,
            )

    def _link(self, part: HubPart, blob: Path) -> None:
        """snapshots/<commit>/<path> -> ../../blobs/<name>, as huggingface_hub links it; a copy
        where symlinks are not allowed (Windows without developer mode)."""
        pointer = self._pointer(part)
        _mkdirs(pointer.parent)
        _confined(pointer.parent, self.snap)
        if pointer.is_symlink() or pointer.exists():
            pointer.unlink()
        try:
            os.symlink(os.path.relpath(blob, pointer.parent), pointer)
        except OSError:
            shutil.copyfile(blob, pointer)

    def _write_ref(self) -> None:
        ref = self.rdir / "refs" / "main"
        if ref.exists() and ref.read_text(encoding="utf-8").strip() == self.file.revision:
            return
        with contextlib.suppress(OSError):
            _mkdirs(ref.parent)
            tmp = ref.with_name(f".main.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)  # a link left there would be written through
            tmp.write_text(self.file.revision, encoding="utf-8")
            os.replace(tmp, ref)


def _blob_name(part: HubPart) -> str:
    """What huggingface_hub names the blob: the LFS sha256, else the git blob id (its etag)."""
    name = part.sha256 or part.blob_id
    if not name or not re.fullmatch(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}", name):
        raise HubError(f"{part.filename}: the Hub listing gives no checksum for it", HubError.HUB)
    return name.lower()


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _size_matches(path: Path, size: int | None) -> bool:
    try:
        return path.is_file() and (size is None or path.stat().st_size == size)
    except OSError:
        return False


def _hash_prefix(path: Path, n: int):
    """sha256 of the first n bytes of `path` (a partial file being resumed)."""
    digest = hashlib.sha256()
    if n:
        with open(path, "rb") as f:
            while n > 0 and (chunk := f.read(min(_CHUNK * 8, n))):
                digest.update(chunk)
                n -= len(chunk)
    return digest


def _mkdirs(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HubError(
            f"cannot create {path}: {e.strerror or e}",
            HubError.DISK_FULL if e.errno == errno.ENOSPC else HubError.HUB,
        ) from None


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 1024:.0f} KiB"
