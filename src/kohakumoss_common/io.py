"""Files that never end half-written, and safetensors checkpoints (single or sharded with an index).

Loading is per tensor (`iter_tensors`), so a 5B model never needs a full fp32 copy in host memory.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .errors import CheckpointError

INDEX_SUFFIX = ".safetensors.index.json"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


# how libraries that do not raise OSError say ENOSPC / EDQUOT (safetensors: "... (os error 28)")
_DISK_FULL_TEXT = ("no space left on device", "disk quota exceeded", "os error 28", "os error 122")


class DiskSpaceError(CheckpointError):
    """Not enough free space for a file or folder about to be written (or a disk that filled mid-write:
    `reason` then holds what the system said, and an enclosing write names its own path instead)."""

    def __init__(self, path: object, message: str, reason: str | None = None):
        self.reason = reason
        super().__init__(path, message)


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def free_bytes(path: str | Path) -> int:
    """Free bytes on the file system that holds `path` (its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def ensure_free_space(path: str | Path, needed: int) -> None:
    """Raise DiskSpaceError (path, needed, free) when `needed` bytes would not fit where `path` goes."""
    free = free_bytes(path)
    if needed > free:
        raise DiskSpaceError(path, f"not enough disk space: needs {_size(needed)}, {_size(free)} free")


def disk_full_reason(error: BaseException) -> str | None:
    """What the system said when `error` (or an error it was raised from) is a full disk or quota, else
    None. Libraries say it their own way: OSError(ENOSPC), safetensors' SafetensorError "... (os error 28)",
    torch.save's RuntimeError raised while handling the OSError of a file object, pyarrow's OSError text."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskSpaceError):
            return error.reason
        if isinstance(error, OSError) and error.errno in _DISK_FULL:
            return error.strerror or os.strerror(error.errno)
        text = str(error).lower()
        for phrase in _DISK_FULL_TEXT:
            if phrase in text:
                return os.strerror(errno.EDQUOT if "122" in phrase or "quota" in phrase else errno.ENOSPC)
        error = error.__cause__ or error.__context__
    return None


@contextmanager
def disk_full_as_error(path: str | Path, needed: int | None = None) -> Iterator[None]:
    """Turn a disk that fills during the block into one DiskSpaceError line naming `path`, whatever library
    raised it (`disk_full_reason`); `needed`: the bytes the block writes, when known."""
    try:
        yield
    except Exception as e:
        reason = disk_full_reason(e)
        if reason is None:
            raise
        need = f"needs {_size(needed)}, " if needed else ""
        raise DiskSpaceError(
            path, f"disk full while writing ({reason}): {need}{_size(free_bytes(path))} free", reason
        ) from e


def _umask() -> int:
    """The process umask, read without changing it where Linux tells it (os.umask sets it to read it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path` in one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        with disk_full_as_error(path):  # whatever wrote the file: a full disk is one line naming it
            yield tmp_path
        tmp_path.chmod(0o666 & ~_umask())  # mkstemp's 0600 (or a writer's own) would outlive the rename
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: str | Path, obj: object) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def save_image(image, path: str | Path, **options) -> None:
    """Atomically write a Pillow image (a sample, a grid, a plot), its format from `path`'s suffix (the
    temporary name has none); `options` go to `Image.save` (pnginfo, quality)."""
    path = Path(path)
    suffix = path.suffix.lower().lstrip(".")
    with atomic_path(path) as tmp:
        image.save(tmp, format={"jpg": "JPEG"}.get(suffix, suffix.upper()), **options)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Build a folder under a temporary name; it appears at `path` only when complete.

    An existing `path` is kept until the new folder is in place, so a crash leaves the old one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would outlive the rename
    try:
        yield tmp
        if path.exists():
            # a complete copy at every moment: the old one is set aside, never deleted, until the new one is
            # in place; a kill between the two renames leaves `.name.old`, which `restore_set_aside` puts back
            old = set_aside_name(path)
            if old.exists():
                shutil.rmtree(old)
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old, path)
                raise
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def set_aside_name(path: str | Path) -> Path:
    """Where `atomic_dir` keeps the previous folder while it swaps a new one in: `.name.old` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}.old")


def restore_set_aside(path: str | Path) -> bool:
    """Put `path`'s set-aside copy back where a kill between `atomic_dir`'s two renames left none; True if it did."""
    path, old = Path(path), set_aside_name(path)
    if path.exists() or not old.is_dir():
        return False
    os.replace(old, path)
    return True


def link_tree(src: str | Path, dst: str | Path) -> list[Path] | None:
    """Hard-link every file under `src` to the same place under `dst` (a file there replaced in one rename):
    a second name for files already written, no bytes copied. None, with nothing changed under `dst`, where
    the filesystem cannot link them (another device, no hard links): the caller writes the files itself."""
    src, dst = Path(src), Path(dst)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    staged: list[tuple[Path, Path]] = []
    try:
        for f in files:
            target = dst / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.link.tmp")
            tmp.unlink(missing_ok=True)
            os.link(f, tmp)
            staged.append((tmp, target))
    except OSError:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        return None
    for tmp, target in staged:
        os.replace(tmp, target)
    return [target for _, target in staged]


def save_safetensors(
    tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """Atomically write one safetensors file (tensors made contiguous, on the CPU)."""
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(cpu, str(tmp), metadata=metadata)
        _check_written_size(tmp, path)


def _check_written_size(tmp: Path, path: str | Path) -> None:
    """A written file must be whole (a full disk can cut it without an error): safetensors' own check."""
    try:
        with safe_open(str(tmp), framework="pt"):
            return
    except SafetensorError:
        pass
    expected, size = _header_span(tmp), tmp.stat().st_size
    raise DiskSpaceError(
        path,
        f"written file is {size} bytes, its header says {expected} (disk full?): {_size(free_bytes(path))} free",
    )


def _header_span(file: Path) -> int | None:
    """The length `file`'s header describes, None where unreadable. Only to name the lengths in an error:
    safetensors refuses a cut file ("incomplete metadata, file not fully covered") without saying them."""
    try:
        with open(file, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or n > 100 << 20:
                return None
            header = json.loads(f.read(n))
        ends = [
            v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
        ]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    return 8 + n + max(ends, default=0)


def save_sharded(
    tensors: dict[str, torch.Tensor],
    directory: str | Path,
    prefix: str = "model",
    max_shard_bytes: int = 5 << 30,
    metadata: dict[str, str] | None = None,
) -> list[Path]:
    """Write `prefix.safetensors`, or `prefix-0000i-of-0000n.safetensors` shards plus the HF index file.

    huggingface_hub splits the tensors and names the files (its `save_torch_state_dict` is not used: it
    writes in place, and a kill mid-save would leave a half-written shard). Each file is written
    atomically; files of an earlier save under the same prefix that this one did not write (other shard
    counts, a stale index) are removed afterwards, so the folder reads as this save.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    split = split_torch_state_dict_into_shards(
        tensors, filename_pattern=f"{prefix}{{suffix}}.safetensors", max_shard_size=max_shard_bytes
    )
    files = split.filename_to_tensors or {f"{prefix}.safetensors": []}  # no tensors: one empty file, as ever
    paths = []
    for name, keys in files.items():
        save_safetensors({k: tensors[k] for k in keys}, directory / name, metadata)
        paths.append(directory / name)
    written = set(paths)
    if split.is_sharded:
        index = directory / f"{prefix}{INDEX_SUFFIX}"
        atomic_write_json(
            index,
            {"metadata": {**split.metadata, **(metadata or {})}, "weight_map": split.tensor_to_filename},
        )
        written.add(index)
    _remove_stale(directory, prefix, written)
    return paths


def _remove_stale(directory: Path, prefix: str, written: set[Path]) -> None:
    """Remove `prefix`'s single file, shards and index that this save did not write."""
    own = [directory / f"{prefix}.safetensors", directory / f"{prefix}{INDEX_SUFFIX}"]
    own += directory.glob(
        f"{glob.escape(prefix)}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].safetensors"
    )
    for path in own:
        if path not in written and path.exists():
            path.unlink()


def resolve_files(path: str | Path) -> list[Path]:
    """The safetensors files behind `path`: a file, an index json, or a folder holding either."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "no such file or folder")
    if path.is_dir():
        indexes = sorted(path.glob(f"*{INDEX_SUFFIX}"))
        if indexes:
            return resolve_files(indexes[0])
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(path, "folder holds no .safetensors file and no index")
        return files
    if path.name.endswith(".json"):
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(path, f"not a safetensors index file ({e})") from e
        files = [path.parent / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise CheckpointError(path, f"index names shard files that do not exist: {missing}")
        return files
    if path.suffix != ".safetensors":
        raise CheckpointError(path, "expected a .safetensors file, an index .json or a folder")
    return [path]


# what a file's keys say it is, for the error of a loader handed the wrong file: (kind, key marker)
_WEIGHT_KINDS = (
    ("a MOSS-Image DiT", ("video_embedder.", "final_linear_video.", "video_head_modulation.")),
    ("a VAE", ("encoder.conv_in.", "decoder.conv_in.")),
    ("a text encoder (a language model)", ("embed_tokens.", "self_attn.q_proj.", "linear_attn.")),
    ("a LoRA / LyCORIS adapter", ("lora_down.", "lora_up.", "lora_A.", "lora_B.", "hada_w1", "lokr_w1")),
)


def weights_kind(keys: Iterable[str]) -> str | None:
    """What a weight file's keys look like ("a VAE (keys like encoder.conv_in.weight)"), or None when unknown."""
    keys = list(keys)
    for kind, markers in _WEIGHT_KINDS:
        hit = next((k for k in keys if any(m in k for m in markers)), None)
        if hit is not None:
            return f"{kind} (keys like {hit})"
    return None


def foreign_weights(path: str | Path, expected: str, keys: Iterable[str]) -> CheckpointError:
    """The error of a loader handed another model's file: what it expected, what the file looks like."""
    keys = sorted(keys)
    kind = weights_kind(keys)
    holds = f"this file holds {kind}" if kind else f"its first keys: {keys[:5]}"
    return CheckpointError(path, f"expected {expected}; {holds}")


def read_header(path: str | Path) -> tuple[dict[str, tuple[str, list[int]]], dict[str, str]]:
    """{key: (dtype, shape)} and the metadata of every file behind `path`, reading no tensor data
    (safetensors' `safe_open`: header only, the file mapped, never read); a file cut short is refused
    here, naming it and both lengths."""
    entries: dict[str, tuple[str, list[int]]] = {}
    metadata: dict[str, str] = {}
    for file in resolve_files(path):
        try:
            with safe_open(str(file), framework="pt") as f:
                metadata.update(f.metadata() or {})
                for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    part = f.get_slice(key)
                    entries[key] = (part.get_dtype(), list(part.get_shape()))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(file, _unreadable(file, e)) from e
    return entries, metadata


def _unreadable(file: Path, error: Exception) -> str:
    """Why safetensors refused `file`: a cut file with both lengths (an interrupted download), else its words."""
    expected = _header_span(file)
    size = file.stat().st_size if file.exists() else 0
    if expected is not None and size < expected:
        return f"cut short: {size} bytes, its header describes {expected} (an interrupted download or copy?)"
    return f"not a readable safetensors file ({error})"


def iter_tensors(
    path: str | Path,
    keys: set[str] | None = None,
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (key, tensor) one at a time from every file behind `path` (memory-mapped reads)."""
    for file in resolve_files(path):
        with readable_file(file), safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                if keys is not None and key not in keys:
                    continue
                tensor = f.get_tensor(key)
                yield key, (transform(key, tensor) if transform else tensor)


@contextmanager
def readable_file(file: str | Path) -> Iterator[None]:
    """safetensors' own error inside the block (a cut or foreign file) as a CheckpointError naming the file."""
    try:
        yield
    except SafetensorError as e:
        raise CheckpointError(file, f"not a readable safetensors file ({e})") from e


def load_tensors(path: str | Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor behind `path`, floating ones cast to `dtype` when given."""

    def cast(_key: str, t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t

    return dict(iter_tensors(path, transform=cast))


def set_module_tensor(
    module: torch.nn.Module, name: str, tensor: torch.Tensor, requires_grad: bool | None = None
) -> None:
    """Replace parameter or buffer `name` (dotted) of `module` by `tensor`, without a copy.

    A parameter keeps its current requires_grad unless `requires_grad` is given.
    """
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if leaf in owner._parameters:
        old = owner._parameters[leaf]
        grad = old.requires_grad if requires_grad is None and old is not None else bool(requires_grad)
        owner._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=grad)
    elif leaf in owner._buffers:
        owner._buffers[leaf] = tensor
    else:
        raise KeyError(name)
