"""Checkpoint files: ``.safetensors`` (parsed and validated by the ``safetensors`` package) and
``.npz`` (NumPy's zip of ``.npy`` members), read into NumPy arrays that nothing else can change.

A checkpoint comes from the internet, so its container is a security boundary. Who checks what
(docs/design.md, "Contract on bad input"):

- safetensors checks the container: the header length (capped at 100 MB), UTF-8 and JSON (depth
  limited), field types, dtype names, shapes x dtype sizes without overflow, and that the byte
  ranges are in order, contiguous and cover the data exactly (no overlap, alias, gap or trailing
  byte). We never parse offsets or trust a size it has not checked.
- We keep the mapping from safetensors dtype codes to NumPy / ml_dtypes dtypes (safetensors' NumPy
  loader cannot build bfloat16, float8, float6 or float4 arrays), the unpacking of its sub-byte
  codes, and the two checks safetensors does not make: a name given twice in the header (its JSON
  reader keeps the last one silently) and BOOL bytes other than 0 and 1.
- Bytes are read with ``pread`` from the file we opened, into arrays we allocate: no memory map
  outlives the call, so rewriting or truncating the file later cannot change (or SIGBUS) them.
- ``.npz``: only the zip methods NumPy writes, and each member's ``.npy`` header (shape x itemsize)
  must match the member's size before anything is allocated; pickles are never loaded.

Every refusal is a ``CheckpointError`` (a ``ValueError``) whose message names the file, the tensor
where one is involved, and the reason. A path that is not a str / bytes / os.PathLike is a
``TypeError``; a file that cannot be opened is the ``OSError`` of ``open``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import stat
import zipfile
from collections.abc import Mapping

import ml_dtypes
import numpy as np
import safetensors


class CheckpointError(ValueError):
    """A checkpoint file or tensor that was refused; the message names the file (or tensor) and why."""


# safetensors dtype code -> the NumPy dtype of one element. Multi-byte codes are little-endian in
# the file, as on every host JAX runs on. Sub-byte codes (PACKED_BITS) are unpacked to one element
# per byte, the way ml_dtypes holds float4 / float6.
SAFETENSORS_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16), "I16": np.dtype(np.int16),
    "U32": np.dtype(np.uint32), "I32": np.dtype(np.int32),
    "U64": np.dtype(np.uint64), "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype(np.float32), "F64": np.dtype(np.float64), "C64": np.dtype(np.complex64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz), "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "F4": np.dtype(ml_dtypes.float4_e2m1fn),
    "F6_E2M3": np.dtype(ml_dtypes.float6_e2m3fn), "F6_E3M2": np.dtype(ml_dtypes.float6_e3m2fn),
}
# Bits per element of the sub-byte codes. The file holds them as one bit stream over the flattened
# tensor, element i in bits [b i, b (i + 1)) counted from the least significant bit of byte 0:
# for F4 that is element 2i in the low nibble of byte i, as PyTorch's float4_e2m1fn_x2 (which
# safetensors writes F4 from), ONNX and OCP MX store it. safetensors defines no bit order for F6
# and no framework writes it; we read the same LSB-first stream (docs/design.md).
PACKED_BITS = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
_CODE_OF = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}
# The names safetensors' writer (TensorSpec) takes; F6 has none, so only reading F6 is possible.
_WRITER_NAMES = {code: ("float4_e2m1fn_x2" if code == "F4" else dtype.name)
                 for code, dtype in SAFETENSORS_DTYPES.items() if code not in ("F6_E2M3", "F6_E3M2")}
_RESERVED_NAME = "__metadata__"  # the header key safetensors reads as the metadata, never as a tensor
_MAX_HEADER_BYTES = 100_000_000  # safetensors' cap on the header (it refuses longer ones first)


def file_path(path) -> str:
    """``path`` as a str; a TypeError for anything but str / bytes / os.PathLike. An int is never
    taken as a file descriptor (it would read, then close, someone else's file)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"a checkpoint path must be a str or os.PathLike, got {type(path).__name__} {path!r} "
                        "(file descriptors are not accepted)")
    return os.fsdecode(os.fspath(path))


# --------------------------------------------------------------------------- sub-byte codes
def fp4_unpack(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., n] -> float4_e2m1fn [..., 2n], element 2i from the low nibble of byte i."""
    codes = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), np.uint8)
    codes[..., 0::2] = packed & 0xF
    codes[..., 1::2] = packed >> 4
    return codes.view(ml_dtypes.float4_e2m1fn)


def fp4_pack(data, what: str) -> np.ndarray:
    """float4_e2m1fn [..., 2n] -> uint8 [..., n], element 2i in the low nibble of byte i."""
    codes = np.asarray(data).view(np.uint8) & 0xF
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise CheckpointError(f"{what}: FP4 data of shape {list(codes.shape)} cannot be packed two per byte along "
                              "its last axis (it must be even)")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def _fp6_unpack(packed: np.ndarray) -> np.ndarray:
    """uint8 [3 n] -> uint8 codes [4 n]: four 6-bit elements per little-endian 24-bit group."""
    group = packed.reshape(-1, 3).astype(np.uint32)
    word = group[:, 0] | (group[:, 1] << 8) | (group[:, 2] << 16)
    return np.stack([(word >> shift) & 0x3F for shift in (0, 6, 12, 18)], axis=1).astype(np.uint8).reshape(-1)


# --------------------------------------------------------------------------- safetensors
@contextlib.contextmanager
def _regular_file(path: str):
    """(fd, stat) of ``path`` opened for reading. O_NONBLOCK: a FIFO named as a checkpoint is
    refused instead of blocking the caller until someone writes to it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:  # a socket (ENXIO), a symlink loop, no permission: named, as any other refusal
        raise CheckpointError(f"{path}: cannot be opened for reading ({e.strerror})") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{path}: not a regular file")
        yield fd, st
    finally:
        os.close(fd)


def _pread(fd: int, into, offset: int) -> int:
    """Fills the writable buffer ``into`` from ``offset``; the number of bytes the file had."""
    view, done = memoryview(into).cast("B"), 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def _safetensors_reason(e: Exception) -> str:
    text = str(e)
    for prefix in ("Error while deserializing header: ", "Error while deserializing: "):
        text = text.removeprefix(prefix)
    return f"{text} (refused by safetensors {safetensors.__version__})"


def _same_file(st, other) -> bool:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == (other.st_dev, other.st_ino, other.st_size,
                                                                  other.st_mtime_ns)


def _validated_index(path: str, fd: int, st):
    """safetensors' view of the file we hold open: [(name, dtype code, shape)] in file order
    (validated contiguous, so each tensor starts where the previous one ends) and the metadata."""
    proc = f"/proc/self/fd/{fd}"  # the open file itself (Linux): safetensors validates what we read
    source = proc if os.path.exists(proc) else path
    try:
        with safetensors.safe_open(source, framework="numpy") as f:
            entries = []
            for name in f.offset_keys():
                tensor = f.get_slice(name)
                entries.append((name, tensor.get_dtype(), tuple(tensor.get_shape())))
            metadata = f.metadata() or {}
    except Exception as e:  # noqa: BLE001 - whatever safetensors raises on this file is a refusal of it
        reason = _safetensors_reason(e)
        if "`" not in reason:  # its message names no tensor
            reason += _culprit(fd)
        raise CheckpointError(f"{path}: not a valid safetensors file: {reason}") from e
    if source == path:
        try:
            replaced = not _same_file(st, os.stat(path))
        except OSError:
            replaced = True
        if replaced:
            raise CheckpointError(f"{path}: the file was replaced while it was being read")
    return entries, metadata


def _culprit(fd: int) -> str:
    """After safetensors refused a file with a reason that names no tensor (a size, an overflow, a
    misaligned sub-byte tensor, data short or long): the first entry whose shape x dtype does not
    fill its byte range, or the data's length against the tensors' end. Only the message uses
    this; safetensors alone decides what is valid."""
    try:
        file_size = os.fstat(fd).st_size
        length, header = _header(fd, min(_MAX_HEADER_BYTES, file_size))
        last = 0
        for name, info in json.loads(header.decode("utf-8")).items():
            if name == _RESERVED_NAME:
                continue
            code, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            bits = _bits(code, shape)
            if bits != 8 * (end - begin):
                size = bits // 8 if bits % 8 == 0 else bits / 8
                return (f"; tensor {name!r} is {code} {shape}: {size} bytes, and its data_offsets "
                        f"[{begin}, {end}) span {end - begin}")
            last = max(last, end)
        if last != file_size - 8 - length:
            return (f"; the tensors end at data byte {last}, the file holds {file_size - 8 - length} data bytes "
                    "(truncated or extended?)")
    except Exception:  # noqa: BLE001 - a header too broken to point at one tensor: the reason stands alone
        return ""
    return ""


def _refuse_repeated_names(path: str, header: bytes) -> None:
    """safetensors' JSON reader keeps the last of two entries with one name; which one the writer
    meant is unknowable, so a repeated name (at any level) is refused. The header is already
    validated by safetensors (UTF-8, JSON, at most 100 MB and 128 levels deep)."""
    def unique(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise CheckpointError(f"{path}: the header names {key!r} twice (safetensors would keep the last "
                                      "silently; which one was meant is ambiguous)")
            seen.add(key)
        return None
    try:
        json.loads(header.decode("utf-8"), object_pairs_hook=unique)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors parsed it; a disagreement is still a refusal
        raise CheckpointError(f"{path}: header not readable as JSON ({type(e).__name__}: {e})") from e


def _bits(code: str, shape) -> int:
    return math.prod(shape) * PACKED_BITS.get(code, 8 * SAFETENSORS_DTYPES[code].itemsize)


def _header(fd: int, limit: int) -> tuple[int, bytes]:
    """The header length the file's first 8 bytes give (-1 if it has fewer) and up to ``limit``
    bytes of the header after them."""
    length = np.zeros(1, "<u8")
    if _pread(fd, length, 0) != 8:
        return -1, b""
    header = bytearray(min(int(length[0]), limit))
    return int(length[0]), bytes(header[:_pread(fd, header, 8)])


def _decode(path: str, name: str, code: str, shape: tuple, raw: np.ndarray) -> np.ndarray:
    dtype = SAFETENSORS_DTYPES[code]
    bits = PACKED_BITS.get(code)
    if bits == 4:
        codes = fp4_unpack(raw).view(np.uint8)
    elif bits == 6:
        codes = _fp6_unpack(raw)
    else:
        codes = raw
    if code == "BOOL" and codes.size and int(codes.max()) > 1:
        raise CheckpointError(f"{path}: tensor {name!r} (BOOL {list(shape)}) holds byte {int(codes.max())} at "
                              f"element {int(np.argmax(codes > 1))}; a BOOL is 0 or 1")
    return _shaped(codes.view(dtype), shape, f"{path}: tensor {name!r} ({code} {list(shape)})")


def _shaped(flat: np.ndarray, shape: tuple, where: str, order: str = "C") -> np.ndarray:
    """``flat`` as ``shape``, or a CheckpointError naming the tensor where NumPy cannot hold that
    shape (rank above NumPy's limit, or extents whose strides overflow even with no elements, e.g.
    [0, 2**62, 4]: valid to safetensors, not representable as an ndarray)."""
    try:
        return flat.reshape(shape, order=order)
    except ValueError as e:
        raise CheckpointError(f"{where}: NumPy cannot hold this shape (rank {len(shape)}; {e})") from None


def read_safetensors(path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file, as NumPy arrays this call allocated (writable; nothing
    else refers to their memory). 0-d tensors stay 0-d; F4 / F6 come unpacked, one element per byte."""
    path = file_path(path)
    with _regular_file(path) as (fd, st):
        entries, _ = _validated_index(path, fd, st)
        for name, code, shape in entries:
            if code not in SAFETENSORS_DTYPES:
                raise CheckpointError(f"{path}: tensor {name!r} has dtype {code}, which safetensors "
                                      f"{safetensors.__version__} knows and jax_gpuext does not map to a NumPy dtype")
        sizes = [_bits(code, shape) // 8 for _, code, shape in entries]
        start = st.st_size - sum(sizes)  # safetensors checked that the tensors end the file, gapless
        length, header = _header(fd, max(start - 8, 0))
        if length != start - 8 or len(header) != length:  # (then safetensors saw other bytes than we do)
            raise CheckpointError(f"{path}: the file changed while it was being read")
        _refuse_repeated_names(path, header)
        out = {}
        for (name, code, shape), size in zip(entries, sizes):
            raw = np.empty(size, np.uint8)
            if _pread(fd, raw, start) != size:
                raise CheckpointError(f"{path}: tensor {name!r}: the file was truncated while it was being read")
            out[name] = _decode(path, name, code, shape, raw)
            start += size
        if not _same_file(st, os.fstat(fd)):
            raise CheckpointError(f"{path}: the file changed while it was being read")
    return out


def read_safetensors_metadata(path) -> dict[str, str]:
    """The free-form ``__metadata__`` of a .safetensors file ({} when it has none)."""
    path = file_path(path)
    with _regular_file(path) as (fd, st):
        return dict(_validated_index(path, fd, st)[1])


def _tensor_spec(path: str, name, value, keep: list):
    """safetensors' TensorSpec of one tensor (a raw pointer into an array ``keep`` holds alive)."""
    if not isinstance(name, str):
        raise CheckpointError(f"{path}: tensor names are str; got {type(name).__name__} {name!r}")
    if name == _RESERVED_NAME:
        raise CheckpointError(f"{path}: a tensor cannot be named {_RESERVED_NAME!r}: safetensors reads that key "
                              "as the file's metadata, so the tensor would be lost")
    try:
        a = np.asarray(value)
    except Exception as e:  # noqa: BLE001 - NumPy's refusal (a ragged list, ...), named
        raise CheckpointError(f"{path}: tensor {name!r} is not an array: {type(e).__name__}: {e}") from e
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    code = _CODE_OF.get(a.dtype)
    if code is None or code not in _WRITER_NAMES:
        why = ("safetensors cannot write it (its writer has no 6-bit dtype)" if code else
               f"it has no safetensors dtype (those are {sorted(_CODE_OF.values())})")
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {a.dtype}: {why}")
    shape = list(a.shape)
    if code == "F4":  # written as PyTorch's float4_e2m1fn_x2: two elements of the last axis per byte
        a = fp4_pack(a, f"{path}: tensor {name!r}")
        shape = list(a.shape)  # TensorSpec doubles the last axis back
    a = np.ascontiguousarray(a)
    keep.append(a)
    spec = safetensors.TensorSpec(dtype=_WRITER_NAMES[code], shape=shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
    if spec.dtype != code:  # our table and safetensors' must agree on every name
        raise CheckpointError(f"{path}: tensor {name!r}: safetensors wrote {a.dtype} as {spec.dtype}, not {code}")
    return spec


def _metadata(path: str, metadata):
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise TypeError(f"{path}: metadata must be a mapping of str to str, got {type(metadata).__name__}")
    bad = [(k, v) for k, v in metadata.items() if not (isinstance(k, str) and isinstance(v, str))]
    if bad:
        raise CheckpointError(f"{path}: metadata holds str -> str only; got {bad[0][0]!r}: {bad[0][1]!r}")
    # None for {}: safetensors (0.7, 0.8) writes an unreadable header `{},"__metadata__":{}}` for an
    # empty metadata dict without tensors (it sizes the JSON map by the metadata's length).
    return dict(metadata) or None


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return f"mode {stat.S_IFMT(mode):o}"


def write_safetensors(path, tensors: Mapping, metadata: Mapping | None = None) -> None:
    """{name: array} (and optional str -> str metadata) -> a .safetensors file, written by the
    safetensors package. The file is written beside ``path`` and renamed over it, so whoever
    has the old file open or mapped keeps reading the old bytes (never a truncated file)."""
    path = file_path(path)
    if not isinstance(tensors, Mapping):
        raise TypeError(f"{path}: tensors must be a mapping of name to array, got {type(tensors).__name__}")
    keep: list = []
    specs = {name: _tensor_spec(path, name, value, keep) for name, value in tensors.items()}
    metadata = _metadata(path, metadata)
    target = os.path.realpath(path)  # through a symlink, replace the file it points to
    try:
        existing = os.stat(target).st_mode
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing):
        # renaming over a FIFO, a device node or a socket would silently replace it with a file
        raise CheckpointError(f"{path}: exists and is not a regular file ({_file_kind(existing)}); "
                              "refusing to replace it")
    folder, base = os.path.split(target)
    while True:
        temp = os.path.join(folder, f".{base}.{secrets.token_hex(6)}.tmp")
        try:  # mode 0o666 less the umask, as open(path, "w") would create it
            os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))
            break
        except FileExistsError:
            continue
    try:
        try:
            safetensors.serialize_file(specs, temp, metadata=metadata)
        except Exception as e:  # noqa: BLE001 - safetensors' refusal of what we gave it, named
            raise CheckpointError(f"{path}: safetensors refused to write it: {e}") from e
        with contextlib.suppress(FileNotFoundError):  # (safetensors may have replaced our temporary)
            os.chmod(temp, stat.S_IMODE(os.stat(target).st_mode))  # an existing file keeps its mode
        fd = os.open(temp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the bytes are on disk before the name points at them
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


# --------------------------------------------------------------------------- .npz
_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
# Deflate emits at least about one bit per 258-byte match, so a member cannot inflate beyond 1032
# times its compressed size; a header claiming more is lying, and is refused before allocating.
_DEFLATE_MAX_RATIO = 1032


def _npz_member(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, file_size: int) -> np.ndarray:
    key = info.filename[:-4]
    where = f"{path}: tensor {key!r} (member {info.filename!r})"
    if info.flag_bits & 0x1:
        raise CheckpointError(f"{where} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise CheckpointError(f"{where} uses zip method {info.compress_type}; NumPy writes stored or deflated only")
    limit = info.compress_size * (1 if info.compress_type == zipfile.ZIP_STORED else _DEFLATE_MAX_RATIO)
    if info.compress_size > file_size or info.file_size > limit:
        raise CheckpointError(f"{where} claims {info.file_size} bytes from {info.compress_size} stored bytes in a "
                              f"{file_size}-byte file")
    with zf.open(info) as fp:
        version = np.lib.format.read_magic(fp)
        if version not in _NPY_HEADER_READERS:
            raise CheckpointError(f"{where}: .npy format version {version} is not read (1.0 and 2.0 are)")
        shape, fortran_order, dtype = _NPY_HEADER_READERS[version](fp)
        if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or dtype.itemsize == 0 \
                or dtype.kind not in "biufcV":
            raise CheckpointError(f"{where} has dtype {dtype}, not a tensor's (objects and pickles are never loaded)")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise CheckpointError(f"{where} has shape {shape!r}")
        size = math.prod(shape) * dtype.itemsize
        if size != info.file_size - fp.tell():
            raise CheckpointError(f"{where} says {dtype}{list(shape)} ({size} bytes) but holds "
                                  f"{info.file_size - fp.tell()} bytes of data")
        raw = np.empty(size, np.uint8)
        view, done = memoryview(raw), 0
        while done < size:
            n = fp.readinto(view[done:])
            if not n:
                raise CheckpointError(f"{where} ends after {done} of {size} data bytes")
            done += n
        if fp.read(1):  # reading to the end also makes zipfile check the CRC
            raise CheckpointError(f"{where} holds more bytes than its header says")
    if dtype == np.bool_ and size and int(raw.max()) > 1:
        raise CheckpointError(f"{where} (bool) holds byte {int(raw.max())}; a bool is 0 or 1")
    a = _shaped(raw.view(dtype), shape, where, order="F" if fortran_order else "C")
    return a.astype(dtype.newbyteorder("=")) if not dtype.isnative else a


def read_npz(path) -> dict[str, np.ndarray]:
    """Every array of an .npz file (np.savez / np.savez_compressed), validated before allocation."""
    path = file_path(path)
    with _regular_file(path) as (fd, st), os.fdopen(os.dup(fd), "rb") as f:
        try:
            with zipfile.ZipFile(f) as zf:
                out = {}
                for info in zf.infolist():
                    if not info.filename.endswith(".npy"):
                        raise CheckpointError(f"{path}: member {info.filename!r} is not an .npy array")
                    if info.filename[:-4] in out:
                        raise CheckpointError(f"{path}: the archive holds {info.filename!r} twice")
                    out[info.filename[:-4]] = _npz_member(path, zf, info, st.st_size)
                return out
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - zipfile / .npy errors on a hostile file, as one refusal
            raise CheckpointError(f"{path}: not a valid .npz file ({type(e).__name__}: {e})") from e


def read_tensors(path) -> dict[str, np.ndarray]:
    """A .safetensors or .npz file as {name: array}."""
    path = file_path(path)
    suffix = os.path.splitext(path)[1].lower()  # FILE.SAFETENSORS is the same kind of file
    if suffix == ".safetensors":
        return read_safetensors(path)
    if suffix == ".npz":
        return read_npz(path)
    raise CheckpointError(f"{path}: expected a .safetensors or .npz file")
