"""WebDataset tar shards and Parquet / Arrow files as sources: index, rows, stores, resumption."""

import gc
import glob
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import shutil
import tarfile
import tracemalloc
import warnings

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("timm")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
wds = pytest.importorskip("webdataset")

from extract import (  # noqa: E402
    FileChangedError,
    ProvenanceError,
    extract_features,
    load_features,
    merge_shards,
    open_source,
    shard_path,
)
from extract._labels import label_kind_problem  # noqa: E402
from extract._schema import FAILED, PENDING  # noqa: E402
from extract._tables import TableError, _drop_cursor  # noqa: E402
from extract._tar_shards import FileBytes, ShardError, tar_members  # noqa: E402
from extract._testing import (  # noqa: E402
    hf_image_schema,
    make_image_folder,
    write_parquet,
    write_webdataset,
)

# Tiny backbones on tiny images: a second torch thread only waits (conftest.py).
pytestmark = pytest.mark.usefixtures("one_torch_thread")

BACKBONE = "timm:test_resnet@random"
# On the CPU wherever a test is about something else than the device: with a GPU present
# the default device computes in bfloat16 and decodes JPEGs there, and rows from batches
# of other sizes then differ by more than these tests' float32 tolerances.
FAST = dict(batch_size=4, num_workers=0, image_size=32, progress=False, device="cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """One image folder, and the same images as 3 tar shards and as a Parquet file."""
    root = tmp_path_factory.mktemp("shards")
    folder = make_image_folder(root / "folder", n_per_class=4)  # 12 images, 2 unreadable
    write_webdataset(folder, root / "wds" / "%05d.tar", maxcount=5)
    write_parquet(folder, root / "hf" / "data" / "train-00000-of-00001.parquet", 5)
    return root


def _source(data, kind: str) -> str:
    return {
        "folder": str(data / "folder"),
        "webdataset": f"webdataset:{data}/wds/{{00000..00002}}.tar",
        "parquet": f"parquet:{data}/hf",
    }[kind]


@pytest.fixture(scope="module")
def stores(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("stores")
    kinds = ("folder", "webdataset", "parquet")
    return {k: extract_features(_source(data, k), BACKBONE, out / f"{k}.h5", **FAST) for k in kinds}


# --- reading tar headers -------------------------------------------------------------


def _tar(path, fmt, names):
    with tarfile.open(path, "w", format=fmt) as tf:
        folder = tarfile.TarInfo("d")
        folder.type = tarfile.DIRTYPE
        tf.addfile(folder)
        link = tarfile.TarInfo("d/link.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "x.jpg"
        tf.addfile(link)
        for k, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = 700 * k + 1
            tf.addfile(info, io.BytesIO(bytes([k % 256]) * info.size))
        for name, target in [*_hard_links(fmt, names), ("h.jpg", "absent.jpg"), ("later.jpg", "z")]:
            hard = tarfile.TarInfo(name)
            hard.type, hard.linkname = tarfile.LNKTYPE, target
            tf.addfile(hard)
        tf.addfile(tarfile.TarInfo("z"))  # after the link that names it


def _hard_links(fmt, names) -> list[tuple[str, str]]:
    """(name, target) of hard links (tar writes one for a file that shares an inode with
    an earlier one) to the members ``names``: to long names and under one where the format
    has them."""
    long = fmt != tarfile.USTAR_FORMAT
    return [  # (the second named as ./a.cls, ./c.cls as c.cls: tar compares names normalised)
        (
            f"{'y' * 120 if long and k == 0 else 'h'}{k}.{name.split('.')[-1]}",
            name.removeprefix("./") if name.startswith("./") else "./" * (k == 1) + name,
        )
        for k, name in enumerate(names)
        if long or len(name) <= 100
    ]


@pytest.mark.parametrize("size", [b"-0001750", b"00017x0", b"0001790"])
def test_a_tar_header_of_an_unreadable_size_is_refused(tmp_path, size):
    # Its checksum right, "-0001750" was read as -1000: the next header was this one again,
    # and indexing never ended; "00017x0" raised int()'s ValueError, naming no shard.
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("a.jpg", "a.cls"):
            info = tarfile.TarInfo(name)
            info.size = 600
            tar.addfile(info, io.BytesIO(b"1" * 600))
    raw = bytearray(buf.getvalue())
    header = raw[1536:2048]  # a.cls's
    header[124:136] = size.ljust(12, b"\0")
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    raw[1536:2048] = header
    (tmp_path / "t.tar").write_bytes(raw)
    match = r"damaged at byte 1536 \(a tar header with an unreadable size\)"
    with open(tmp_path / "t.tar", "rb") as fh, pytest.raises(ShardError, match=match):
        tar_members(FileBytes(fh, "t.tar"), "t.tar", hashlib.sha256())


def test_file_bytes_are_sliced_as_bytes_are(tmp_path):
    # A reversed slice past the bytes read ahead (a tar header's negative size) gave the
    # read-ahead's bytes up to a negative index, not b"".
    ahead = FileBytes._AHEAD
    data = np.random.default_rng(0).integers(0, 256, 3 * ahead + 17, np.uint8).tobytes()
    (tmp_path / "f").write_bytes(data)
    edges = [0, 1, 511, ahead - 1, ahead, ahead + 1, 2 * ahead + 3, len(data) - 1, len(data)]
    edges += [len(data) + 1, len(data) + ahead]
    with open(tmp_path / "f", "rb") as fh:
        shard = FileBytes(fh, "f")
        for start in edges:
            for stop in edges:
                assert shard[start:stop] == data[start:stop], (start, stop)
                assert shard[stop:start] == data[stop:start], (stop, start)


def test_indexing_a_shard_reads_little_of_its_images(tmp_path, monkeypatch):
    # Each header was read with the 64 KiB after it: of a shard of 256 KiB images, more
    # bytes than the shard holds (3 reads a sample), where a mapping read the headers' pages.
    from extract import _tar_shards

    with tarfile.open(tmp_path / "s.tar", "w") as tar:
        for k in range(4):
            for ext, data in (("jpg", b"\xff" * (256 << 10)), ("cls", b"1")):
                info = tarfile.TarInfo(f"{k}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    read, pread = [], os.pread
    monkeypatch.setattr(_tar_shards.os, "pread", lambda *a: read.append(a[1]) or pread(*a))
    assert len(_tar_shards.index_shard(str(tmp_path / "s.tar"), ("jpg",), "cls").keys) == 4
    assert sum(read) < os.path.getsize(tmp_path / "s.tar") / 10


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_tar_headers_are_read_as_tarfile_reads_them(tmp_path, fmt, caplog):

    long_dir = "/".join(["folder"] * 15)  # 104 characters: ustar stores it in the prefix
    names = ["a.jpg", "a.cls", f"{long_dir}/b.seg.png", "ü/é.txt", "./c.cls"]
    if fmt != tarfile.USTAR_FORMAT:
        names.append("x" * 150 + ".jpg")  # longer than any ustar name: pax / GNU long name
    _tar(tmp_path / "t.tar", fmt, names)
    with tarfile.open(tmp_path / "t.tar") as tf:
        # A hard link reads as the earlier member it names, names compared normalised (as
        # tarfile's extractfile finds it); one to no earlier member is skipped.
        expected, seen = [], {}  # (seen by normalised name)
        for m in tf.getmembers():
            name = posixpath.normpath(m.name)
            if m.islnk():
                try:
                    content = tf.extractfile(m).read()
                except KeyError:  # tarfile finds no such member before it either
                    continue
                seen[name] = seen[posixpath.normpath(m.linkname)]
                assert content == tf.extractfile(seen[name]).read()
            elif m.isreg():
                seen[name] = m
            else:
                continue
            expected.append((m.name, seen[name].offset_data, seen[name].size))
    with open(tmp_path / "t.tar", "rb") as fh:
        caplog.set_level(logging.WARNING, logger="extract")
        assert tar_members(FileBytes(fh, "t.tar"), "t.tar", hashlib.sha256()) == expected
    assert caplog.messages == [
        "t.tar: 2 hard links to no earlier member are skipped ('h.jpg', 'later.jpg')."
    ]
    linked = [name for name, _ in _hard_links(fmt, names)]
    assert [name for name, _, _ in expected] == [*names, *linked, "z"]


def _rewrite_header(data: bytearray, offset: int, start: int, value: bytes) -> None:
    """Write ``value`` at ``start`` of the tar header at ``offset``; fix its checksum."""
    header = data[offset : offset + 512]
    header[start : start + len(value)] = value
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[offset : offset + 512] = header


def test_a_pax_size_record_and_gnu_header_times_are_read_as_tar_reads_them(tmp_path):
    # A pax 'size' record (how pax writes a member of 8 GiB or more) is the member's size,
    # whatever its ustar field says; a GNU header's access and change times (incremental
    # dumps) lie where ustar has its name prefix, and are no part of the name.
    with tarfile.open(tmp_path / "p.tar", "w", format=tarfile.PAX_FORMAT) as tf:
        for name, size in (("a.jpg", 600), ("a.cls", 1)):
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = size, {"size": str(size)}
            tf.addfile(info, io.BytesIO(b"1" * size))
    with tarfile.open(tmp_path / "g.tar", "w", format=tarfile.GNU_FORMAT) as tf:
        for name, size in (("a.jpg", 600), ("a.cls", 1)):
            info = tarfile.TarInfo(name)
            info.size = size
            tf.addfile(info, io.BytesIO(b"1" * size))
    for path, start, value in (("p.tar", 124, b"00000000000\0"), ("g.tar", 345, b"14677016640\0")):
        data = bytearray((tmp_path / path).read_bytes())
        with tarfile.open(tmp_path / path) as tf:
            first = tf.getmembers()[0]
        _rewrite_header(data, first.offset_data - 512, start, value)  # the member's own header
        (tmp_path / path).write_bytes(bytes(data))
        src = open_source(f"webdataset:{tmp_path / path}")
        assert src.ids == ["a"] and src.archive.read(src.root, [0], {}) == [b"1" * 600]


def _damage(path, how) -> int:
    """Damage a shard; returns the offset of the header the damage is in."""
    data = bytearray(path.read_bytes())
    with tarfile.open(path) as tf:
        members = tf.getmembers()
    headers = [m.offset for m in members]  # where each member's (first) header starts
    if how == "checksum":
        data[headers[1] + 10] ^= 0xFF
    elif how == "after end":
        data[-20] = 1
    elif how == "inside a header":
        data = data[: headers[-1] + 100]
    elif how == "inside a pax header":
        data = data[: headers[-1] + 513]  # the writer puts a pax header before each member
    elif how == "in a pax header's padding":  # its records whole, its last block not
        size = int(bytes(data[headers[-1] + 124 : headers[-1] + 136]).strip(b"\0 "), 8)
        data = data[: headers[-1] + 512 + size + 1]
    elif how == "inside a label":
        label = [m for m in members if m.name.endswith(".cls")][-1]
        data = data[: label.offset_data]
    elif how in ("inside a member", "in a member's padding"):
        # Before the last sample's: the samples after the cut were dropped, unsaid.
        label = [m for m in members if m.name.endswith(".cls")][0]
        data = data[: label.offset_data + (1 if how == "in a member's padding" else 0)]
    elif how in ("pax record of length 0", "pax size not a number"):
        pax = headers[-1] + 512  # the payload of the last member's pax header
        record = bytes(data[pax : pax + 512]).split(b"\n")[0] + b"\n"  # "LENGTH key=value\n"
        digits = record.split(b" ")[0]
        if how == "pax record of length 0":  # read over and over, for ever
            new = b"0" * len(digits) + record[len(digits) :]
        else:  # a record of the same length, "size=xx...x"
            new = digits + b" size=" + b"x" * (len(record) - len(digits) - 7) + b"\n"
        data[pax : pax + len(record)] = new  # tar's checksums leave the payload out
    elif how == "between members":  # accepted: the samples after it vanished unsaid
        data = data[: headers[2]]
    path.write_bytes(bytes(data))
    return {"checksum": headers[1], "between members": headers[2]}.get(how, headers[-1])


@pytest.mark.parametrize(
    "how, match",
    [
        ("checksum", r"damaged at byte {} \(a tar header with a wrong checksum\)"),
        ("after end", "data after the end-of-archive marker"),
        ("inside a header", r"damaged at byte {} \(the file ends inside a tar header\)"),
        ("inside a pax header", r"damaged at byte {} \(the file ends inside a tar header\)"),
        ("in a pax header's padding", r"damaged at byte {} \(the file ends inside a tar head"),
        ("inside a label", r"damaged at byte \d+ \(the file ends inside the member '.*\.cls': it"),
        ("inside a member", r"damaged at byte \d+ \(the file ends inside the member '.*\.cls': it"),
        ("in a member's padding", r"at byte \d+ \(the file ends inside the member '.*\.cls': it"),
        ("pax record of length 0", r"damaged at byte {} \(an unreadable pax header\)"),
        ("pax size not a number", r"damaged at byte {} \(an unreadable pax header\)"),
        ("between members", r"damaged at byte {} \(no end-of-archive marker: the file was cut"),
        ("empty", "is empty"),
    ],
)
def test_damaged_shards_are_refused_naming_the_place(data, tmp_path, how, match):
    shard = tmp_path / "s.tar"
    shard.write_bytes((data / "wds" / "00000.tar").read_bytes() if how != "empty" else b"")
    if how != "empty":
        match = match.format(_damage(shard, how))
    with pytest.raises(ShardError, match=match) as info:
        open_source(f"webdataset:{shard}")
    assert str(shard) in str(info.value)


# --- the webdataset source -----------------------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    ["D/{00000..00002}.tar", "D/*.tar", "D", "D/00000.tar::D/0000{1,2}.tar"],
)
def test_webdataset_rows_are_the_samples_in_shard_order(data, pattern):
    src = open_source("webdataset:" + pattern.replace("D", str(data / "wds")))
    folder = open_source(data / "folder")
    assert src.ids == [os.path.splitext(i)[0] for i in folder.ids]  # keys, as the writer got them
    np.testing.assert_array_equal(src.labels, folder.labels)
    assert src.class_names == ["0", "1"]  # cls holds class indices
    assert list(src.files) == ["00000.tar", "00001.tar", "00002.tar"]
    assert src.archive.unit.tolist() == [0] * 5 + [1] * 5 + [2] * 2
    assert src.item_name(6) == f"{data}/wds/00001.tar:{src.ids[6]}"


@pytest.mark.parametrize(
    "label_key, class_names",
    [("json.label", ["cat", "dog"]), ("cls", ["tabby", "hound"])],
)
def test_webdataset_labels_from_json_paths_and_classnames_txt(
    data, tmp_path, label_key, class_names
):
    shards = tmp_path / "test"
    shards.mkdir()
    for shard in (data / "wds").glob("*.tar"):
        (shards / shard.name).write_bytes(shard.read_bytes())
    # clip_benchmark's layout; a byte-order mark, as editors save one, is no part of a name
    # (nor are a Windows line end and blanks after a name; blank lines after the last name
    # name no class)
    (tmp_path / "classnames.txt").write_text("tabby \r\nhound\n\r\n \n", encoding="utf-8-sig")
    src = open_source(f"webdataset:{shards}/*.tar", label_key=label_key)
    assert src.class_names == class_names
    np.testing.assert_array_equal(src.labels, open_source(data / "folder").labels)
    assert src.options["label_key"] == label_key


def test_a_byte_order_mark_in_a_text_label_is_no_part_of_the_name(tmp_path):
    # It made "\ufeffcat" a second class beside "cat", without a word.
    _write_shard(
        tmp_path / "s.tar",
        [{"__key__": "a", "jpg": b"x", "txt": "\ufeffcat".encode()},
         {"__key__": "b", "jpg": b"x", "txt": b"cat"}],
    )  # fmt: skip
    src = open_source(f"webdataset:{tmp_path}/s.tar", label_key="txt")
    assert src.class_names == ["cat"]
    np.testing.assert_array_equal(src.labels, [0, 0])


@pytest.mark.parametrize(
    "names, match",
    [
        ("tabby\nhound\ntabby\n", r"The class names give 'tabby' 2 times: each class needs"),
        ("tabby\nho\0und\n", r"The class name 'ho\\x00und' holds a NUL character"),
        # A blank line: class 1 was named '', the names after it shifted onto the next.
        ("tabby\n\nhound\n", r"leave class 1 without a name; each class needs one \(a blank"),
        ("tabby\n \t\nhound\n", r"The class names leave class 1 without a name"),
        # A blank first line: stripped away, each name named the class before its own.
        ("\ntabby\nhound\n", r"The class names leave class 0 without a name"),
        (" \r\ntabby\r\nhound\r\n", r"The class names leave class 0 without a name"),
    ],
)
def test_class_names_of_indices_name_each_class_once_in_storable_text(tmp_path, names, match):
    # Accepted, a store named two classes alike (their per-class results indistinct), or
    # h5py refused a NUL with its own words.
    shards = tmp_path / "test"
    shards.mkdir()
    _write_shard(shards / "s.tar", [{"__key__": "a", "jpg": b"x", "cls": 0}])
    (tmp_path / "classnames.txt").write_text(names, encoding="utf-8")
    with pytest.raises(ShardError, match=match + r".*classnames.txt'\)$"):
        open_source(f"webdataset:{shards}/s.tar")
    # Labels that are names leave the file unread: it is no concern of theirs (not even
    # where it is no UTF-8 text).
    _write_shard(shards / "s.tar", [{"__key__": "a", "jpg": b"x", "txt": b"cat"}])
    assert open_source(f"webdataset:{shards}/s.tar", label_key="txt").class_names == ["cat"]
    (tmp_path / "classnames.txt").write_bytes("tabby\nhound\xe9\n".encode("latin-1"))
    assert open_source(f"webdataset:{shards}/s.tar", label_key="txt").class_names == ["cat"]


@pytest.mark.parametrize(
    "names, said",
    [
        (
            "# ImageNet subset\ntabby\nhound\n",
            r": line 1 \('# ImageNet subset'\) starts with '#' and is read as a class name:",
        ),
        ("tabby\n  #2\nhound\n#4\n", r": lines 2, 4 \('#2'\) start with '#' and are read"),
        ("tabby\nhound\n", None),
    ],
)
def test_a_comment_looking_line_of_classnames_txt_is_a_name_and_said(tmp_path, caplog, names, said):
    # A '#' line, meant as a comment, named class 0 and shifted every name after it onto
    # the next class, without a word. Kept (a class may be called '#1'), and said once.
    shards = tmp_path / "test"
    shards.mkdir()
    _write_shard(shards / "s.tar", [{"__key__": "a", "jpg": b"x", "cls": 0}])
    (tmp_path / "classnames.txt").write_text(names, encoding="utf-8")
    caplog.set_level(logging.WARNING, logger="extract")
    src = open_source(f"webdataset:{shards}/s.tar")
    assert src.class_names == [line.strip() for line in names.splitlines()]
    said_of = [r.getMessage() for r in caplog.records if "classnames.txt" in r.getMessage()]
    if said is None:
        assert not said_of
        return
    (message,) = said_of
    assert re.search(said, message)
    assert "each line is the name of one class, in the order of the class indices" in message
    assert "no comment syntax" in message


def test_classnames_txt_lines_are_numbered_as_an_editor_numbers_them(tmp_path, caplog):
    # str.splitlines cut a name at a form feed or U+2028 too: one class became two, and
    # every line number after it was off by one.
    shards = tmp_path / "test"
    shards.mkdir()
    _write_shard(shards / "s.tar", [{"__key__": "a", "jpg": b"x", "cls": 1}])
    (tmp_path / "classnames.txt").write_text("tabby\u2028cat\r\n#2\n", encoding="utf-8")
    caplog.set_level(logging.WARNING, logger="extract")
    assert open_source(f"webdataset:{shards}/s.tar").class_names == ["tabby\u2028cat", "#2"]
    assert ": line 2 ('#2')" in caplog.text


def test_a_classnames_txt_that_is_not_utf8_is_named(data, tmp_path):
    # "'utf-8' codec can't decode byte 0xff in position 0", of no file.
    shards = tmp_path / "test"
    shutil.copytree(data / "wds", shards)
    (tmp_path / "classnames.txt").write_bytes("tabby\nhound\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"classnames.txt' is not UTF-8 text .* save it as UTF-8"):
        open_source(f"webdataset:{shards}/*.tar")


def _write_shard(path, samples):
    with wds.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)
    return path


@pytest.mark.parametrize(
    "odd, match",
    [
        ("-1", "'-1', which is no class index"),
        ("cat", "'cat', a class name, where other"),
        ("٣", "'٣', a class name, where other"),  # a digit to str.isdigit, not to us
    ],
)
def test_labels_that_mix_indices_with_other_labels_are_refused(tmp_path, odd, match):
    # One such label made every label a name, sorted as text: "10" before "2", and the
    # classes of these shards renumbered against those of shards without it.
    labels = [str(k) for k in range(12)] + [odd]
    samples = [{"__key__": f"s{k:03d}", "jpg": b"x", "cls": v} for k, v in enumerate(labels)]
    _write_shard(tmp_path / "00000.tar", samples)
    with pytest.raises(ShardError, match=f"sample 's012' .* has the label {match}"):
        open_source(f"webdataset:{tmp_path}")


@pytest.mark.parametrize(
    "labels, warning",
    [
        (
            [f"{k % 12}.0" for k in range(24)],
            r"sample 's002' .* has the label '2.0', which is a whole.* \(class 4 is '2.0'\)",
        ),
        # -1.0 sorted first (pandas' -1 of unlabelled samples): "0.0" was class 1, unsaid.
        (
            ["-1.0", "0.0", "1.0"],
            r"sample 's001' .* has the label '0.0', which is a whole.* \(class 1 is '0.0'\)",
        ),
        (["0.0", "1.0", "1.0"], None),  # classes 0 and 1 either way
        (["0.5", "1.0"], None),  # not integers: names
    ],
)
def test_labels_of_whole_numbers_written_as_decimals_are_said_as_in_a_list(
    tmp_path, caplog, labels, warning
):
    # "2.0" (pandas writes integers so in a column that held a missing value) was class 4
    # of 12 without a word, where a list file of the same labels says so.
    samples = [{"__key__": f"s{k:03d}", "jpg": b"x", "cls": v} for k, v in enumerate(labels)]
    _write_shard(tmp_path / "00000.tar", samples)
    caplog.set_level(logging.WARNING, logger="extract")
    src = open_source(f"webdataset:{tmp_path}")
    assert src.class_names == sorted(set(labels))
    if warning is None:
        assert not caplog.records
    else:
        assert len(caplog.records) == 1 and re.search(warning, caplog.text)
        assert "the classes sorted as text (class" in caplog.text


@pytest.mark.parametrize("shards", [[["a", "b", "a"]], [["a", "b"], ["c", "b"]]])
def test_a_sample_key_used_twice_is_refused(tmp_path, shards):
    # Apart in one shard or in two shards, a key became two rows of one path: the store
    # could not tell their images apart.
    for number, keys in enumerate(shards):
        samples = [{"__key__": key, "jpg": b"x", "cls": "0"} for key in keys]
        _write_shard(tmp_path / f"{number:05d}.tar", samples)
    where = ", ".join(repr(str(tmp_path / f"{n:05d}.tar")) for n in range(len(shards)))
    key = "a" if len(shards) == 1 else "b"
    match = re.escape(f"sample key '{key}' occurs 2 times, in {where}: each")
    with pytest.raises(ShardError, match=match):
        open_source(f"webdataset:{tmp_path}")


@pytest.mark.parametrize(
    "members, match",
    [  # tar cf s.tar *.jpg *.cls (each image, then each label), or *.cls *.jpg
        (["a.jpg", "b.jpg", "a.cls", "b.cls"], r"\(jpg here; cls later, other samples' members"),
        (["a.cls", "b.cls", "a.jpg", "b.jpg"], r"\(jpg here; cls earlier, other samples' members"),
        (["a.jpg", "a.cls", "b.jpg", "b.cls", "a.txt"], r"\(txt here; jpg, cls earlier, other"),
        (["a.cls", "b.cls", "a.jpg", "b.jpg", "a.txt"], r"\(jpg here; cls earlier and txt later,"),
    ],
)
def test_a_sample_whose_members_lie_apart_is_refused_as_such(tmp_path, members, match):
    # It was said to have no 'cls' label, to be chosen with --label-key (txt, here).
    _write_tar(tmp_path / "s.tar", [(name, b"0") for name in members])
    with pytest.raises(ShardError, match=r"The sample 'a' of .* has its members apart " + match):
        open_source(f"webdataset:{tmp_path}/s.tar")


@pytest.mark.parametrize(
    "labels, row, why",
    [  # each became a class: '' for the empty and blank ones, '-1' for an unlabelled split
        (["cat", "dog", "", "dog"], 2, "'', which is empty"),
        (["cat", " ", "dog"], 1, "'', which is empty"),
        (["-1", "-1", "-1"], 0, "'-1', which is no class index"),
    ],
)
def test_empty_and_unlabelled_labels_are_refused(tmp_path, labels, row, why):
    assert label_kind_problem(["cat", "dog", "-1"]) is None  # names: ±1 labels, say
    assert label_kind_problem(["+1", "-1"]) is None
    assert label_kind_problem(["-5C", "-10C"]) is None  # names that start like a -1
    samples = [{"__key__": f"s{k:03d}", "jpg": b"x", "txt": v} for k, v in enumerate(labels)]
    _write_shard(tmp_path / "00000.tar", samples)
    with pytest.raises(ShardError, match=f"sample 's00{row}' .* has the label {why}"):
        open_source(f"webdataset:{tmp_path}", label_key="txt")
    _table(tmp_path / "t.parquet", {"image": [b"x"] * len(labels), "label": labels})
    with pytest.raises(TableError, match=f"Row {row} .* has the 'label' label {why}"):
        open_source(f"parquet:{tmp_path}/t.parquet")


@pytest.mark.parametrize("as_folder", [True, False])
@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz", ".tar"])
def test_a_compressed_shard_is_refused_in_a_folder_as_in_a_pattern(tmp_path, as_folder, suffix):
    # A folder source listed only its .tar files: the samples of a .tar.gz were left out.
    import gzip

    samples = [{"__key__": f"s{k}", "jpg": b"x", "cls": "0"} for k in range(2)]
    _write_shard(tmp_path / "00000.tar", samples)
    plain = _write_shard(tmp_path / "00001.tar", samples)
    data = plain.read_bytes()
    plain.unlink()
    (tmp_path / f"00001{suffix}").write_bytes(gzip.compress(data))
    (tmp_path / "notes.txt.gz").write_bytes(gzip.compress(b"not a shard"))  # ignored
    source = f"webdataset:{tmp_path}" if as_folder else f"webdataset:{tmp_path}/0*"
    with pytest.raises(ValueError, match=f"00001{suffix}' is compressed"):
        open_source(source)  # a gzipped shard named .tar was called damaged


def test_a_shard_whose_first_member_starts_like_bzip2_is_no_compressed_shard(tmp_path):
    import bz2

    samples = [{"__key__": "BZhang_001", "jpg": b"x", "cls": "0"}]
    shard = _write_shard(tmp_path / "00000.tar", samples)
    assert open_source(f"webdataset:{shard}").ids == ["BZhang_001"]
    shard.write_bytes(bz2.compress(shard.read_bytes()))
    with pytest.raises(ValueError, match="is compressed"):
        open_source(f"webdataset:{shard}")


def test_hidden_files_in_a_shard_folder_are_no_shards(tmp_path):
    # macOS's AppleDouble ._00000.tar made the folder "damaged at byte 0"; a glob skips it.
    samples = [{"__key__": f"s{k}", "jpg": b"x", "cls": "0"} for k in range(2)]
    _write_shard(tmp_path / "00000.tar", samples)
    (tmp_path / "._00000.tar").write_bytes(b"\x00\x05\x16\x07" + bytes(4092))
    assert (
        open_source(f"webdataset:{tmp_path}").ids
        == open_source(f"webdataset:{tmp_path}/*.tar").ids
        == ["s0", "s1"]
    )


@pytest.mark.parametrize("side", ["00000_stats.json", "00000.parquet"])
def test_a_pattern_that_names_a_side_file_says_it_is_no_tar(tmp_path, side):
    # 'shards/*' beside img2dataset's side files: the JSON was "a shard damaged at byte 0
    # (the file ends inside a tar header) ... repair the shard".
    _write_shard(tmp_path / "00000.tar", [{"__key__": "s0", "jpg": b"x", "cls": "0"}])
    (tmp_path / side).write_bytes(
        b'{"count": 1}' if side.endswith("json") else bytes(range(256)) * 4
    )
    with pytest.raises(ShardError) as info:
        open_source(f"webdataset:{tmp_path}/*")
    assert str(info.value) == (
        f"{str(tmp_path / side)!r} is no tar file (it does not start with a tar header), but "
        "the pattern names it as a shard: name the shards alone (e.g. 'shards/*.tar', or the "
        "folder 'shards/')."
    )
    assert open_source(f"webdataset:{tmp_path}").ids == ["s0"]  # (the folder: .tar alone)


def test_an_img2dataset_folder_is_read_with_its_keys(tmp_path):
    # img2dataset's webdataset output: {00000..N}.tar of key.jpg / key.txt / key.json, keys
    # shard * 10^4 + index on 9 digits, beside NNNNN.parquet and NNNNN_stats.json.
    for shard in range(2):
        samples = [
            {
                "__key__": f"{shard * 10_000 + k:09d}",
                "jpg": b"\xff\xd8 not decoded here",
                "txt": f"a photo number {k}",
                "json": {
                    "url": "https://x/y.jpg",
                    "status": "success",
                    "label": ["cat", "dog"][k % 2],
                },
            }
            for k in range(3)
        ]
        _write_shard(tmp_path / f"{shard:05d}.tar", samples)
        _table(tmp_path / f"{shard:05d}.parquet", {"key": [s["__key__"] for s in samples]})
        (tmp_path / f"{shard:05d}_stats.json").write_text("{}")
    src = open_source(f"webdataset:{tmp_path}", label_key="json.label")
    assert src.ids == ["000000000", "000000001", "000000002", "000010000", "000010001", "000010002"]
    assert src.class_names == ["cat", "dog"] and src.labels.tolist() == [0, 1, 0, 0, 1, 0]
    assert list(src.files) == ["00000.tar", "00001.tar"]
    with pytest.raises(
        ShardError,
        match=r"choose it with --label-key, e.g. --label-key json.label or --label-key txt\.$",
    ):
        open_source(f"webdataset:{tmp_path}/{{00000..00001}}.tar")  # no cls member


def _write_tar(path, members):
    """A tar of ``(name, bytes)`` members, written as they are given."""
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_members_are_grouped_into_samples_as_webdataset_groups_them(tmp_path):
    # Extensions are lower-cased (a camera's A.JPG is a jpg member), WebDataset's metadata
    # members (__meta__/...) are no samples, and a member whose extension ends in json is
    # decoded as JSON, as webdataset decodes it.
    members = [("__meta__/info.txt", b"x"), ("a.JPG", b"jpeg"), ("a.Cls", b"1"), ("b.jpg", b"")]
    _write_tar(tmp_path / "s.tar", [*members, ("b.cls", b"0"), ("c.jpg", b"x"), ("c.cls", b"1")])
    src = open_source(f"webdataset:{tmp_path}/s.tar")
    assert src.ids == ["a", "b", "c"] and src.labels.tolist() == [1, 0, 1]
    assert src.archive.read(src.root, [0], {})[0] == b"jpeg"
    assert open_source(f"webdataset:{tmp_path}/s.tar", image_key="JPG").ids == ["a", "b", "c"]
    _write_tar(tmp_path / "s.tar", [("a.jpg", b"x"), ("a.meta.json", b'"cat"')])
    assert open_source(f"webdataset:{tmp_path}/s.tar", label_key="meta.json").class_names == ["cat"]
    # Two members of one name in a row: the sample's second image would replace its first.
    _write_tar(tmp_path / "s.tar", [("a.jpg", b"x"), ("a.jpg", b"y"), ("a.cls", b"0")])
    with pytest.raises(ShardError, match="has two 'a.jpg' members in a row"):
        open_source(f"webdataset:{tmp_path}/s.tar")


def test_a_json_member_named_alone_is_decoded_as_json(tmp_path):
    # Its raw text was the label: the JSON string "cat" became the class '"cat"'.
    texts = [b'"dog"', b' "cat"']
    samples = [{"__key__": f"k{k}", "jpg": b"x", "json": v} for k, v in enumerate(texts)]
    _write_shard(tmp_path / "s.tar", samples)
    src = open_source(f"webdataset:{tmp_path}/s.tar", label_key="json")
    assert src.class_names == ["cat", "dog"] and src.labels.tolist() == [1, 0]


def test_a_relative_shard_or_parquet_pattern_is_recorded_anchored_as_typed(tmp_path, monkeypatch):
    # 'webdataset:shards/{0..1}.tar' was the store's source as typed: relative to a folder
    # that neither the store nor report.json named.
    (tmp_path / "shards").mkdir()
    for k in range(2):
        _write_shard(
            tmp_path / "shards" / f"{k}.tar", [{"__key__": f"k{k}", "jpg": b"x", "cls": b"0"}]
        )
    pq.write_table(pa.table({"image": [b"a"], "label": ["cat"]}), tmp_path / "t.parquet")
    monkeypatch.chdir(tmp_path)
    src = open_source("webdataset:shards/{0..1}.tar")
    assert src.description == f"webdataset:{tmp_path}/shards/{{0..1}}.tar"
    assert open_source("parquet:*.parquet").description == f"parquet:{tmp_path}/*.parquet"


@pytest.mark.parametrize(
    "sample, label_key, match",
    [
        (
            {"jpg": b"x", "txt": b"cat"},
            None,
            r"sample 'k0' of .* has no 'cls' label \(its members: jpg, txt\)",
        ),
        # A misspelt path said what is there (it was "has no 'json.label' label" alone).
        (
            {"jpg": b"x", "json": {"y": 1, "lable": "cat"}},
            "json.label",
            r"has no 'json.label' label; 'label' is not among the keys there \(y, lable\)",
        ),
        ({"jpg": b"x", "json": {"label": 1.5}}, "json.label", "is 1.5; a label is an integer"),
        ({"jpg": b"x", "json": {"label": True}}, "json.label", "is True; a label is an integer"),
        (
            {"jpg": b"x", "json": {"labels": [3]}},
            "json.labels.1",
            r"has no 'json.labels.1' label; '1' is no index of the array there \(1 item, from 0\)",
        ),
        (
            {"jpg": b"x", "json": b"{not json"},
            "json.label",
            "'json' member of the sample 'k0' .* unreadable",
        ),
        ({"txt": b"cat"}, "txt", r"No sample .* has a jpg/.* member \(the first has txt\)"),
        # A JSON member named alone: each whole document was a class name (on img2dataset
        # shards, every sample a class of its own).
        (
            {"jpg": b"x", "json": {"url": "u", "label": "cat"}},
            "json",
            r"The 'json' member of the sample 'k0' of .* is an object \(its keys: url, label\), "
            r"not a label; give the label's path in it, e.g. --label-key json.label\.$",
        ),
        (
            {"jpg": b"x", "json": {"url": "u", "key": "k0"}},
            "json",
            r"an object \(its keys: url, key\), not a label; give the label's path in it, "
            r"--label-key json.KEY, KEY the one that holds the label\.$",
        ),
        ({"jpg": b"x", "json": [3, "x"]}, "json", r"is an array, .* e.g. --label-key json.0\.$"),
        # Without classnames.txt the message ended in "(None)", as if naming a file.
        ({"jpg": b"x", "cls": 2000000}, None, r"would make 2000001 classes .* from 0\.$"),
        # Text HDF5 cannot hold ended in h5py's "VLEN strings do not support embedded
        # NULLs", or "surrogates not allowed", of no sample.
        (
            {"jpg": b"x", "txt": b"cat\0dog"},
            "txt",
            r"The 'txt' label of the sample 'k0' of .* is 'cat\\x00dog', which holds a NUL",
        ),
        (
            {"jpg": b"x", "json": b'{"label": "x\\u0000"}'},
            "json.label",
            r"is 'x\\x00', which holds a NUL character",
        ),
        (
            {"jpg": b"x", "json": b'{"label": "\\ud800"}'},
            "json.label",
            r"is '\\ud800', which is not UTF-8 text \(it holds a lone surrogate\)",
        ),
    ],
)
def test_webdataset_label_and_image_errors_are_one_line(tmp_path, sample, label_key, match):
    _write_shard(tmp_path / "s.tar", [{"__key__": "k0", **sample}])
    with pytest.raises(ShardError, match=match) as info:
        open_source(f"webdataset:{tmp_path}/s.tar", label_key=label_key)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "pattern, error, match",
    [
        ("", ValueError, "empty pattern; give e.g. webdataset:shards/"),
        ("{0..3}.tar", FileNotFoundError, "shard '0.tar' .* does not exist"),
        ("*.nothing", ValueError, "matches no file"),
        ("https://host/{0..3}.tar", ValueError, "is not a local file"),
        ("s.tar::s.tar", ValueError, "names '.*s.tar' twice"),
    ],
)
def test_bad_shard_patterns(tmp_path, monkeypatch, pattern, error, match):
    monkeypatch.chdir(tmp_path)
    _write_shard(tmp_path / "s.tar", [{"__key__": "k", "jpg": b"x", "cls": 0}])
    with pytest.raises(error, match=match):
        open_source(f"webdataset:{pattern}")


def test_a_glob_that_matches_folders_too_names_its_files_alone(tmp_path):
    # A folder beside the shards (a scratch folder, a copy in progress) matched by '*' was
    # taken for a shard and failed to open: IsADirectoryError.
    _write_shard(tmp_path / "s.tar", [{"__key__": "k", "jpg": b"x", "cls": 0}])
    (tmp_path / "tmp.tar").mkdir()
    src = open_source(f"webdataset:{tmp_path}/*")
    assert list(src.files) == ["s.tar"] and src.ids == ["k"]


def test_samples_without_image_or_with_bad_bytes_are_failed_rows(tmp_path):
    good = io.BytesIO()
    from PIL import Image

    Image.new("RGB", (20, 16), (200, 10, 10)).save(good, format="JPEG")
    samples = [
        {"__key__": "a", "jpg": good.getvalue(), "cls": 0},
        {"__key__": "b", "txt": b"no image here", "cls": 1},
        {"__key__": "c", "jpg": b"not a jpeg", "cls": 1},
        {"__key__": "d", "png": good.getvalue()[:100], "cls": 0},  # truncated (and not a PNG)
    ]
    _write_shard(tmp_path / "s.tar", samples)
    out = extract_features(f"webdataset:{tmp_path}/s.tar", BACKBONE, tmp_path / "f.h5", **FAST)
    loaded = load_features(out)
    assert loaded.paths == ["a"]
    reasons = dict(loaded.failures)
    assert reasons["b"].startswith("LookupError: the sample has no jpg/jpeg/png")
    assert "cannot identify image file" in reasons["c"] and "s.tar:c" in reasons["c"]
    assert set(reasons) == {"b", "c", "d"}


# --- the parquet source --------------------------------------------------------------


def test_parquet_rows_labels_and_hf_class_names(data):
    src = open_source(f"parquet:{data}/hf")
    folder = open_source(data / "folder")
    assert src.class_names == ["cat", "dog"]  # from the huggingface schema metadata
    np.testing.assert_array_equal(src.labels, folder.labels)
    name = "data/train-00000-of-00001.parquet"
    assert src.ids[:2] == [f"{name}:0", f"{name}:1"] and list(src.files) == [name]
    assert src.archive.unit.tolist() == [0] * 5 + [1] * 5 + [2] * 2  # row groups of 5
    assert src.archive.row.tolist() == [0, 1, 2, 3, 4] * 2 + [0, 1]
    assert src.options == {"image_key": "image", "label_key": "label"}


def _table(path, columns, schema=None, **kwargs):
    pq.write_table(pa.table(columns, schema=schema), path, **kwargs)
    return path


def test_parquet_labels_that_mix_indices_and_names_are_refused(tmp_path):
    # An integer column in one file and names in another became names sorted as text:
    # the indices renumbered ("10" before "2").
    _table(tmp_path / "0.parquet", {"image": [b"a", b"b"], "label": [2, 10]})
    _table(tmp_path / "1.parquet", {"image": [b"c", b"d"], "label": ["cat", "dog"]})
    with pytest.raises(TableError, match="indices .* in some, class names .* in others"):
        open_source(f"parquet:{tmp_path}/{{0,1}}.parquet")


def test_parquet_binary_columns_string_labels_and_several_files(tmp_path):
    for k in range(2):  # img2dataset's parquet output: a binary jpg column
        _table(tmp_path / f"{k}.parquet", {"jpg": [b"a", b"b"], "label": ["dog", f"c{k}"]})
    src = open_source(f"parquet:{tmp_path}/{{0,1}}.parquet")
    assert src.class_names == ["c0", "c1", "dog"] and src.labels.tolist() == [2, 0, 2, 1]
    assert src.ids == ["0.parquet:0", "0.parquet:1", "1.parquet:0", "1.parquet:1"]
    assert src.options["image_key"] == "jpg" and src.archive.unit.tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("kind", [pa.large_string(), pa.string_view()])
def test_parquet_class_names_in_other_string_types(tmp_path, kind):
    # string_view labels were refused as "a label column holds ... class names".
    labels = pa.array(["dog", "cat", "dog"], kind)
    _table(tmp_path / "0.parquet", {"image": [b"a", b"b", b"c"], "label": labels})
    src = open_source(f"parquet:{tmp_path}/0.parquet")
    assert src.class_names == ["cat", "dog"] and src.labels.tolist() == [1, 0, 1]


def test_parquet_string_labels_of_digits_are_class_names(tmp_path):
    # "10" and "2" were read as class indices: 11 classes, 9 of them empty.
    _table(tmp_path / "0.parquet", {"image": [b"a", b"b", b"c"], "label": ["10", "2", "10"]})
    src = open_source(f"parquet:{tmp_path}/0.parquet")
    assert src.class_names == ["10", "2"] and src.labels.tolist() == [0, 1, 0]
    # Names all, digits among them: no mix of indices with names to refuse.
    _table(tmp_path / "0.parquet", {"image": [b"a", b"b", b"c"], "label": ["10", "cat", "2"]})
    assert open_source(f"parquet:{tmp_path}/0.parquet").class_names == ["10", "2", "cat"]
    # and among such labels a "-1" still marks an unlabelled row, not a class
    _table(tmp_path / "1.parquet", {"image": [b"a", b"b", b"c"], "label": ["0", "1", "-1"]})
    with pytest.raises(TableError, match="Row 2 .* '-1', which is no class index"):
        open_source(f"parquet:{tmp_path}/1.parquet")


@pytest.mark.parametrize(
    "columns, kwargs, match",
    [
        (
            {"image": [b"a"], "y": [0]},
            {},
            r"has no column 'label' \(its columns: \['image', 'y'\]\)",
        ),
        ({"a": [b"a"], "b": [b"b"], "label": [0]}, {}, r"2 columns of image bytes \(a, b\)"),
        ({"image": ["text"], "label": [0]}, {}, "column 'image' .* is string, not encoded images"),
        (
            {"image": [b"a", b"b"], "label": [0, -1]},
            {},
            "Row 1 .* label -1, which is no class .*unlabelled",
        ),
        ({"image": [b"a"], "label": [None]}, {}, "Row 0 .* has no 'label' label"),
        ({"image": [b"a"], "label": [0.5]}, {}, "'label' column .* is double"),
        ({"image": [b"a"], "label": [0]}, {"image_key": "img"}, "has no column 'img'"),
        # A struct with a 'bytes' field of text is no Hugging Face Image.
        (
            {"image": [{"bytes": "a", "path": None}], "label": [0]},
            {},
            "column 'image' .* is struct<bytes: string, path: null>, not encoded images",
        ),
    ],
)
def test_parquet_column_errors_are_one_line(tmp_path, columns, kwargs, match):
    _table(tmp_path / "t.parquet", columns)
    with pytest.raises(TableError, match=match) as info:
        open_source(f"parquet:{tmp_path}/t.parquet", **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("dictionary", [["dog", None], [3, None]])
def test_a_null_in_a_label_column_s_dictionary_is_a_missing_label(tmp_path, dictionary):
    # null_count counts the indices' nulls only: a null in the dictionary (an Arrow stream
    # can hold one) became the class "None", or "nan" of integers.
    labels = pa.DictionaryArray.from_arrays(pa.array([0, 1]), pa.array(dictionary))
    table = pa.table({"image": [b"a", b"b"], "label": labels})
    _arrow_stream(tmp_path / "t.arrow", table, 2)
    with pytest.raises(TableError, match="Row 1 .* has no 'label' label"):
        open_source(f"parquet:{tmp_path}/t.arrow")


def test_files_with_their_images_in_different_columns_are_refused(tmp_path):
    # Read from the first file's column, every row of the other failed: no such column.
    _table(tmp_path / "a.parquet", {"image": [b"x"], "label": [0]})
    _table(tmp_path / "b.parquet", {"img": [b"x"], "label": [1]})
    with pytest.raises(TableError, match="hold their images in different columns"):
        open_source(f"parquet:{tmp_path}/*.parquet")


def test_rows_without_image_bytes_say_where_the_image_is(tmp_path):
    rows = {"image": [{"bytes": b"a", "path": None}, {"bytes": None, "path": "x.jpg"}, None]}
    schema = hf_image_schema(["a", "b"])
    _table(tmp_path / "t.parquet", rows | {"label": [0, 1, 1]}, schema=schema)
    src = open_source(f"parquet:{tmp_path}/t.parquet")
    first, second, third = src.archive.read(src.root, [0, 1, 2], {})
    assert first == bytearray(b"a") and isinstance(second, LookupError)
    assert str(second) == "the row holds no image bytes (it refers to 'x.jpg' instead)"
    assert str(third) == "the row holds no image bytes"  # no image at all


def test_rows_of_a_large_row_group_are_read_as_asked_in_any_order(tmp_path):
    # A row before the cursor's record batch (64 rows) reopens the row group: read from
    # the batch the cursor holds, a negative position gave another row's image.
    images = [f"image {k}".encode() for k in range(150)]
    _table(tmp_path / "t.parquet", {"image": images, "label": [0] * 150}, row_group_size=150)
    src = open_source(f"parquet:{tmp_path}/t.parquet")
    rows = [100, 3, 140, 70, 69]
    assert src.archive.read(src.root, rows, {}) == [images[k] for k in rows]
    # A row that fails is named by its file and row (not by its id after the file).
    from extract._images import ItemDataset

    ((_, _, reason, _),) = ItemDataset(src, lambda im: torch.zeros(3, 2, 2)).__getitems__([3])
    assert reason.endswith("cannot identify image file '" + str(tmp_path / "t.parquet:3'"))


def test_a_parquet_folder_is_read_in_sorted_order_whatever_the_listing(tmp_path, reversed_listing):
    # The files of a folder came in the order the file system lists them (ext4: by hash).
    for k in range(3):
        _table(tmp_path / f"train-0000{k}-of-00003.parquet", {"image": [b"x"], "label": [k]})
    src = open_source(f"parquet:{tmp_path}")
    assert src.labels.tolist() == [0, 1, 2]
    assert list(src.files) == [f"train-0000{k}-of-00003.parquet" for k in range(3)]


def test_a_damaged_page_fails_the_rows_of_its_row_group_alone(tmp_path):
    # Rows are read a record batch at a time: a page header that cannot be read fails the
    # rows of its row group, each on its own, and the next row group reads as before.
    images = [bytes([i]) * 3000 for i in range(40)]
    schema = pa.schema([pa.field("image", pa.binary(), nullable=False), ("label", pa.int64())])
    path = _table(
        tmp_path / "t.parquet",
        {"image": images, "label": np.arange(40) % 2},
        schema=schema,
        row_group_size=20,
        use_dictionary=False,
        compression="none",
        write_batch_size=4,
        data_page_size=8000,
        write_statistics=False,  # page headers without min and max images
    )
    raw = bytearray(path.read_bytes())
    # Uncompressed plain pages: each value is its length and its bytes; between rows 3 and
    # 4 lies the header of the row group's second page.
    end = raw.find((3000).to_bytes(4, "little") + images[3]) + 3004
    start = raw.find((3000).to_bytes(4, "little") + images[4])
    assert 0 < end < start < end + 64
    raw[end:start] = b"\xff" * (start - end)
    path.write_bytes(raw)
    src = open_source(f"parquet:{path}")
    state = {}
    read = src.archive.read(src.root, list(range(40)), state)
    _drop_cursor(state)
    assert all(isinstance(r, OSError) and "page header" in str(r) for r in read[:20])
    assert read[20:] == images[20:]


def test_parquet_labels_and_class_names_a_store_cannot_hold_are_refused(tmp_path):
    rows = {"image": [{"bytes": b"a", "path": None}] * 2, "label": ["a", "b\0"]}
    _table(tmp_path / "t.parquet", rows)
    with pytest.raises(TableError, match=r"Row 1 of .* the 'label' label 'b\\x00', which holds"):
        open_source(f"parquet:{tmp_path}/t.parquet")
    rows = {"image": [{"bytes": b"a", "path": None}], "label": [0]}
    _table(tmp_path / "t.parquet", rows, schema=hf_image_schema(["a", "a"]))
    match = r"The 'label' labels of .*t.parquet': The class names give 'a' 2 times"
    with pytest.raises(TableError, match=match):
        open_source(f"parquet:{tmp_path}/t.parquet")
    # String labels are names: the ClassLabel names go unread.
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([pa.field("image", pa.binary()), pa.field("label", pa.string())],
                       metadata=hf_image_schema(["a", "a"]).metadata)  # fmt: skip
    pq.write_table(pa.table({"image": [b"a"], "label": ["cat"]}, schema=schema),
                   tmp_path / "t.parquet")  # fmt: skip
    assert open_source(f"parquet:{tmp_path}/t.parquet").class_names == ["cat"]
    # Nor do files disagree on names they leave unread.
    pq.write_table(pa.table({"image": [b"b"], "label": ["dog"]}), tmp_path / "u.parquet")
    assert open_source(f"parquet:{tmp_path}/*.parquet").class_names == ["cat", "dog"]
    (tmp_path / "u.parquet").unlink()
    # A string column of bytes that are not UTF-8 ended in a bare UnicodeDecodeError.
    labels = pa.array([b"cat", b"d\xffg"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"image": [b"a", b"b"], "label": labels}), tmp_path / "t.parquet")
    with pytest.raises(TableError, match=r"Row 1 of .* has a 'label' label that is not UTF-8"):
        open_source(f"parquet:{tmp_path}/t.parquet")


@pytest.mark.parametrize(
    "labels, said",
    [
        ([str(k) for k in range(12)], r"Row 10 of .* has the 'label' label '10', a string of "),
        (["2", "10", "2"], r"Row 1 of .* label '10', .* \(class 0 is '10'\)"),
        (["0", "1", "2"], None),  # sorted alike as text and as numbers
        (["10", "2", "cat"], None),  # names
    ],
)
def test_a_string_column_of_digits_sorted_as_text_is_said(tmp_path, caplog, labels, said):
    # "2" of a string column was class 4 of 12 (the classes sorted as text), unsaid, where
    # shards' and lists' labels say so where such a reading renumbers the classes.
    images = [b"x"] * len(labels)
    pq.write_table(pa.table({"image": images, "label": labels}), tmp_path / "t.parquet")
    caplog.set_level(logging.WARNING, logger="extract")
    src = open_source(f"parquet:{tmp_path}/t.parquet")
    assert src.class_names == sorted(set(labels))  # names, as the docs say
    if said is None:
        assert not caplog.records
        return
    (message,) = [r.getMessage() for r in caplog.records]
    assert re.search(said, message)
    assert "the classes sorted as text" in message and "store the labels as integers" in message


def test_class_label_out_of_range_is_refused(tmp_path):
    rows = {"image": [{"bytes": b"a", "path": None}], "label": [2]}
    _table(tmp_path / "t.parquet", rows, schema=hf_image_schema(["a", "b"]))
    with pytest.raises(TableError, match="label 2, which is no class; the classes are 0..1"):
        open_source(f"parquet:{tmp_path}/t.parquet")


def test_dataset_folders_with_several_splits_ask_for_one(tmp_path):
    (tmp_path / "data").mkdir()
    for split in ("train", "test"):
        name = f"{split}-00000-of-00001.parquet"
        _table(tmp_path / "data" / name, {"image": [b"a"], "label": [0]})
    match = r"holds the splits \['test', 'train'\]; read one, e.g. parquet:.*/data/train\*.parquet"
    with pytest.raises(TableError, match=match):
        open_source(f"parquet:{tmp_path}")
    assert len(open_source(f"parquet:{tmp_path}/data/train*.parquet")) == 1


def test_a_dataset_s_configs_and_a_pattern_of_several_splits_are_refused(tmp_path):
    # A repository whose configs (160px/, 320px/) each hold the split was read as one
    # source, every image once per config; a glob over train and validation files was read
    # whole; the suggested pattern matched no file.
    for config in ("160px", "320px"):
        (tmp_path / "repo" / config).mkdir(parents=True)
        _table(tmp_path / "repo" / config / "train-00000-of-00001.parquet",
               {"image": [b"a", b"b"], "label": [0, 1]})  # fmt: skip
    match = r"one split in several folders \['160px', '320px'\].* parquet:(.*)\.$"
    with pytest.raises(TableError, match=match) as refused:
        open_source(f"parquet:{tmp_path}/repo")
    suggested = re.search(match, str(refused.value)).group(1)
    assert len(open_source(f"parquet:{suggested}")) == 2
    # A pattern names its folders on purpose: both configs, if asked for.
    assert len(open_source(f"parquet:{tmp_path}/repo/*/train-*.parquet")) == 4
    _table(tmp_path / "repo" / "160px" / "validation-00000-of-00001.parquet",
           {"image": [b"c"], "label": [0]})  # fmt: skip
    match = r"pattern .* holds the splits \['train', 'validation'\]; read one, e.g. parquet:(.*)\.$"
    with pytest.raises(TableError, match=match) as refused:
        open_source(f"parquet:{tmp_path}/repo/160px/*.parquet")
    suggested = re.search(match, str(refused.value)).group(1)
    assert len(open_source(f"parquet:{suggested}")) == 2


def test_a_split_over_folders_opens_by_pattern_and_suggestions_open(tmp_path):
    # Partitions of one split (part1/, part2/) opened before the configs check refused
    # every pattern over several folders; a suggestion could name the refused files again
    # (files without a split name), end in .parquet for Arrow files, or not be escaped.
    for part in ("part1", "part2"):
        (tmp_path / "A" / part).mkdir(parents=True)
        _table(tmp_path / "A" / part / "00000.parquet", {"image": [b"a"], "label": [0]})
    assert len(open_source(f"parquet:{tmp_path}/A/{{part1,part2}}/*.parquet")) == 2
    with pytest.raises(TableError, match="several folders"):
        open_source(f"parquet:{tmp_path}/A")  # a folder: as configs, said with the remedy
    match = r"holds the splits .*; read one, e.g. parquet:(.*)\.$"
    (tmp_path / "C").mkdir()
    for name in ("00000.parquet", "test-00000.parquet"):
        _table(tmp_path / "C" / name, {"image": [b"a"], "label": [0]})
    (tmp_path / "E[v2]" / "train").mkdir(parents=True)
    (tmp_path / "E[v2]" / "test").mkdir()
    for split in ("train", "test"):
        _arrow_stream(tmp_path / "E[v2]" / split / "data-00000-of-00001.arrow",
                      pa.table({"image": [b"a"], "label": [0]}), 1)  # fmt: skip
    arrows = f"{glob.escape(str(tmp_path / 'E[v2]'))}/*/*.arrow"
    for source, rows in ((f"{tmp_path}/C", 1), (arrows, 1)):
        with pytest.raises(TableError, match=match) as refused:
            open_source(f"parquet:{source}")
        suggested = re.search(match, str(refused.value)).group(1)
        assert len(open_source(f"parquet:{suggested}")) == rows


def test_hugging_face_shard_names_tell_their_split_and_count(tmp_path):
    # Splits of other names (query, gallery) were read as one source, a folder named like a
    # split (dev_set/) took every file under it for its split, and shards of two revisions
    # (-of-00001 beside -of-00002) or with one missing were read without a word.
    def files(folder, *names):
        for name in names:
            (tmp_path / folder / name).parent.mkdir(parents=True, exist_ok=True)
            _table(tmp_path / folder / name, {"image": [b"a", b"b"], "label": [0, 1]})
        return f"parquet:{tmp_path / folder}"

    one = "-00000-of-00001.parquet"
    with pytest.raises(TableError, match=r"holds the splits \['gallery', 'query'\]"):
        open_source(files("q", f"data/query{one}", f"data/gallery{one}"))
    # The pattern suggested reads one split: not train*, which names train_extra's too.
    with pytest.raises(TableError, match=r"e.g. parquet:.*/x/data/train-00000-of-00001.parquet\.$"):
        open_source(files("x", f"data/train{one}", f"data/train_extra{one}"))
    # Splits whose names start with a split's (GLUE MNLI's): two splits, not one.
    with pytest.raises(TableError, match=r"splits \['validation_matched', 'validation_mism"):
        open_source(files("m", f"data/validation_matched{one}", f"data/validation_mismatched{one}"))
    with pytest.raises(TableError, match=r"holds the splits \['test', 'train'\]"):
        open_source(files("d", f"dev_set/train{one}", f"dev_set/test{one}"))
    stale = files(
        "s", f"data/train{one}", *(f"data/train-0000{k}-of-00002.parquet" for k in (0, 1))
    )
    for source in (stale, f"{stale}/data/train-*.parquet"):
        with pytest.raises(TableError, match=r"shards .*train-\*' of \[1, 2\] shards each"):
            open_source(source)
    cut = files("c", *(f"data/train-0000{k}-of-00003.parquet" for k in (0, 2)))
    with pytest.raises(TableError, match=r"lacks shard 1 of the 3 of .*train-\*' \(1 missing\)"):
        open_source(cut)
    assert len(open_source(f"{cut}/data/train-*.parquet")) == 4  # the shards named: read
    # A shard name of no split's under the splits' folders: the folders tell the split.
    with pytest.raises(TableError, match=r"holds the splits \['test', 'train'\]"):
        open_source(f"{files('f', f'train/images{one}', f'test/images{one}')}/*/images-*.parquet")
    # Shards numbered from 1, or in capitals, are one complete split.
    assert (
        len(open_source(files("n", *(f"data/train-0000{k}-of-00002.parquet" for k in (1, 2))))) == 4
    )
    assert (
        len(
            open_source(
                files("u", "data/Train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet")
            )
        )
        == 4
    )


def test_the_splits_of_datasets_cache_files_are_told_apart(tmp_path):
    # <builder>-<split>[-NNNNN-of-NNNNN].arrow: three splits were read as one source.
    for split in ("train", "test", "validation"):
        for shard in ("-00000-of-00002", "-00001-of-00002"):
            _arrow_stream(tmp_path / f"beans-{split}{shard}.arrow",
                          pa.table({"image": [b"a"], "label": [0]}), 1)  # fmt: skip
    match = r"splits \['test', 'train', 'validation'\]; read one, e.g. parquet:(.*)\.$"
    with pytest.raises(TableError, match=match) as refused:
        open_source(f"parquet:{tmp_path}/*.arrow")
    suggested = re.search(match, str(refused.value)).group(1)
    assert os.path.basename(suggested).startswith("beans-train")
    assert len(open_source(f"parquet:{suggested}")) == 2
    assert len(open_source(f"parquet:{tmp_path}/beans-test-*.arrow")) == 2


def _arrow_stream(path, table, batch_rows):
    with pa.ipc.new_stream(path, table.schema) as sink:
        for batch in table.to_batches(max_chunksize=batch_rows):
            sink.write_batch(batch)


@pytest.mark.parametrize(
    "cut, match",
    [
        # pyarrow reads a stream cut between two record batches as a whole one: the batches
        # after the cut were dropped unsaid. Each batch's data ends in the bytes of the
        # end-of-stream marker here (an int32 column ending -1, 0), which must not pass for it.
        ("between batches", r"damaged at byte \d+ \(no end-of-stream marker: the file was cut"),
        # A bare pyarrow error that named no file.
        ("inside a batch", r"damaged at byte \d+ \(Expected to .*read"),
        ("data after its end", r"damaged at byte \d+ \(data after the end-of-stream marker\)"),
        ("zeros after its end", None),  # padding
        # Zeros in place of the last batches (a copy that stopped, a preallocated file):
        # their first four bytes read as the older format's marker.
        ("zeros after a batch", r"damaged at byte \d+ \(no end-of-stream marker: the file was"),
        ("legacy format", None),  # before Arrow 0.15: a 4-byte marker
    ],
)
def test_arrow_streams_cut_short_are_refused_naming_the_file(tmp_path, cut, match):
    table = pa.table(
        {
            "image": [b"a", b"b"] * 3,
            "label": [0, 1] * 3,
            "id": pa.array([-1, 0] * 3, pa.int32()),  # the marker's bytes: ff ff ff ff 0 0 0 0
        }
    )
    path = tmp_path / "data-00000-of-00001.arrow"
    options = pa.ipc.IpcWriteOptions(use_legacy_format=cut == "legacy format")
    ends = []  # where each record batch ends
    with (
        pa.OSFile(str(path), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema, options=options) as writer,
    ):
        for batch in table.to_batches(max_chunksize=2):
            writer.write_batch(batch)
            ends.append(sink.tell())
    whole = path.read_bytes()
    assert len(ends) == 3 and whole[ends[0] - 8 : ends[0]] == b"\xff" * 4 + b"\0" * 4
    damaged = {
        "between batches": whole[: ends[0]],  # two batches and the marker lost
        "inside a batch": whole[: ends[1] - 5],
        "data after its end": whole + b"\1" * 8,
        "zeros after its end": whole + b"\0" * 8,
        "zeros after a batch": whole[: ends[0]] + b"\0" * (len(whole) - ends[0]),
        "legacy format": whole,
    }[cut]
    path.write_bytes(damaged)
    if match is None:
        assert open_source(f"parquet:{path}").labels.tolist() == [0, 1] * 3
        return
    with pytest.raises(TableError, match=match) as info:
        open_source(f"parquet:{path}")
    assert f"The Arrow stream '{path}'" in str(info.value)


def test_save_to_disk_folders_read_their_arrow_streams(data, stores, tmp_path):
    # Dataset.save_to_disk: data-*.arrow (IPC streams) listed in state.json.
    table = pq.read_table(data / "hf" / "data" / "train-00000-of-00001.parquet")
    _arrow_stream(tmp_path / "data-00000-of-00002.arrow", table.slice(0, 7).combine_chunks(), 3)
    _arrow_stream(tmp_path / "data-00001-of-00002.arrow", table.slice(7).combine_chunks(), 3)
    files = [{"filename": f"data-0000{k}-of-00002.arrow"} for k in range(2)]
    (tmp_path / "state.json").write_text(json.dumps({"_data_files": files}))
    src = open_source(f"parquet:{tmp_path}")
    assert (
        src.class_names == ["cat", "dog"]
        and src.archive.unit.tolist() == [0] * 3 + [1] * 3 + [2] + [3] * 3 + [4] * 2
    )
    out = extract_features(f"parquet:{tmp_path}", BACKBONE, tmp_path / "a.h5", **FAST)
    arrow, parquet = (
        load_features(out, in_memory=True),
        load_features(stores["parquet"], in_memory=True),
    )
    np.testing.assert_array_equal(arrow.features, parquet.features)
    assert len(arrow.failures) == 2
    (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(
        TableError, match=r"splits \['train', 'test'\] of a DatasetDict; give one .*train"
    ):
        open_source(f"parquet:{tmp_path}")
    (tmp_path / "dataset_dict.json").unlink()
    # datasets < 1.15 saved a selection as its parent's whole table beside an indices file
    # (the 2020 nlp library, as slices of its files): every row of the parent was read.
    for state in (
        {"_data_files": files, "_indices_data_files": [{"filename": "indices.arrow"}]},
        {"_data_files": [{"filename": files[0]["filename"], "skip": 2, "take": 3}]},
    ):
        (tmp_path / "state.json").write_text(json.dumps(state))
        with pytest.raises(TableError, match="saved by an old datasets release as a selection"):
            open_source(f"parquet:{tmp_path}")
    # datasets' own, flattened; and 1.0-1.5's, which gave every whole file skip 0 and take
    whole = [dict(f, skip=0, take=n) for f, n in zip(files, (7, len(table) - 7), strict=True)]
    for state in ({"_data_files": files, "_indices_data_files": None}, {"_data_files": whole}):
        (tmp_path / "state.json").write_text(json.dumps(state))
        assert len(open_source(f"parquet:{tmp_path}")) == len(table)


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"splits": 3}', "{}"])
def test_a_dataset_dict_json_of_something_else_is_named(data, tmp_path, content):
    # A JSON error naming no file, or "'list' object has no attribute 'get'" and a traceback.
    shutil.copytree(data / "hf" / "data", tmp_path / "d")
    (tmp_path / "d" / "dataset_dict.json").write_text(content)
    with pytest.raises(TableError, match="dataset_dict.json' is not the dataset_dict.json of a"):
        open_source(f"parquet:{tmp_path}/d")


@pytest.mark.parametrize(
    "info",
    [None, [], {"features": {"label": {"_type": "ClassLabel"}}}]
    + [
        {"features": {"label": {"_type": "ClassLabel", "names": n}}} for n in (["a", ["b"]], [1, 2])
    ],
)
def test_a_schema_s_huggingface_metadata_of_another_shape_names_no_classes(tmp_path, info):
    # An AttributeError ('NoneType' object has no attribute 'get') or a KeyError ('names').
    metadata = {b"huggingface": json.dumps({"info": info})}
    schema = pa.schema([("image", pa.binary()), ("label", pa.int64())], metadata=metadata)
    _table(tmp_path / "t.parquet", {"image": [b"a", b"b"], "label": [1, 0]}, schema=schema)
    src = open_source(f"parquet:{tmp_path}")
    assert src.labels.tolist() == [1, 0] and src.class_names == ["0", "1"]


@pytest.mark.parametrize("state", ['{"step": 3}', "[1, 2]", "not json", '{"_data_files": 1}'])
def test_a_state_json_of_something_else_leaves_a_parquet_folder_as_it_is(data, tmp_path, state):
    # Any state.json was taken for save_to_disk's: a KeyError (a TypeError for an array)
    # and a traceback, for a folder of Parquet files beside a training run's state.
    shutil.copytree(data / "hf" / "data", tmp_path / "d")
    (tmp_path / "d" / "state.json").write_text(state)
    src = open_source(f"parquet:{tmp_path}/d")
    assert src.class_names == ["cat", "dog"] and len(src) == 12


# --- stores made from shards ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["webdataset", "parquet"])
def test_stores_equal_the_folder_store_of_the_same_images(stores, kind):
    folder, other = (load_features(stores[k], in_memory=True) for k in ("folder", kind))
    np.testing.assert_array_equal(other.features, folder.features)  # same bytes, same batches
    np.testing.assert_array_equal(other.labels, folder.labels)
    np.testing.assert_array_equal(other.rows, folder.rows)
    kinds = [[reason.split(":")[0] for _, reason in s.failures] for s in (other, folder)]
    assert kinds[0] == kinds[1] and len(kinds[0]) == 2  # the corrupt and the truncated image
    with h5py.File(stores[kind], "r") as f, h5py.File(stores["folder"], "r") as g:
        np.testing.assert_array_equal(f["content_sha256"][:], g["content_sha256"][:])
        assert json.loads(f.attrs["source_options"])["label_key"] in ("cls", "label")
        assert "source_options" not in g.attrs


def test_worker_processes_give_the_same_store(data, stores, tmp_path):
    # Each worker opens the files of its blocks and keeps its own place in a row group.
    kwargs = FAST | dict(num_workers=2)
    out = extract_features(_source(data, "parquet"), BACKBONE, tmp_path / "w.h5", **kwargs)
    assert out.read_bytes() == stores["parquet"].read_bytes()


def test_tensor_decoding_reads_jpeg_samples_undecoded(data, stores, tmp_path):
    # The default on CUDA: JPEG members leave the workers as bytes, decoded on the device.
    out = extract_features(
        _source(data, "webdataset"), BACKBONE, tmp_path / "t.h5", decode="tensor", **FAST
    )
    tensor, pil = load_features(out, in_memory=True), load_features(stores["webdataset"], True)
    assert tensor.metadata["preprocessing"]["decode"] == "tensor"
    assert [p for p, _ in tensor.failures] == [p for p, _ in pil.failures]
    np.testing.assert_allclose(
        tensor.features, pil.features, atol=0.05 * np.abs(pil.features).max()
    )


@pytest.mark.parametrize("kind", ["webdataset", "parquet"])
@pytest.mark.parametrize("key", ["image_key", "label_key"])
@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_key_is_refused_by_the_source_functions_too(data, kind, key, value):
    # webdataset_shards and parquet_files read "" as the default (label_key="" as "cls" or
    # "label"), where open_source refuses it; " " was looked for as a member or column.
    from extract import parquet_files, webdataset_shards

    opener = {"webdataset": webdataset_shards, "parquet": parquet_files}[kind]
    pattern = _source(data, kind).partition(":")[2]
    message = f"^The '{key}' parameter must name a member or column, .* Got {value!r} instead.$"
    with pytest.raises(ValueError, match=message):
        opener(pattern, **{key: value})


@pytest.mark.parametrize("kind", ["webdataset", "parquet"])
@pytest.mark.parametrize("key", ["image_key", "label_key"])
@pytest.mark.parametrize("value", [5, b"cls", ["png"]])
def test_a_key_that_is_no_text_is_refused(data, kind, key, value):
    # It failed in a bare AttributeError ('int' object has no attribute 'split') or, as
    # bytes, a TypeError of str and bytes mixed.
    from extract import parquet_files, webdataset_shards

    opener = {"webdataset": webdataset_shards, "parquet": parquet_files}[kind]
    source = _source(data, kind)
    message = rf"^The '{key}' parameter must be a str or None. Got {re.escape(repr(value))}"
    with pytest.raises(ValueError, match=message):
        opener(source.partition(":")[2], **{key: value})
    with pytest.raises(ValueError, match=message):
        open_source(source, **{key: value})


def test_webdataset_store_keeps_keys_as_paths(stores):
    loaded = load_features(stores["webdataset"])
    assert "cat/alpha" in loaded.paths and "cat/corrupt" in dict(loaded.failures)
    assert loaded.metadata["source_files"].keys() == {"00000.tar", "00001.tar", "00002.tar"}


@pytest.mark.parametrize("kind", ["webdataset", "parquet"])
def test_ranks_take_whole_shards_and_merge_in_source_order(data, stores, tmp_path, kind):
    source = _source(data, kind)
    out = tmp_path / "m.h5"
    shards = [extract_features(source, BACKBONE, out, rank=r, world_size=2, **FAST) for r in (0, 1)]
    with h5py.File(shards[0], "r") as f0, h5py.File(shards[1], "r") as f1:
        # Units (tar shards / row groups of 5 rows) 0 and 2 to rank 0, unit 1 to rank 1.
        assert f0["indices"][:].tolist() == [0, 1, 2, 3, 4, 10, 11]
        assert f1["indices"][:].tolist() == [5, 6, 7, 8, 9]
    merge_shards(shards[::-1], out)
    merged, single = load_features(out, in_memory=True), load_features(stores[kind], in_memory=True)
    assert merged.paths == single.paths and merged.failures == single.failures
    # Other batches than the single run's: equal up to float rounding.
    np.testing.assert_allclose(merged.features, single.features, rtol=1e-5, atol=1e-6)
    assert shard_path(out, 1, 2) == shards[1]


@pytest.mark.parametrize("kind", ["webdataset", "parquet"])
def test_resume_reads_only_the_rows_still_pending(data, stores, tmp_path, monkeypatch, kind):
    source = _source(data, kind)
    out = tmp_path / "f.h5"
    out.write_bytes(stores[kind].read_bytes())
    with h5py.File(out, "r+") as f:
        f["status"][4:8] = PENDING  # block 1 of 3 (batch size 4) was not done
    read = []
    archive_type = type(open_source(source).archive)
    original = archive_type.read_file

    def counting(self, path, f, items, state):
        read.extend(items)
        return original(self, path, f, items, state)

    monkeypatch.setattr(archive_type, "read_file", counting)
    extract_features(source, BACKBONE, out, **FAST)
    assert read == [4, 5, 6, 7]
    assert out.read_bytes() == stores[kind].read_bytes()


def _copy(src, dst):
    dst.mkdir(parents=True, exist_ok=True)
    for shard in sorted(src.glob("*.tar")):
        (dst / shard.name).write_bytes(shard.read_bytes())
        os.utime(dst / shard.name, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns))
    return dst


def _touch(path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _other_image_bytes(shard) -> None:
    """Change a byte of the last image member of ``shard`` (a readable image in the test
    data), its size and every tar header (its identity) kept, its modification time not."""
    with tarfile.open(shard) as tf:
        image = [m for m in tf.getmembers() if m.name.endswith((".png", ".jpg"))][-1]
    changed = bytearray(shard.read_bytes())
    changed[image.offset_data + image.size // 2] ^= 0xFF
    shard.write_bytes(changed)
    _touch(shard)  # (a file system of coarse times may have kept it)


def test_another_shard_set_is_refused_naming_the_first_difference(data, tmp_path):
    shards = _copy(data / "wds", tmp_path / "wds")
    out = extract_features(
        f"webdataset:{shards}/{{00000..00001}}.tar", BACKBONE, tmp_path / "f.h5", **FAST
    )

    def refused(pattern, **kwargs):
        with pytest.raises(ProvenanceError) as info:
            extract_features(f"webdataset:{pattern}", BACKBONE, out, **FAST, **kwargs)
        assert "\n" not in str(info.value) and "--force" in str(info.value)
        return str(info.value)

    more = refused(f"{shards}/{{00000..00002}}.tar")
    assert f"made from 2 files, the request reads 3: '{shards}/00002.tar' is new" in more
    one = extract_features(f"webdataset:{shards}/00000.tar", BACKBONE, tmp_path / "g.h5", **FAST)
    with pytest.raises(ProvenanceError, match="made from 1 file, the request reads 2: "):
        extract_features(f"webdataset:{shards}/{{00000..00001}}.tar", BACKBONE, one, **FAST)
    other = refused(f"{shards}/00000.tar::{shards}/00002.tar")
    assert "file 2 of the source is '00001.tar' in the store, '00002.tar' in the request" in other
    key = refused(f"{shards}/{{00000..00001}}.tar", label_key="json.label")
    assert "source_options.label_key: file has 'cls', request has 'json.label'" in key
    assert "images differ" not in key  # the shards are the same: only the key changed
    # The same shard written again: another size, or the same size at another time.
    (shards / "00001.tar").write_bytes((shards / "00001.tar").read_bytes() + bytes(10240))
    changed = refused(f"{shards}/{{00000..00001}}.tar")
    assert f"'{shards}/00001.tar' is not the file the store was made from" in changed
    assert "bytes now" in changed


def test_a_shard_changed_during_the_run_gives_failed_rows(data, tmp_path):
    shards = _copy(data / "wds", tmp_path / "wds")
    src = open_source(f"webdataset:{shards}/*.tar")
    (shards / "00001.tar").write_bytes((shards / "00002.tar").read_bytes())
    read = src.archive.read(src.root, [0, 5, 6], {})
    assert isinstance(read[0], bytearray)
    assert all(
        isinstance(r, OSError) and "00001.tar is not the file listed" in str(r) for r in read[1:]
    )
    # Its reason said that --retry-failed takes it, which refuses a container whose rows
    # were read in part before the change (0 here): --force; so is a Parquet file's.
    remedy = "--force extracts the store again (a changed shard or Parquet file is not taken"
    assert remedy in str(read[1])
    table = tmp_path / "hf"
    shutil.copytree(data / "hf" / "data", table)
    src = open_source(f"parquet:{table}")
    os.utime(table / "train-00000-of-00001.parquet", ns=(0, 0))
    read = src.archive.read(src.root, [0], {})
    assert "(modified since, same size); once it no longer changes, " + remedy in str(read[0])
    out = tmp_path / "f.h5"
    refused = "is not the file the store was made from"
    shards = _copy(data / "wds", tmp_path / "wds2")
    first = extract_features(f"webdataset:{shards}/*.tar", BACKBONE, out, **FAST)
    _other_image_bytes(shards / "00001.tar")  # as if changed after its first rows were read
    with h5py.File(first, "r+") as f:
        f["status"][6] = FAILED
    with pytest.raises(ProvenanceError, match=refused):  # the remedy said is the one that works
        extract_features(f"webdataset:{shards}/*.tar", BACKBONE, out, retry_failed=True, **FAST)
    extract_features(f"webdataset:{shards}/*.tar", BACKBONE, out, overwrite=True, **FAST)


def test_a_shard_rewritten_while_its_samples_are_read_gives_failed_rows(
    data, tmp_path, monkeypatch
):
    # Its size and time were checked when it was opened alone: rewritten in place as its
    # samples were read (its size kept), they were taken, bytes of either version mixed.
    shards = _copy(data / "wds", tmp_path / "wds")
    src = open_source(f"webdataset:{shards}/*.tar")
    shard = shards / "00001.tar"
    st, preadv, reads = shard.stat(), os.preadv, []

    def rewritten(fd, buffers, offset):  # after its first sample: then the shard changes
        reads.append(offset)
        if len(reads) == 2:
            shard.write_bytes(bytes(b ^ 0xFF for b in shard.read_bytes()))
            os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", rewritten)
    read = src.archive.read(src.root, [5, 6, 7], {})
    assert len(reads) == 3  # (every sample read, each from the shard opened once)
    assert all(
        isinstance(r, FileChangedError) and "00001.tar is not the file listed" in str(r)
        for r in read
    )
    assert "(modified since, same size); once it no longer changes, --force" in str(read[0])


def _two_versions(path, extra: int, n: int = 12):
    """Write a Parquet file or Arrow stream of ``n`` distinct images in one row group
    (record batch); its images, and the bytes of a second version to write over it: other
    images, ``extra`` bytes longer each (0: a file of the same layout and size)."""
    versions = []
    for other in (False, True):
        images = [bytes([k + 16 * other]) * (3000 + extra * other) for k in range(n)]
        table = pa.table({"image": pa.array(images, pa.binary()), "label": np.arange(n) % 2})
        if str(path).endswith(".arrow"):
            _arrow_stream(path, table, n)
        else:
            pq.write_table(
                table, path, row_group_size=n, write_batch_size=2, data_page_size=4000,
                compression="none", use_dictionary=False,
            )  # fmt: skip
        versions.append((images, path.read_bytes()))
    path.write_bytes(versions[0][1])
    return versions[0][0], versions[1][1]


@pytest.mark.parametrize("extra", [0, 5], ids=["same size", "another size"])
@pytest.mark.parametrize(
    "name, when",
    [("t.parquet", "between blocks"), ("t.arrow", "between blocks"), ("t.parquet", "in a block")],
)
def test_a_parquet_or_arrow_file_rewritten_while_its_rows_are_read_gives_failed_rows(
    tmp_path, monkeypatch, name, when, extra
):
    # The cursor, opened and checked once, kept its place between blocks: rows taken
    # after the file was rewritten in place held the new version's bytes (Arrow's
    # mapping, Parquet pages read as they are needed) or pyarrow's error on them
    # (ArrowInvalid), and an Arrow file rewritten shorter crashed the process.
    from extract import _tables

    # Batches of 2 rows, pages of 4000 bytes read as they are needed.
    monkeypatch.setattr(_tables, "_STREAM_ROWS", 2)
    monkeypatch.setattr(_tables, "_READ_BUFFER", 4000)
    path = tmp_path / name
    images, other = _two_versions(path, extra)
    src = open_source(f"parquet:{path}")
    stream = _tables._Table.stream

    def rewritten(table, group, column):  # as row 2 (block 2) is read, after its batch
        for k, batch in enumerate(stream(table, group, column)):
            if k == 1:
                path.write_bytes(other)
            yield batch

    if when == "in a block":
        monkeypatch.setattr(_tables._Table, "stream", rewritten)
    state = {}
    first = src.archive.read(src.root, [0, 1], state)
    if when == "between blocks":
        path.write_bytes(other)
    second = [src.archive.read(src.root, [k], state)[0] for k in range(2, 12)]  # (blocks of 1)
    _drop_cursor(state)
    assert first == images[:2]
    size = src.archive.sizes[0]
    change = f"{size} -> {len(other)} bytes" if extra else "modified since, same size"
    changed = f"{path} is not the file listed when the extraction started ({change})"
    assert all(isinstance(r, FileChangedError) and changed in str(r) for r in second)


@pytest.mark.parametrize("name", ["t.parquet", "t.arrow"])
def test_a_file_rewritten_within_a_block_fails_the_rows_from_the_change_on(
    tmp_path, monkeypatch, name
):
    # The rows taken before the change, of the file listed, failed with the rest of the
    # block: the cursor reopened for the row after the change raised out of the block.
    from extract import _tables

    monkeypatch.setattr(_tables, "_STREAM_ROWS", 2)
    monkeypatch.setattr(_tables, "_READ_BUFFER", 4000)
    path = tmp_path / name
    images, other = _two_versions(path, 5)
    src = open_source(f"parquet:{path}")
    stream = _tables._Table.stream

    def rewritten(table, group, column):  # as rows 2 and 3 are reached
        for k, batch in enumerate(stream(table, group, column)):
            if k == 1:
                path.write_bytes(other)
            yield batch

    monkeypatch.setattr(_tables._Table, "stream", rewritten)
    state = {}
    read = src.archive.read(src.root, list(range(6)), state)
    _drop_cursor(state)
    assert read[:2] == images[:2]
    assert all(isinstance(r, FileChangedError) for r in read[2:])


def test_a_parquet_file_rewritten_between_blocks_of_a_run_gives_failed_rows(
    data, tmp_path, monkeypatch
):
    # Through a run: the rows read before the change are extracted, those after it failed
    # rows naming the change, and the store is complete and loads.
    from extract._tables import TableRows

    path = tmp_path / "train-00000-of-00001.parquet"
    shutil.copy(data / "hf" / "data" / path.name, path)
    table = pq.read_table(path)
    read_file, calls = TableRows.read_file, []

    def rewritten(self, *args):
        out = read_file(self, *args)
        calls.append(len(out))
        if len(calls) == 1:  # after the first block: the same rows in the other order
            pq.write_table(table.take(np.arange(len(table))[::-1]), path, row_group_size=5)
        return out

    monkeypatch.setattr(TableRows, "read_file", rewritten)
    fast = {**FAST, "batch_size": 2}
    out = extract_features(f"parquet:{path}", BACKBONE, tmp_path / "f.h5", **fast)
    assert calls[0] == 2
    loaded = load_features(out, in_memory=True)
    changed = [p for p, why in loaded.failures if why.startswith("FileChangedError: ")]
    assert loaded.paths == [f"{path.name}:{k}" for k in (0, 1)]
    assert changed == [f"{path.name}:{k}" for k in range(2, len(table))]


@pytest.mark.parametrize("image", ["binary", "struct"])
def test_an_arrow_record_batch_is_copied_out_of_its_mapping_a_stream_batch_at_a_time(
    tmp_path, monkeypatch, image
):
    # A record batch's whole image column was copied when the batch was reached: a stream
    # written as one batch (pa.ipc's write_table of one chunk) was held whole, by each
    # worker reading a share of it, for a block of 2 rows. As Parquet's: 2 rows at a time.
    from extract import _tables

    monkeypatch.setattr(_tables, "_STREAM_ROWS", 2)
    images = [bytes([k]) * 3000 for k in range(7)]
    column = pa.array(images, pa.binary())
    if image == "struct":  # (Hugging Face's Image feature)
        paths = pa.array([f"{k}.png" for k in range(7)])
        column = pa.StructArray.from_arrays([column, paths], ["bytes", "path"])
    path = tmp_path / "t.arrow"
    _arrow_stream(path, pa.table({"image": column, "label": np.arange(7) % 2}), 7)
    with open(path, "rb") as fh:
        streamed = [values for values, _ in _tables._Table(str(path), fh).stream(0, "image")]
        assert [len(values) for values in streamed] == [2, 2, 2, 1]
        assert max(values.nbytes for values in streamed) < 3 * 3000  # (2 rows of 3000 bytes)
        assert [v.as_py() for values in streamed for v in values] == images
    src = open_source(f"parquet:{path}")
    state = {}
    assert (
        src.archive.read(src.root, [0, 1, 2], state)
        + src.archive.read(src.root, [3, 4, 5, 6], state)
        == images
    )
    _drop_cursor(state)


def test_an_arrow_file_cut_shorter_between_blocks_gives_failed_rows(tmp_path, monkeypatch):
    # Its record batch is copied out of the mapping a stream batch at a time: read past
    # the end of the file cut shorter, the mapping killed the process (SIGBUS), unless the
    # file was checked first. (4 MB: a few pages past the end, a read did not always crash.)
    from extract import _tables

    monkeypatch.setattr(_tables, "_STREAM_ROWS", 2)
    images = [bytes([k % 256]) * 10_000 for k in range(400)]
    path = tmp_path / "t.arrow"
    _arrow_stream(path, pa.table({"image": images, "label": np.arange(400) % 2}), 400)
    src = open_source(f"parquet:{path}")
    state = {}
    assert src.archive.read(src.root, [0, 1], state) == images[:2]
    os.truncate(path, 1000)
    (read,) = src.archive.read(src.root, [300], state)
    _drop_cursor(state)
    assert isinstance(read, FileChangedError) and "-> 1000 bytes" in str(read)


_TAR_CUT_AS_IT_IS_INDEXED = """
import io, os, sys, tarfile
sys.path.insert(0, sys.argv[1])
from extract import open_source
from extract import _tar_shards

path = sys.argv[2]
with tarfile.open(path, "w") as tar:
    for k in range(40):
        for ext, data in (("png", bytes([k]) * 10_000), ("cls", b"%d" % (k % 2))):
            info = tarfile.TarInfo(f"{k:04d}.{ext}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
members = _tar_shards.tar_members

def members_then_cut(*args):  # cut shorter after the headers were read, before the labels
    listed = members(*args)
    os.truncate(path, 1000)
    return listed

_tar_shards.tar_members = members_then_cut
try:
    open_source(f"webdataset:{path}")
except _tar_shards.ShardError as err:
    print("refused:", err)
"""


@pytest.mark.slow  # (a fresh interpreter)
def test_a_shard_cut_shorter_as_it_is_indexed_is_refused(tmp_path):
    # Its headers and labels were read out of a mapping of the file: cut shorter meanwhile,
    # the read past its new end killed the process (SIGBUS).
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        [sys.executable, "-c", _TAR_CUT_AS_IT_IS_INDEXED, root, str(tmp_path / "s.tar")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert re.search(
        r"refused: The shard .*s\.tar' is damaged at byte \d+ \(the file ends", run.stdout
    )


def test_an_arrow_file_is_mapped_from_the_file_opened_and_checked(tmp_path, monkeypatch):
    # The stream was mapped by its path after the file was opened and checked: replaced
    # there in between (a rename), its rows were the new file's while every check of the
    # file opened passed.
    from extract import _tables

    path = tmp_path / "t.arrow"
    images, other = _two_versions(path, 5)
    src = open_source(f"parquet:{path}")
    init = _tables._Table.__init__

    def replaced(table, name, fh):  # after the cursor opened and checked it
        (tmp_path / "new.arrow").write_bytes(other)
        os.replace(tmp_path / "new.arrow", path)
        init(table, name, fh)

    monkeypatch.setattr(_tables._Table, "__init__", replaced)
    state = {}
    assert src.archive.read(src.root, list(range(12)), state) == images
    _drop_cursor(state)


def test_a_retry_refuses_a_replaced_parquet_file_whose_rows_all_failed(tmp_path):
    # A changed container is not taken by --retry-failed, even one whose rows all failed:
    # the store records the files it was made from, and would keep the old file's identity
    # under the request's fingerprint.
    folder = make_image_folder(tmp_path / "images", n_per_class=2, special=False)
    cat, dog = (sorted(p.read_bytes() for p in (folder / k).iterdir()) for k in ("cat", "dog"))

    def table(name, images, labels):
        rows = {"image": [{"bytes": b, "path": None} for b in images], "label": labels}
        _table(tmp_path / name, rows, schema=hf_image_schema(["a", "b"]))

    table("0.parquet", [cat[0], dog[0]], [0, 1])
    table("1.parquet", [b"not an image"], [1])
    source, out = f"parquet:{tmp_path}/{{0,1}}.parquet", tmp_path / "f.h5"
    extract_features(source, BACKBONE, out, **FAST)
    before = out.read_bytes()
    table("1.parquet", [dog[1]], [1])
    with pytest.raises(ProvenanceError, match=r"1\.parquet' is not the file the store was made"):
        extract_features(source, BACKBONE, out, retry_failed=True, **FAST)
    assert out.read_bytes() == before


# --- memory --------------------------------------------------------------------------


def _blocks(src, size=8):
    state = {}
    for lo in range(0, len(src), size):
        yield src.archive.read(src.root, list(range(lo, min(lo + size, len(src)))), state)
    if state.get("cursor") is not None:
        state["cursor"].close()


def test_parquet_reading_streams_within_a_row_group(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.bytes(12_000) for _ in range(1024)]  # 12 MB in one row group
    path = _table(
        tmp_path / "big.parquet",
        {"image": pa.array(images, pa.binary()), "label": np.arange(1024) % 4},
        row_group_size=1 << 20,
        write_batch_size=16,
        data_page_size=1 << 16,
    )
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    default = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(default)
    pa.set_memory_pool(pool)
    try:
        src = open_source(f"parquet:{path}")
        read = [bytes(b) for block in _blocks(src) for b in block]
        gc.collect()
        peak, left = pool.max_memory(), pool.bytes_allocated()
    finally:
        pa.set_memory_pool(default)
    assert read == images
    # A record batch of 64 rows and the read buffers, not the row group (12 MB).
    assert 0 < peak < os.path.getsize(path) / 4 and left == 0


# Three workers whatever the machine's CPUs: torch notes where they are more than those.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_loader_workers_each_stream_whole_row_groups(tmp_path, monkeypatch):
    # Blocks dealt round-robin in source order: every worker streamed every row group past
    # the other workers' blocks (its cursor only goes forward), reading the data W times.
    from types import SimpleNamespace

    from extract import _loading, _tables

    rng = np.random.default_rng(0)
    n, group, size, workers = 288, 48, 16, 3
    images = pa.array([rng.bytes(100) for _ in range(n)], pa.binary())
    path = _table(
        tmp_path / "t.parquet", {"image": images, "label": np.arange(n) % 2}, row_group_size=group
    )
    src = open_source(f"parquet:{path}")
    blocks = [np.arange(lo, lo + size) for lo in range(0, n, size)]
    streamed = []
    real = _tables._Table.stream

    def counted(self, g, column):
        for values, paths in real(self, g, column):
            streamed.append(len(values))
            yield values, paths

    monkeypatch.setattr(_tables._Table, "stream", counted)

    def rows_streamed(order):  # each worker reads the blocks dealt to it, in turn
        streamed.clear()
        states = [{} for _ in range(workers)]
        for i, block in enumerate(order):
            src.archive.read(src.root, block.tolist(), states[i % workers])
        return sum(streamed)

    backbone = SimpleNamespace(transform=None, preprocess={"mode": "center"})
    loader = _loading._loader(src, backbone, blocks, workers, "pil",
                              torch.device("cpu"))  # fmt: skip
    order = [np.asarray(b) for b in loader.batch_sampler]
    assert sorted(map(tuple, order)) == sorted(map(tuple, blocks))
    assert rows_streamed(blocks) > 1.5 * n  # dealt in source order
    assert rows_streamed(order) == n  # each row group read once, by one worker
    # One row group of them all, larger than a worker's share: split between the workers,
    # each part in source order (a tail dealt in reverse re-streamed the group for every
    # block).
    one = _loading.worker_order(blocks, np.zeros(n, dtype=np.int64), workers)
    for w in range(workers):
        firsts = [int(b[0]) for b in one[w::workers]]
        assert firsts == sorted(firsts)
    assert sorted(map(tuple, one)) == sorted(map(tuple, blocks))


def test_tar_reading_holds_one_block(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.bytes(12_000) for _ in range(512)]
    samples = [{"__key__": f"{k:04d}", "jpg": img, "cls": 0} for k, img in enumerate(images)]
    _write_shard(tmp_path / "s.tar", samples)
    src = open_source(f"webdataset:{tmp_path}/s.tar")
    tracemalloc.start()
    try:
        n_read = 0
        for block in _blocks(src):
            assert [bytes(b) for b in block] == images[n_read : n_read + len(block)]
            n_read += len(block)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n_read == 512 and peak < 12_000 * 8 * 4  # a few blocks of 8, not 6 MB of samples


@pytest.mark.parametrize("kind", ["webdataset", "parquet"])
def test_archived_items_are_read_as_asked_in_any_order_and_after_a_subset(data, kind):
    # Each item's bytes are its own: read in any order within a container, and after a
    # subset (--per-class, --max-items), whose rows keep their places in the containers.
    src = open_source(_source(data, kind))
    folder = open_source(_source(data, "folder"))
    images = [(data / "folder" / item).read_bytes() for item in folder.ids]
    assert src.archive.read(src.root, [2, 0, 1], {}) == [images[2], images[0], images[1]]
    sub = src.subset(n_per_class=2)  # items 0, 1 (cat), 8, 9 (dog)
    assert sub.archive.read(sub.root, list(range(len(sub))), {}) == [
        images[i] for i in sub.source_index
    ]
    assert sub.source_index.tolist() == [0, 1, 8, 9]


@pytest.mark.parametrize("jpeg_bytes", [True, False])
def test_archived_images_meet_the_pixel_limit_set_when_the_dataset_was_made(
    tmp_path, monkeypatch, jpeg_bytes
):
    # Workers started by spawn or forkserver import PIL afresh, with its default limit.
    from PIL import Image

    from extract._images import ItemDataset

    image = io.BytesIO()
    Image.new("RGB", (40, 36)).save(image, format="JPEG")  # 1440 pixels
    _write_shard(tmp_path / "s.tar", [{"__key__": "k", "jpg": image.getvalue(), "cls": 0}])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    src = open_source(f"webdataset:{tmp_path}/s.tar")
    ds = ItemDataset(src, lambda im: torch.zeros(3, 2, 2), jpeg_bytes=jpeg_bytes)
    Image.MAX_IMAGE_PIXELS = 89478485  # as a fresh worker process has it
    (reason,) = [reason for _, _, reason, _ in ds.__getitems__([0])]
    assert "1440 pixels, more than the limit of 1000" in reason


def test_a_sample_with_several_images_gives_the_first_of_the_image_keys(tmp_path):
    samples = [{"__key__": "k0", "png": b"png bytes", "jpg": b"jpg bytes", "cls": "0"}]
    _write_shard(tmp_path / "s.tar", samples)
    src = open_source(f"webdataset:{tmp_path}/s.tar")
    assert src.archive.read(src.root, [0], {}) == [bytearray(b"jpg bytes")]  # jpg before png
    src = open_source(f"webdataset:{tmp_path}/s.tar", image_key="png;jpg")
    assert src.archive.read(src.root, [0], {}) == [bytearray(b"png bytes")]
    # Empty alternatives are none: ";" named no member (a "has no / member" error).
    src = open_source(f"webdataset:{tmp_path}/s.tar", image_key=" png ;; jpg")
    assert src.archive.read(src.root, [0], {}) == [bytearray(b"png bytes")]
    assert src.options["image_key"] == "png;jpg"
    message = r"'image_key' parameter must name a member extension, .* Got ' ; ' instead.$"
    with pytest.raises(ValueError, match=message):
        open_source(f"webdataset:{tmp_path}/s.tar", image_key=" ; ")


def test_a_shard_s_identity_is_its_size_headers_and_labels(tmp_path):
    # A shard's identity (kept in the store to recognise the shards it was made from) is
    # the sha256 of its size, every header block and pax record, and its label members:
    # a shard rewritten to the same size with other member headers (times, pax records)
    # or labels is another shard.
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in (("a.jpg", b"x" * 10), ("a.cls", b"1"), ("b.jpg", b"y"), ("b.cls", b"0")):
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = len(data), {"comment": name}
            tf.addfile(info, io.BytesIO(data))
    whole = path.read_bytes()
    digest = hashlib.sha256(f"{len(whole)}\n".encode())
    with tarfile.open(path) as tf:
        members = tf.getmembers()
    for m in members:  # a pax header, its records, the member's header
        pax_size = int(whole[m.offset + 124 : m.offset + 136].strip(b"\0 "), 8)
        digest.update(whole[m.offset : m.offset + 512])
        digest.update(whole[m.offset + 512 : m.offset + 512 + pax_size])
        digest.update(whole[m.offset_data - 512 : m.offset_data])
    for m in members[1::2]:  # the labels, sample by sample
        digest.update(whole[m.offset_data : m.offset_data + m.size])
    expected = f"sha256:{digest.hexdigest()}"
    assert open_source(f"webdataset:{path}").files == {"s.tar": expected}


def test_parquet_file_identity_is_its_size_and_footer(tmp_path):
    # A Parquet file's identity (kept in the store to recognise the files it was made from)
    # is the sha256 of its size and its whole footer: the Thrift metadata just before the
    # last 8 bytes. Hashing a shifted window would leave the footer's last byte unchecked
    # and would change every identity already recorded in existing stores.
    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"image": [b"a", b"b", b"c"], "label": [0, 1, 0]}), path)
    whole = path.read_bytes()
    length = int.from_bytes(whole[-8:-4], "little")
    footer = whole[-8 - length : -8]
    expected = hashlib.sha256(f"{len(whole)}\n".encode() + footer).hexdigest()
    assert open_source(f"parquet:{path}").files == {"train.parquet": f"sha256:{expected}"}


def test_arrow_streams_of_one_size_with_other_headers_differ_in_identity(tmp_path):
    # Two Arrow streams of the same byte size whose schemas differ (here the ClassLabel
    # names, renamed in place) are different datasets: their identities must differ, so
    # that a store made from one is not taken for a store of the other.
    def write(path, names):
        schema = hf_image_schema(names)
        table = pa.table(
            {"image": [{"bytes": b"x" * 8, "path": None}] * 4, "label": [0, 1, 0, 1]},
            schema=schema,
        )
        with pa.ipc.new_stream(str(path), schema) as sink:
            for batch in table.to_batches(max_chunksize=2):
                sink.write_batch(batch)

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write(tmp_path / "a" / "data.arrow", ["cat", "dog"])
    write(tmp_path / "b" / "data.arrow", ["cow", "dog"])
    assert (tmp_path / "a" / "data.arrow").stat().st_size == (
        tmp_path / "b" / "data.arrow"
    ).stat().st_size
    a = open_source(f"parquet:{tmp_path}/a/data.arrow")
    b = open_source(f"parquet:{tmp_path}/b/data.arrow")
    assert a.class_names == ["cat", "dog"] and b.class_names == ["cow", "dog"]
    assert a.files["data.arrow"] != b.files["data.arrow"]


def test_parquet_files_that_disagree_on_class_names_are_refused(tmp_path):
    # The class names of integer labels come from each file's Hugging Face metadata. Files
    # naming the classes differently (or one without names) cannot share one list of
    # classes: picking either list would silently mislabel the rows of the other files.
    def write(path, names):
        schema = hf_image_schema(names) if names else None
        images = [{"bytes": b"a", "path": None}, {"bytes": b"b", "path": None}]
        pq.write_table(pa.table({"image": images, "label": [0, 1]}, schema=schema), path)

    write(tmp_path / "0.parquet", ["cat", "dog"])
    write(tmp_path / "1.parquet", ["dog", "cat"])
    with pytest.raises(TableError, match="disagree on the 'label' class names"):
        open_source(f"parquet:{tmp_path}/{{0,1}}.parquet")
    write(tmp_path / "1.parquet", None)
    with pytest.raises(TableError, match="disagree on the 'label' class names"):
        open_source(f"parquet:{tmp_path}/{{0,1}}.parquet")


def test_tar_headers_with_old_signed_checksums_are_read(tmp_path):
    # Some old tar writers summed the header bytes as signed chars. Their checksums differ
    # from the unsigned sum only when a header holds bytes >= 0x80 (a UTF-8 name); such
    # shards are valid tars and must be indexed, not refused as damaged.
    import struct

    path = tmp_path / "00000.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT, encoding="utf-8") as tf:
        for name, data in (("\u00e9t\u00e9.cls", b"0"), ("\u00e9t\u00e9.jpg", b"xyz")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    raw = bytearray(path.read_bytes())
    for start in (0, 1024):  # the two headers
        header = raw[start : start + 512]
        header[148:156] = b" " * 8
        signed = sum(struct.unpack("512b", bytes(header)))
        assert signed != sum(header)  # the name's bytes >= 0x80 make the sums differ
        raw[start + 148 : start + 156] = b"%06o\0 " % signed
    path.write_bytes(bytes(raw))
    src = open_source(f"webdataset:{path}")
    assert src.ids == ["\u00e9t\u00e9"] and src.labels.tolist() == [0]


def test_webdataset_json_label_paths_index_into_lists(tmp_path):
    # A JSON label path may step into a list by position (json.labels.1 is the second
    # entry of "labels"), as multi-label metadata stores its classes; the path must reach
    # the entry, not stop at the list and refuse the sample.
    with wds.TarWriter(str(tmp_path / "s.tar")) as sink:
        sink.write({"__key__": "k0", "jpg": b"x", "json": {"labels": ["cat", 1]}})
        sink.write({"__key__": "k1", "jpg": b"y", "json": {"labels": ["dog", 0]}})
    src = open_source(f"webdataset:{tmp_path}/s.tar", label_key="json.labels.1")
    assert src.labels.tolist() == [1, 0]
    names = open_source(f"webdataset:{tmp_path}/s.tar", label_key="json.labels.0")
    assert names.class_names == ["cat", "dog"] and names.labels.tolist() == [0, 1]


def test_a_repeated_key_names_only_the_shards_holding_it(tmp_path):
    # The message about a key used twice lists the shards where it occurs, so that the
    # user knows which shards to fix; a shard without that key must not be blamed.
    for number, keys in enumerate([["a", "b"], ["c"], ["d", "b"]]):
        with wds.TarWriter(str(tmp_path / f"{number:05d}.tar")) as sink:
            for key in keys:
                sink.write({"__key__": key, "jpg": b"x", "cls": "0"})
    with pytest.raises(ShardError, match="'b' occurs 2 times") as info:
        open_source(f"webdataset:{tmp_path}")
    message = str(info.value)
    assert "00000.tar" in message and "00002.tar" in message
    assert "00001.tar" not in message


def test_a_folder_without_tar_shards_is_refused_by_name(tmp_path):
    # A folder given as the source that holds no .tar files (only other files, or hidden
    # ones) must be refused with a message naming the folder, not fail later with a bare
    # IndexError that says nothing of what was wrong.
    (tmp_path / "notes.txt").write_text("no shards here")
    (tmp_path / "._00000.tar").write_bytes(b"macOS metadata")
    with pytest.raises(ValueError, match=r"holds no \.tar shards") as info:
        open_source(f"webdataset:{tmp_path}")
    assert str(tmp_path) in str(info.value)


def test_a_parquet_reader_dropped_mid_row_group_closes_its_file(data):
    # The reader keeps its place in a row group, an open file, between blocks; a dataset
    # dropped there (the end of a run, a worker that exits) left the file to the garbage
    # collector, which warned "unclosed file".
    from extract._images import ItemDataset

    dataset = ItemDataset(open_source(_source(data, "parquet")), lambda image: image)
    assert len(dataset.__getitems__([0, 1])) == 2 and "cursor" in dataset.reader_state
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del dataset
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_the_shards_beside_an_output_without_a_suffix_are_its_own(tmp_path):
    # `feats`'s shards were globbed as feats.shard-*-of-*, which took those of feats.h5
    # beside it (a forced rebuild of `feats` would mark them superseded).
    from extract._merge import shards_beside

    for rank in range(2):
        shard_path(tmp_path / "feats.h5", rank, 2).touch()
        shard_path(tmp_path / "feats", rank, 3).touch()
    assert [p.name for p in shards_beside(tmp_path / "feats")] == [
        "feats.shard-00000-of-00003",
        "feats.shard-00001-of-00003",
    ]
    assert [p.name for p in shards_beside(tmp_path / "feats.h5")] == [
        "feats.shard-00000-of-00002.h5",
        "feats.shard-00001-of-00002.h5",
    ]


def test_webdataset_shards_and_parquet_files_take_a_pathlib_path(data):
    # Paths as pathlib gives them failed with "'PosixPath' object has no attribute
    # 'startswith'" (the folder's ~ looked for).
    from extract import parquet_files, webdataset_shards

    for read, folder, text in (
        (webdataset_shards, data / "wds", "webdataset:"),
        (parquet_files, data / "hf", "parquet:"),
    ):
        given, as_text = read(folder), open_source(f"{text}{folder}")
        assert given.ids == as_text.ids and given.description == as_text.description
        np.testing.assert_array_equal(given.labels, as_text.labels)


def _touched_shards(data, tmp_path, monkeypatch, touched, changed=None):
    """A store of the test shards, the shards ``touched`` since (``changed``: one of them
    with other image bytes), the source opened, and the list that each shard's read
    appends its name to."""
    copy = tmp_path / "wds"
    shutil.copytree(data / "wds", copy)
    source = f"webdataset:{copy}/*.tar"
    out = extract_features(source, BACKBONE, tmp_path / "f.h5", **FAST)
    for name in touched:
        _touch(copy / name)
    if changed:
        _other_image_bytes(copy / changed)
    src, read = open_source(source), []
    kind = type(src.archive)
    real = kind.read_file

    def spied(self, path, f, items, state):
        read.append(os.path.basename(path))
        return real(self, path, f, items, state)

    monkeypatch.setattr(kind, "read_file", spied)
    return out, src, read


@pytest.mark.parametrize("changed", [None, "00001.tar"])
def test_under_torchrun_each_touched_container_is_hashed_by_one_rank(
    data, tmp_path, monkeypatch, changed
):
    # Every rank read every touched container to hash its rows' image bytes. Each rank of
    # 2 reads every other one (as ranks divide shards); taking the other rank's verdicts,
    # it reads none again, and names the row the other found changed as it found it.
    from extract._touched import (
        _key_columns,
        first_other_bytes,
        hash_share,
        hashed_once,
        take_verdicts,
        touched_rows,
    )

    out, src, read = _touched_shards(
        data, tmp_path, monkeypatch, ["00000.tar", "00001.tar", "00002.tar"], changed
    )
    rows, said, reads = np.arange(len(src)), [], []
    with h5py.File(out, "r") as f:
        check, digests = touched_rows(f, src, rows, False), f["content_sha256"][:]
        assert check.tolist() == list(range(12))  # every row: 3 shards touched
        for rank in (0, 1):
            with hashed_once():
                said.append(hash_share(digests, src, rows, check, rank, 2))
            reads.append(sorted(set(read)))
            read.clear()
        with hashed_once():
            take_verdicts(src, rows, check, _key_columns(digests, src, rows, check), 2, said)
            found = first_other_bytes(f, src, rows, check)
    assert reads == [["00000.tar", "00002.tar"], ["00001.tar"]] and read == []
    with hashed_once(), h5py.File(out, "r") as f:  # as one process finds it, reading
        assert found == first_other_bytes(f, src, rows, check)
    assert found == (None if changed is None else (9, None))  # its last image: row 9


def test_under_torchrun_the_touched_containers_are_shared_evenly(data, tmp_path, monkeypatch):
    # A touched container went to the rank of its number among all the source's (every
    # W-th of them): with 00000.tar and 00002.tar touched alone, rank 0 of 2 read both
    # and rank 1 none. It goes by its number among the touched ones.
    from extract._touched import hash_share, hashed_once, touched_rows

    out, src, read = _touched_shards(data, tmp_path, monkeypatch, ["00000.tar", "00002.tar"])
    rows, reads = np.arange(len(src)), []
    with h5py.File(out, "r") as f:
        check, digests = touched_rows(f, src, rows, False), f["content_sha256"][:]
        for rank in (0, 1):
            with hashed_once():
                _, _, found = hash_share(digests, src, rows, check, rank, 2)
            assert found is None
            reads.append(sorted(set(read)))
            read.clear()
    assert reads == [["00000.tar"], ["00002.tar"]]


@pytest.mark.parametrize("kind", ["webdataset", "parquet"])
def test_a_touched_container_is_the_store_s_by_its_rows_bytes(data, tmp_path, monkeypatch, kind):
    # A shard or Parquet file touched since (its modification time changed; its size and
    # identity, headers and labels, not) was refused as another file: read again, the
    # image bytes of its rows hashed as recorded, it is the store's, its new time recorded.
    # One image's bytes changed under the same headers, it is refused, named.
    from extract import _runner

    folder = {"webdataset": "wds", "parquet": "hf"}[kind]
    copy = tmp_path / folder
    shutil.copytree(data / folder, copy)
    source = {"webdataset": f"webdataset:{copy}/*.tar", "parquet": f"parquet:{copy}"}[kind]
    out = extract_features(source, BACKBONE, tmp_path / "f.h5", **FAST)
    before = load_features(out, in_memory=True)
    container = sorted(p for p in copy.rglob("*.*") if p.suffix in (".tar", ".parquet"))[-1]
    _touch(container)
    monkeypatch.setattr(_runner, "write_rows", None)  # (no row is extracted again)
    extract_features(source, BACKBONE, out, **FAST)
    np.testing.assert_array_equal(load_features(out, in_memory=True).features, before.features)
    with h5py.File(out, "r") as f:
        assert container.stat().st_mtime_ns in f["file_mtime_ns"][:]
        assert f.attrs["source_fingerprint"] == open_source(source).fingerprint()
    if kind == "webdataset":  # an image member's byte changed, every header kept
        _other_image_bytes(container)
        with pytest.raises(ProvenanceError, match=r"\.tar' is not the file .* its bytes are not"):
            extract_features(source, BACKBONE, out, **FAST)
