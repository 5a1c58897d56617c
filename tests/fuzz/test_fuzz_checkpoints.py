"""Fuzz: checkpoint files, as a hostile download would be. Valid .safetensors files are written by
the safetensors package in every dtype it has (0-d, empty and sub-byte tensors, unicode names,
metadata); then one mutation of the header (JSON structure, entry and field types, dtypes,
shapes, offsets, repeated names, metadata, the length prefix) or of the bytes (truncation,
extension, insertion, overwrites), and .npz files written by NumPy with the same kind of damage.

Every outcome must be an exact load of what safetensors' own reader finds in the file (for .npz,
what np.load finds) or a CheckpointError naming the file; never another exception, a crash or a
hang. Every case runs in the worker process (tests/fuzz/_pool.py), reader and oracle alike, so a
crash, a SIGBUS included, fails the test with the case instead of killing pytest.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import _safetensors_files as sf
import _values
from _budget import fuzz, judged, record
from _judge import worker_outcome

CLEAN = ("CheckpointError", "CheckpointLayoutError")
CODES = sf.installed_dtypes()
NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=10).filter(
    lambda s: s != "__metadata__")
DIMS = st.lists(st.sampled_from([0, 1, 2, 3, 5, 8]), max_size=3).map(tuple)
TENSORS = st.dictionaries(NAMES, st.tuples(st.sampled_from(CODES), DIMS, _values.seeds), max_size=4)
METADATA = st.one_of(st.none(), st.dictionaries(NAMES, st.text(max_size=10), max_size=3))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_checkpoints")


def whole_bytes(code: str, shape: tuple) -> tuple:
    """``shape``, grown so a sub-byte tensor fills whole bytes (F4: an even count, F6: four)."""
    group = {4: 2, 6: 4}.get(sf.SUB_BYTE.get(code, (None, 8))[1], 1)
    return shape if math.prod(shape) % group == 0 else shape + (group,)


def make_tensors(drawn: dict) -> dict:
    return {name: sf.random_tensor(code, whole_bytes(code, shape), seed) for name, (code, shape, seed) in drawn.items()}


def judge(area: str, worker, path, case: str, then=None, names=()):
    """Runs the reader and the oracle in the worker; an exact load or a clean refusal, or it fails.
    A refusal names the file, and one of ``names`` (the tensors at fault) when given."""
    path = str(path)
    r = worker_outcome(area, worker.run("read_checkpoint", dict(path=path, then=then), timeout=60), case)
    assert not (isinstance(r, tuple) and r[0] == "raised"), f"[{area}] the case itself failed: {r} ({case})"
    ours = r["ours"]
    if ours[0] == "raised":
        _, exc_type, message = ours
        assert exc_type in CLEAN, f"[{area}] unclear error {exc_type}: {message} ({case})"
        assert path in message, f"[{area}] the refusal does not name the file: {message} ({case})"
        numpy_shape = path.endswith(".safetensors") and str(r["expected"][1]).startswith("NumPy cannot hold")
        assert not (names and numpy_shape) or any(repr(n) in message for n in names), (
            f"[{area}] the refusal does not name the tensor: {message} ({case})")
        if path.endswith(".safetensors"):
            kind, want = r["expected"]
            assert kind == "refused", f"[{area}] refused a file safetensors reads: {message} ({case})"
        record(area, "refused")
        return None
    if path.endswith(".safetensors"):
        kind, want = r["expected"]
        assert kind == "loaded", f"[{area}] loaded a file that must be refused ({want}) ({case})"
        meta = r["metadata"]
        assert meta[0] == "ok", f"[{area}] metadata of a valid file refused: {meta} ({case})"
    else:
        status, *want = r["expected"]
        assert status == "ok", f"[{area}] loaded an .npz NumPy refuses ({want}) ({case})"
        want = want[0]
    sf.assert_same_tensors(ours[1], want, f"[{area}] {case}")
    if then:
        assert r["unchanged"], f"[{area}] arrays read earlier changed when the file was {then} ({case})"
    record(area, "loaded")
    return ours[1], (meta[1] if path.endswith(".safetensors") else None)


# --------------------------------------------------------------------------- valid files
@fuzz("safetensors valid", 20)
@given(drawn=TENSORS, metadata=METADATA)
def test_valid_files_load_exactly(worker, folder, drawn, metadata):
    tensors = make_tensors(drawn)
    path = folder / "valid.safetensors"
    path.write_bytes(sf.serialize(tensors, metadata))
    case = f"{ {k: (c, whole_bytes(c, s), seed) for k, (c, s, seed) in drawn.items()} } metadata={metadata!r}"
    with judged("safetensors valid"):
        result = judge("safetensors valid", worker, path, case)
        assert result is not None, f"a file written by safetensors was refused ({case})"
        got, meta = result
        sf.assert_same_tensors(got, tensors, case)
        assert meta == (metadata or {}), f"metadata {meta!r} != {metadata!r} ({case})"
        # and our writer: what it writes, safetensors reads back as the same tensors
        writable = all(not a.dtype.name.startswith("float6") and not (
            a.dtype.name == "float4_e2m1fn" and (a.ndim == 0 or a.shape[-1] % 2)) for a in tensors.values())
        if writable:  # (safetensors writes no F6, and F4 only as pairs along the last axis)
            from jax_gpuext import checkpoints
            ours = folder / "ours.safetensors"
            checkpoints.write_safetensors(ours, tensors, metadata)
            kind, want = sf.expected(ours.read_bytes())
            assert kind == "loaded", f"safetensors refuses what write_safetensors wrote: {want} ({case})"
            sf.assert_same_tensors(want, tensors, f"write_safetensors, read by safetensors ({case})")


# --------------------------------------------------------------------------- header mutations
JUNK = (None, True, False, 1.5, "4", -1, 2**62, 2**63, 2**64, [], [1, "2"], [[1]], {"a": 1}, [True, False])
TEXTS = (b"[1, 2]", b"3", b'"x"', b"null", b"", b"{", b"{}}", b"\xef\xbb\xbf{}", b'{"a": 1} x', b"{\"\xff\": 1}",
         b'{"\\ud800": {}}', b" " * 7 + b"{}")


def mutate_header(data, header: dict, blob_data: bytes):
    """One mutation of a valid file's header -> (file bytes, what was done)."""
    names = [k for k in header if k != "__metadata__"]
    what = data.draw(st.sampled_from(["text", "nesting", "encoding", "padding", "entry", "missing", "extra",
                                      "field", "dtype", "as_bool", "shape", "offsets", "alias", "repeat",
                                      "metadata", "length"]), label="mutation")
    header = json.loads(json.dumps(header))
    text = json.dumps(header).encode()
    if what == "text":
        return sf.build(None, blob_data, text=data.draw(st.sampled_from(TEXTS))), what
    if what == "nesting":
        depth = data.draw(st.sampled_from([10, 127, 129, 1000, 100_000]))
        return sf.build(None, blob_data, text=b'{"t":' * depth + b"1" + b"}" * depth), f"nesting {depth}"
    if what == "encoding":
        enc = data.draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32", "latin-1", "utf-8-sig"]))
        return sf.build(None, blob_data, text=json.dumps(header, ensure_ascii=False).encode(enc, "replace")), enc
    if what == "padding":
        pad = data.draw(st.sampled_from([b" ", b"        ", b"\0", b"\n", b"\t"]))
        return sf.build(None, blob_data, text=text + pad), f"padding {pad!r}"
    if what == "length":
        n = data.draw(st.sampled_from([0, 1, len(text) - 1, len(text) + 1, len(text) + len(blob_data),
                                       100_000_001, 2**63, 2**64 - 1]))
        return sf.build(None, blob_data, text=text, length=n), f"length prefix {n}"
    if what == "metadata":
        value = data.draw(st.sampled_from([{"k": 1}, {"k": None}, ["x"], "x", {"k": {"n": "v"}}, {"k": "v"}, {}, None,
                                           {"k": "\ud7ff\u2028"}]))
        header["__metadata__"] = value
        return sf.build(header, blob_data), f"__metadata__ = {value!r}"
    if not names:
        header[data.draw(NAMES)] = data.draw(st.sampled_from(JUNK))
        return sf.build(header, blob_data), "junk entry in an empty header"
    name = data.draw(st.sampled_from(names))
    info = header[name]
    field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
    if what == "entry":
        header[name] = data.draw(st.sampled_from(JUNK))
    elif what == "missing":
        del info[field]
    elif what == "extra":
        info[data.draw(st.sampled_from(["x", "offsets", "DTYPE"]))] = data.draw(st.sampled_from(JUNK))
    elif what == "field":
        info[field] = data.draw(st.sampled_from(JUNK))
    elif what == "dtype":
        info["dtype"] = data.draw(st.sampled_from(CODES + ["f32", "F128", "", "U4", "F8_E4M3FN"]))
    elif what == "as_bool":  # its bytes read as BOOL: valid for safetensors whatever the bytes are
        info.update(dtype="BOOL", shape=[info["data_offsets"][1] - info["data_offsets"][0]])
    elif what == "shape":
        info["shape"] = data.draw(st.one_of(
            st.permutations(info["shape"]).map(list), st.just([]),
            st.lists(st.sampled_from([0, 1, 2, 3, 4, 16, 2**31, 2**32, 2**62, -1]), max_size=3)))
    elif what == "offsets":
        begin, end = info["data_offsets"]
        d0, d1 = data.draw(st.sampled_from([-8, -4, -1, 0, 1, 4, 8])), data.draw(st.sampled_from([-8, -1, 0, 1, 8]))
        info["data_offsets"] = data.draw(st.sampled_from([[begin + d0, end + d1], [end, begin], [begin, begin],
                                                          [0, end - begin], [begin, 2**64 - 1]]))
    elif what == "alias":  # one tensor's range given to another
        other = header[data.draw(st.sampled_from(names))]
        info["data_offsets"] = list(other["data_offsets"])
    elif what == "repeat":  # the same name twice, the copy possibly changed
        copy = dict(info, dtype=data.draw(st.sampled_from([info["dtype"]] + CODES)))
        entries = [json.dumps(k) + ": " + json.dumps(v) for k, v in header.items()]
        entries.insert(data.draw(st.integers(0, len(entries))), json.dumps(name) + ": " + json.dumps(copy))
        return sf.build(None, blob_data, text=("{" + ", ".join(entries) + "}").encode()), f"{name!r} twice"
    return sf.build(header, blob_data), f"{what} of {name!r} ({field}): {header.get(name)!r}"


@fuzz("safetensors header", 120)
@given(drawn=TENSORS.filter(bool), metadata=METADATA, data=st.data())
def test_header_mutations(worker, folder, drawn, metadata, data):
    header, blob_data = sf.split(sf.serialize(make_tensors(drawn), metadata))
    blob, what = mutate_header(data, header, blob_data)
    path = folder / "header.safetensors"
    path.write_bytes(blob)
    with judged("safetensors header"):
        judge("safetensors header", worker, path, f"{what}; file {blob[:300]!r}...")


# --------------------------------------------------------------------------- byte-range mutations
@fuzz("safetensors bytes", 60)
@given(drawn=TENSORS, data=st.data())
def test_byte_mutations(worker, folder, drawn, data):
    blob = sf.serialize(make_tensors(drawn))
    what = data.draw(st.sampled_from(["truncate", "extend", "insert", "overwrite", "overwrite data", "delete"]),
                     label="mutation")
    data_start = len(blob) - len(sf.split(blob)[1])  # overwriting only data keeps the file valid: values change
    at = data.draw(st.integers(data_start if what == "overwrite data" else 0, len(blob)), label="at")
    chunk = data.draw(st.binary(min_size=1, max_size=16), label="bytes")
    if what == "truncate":
        blob = blob[:at]
    elif what == "extend":
        blob = blob + chunk
    elif what == "insert":
        blob = blob[:at] + chunk + blob[at:]
    elif what.startswith("overwrite"):
        blob = blob[:at] + chunk[:len(blob) - at if what == "overwrite data" else None] + blob[at + len(chunk):]
    else:
        blob = blob[:at] + blob[at + len(chunk):]
    path = folder / "bytes.safetensors"
    path.write_bytes(blob)
    with judged("safetensors bytes"):
        judge("safetensors bytes", worker, path, f"{what} at {at} ({chunk!r}); file {blob[:300]!r}...")


# --------------------------------------------------------------------------- .npz
NPZ_DTYPES = ("<f4", ">f4", "<f8", "i1", "<i4", ">i8", "u1", "?", "<c8", "<f2")


@fuzz("npz", 40)
@given(arrays=st.dictionaries(st.text("abcxyz._", min_size=1, max_size=6),
                              st.tuples(st.sampled_from(NPZ_DTYPES), DIMS, _values.seeds, st.booleans()), max_size=3),
       compressed=st.booleans(), data=st.data())
def test_npz_mutations(worker, folder, arrays, compressed, data):
    made = {}
    for name, (dtype, shape, seed, fortran) in arrays.items():
        a = _values.make(shape, np.dtype(dtype).newbyteorder("="), seed).astype(dtype)
        made[name] = np.asfortranarray(a) if fortran else a
    f = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(f, **made)
    blob = f.getvalue()
    what = data.draw(st.sampled_from(["none", "truncate", "overwrite", "shape", "sizes"]), label="mutation")
    if what == "truncate":
        blob = blob[:data.draw(st.integers(0, len(blob)))]
    elif what == "overwrite":
        at = data.draw(st.integers(0, len(blob)))
        chunk = data.draw(st.binary(min_size=1, max_size=8))
        blob = blob[:at] + chunk + blob[at + len(chunk):]
    elif what == "shape" and b"'shape': (" in blob:  # a .npy header's shape, rewritten to the same length
        at = blob.index(b"'shape': (") + len(b"'shape': (")
        end = blob.index(b")", at)
        new = data.draw(st.sampled_from([b"8589934592, 2", b"4611686018427387904,", b"-1,", b"1, 1, 1, 1", b""]))
        blob = blob[:at] + new + b" " * max(0, end - at - len(new)) + blob[max(end, at + len(new)):]
    elif what == "sizes" and b"PK\x01\x02" in blob:  # the central directory's sizes of the first member
        at = blob.index(b"PK\x01\x02") + data.draw(st.sampled_from([20, 24]))
        blob = blob[:at] + data.draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x00\x00\x00\x10"])) \
            + blob[at + 4:]
    path = folder / "mutated.npz"
    path.write_bytes(blob)
    case = f"{what} of {'savez_compressed' if compressed else 'savez'} {arrays}"
    with judged("npz"):
        loaded = judge("npz", worker, path, case)
        if what == "none":
            assert loaded is not None, f"refused an .npz NumPy wrote ({case})"


# --------------------------------------------------------------------------- rewriting after a read
@fuzz("checkpoint rewrite", 6)
@given(drawn=TENSORS.filter(bool), then=st.sampled_from(["rewrite", "truncate"]))
def test_arrays_outlive_their_file(worker, folder, drawn, then):
    path = folder / "rewritten.safetensors"
    path.write_bytes(sf.serialize(make_tensors(drawn)))
    with judged("checkpoint rewrite"):
        assert judge("checkpoint rewrite", worker, path, f"{then} after reading {drawn}", then=then) is not None


# --------------------------------------------------------------------------- shapes NumPy cannot hold (issue 34)
BIG = [2**31, 2**32, 2**40, 2**62, 2**63 - 1, 2**64 - 1]
WHOLE_BYTE_CODES = [c for c in ("F32", "U8", "BF16", "I64", "BOOL", "F8_E4M3", "F8_E8M0") if c in CODES]


@st.composite
def numpy_cannot_hold(draw):
    """A shape safetensors accepts with the bytes it implies (0 or 1 element) that NumPy may not
    hold: an empty tensor whose other extents overflow every stride, or a rank beyond NumPy's."""
    kind = draw(st.sampled_from(["empty", "rank", "empty and rank"]))
    if kind == "empty":
        shape = draw(st.permutations([0] + draw(st.lists(st.sampled_from(BIG + [1, 4]), min_size=1, max_size=3))))
    else:
        shape = [1] * draw(st.sampled_from([32, 33, 63, 64, 65, 100, 1000]))
        if kind == "empty and rank":
            shape[draw(st.integers(0, len(shape) - 1))] = 0
    return list(shape)


@fuzz("safetensors shapes", 12)
@given(shape=numpy_cannot_hold(), code=st.sampled_from(WHOLE_BYTE_CODES), name=NAMES.filter(bool),
       neighbour=st.booleans())
def test_shapes_numpy_cannot_hold(worker, folder, shape, code, name, neighbour):
    """Loaded exactly where NumPy holds the shape, else a CheckpointError naming the file and the
    tensor (never NumPy's bare ValueError); a valid tensor beside it changes nothing."""
    size = sf.element_dtype(code).itemsize * (0 if 0 in shape else 1)
    header = {name: {"dtype": code, "shape": shape, "data_offsets": [0, size]}}
    data = bytes(size)
    if neighbour and name != "ok":
        header["ok"] = {"dtype": "U8", "shape": [2], "data_offsets": [size, size + 2]}
        data += b"\x01\x02"
    path = folder / "shape.safetensors"
    path.write_bytes(sf.build(header, data))
    case = f"{name!r}: {code} of shape {shape if len(shape) < 8 else f'[{len(shape)} dims: {set(shape)}]'}"
    with judged("safetensors shapes"):
        judge("safetensors shapes", worker, path, case, names=(name,))


# --------------------------------------------------------------------------- special files (issue 34)
SPECIAL = ["fifo", "directory", "socket", "symlink to fifo", "symlink to directory", "symlink to /dev/null",
           "dangling symlink", "missing", "empty file"]
SUFFIXES = [".safetensors", ".SAFETENSORS", ".SafeTensors", ".npz", ".NPZ", "", ".bin"]
# Never a write through /dev/null: were the refusal ever lost, a root CI would replace the device.
ACTIONS = {"read_tensors", "read_safetensors_metadata", "read_npz", "write_safetensors"}


@fuzz("special files", 16)
@given(kind=st.sampled_from(SPECIAL), suffix=st.sampled_from(SUFFIXES), action=st.sampled_from(sorted(ACTIONS)))
# Always run: what the class found (a socket's open() raised a bare OSError) and the writes the
# issue named (a FIFO replaced by a file).
@example(kind="socket", suffix=".npz", action="read_npz")
@example(kind="socket", suffix=".safetensors", action="read_tensors")
@example(kind="fifo", suffix=".safetensors", action="write_safetensors")
@example(kind="symlink to fifo", suffix=".SAFETENSORS", action="write_safetensors")
@example(kind="empty file", suffix=".safetensors", action="write_safetensors")
def test_special_files(worker, kind, suffix, action):
    """A FIFO, a directory, a socket (or a symlink to one, or to a character device) named as a
    checkpoint: refused at once with a CheckpointError naming it, never read as empty, never waited
    on, never replaced by a write. A missing file is FileNotFoundError or a CheckpointError; an
    empty regular file is refused on reading and written over."""
    if action == "write_safetensors" and kind == "symlink to /dev/null":
        kind = "symlink to fifo"
    area = "special files"
    case = f"{action} on {kind} named 'x{suffix}'"
    with judged(area):
        r = worker_outcome(area, worker.run("special_file", dict(kind=kind, name=f"x{suffix}", action=action),
                                            timeout=60), case)
        assert not (isinstance(r, tuple) and r[0] == "raised"), f"[{area}] the case itself failed: {r} ({case})"
        outcome, path = r["outcome"], r["path"]
        special = kind not in ("missing", "dangling symlink", "empty file")
        if action == "write_safetensors":
            assert r["after"] == r["before"] or not special, f"[{area}] the write replaced {kind} ({case})"
            if not special:
                assert outcome[0] == "ok", f"[{area}] refused to write a new or regular file: {outcome} ({case})"
                assert r["readback"][0] == "ok", f"[{area}] the file written does not read back: {r['readback']}"
                record(area, "written")
                return
        assert outcome[0] == "raised", f"[{area}] {action} accepted {kind} ({case}): {outcome}"
        _, exc_type, message = outcome
        missing = kind in ("missing", "dangling symlink") and action != "write_safetensors"
        allowed = ("CheckpointError", "FileNotFoundError") if missing else ("CheckpointError",)
        assert exc_type in allowed, f"[{area}] {exc_type}: {message} ({case})"
        assert path in message, f"[{area}] the refusal does not name the file: {message} ({case})"
        record(area, "refused")
