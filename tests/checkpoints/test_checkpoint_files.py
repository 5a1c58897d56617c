"""Checkpoint files as a security boundary (issue 26, findings 1-4): one regression test per
defect found. Files are written by the safetensors package or built by hand for the broken ones
(tests/_safetensors_files.py); what a file holds is decided by safetensors' own reader there,
never by jax_gpuext's. The randomized version of these checks is tests/fuzz/test_fuzz_checkpoints.py.
"""

from __future__ import annotations

import io
import os
import pathlib
import re
import stat
import struct
import subprocess
import sys
import textwrap
import zipfile

import ml_dtypes
import numpy as np
import pytest
import safetensors

import _safetensors_files as sf
from jax_gpuext import checkpoints as ck
from jax_gpuext import formats


def entry(dtype, shape, offsets):
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def refused(path, *fragments):
    """pytest.raises for a CheckpointError whose message names the file and each fragment."""
    return pytest.raises(ck.CheckpointError, match=re.escape(str(path)) + ".*" + ".*".join(fragments))


def write(tmp_path, blob: bytes, name="m.safetensors"):
    path = tmp_path / name
    path.write_bytes(blob)
    return path


# --------------------------------------------------------------------------- 1. crash
def test_arrays_read_are_owned_and_a_rewrite_replaces_the_file(tmp_path):
    """Findings 1: arrays were views of a live memory map, so rewriting the file changed them and
    reading them after a truncation killed the process (SIGBUS); write_safetensors truncated in
    place a file others had mapped. In a child process, so a SIGBUS fails this test only."""
    script = textwrap.dedent("""
        import os, stat, sys
        import numpy as np
        from jax_gpuext import checkpoints as ck
        folder = sys.argv[1]
        p = os.path.join(folder, "m.safetensors")
        ck.write_safetensors(p, {"w": np.arange(1 << 16, dtype=np.float32)})  # 256 KiB: many pages
        a = ck.read_safetensors(p)["w"]
        before = a.copy()
        assert a.flags.writeable and a.base is None or a.base.base is None, "not an array of its own"
        ck.write_safetensors(p, {"w": -np.arange(1 << 16, dtype=np.float32)})
        assert np.array_equal(a, before), "a rewrite changed an array read earlier"
        with open(p, "r+b") as f:
            f.truncate(0)  # in place, as the old writer did
        assert np.array_equal(a, before), "a truncation changed an array read earlier"
        print("read side survived")

        # someone else maps the file (np.memmap, safetensors' own loaders); we rewrite it shorter
        ck.write_safetensors(p, {"w": np.arange(1 << 16, dtype=np.float32)})
        os.chmod(p, 0o640)
        inode = os.stat(p).st_ino
        mapped = np.memmap(p, np.uint8, "r")
        old = mapped.tobytes()
        ck.write_safetensors(p, {"w": np.zeros(3, np.float32)})
        assert mapped.tobytes() == old, "the mapped old file changed"
        assert os.stat(p).st_ino != inode, "the file was rewritten in place"
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o640, "the file's mode was not kept"
        assert sorted(os.listdir(folder)) == ["m.safetensors"], os.listdir(folder)
        # through a symlink: the file it points to is replaced, the link stays a link
        link = os.path.join(folder, "link.safetensors")
        os.symlink(p, link)
        ck.write_safetensors(link, {"w": np.ones(2, np.float32)})
        assert os.path.islink(link) and ck.read_safetensors(p)["w"].tolist() == [1.0, 1.0]
        print("write side survived")
    """)
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit status {r.returncode} (-7 is SIGBUS)\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "read side survived" in r.stdout and "write side survived" in r.stdout


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "m.safetensors"
    ck.write_safetensors(path, {"w": np.arange(4, dtype=np.float32)})
    with refused(path, "'bad'", "object"):
        ck.write_safetensors(path, {"ok": np.ones(2), "bad": np.array([object()])})
    assert ck.read_safetensors(path)["w"].tolist() == [0, 1, 2, 3]
    assert os.listdir(tmp_path) == ["m.safetensors"]


# --------------------------------------------------------------------------- 2. unclear errors
DATA4 = bytes(4)
MALFORMED = {  # what used to leak -> a CheckpointError naming the file and safetensors' reason
    "header_a_list": (sf.build(None, text=b"[1, 2]"), "invalid type: sequence"),  # AttributeError
    "entry_not_an_object": (sf.build({"t": 3}), "invalid type: integer"),  # AttributeError
    "missing_field": (sf.build({"t": {"dtype": "F32", "shape": [0]}}), "missing field `data_offsets`"),  # KeyError
    "deep_nesting": (sf.build(None, text=b'{"t":' * 5000 + b"1" + b"}" * 5000), "recursion limit"),  # RecursionError
    "shape_of_lists": (sf.build({"t": entry("F32", [[1]], [0, 4])}, DATA4), "invalid type: sequence"),  # unhashable
    "offsets_strings": (sf.build({"t": entry("F32", [1], ["0", "4"])}, DATA4), "invalid type: string"),  # slice
    "truncated_json": (sf.build(None, DATA4, text=b'{"t": {"dtype": "F32", "shape": [1], "data_o'), "EOF"),
    "not_utf8": (sf.build(None, DATA4, text=b'{"\xff": ' + b'{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
                 "invalid UTF-8"),  # UnicodeDecodeError
    "size_mismatch": (sf.build({"t": entry("F32", [3], [0, 16])}, bytes(16)), "tensor 't' is F32 \\[3\\]: 12 bytes"),
    "shape_overflows": (sf.build({"t": entry("F32", [2**62, 4], [0, 16])}, bytes(16)),  # passed as 0 bytes
                        "overflow", "tensor 't'"),
    "shape_past_u64": (sf.build({"t": entry("F32", [2**64, 4], [0, 16])}, bytes(16)), "expected usize"),
    "negative_dim": (sf.build({"t": entry("F32", [-1], [0, 4])}, DATA4), "expected usize"),
    "unknown_dtype": (sf.build({"t": entry("F128", [1], [0, 4])}, DATA4), "unknown variant `F128`"),
    "data_short": (sf.build({"t": entry("F32", [4], [0, 16])}, bytes(12)), "not fully covered",
                   "tensors end at data byte 16, the file holds 12"),  # the reader sliced past the end
    "too_short": (b"\x01\x00", "header too small"),
    "empty": (b"", "header too small"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_headers_are_one_clear_refusal(tmp_path, case):
    blob, *fragments = MALFORMED[case]
    path = write(tmp_path, blob)
    with refused(path, "not a valid safetensors file", *fragments):
        ck.read_safetensors(path)


def npy_member(shape, dtype, data: bytes) -> bytes:
    """An .npy file whose header says ``shape`` and ``dtype`` and whose data is ``data``."""
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                             "fortran_order": False, "shape": shape})
    return f.getvalue() + data


def npz(members: dict, method=zipfile.ZIP_STORED) -> bytes:
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w", method) as z:
        for name, blob in members.items():
            z.writestr(name, blob)
    return f.getvalue()


def test_npz_failures_are_clear_refusals_before_any_allocation(tmp_path):
    """BadZipFile, EOFError and MemoryError ("Unable to allocate 64 GiB" from a few hundred bytes)
    leaked from np.load; each is now a CheckpointError, and nothing is allocated from a header."""
    path = write(tmp_path, b"PK\x03\x04 not a zip at all", "a.npz")
    with refused(path, "not a valid .npz file", "BadZipFile"):
        ck.read_tensors(path)
    path = write(tmp_path, npz({"w.npy": npy_member((64, 64), np.float32, bytes(16))}), "b.npz")
    with refused(path, "'w'", r"float32\[64, 64\] \(16384 bytes\) but holds 16 bytes"):
        ck.read_tensors(path)
    huge = npz({"w.npy": npy_member((1 << 33, 2), np.float32, bytes(8))})  # 64 GiB by its header
    assert len(huge) < 400
    path = write(tmp_path, huge, "c.npz")
    with refused(path, "'w'", "68719476736 bytes"):
        ck.read_tensors(path)
    deflated = npz({"w.npy": npy_member((1 << 20,), np.float32, bytes(1 << 22))}, zipfile.ZIP_DEFLATED)
    zip_bomb = bytearray(deflated)  # the central directory claims 2**40 bytes for ~4 KiB of deflate
    at = zip_bomb.rfind(b"PK\x01\x02")
    zip_bomb[at + 24:at + 28] = struct.pack("<I", 0xFFFFFFFF)
    path = write(tmp_path, bytes(zip_bomb), "d.npz")
    with refused(path, "'w.npy'"):
        ck.read_tensors(path)
    valid = npz({"w.npy": npy_member((2, 2), np.float32, np.arange(4, dtype=np.float32).tobytes())})
    path = write(tmp_path, valid[: len(valid) // 2], "e.npz")  # truncated
    with refused(path, "not a valid .npz file"):
        ck.read_tensors(path)
    path = write(tmp_path, npz({"w.npy": np.lib.format.MAGIC_PREFIX + b"\x01\x00\xff\xff" + b"{"}), "f.npz")
    with refused(path, "not a valid .npz file"):
        ck.read_tensors(path)
    path = write(tmp_path, npz({"w.npy": npy_member((2,), object, b"\x80\x04N.")}), "g.npz")  # a pickle
    with refused(path, "'w.npy'\\) has dtype object", "never loaded"):
        ck.read_tensors(path)
    path = write(tmp_path, npz({"w.npy": npy_member((2,), np.float32, bytes(8)), "w": b"x"}), "h.npz")
    with refused(path, "'w' is not an .npy array"):
        ck.read_tensors(path)


def test_npz_reads_what_numpy_writes(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"f32": rng.standard_normal((3, 5)).astype(np.float32), "fortran": np.asfortranarray(rng.random((4, 3))),
              "big_endian": np.arange(6, dtype=">i4").reshape(2, 3), "bool": rng.random(7) < 0.5,
              "scalar": np.float32(2.5), "empty": np.zeros((0, 3), np.int8), "c64": np.ones(2, np.complex64)}
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "a.npz", **arrays)
        got = ck.read_tensors(tmp_path / "a.npz")
        assert sorted(got) == sorted(arrays)
        for k, v in arrays.items():
            assert got[k].dtype == v.dtype.newbyteorder("=") and got[k].shape == np.shape(v)
            assert np.array_equal(got[k], v), k


# --------------------------------------------------------------------------- 3. invalid accepted
INVALID = {  # files the safetensors package rejects, which the hand-written reader accepted
    "overlap": (sf.build({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [1], [4, 8])}, bytes(8)),
                "invalid offset for tensor `b`"),
    "alias": (sf.build({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [2], [0, 8])}, bytes(8)),
              "invalid offset for tensor"),
    "gap_before_first": (sf.build({"a": entry("F32", [1], [4, 8])}, bytes(8)), "invalid offset for tensor `a`"),
    "trailing_bytes": (sf.build({"a": entry("F32", [1], [0, 4])}, bytes(8)), "not fully covered"),
    "utf16_header": (sf.build(None, DATA4, text='{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
                              .encode("utf-16")), "invalid UTF-8"),
    "boolean_offsets": (sf.build(None, DATA4, text=b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": '
                                 b'[false, true]}}'), "invalid type: boolean"),
    "metadata_not_strings": (sf.build({"__metadata__": {"step": 1}, "a": entry("F32", [1], [0, 4])}, DATA4),
                             "expected a string"),
    "header_over_100MB": (struct.pack("<Q", 100_000_001) + b"{}", "header too large"),  # 1.2 GB RSS before
    "header_past_the_file": (struct.pack("<Q", 10**6) + b"{}", "invalid header length"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_files_safetensors_rejects_are_refused(tmp_path, case):
    blob, fragment = INVALID[case]
    assert sf.expected(blob)[0] == "refused"  # the library's own verdict
    path = write(tmp_path, blob)
    with refused(path, "not a valid safetensors file", fragment):
        ck.read_safetensors(path)


@pytest.mark.parametrize("second", ["same", "other_dtype", "in_metadata"])
def test_a_name_given_twice_is_refused(tmp_path, second):
    """safetensors keeps the last of two entries silently; we refuse (our own check)."""
    first = b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    text = {"same": b"{" + first + b", " + first + b"}",
            "other_dtype": b"{" + first + b', "a": {"dtype": "I32", "shape": [1], "data_offsets": [0, 4]}}',
            "in_metadata": b'{"__metadata__": {"k": "1", "k": "2"}, ' + first + b"}"}[second]
    blob = sf.build(None, DATA4, text=text)
    safetensors.deserialize(blob)  # accepted by the library: the check is ours
    path = write(tmp_path, blob)
    with refused(path, "names '" + ("k" if second == "in_metadata" else "a") + "' twice"):
        ck.read_safetensors(path)


def test_a_path_must_be_a_path_never_a_descriptor(tmp_path):
    path = tmp_path / "m.safetensors"
    ck.write_safetensors(path, {"w": np.ones(2, np.float32)})
    fd = os.open(path, os.O_RDONLY)
    try:
        for reader in (ck.read_safetensors, ck.read_tensors, ck.read_npz, ck.read_safetensors_metadata):
            with pytest.raises(TypeError, match="file descriptors are not accepted"):
                reader(fd)
        os.fstat(fd)  # still open: the caller's descriptor was not closed
    finally:
        os.close(fd)
    with pytest.raises(TypeError, match="file descriptors"):
        ck.write_safetensors(fd, {})
    assert ck.read_tensors(os.fsencode(path))["w"].tolist() == [1, 1]  # bytes paths are paths
    os.mkfifo(tmp_path / "pipe.safetensors")  # refused at once, not a read that waits for a writer
    with refused(tmp_path / "pipe.safetensors", "not a regular file"):
        ck.read_safetensors(tmp_path / "pipe.safetensors")
    with refused(tmp_path, "not a regular file"):
        ck.read_safetensors(tmp_path)


def test_a_bool_byte_other_than_0_or_1_is_refused(tmp_path):
    path = write(tmp_path, sf.build({"flags": entry("BOOL", [3], [0, 3])}, b"\x00\x01\x02"))
    with refused(path, "tensor 'flags'", "byte 2 at element 2"):
        ck.read_safetensors(path)


# --------------------------------------------------------------------------- 4. valid refused or changed
def test_every_dtype_safetensors_has_loads_exactly(tmp_path):
    """A BOOL/I16/U16/U32/U64/C64 tensor made the whole file unreadable. Now every dtype the
    installed safetensors knows maps to one NumPy dtype, and files written by safetensors load bit
    for bit (NaN payloads, -0, every sub-byte code; 0-d where a whole byte allows)."""
    codes = sf.installed_dtypes()
    assert set(codes) <= set(ck.SAFETENSORS_DTYPES), f"unmapped: {set(codes) - set(ck.SAFETENSORS_DTYPES)}"
    tensors = {}
    for i, code in enumerate(codes):
        tensors[code] = sf.random_tensor(code, (3, 8), i)
        if code not in ck.PACKED_BITS:
            tensors[f"{code}.scalar"] = sf.random_tensor(code, (), 100 + i)
        tensors[f"{code}.empty"] = sf.random_tensor(code, (0, 4), 0)
    tensors["F4.odd_last_axis"] = sf.random_tensor("F4", (2, 3), 7)
    blob = sf.serialize(tensors, metadata={"format": "np"})
    kind, want = sf.expected(blob)
    assert kind == "loaded"
    sf.assert_same_tensors(want, tensors, "safetensors' reader")
    path = write(tmp_path, blob)
    sf.assert_same_tensors(ck.read_safetensors(path), tensors, "read_safetensors")
    assert ck.read_safetensors_metadata(path) == {"format": "np"}


def test_our_writer_writes_what_safetensors_reads(tmp_path):
    tensors = {code: sf.random_tensor(code, (2, 4), i) for i, code in enumerate(sf.installed_dtypes())
               if code not in ("F6_E2M3", "F6_E3M2")}
    tensors["scalar"] = np.array(np.float32(0.013))  # ModelOpt's weight_scale_2: it was written as [1]
    path = tmp_path / "m.safetensors"
    ck.write_safetensors(path, tensors, metadata={"producer": "jax_gpuext", "": ""})
    kind, want = sf.expected(path.read_bytes())
    assert kind == "loaded"
    sf.assert_same_tensors(want, tensors, "safetensors' reader of our file")
    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert f.metadata() == {"producer": "jax_gpuext", "": ""}
        assert f.get_slice("scalar").get_shape() == []
    sf.assert_same_tensors(ck.read_safetensors(path), tensors, "round trip")


def test_empty_files_round_trip(tmp_path):
    """safetensors writes {} tensors with {} metadata as the unreadable header `{},"__metadata__":{}}`;
    write_safetensors passes empty metadata as none, so its file reads back."""
    for metadata in ({}, None, {"k": "v"}):
        ck.write_safetensors(tmp_path / "e.safetensors", {}, metadata=metadata)
        assert ck.read_safetensors(tmp_path / "e.safetensors") == {}
        assert ck.read_safetensors_metadata(tmp_path / "e.safetensors") == (metadata or {})


def test_writer_refusals_name_the_tensor(tmp_path):
    path = tmp_path / "m.safetensors"
    with refused(path, "'__metadata__'", "metadata"):  # was written, then dropped by every reader
        ck.write_safetensors(path, {"__metadata__": np.ones(1, np.float32)})
    with refused(path, "'w'", "float6_e2m3fn", "no 6-bit dtype"):
        ck.write_safetensors(path, {"w": np.zeros(4, ml_dtypes.float6_e2m3fn)})
    with refused(path, "'w'", "last axis"):
        ck.write_safetensors(path, {"w": np.zeros(3, ml_dtypes.float4_e2m1fn)})
    with refused(path, "'w'", "float128|complex128|datetime"):
        ck.write_safetensors(path, {"w": np.zeros(2, np.complex128)})
    with refused(path, "str -> str", "'step': 1"):
        ck.write_safetensors(path, {"w": np.zeros(2)}, metadata={"step": 1})
    with refused(path, "'w' is not an array"):
        ck.write_safetensors(path, {"w": [[1, 2], [3]]})
    with refused(path, "names are str", "int 3"):
        ck.write_safetensors(path, {3: np.zeros(2)})
    assert not path.exists()


def test_modelopt_scalars_round_trip_as_scalars(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.integers(0, 256, (4, 16), dtype=np.uint8)
    ws = (rng.random((4, 2)) + 0.5).astype(ml_dtypes.float8_e4m3fn)
    q, act = ck.from_modelopt_nvfp4(w, ws, np.float32(0.25), np.float32(0.5), name="p.weight")
    ck.write_safetensors(tmp_path / "m.safetensors", {f"p.{k}": v for k, v in ck.to_modelopt_nvfp4(q, act).items()})
    got = ck.read_tensors(tmp_path / "m.safetensors")
    assert got["p.weight_scale_2"].shape == () and got["p.input_scale"].shape == ()
    q2, act2 = ck.load_modelopt_nvfp4(got, "p")
    assert q2.format is formats.NVFP4 and float(q2.global_scale) == 0.25 and float(act2) == 0.5
    assert np.array_equal(np.asarray(q2.data).view(np.uint8), np.asarray(q.data).view(np.uint8))
    with pytest.raises(ck.CheckpointLayoutError, match=r"p\.input_scale: expected one value"):
        ck.from_modelopt_nvfp4(w, ws, np.float32(0.25), np.ones(2, np.float32), name="p.weight")


@pytest.mark.parametrize("shape", [[0, 2**62, 4], [0] * 100, [1] * 65], ids=["strides_overflow", "rank_100", "rank_65"])
def test_shapes_safetensors_accepts_and_numpy_cannot_hold_are_named(tmp_path, shape):
    """A header safetensors validates (0 elements, 0 bytes) whose shape no ndarray can have: one
    ck.CheckpointError naming the file and the tensor, never a bare NumPy ValueError (issue 34)."""
    path = write(tmp_path, sf.build({"t": entry("F32", shape, [0, 0 if 0 in shape else 4])},
                                 b"" if 0 in shape else b"\0" * 4))
    safetensors.safe_open(path, framework="numpy")  # the library's own reader accepts the header
    for reader in (ck.read_safetensors, ck.read_tensors):
        with pytest.raises(ck.CheckpointError, match=r"tensor 't'.*NumPy cannot hold this shape") as e:
            reader(path)
        assert str(path) in str(e.value)


def test_an_upper_case_suffix_is_the_same_kind_of_file(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    ck.write_safetensors(tmp_path / "m.SAFETENSORS", {"a": a})
    np.testing.assert_array_equal(ck.read_tensors(tmp_path / "m.SAFETENSORS")["a"], a)
    with open(tmp_path / "n.NPZ", "wb") as f:  # (np.savez would append ".npz" to a name)
        np.savez(f, a=a)
    np.testing.assert_array_equal(ck.read_tensors(tmp_path / "n.NPZ")["a"], a)


def test_the_writer_never_replaces_a_special_file(tmp_path):
    """A FIFO, a directory (and, where one can be made, a device node) named as the target are
    refused and left as they were; os.replace would have swapped in a regular file (issue 34)."""
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    folder = tmp_path / "dir.safetensors"
    folder.mkdir()
    link = tmp_path / "link.safetensors"
    link.symlink_to(fifo)  # through a symlink, the FIFO it points to
    for target, kind in ((fifo, "a FIFO"), (folder, "a directory"), (link, "a FIFO")):
        with pytest.raises(ck.CheckpointError, match=f"not a regular file \\({kind}\\)"):
            ck.write_safetensors(target, {"a": np.zeros(2, np.float32)})
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and folder.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.safetensors", "link.safetensors", "pipe.safetensors"]
    dev_null = pathlib.Path("/dev/null")
    if os.access("/dev", os.W_OK):  # as root: the device node itself must survive
        with pytest.raises(ck.CheckpointError, match="a character device"):
            ck.write_safetensors(dev_null, {"a": np.zeros(2, np.float32)})
        assert stat.S_ISCHR(os.stat(dev_null).st_mode)
