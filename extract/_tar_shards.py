"""WebDataset tar shards as an indexed image source (``webdataset:PATTERN``).

Opening the source reads each shard's tar headers once (memory-mapped: the image data is
never touched) and groups the members into samples as WebDataset does: consecutive
members sharing a key (the name up to the first dot of its last component, e.g.
``000012`` for ``000012.jpg``), extensions lower-cased, ``__*__`` metadata members and
names without an extension skipped, regular files only (a hard link is read as the
earlier member it names, as tar extracts it). Each sample then becomes one row,
read later by offset (``os.preadv``), so that a resumed run reads only the rows it still
needs and ranks read whole shards.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import posixpath
import re
import struct
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._archives import (
    Archive,
    archive_source,
    container_root,
    expand_pattern,
    open_listed,
    stat_containers,
)
from ._images import ImageSource, check_keys
from ._labels import (
    _AS_TEXT,
    _DECIMAL,
    encode_labels,
    is_index,
    label_kind_problem,
    renumbered_decimal,
    text_problem,
)
from ._paths import expand_home, plural

logger = logging.getLogger(__name__)

# Image members tried in this order when no --image-key is given (WebDataset's own image
# extensions and torchvision's).
IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "pbm", "pnm", "bmp", "tif", "tiff")
CLASS_NAMES_FILE = "classnames.txt"  # clip_benchmark's class names beside the shards
_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_REGULAR = (b"0", b"\0", b"7")  # regular and contiguous files
_HARD_LINK = b"1"  # read as the earlier member it names; symbolic links and folders skipped
_META = re.compile(r"__[^/]*__($|/)")  # WebDataset's metadata members (skip_meta)
_POSIX_MAGIC = b"ustar\x0000"


class ShardError(ValueError):
    """A shard cannot be indexed: damaged, truncated in a header, or a sample lacks a label."""


def _number(field: bytes) -> int:
    """A tar header number: octal text, or base-256 for sizes of 8 GiB and more."""
    if field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    if digits and not digits.isdigit():  # (int() took "-1750": a size that went backwards)
        raise ValueError(f"a tar number of {digits!r}")
    return int(digits, 8) if digits else 0


def _checksum_ok(header: bytes) -> bool:
    try:
        stored = _number(header[148:156])
    except ValueError:
        return False
    unsigned = sum(header) - sum(header[148:156]) + 8 * 32  # the field counts as spaces
    if stored == unsigned:
        return True
    signed = sum(struct.unpack("148b8x356b", header)) + 8 * 32  # old tars sum signed bytes
    return stored == signed


def _pax_records(data: bytes) -> dict[str, str]:
    """The ``length key=value\\n`` records of a pax extended header."""
    records, pos = {}, 0
    while pos < len(data) and data[pos] != 0:
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        end = pos + length  # a record counts its own length digits, space and newline
        if end <= space + 1 or end > len(data) or data[end - 1] != ord("\n"):
            raise ValueError(f"a pax record of length {length} at byte {pos}")
        key, _, value = data[space + 1 : end - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "replace")
        pos = end
    size = records.get("size", "0")
    if not (size.isascii() and size.isdigit()):
        raise ValueError(f"a pax size of {size!r}")
    return records


def _damaged(path: str, offset: int, what: str) -> ShardError:
    if offset == 0 and not path.endswith(".tar"):
        # (a pattern's * matched img2dataset's 00000_stats.json beside 00000.tar: said as
        # a shard "damaged at byte 0")
        return ShardError(
            f"{path!r} is no tar file (it does not start with a tar header), but the "
            "pattern names it as a shard: name the shards alone (e.g. 'shards/*.tar', or the "
            "folder 'shards/')."
        )
    return ShardError(
        f"The shard {path!r} is damaged at byte {offset} ({what}); the samples after it "
        "cannot be listed: repair the shard or leave it out of the pattern."
    )


class FileBytes:
    """An open file's bytes by slices, read with ``pread``, not a memory mapping: a file cut
    shorter as it is read is a ShardError, where a read of a mapping past the file's new end
    killed the process (SIGBUS)."""

    # Bytes read at once: a small member's header, data and the next header come one after
    # another. 4 KiB, not 64: after a large member's header (an image) the rest was read for
    # nothing, copying more than the shard's size in all (indexing's CPU time +40%).
    _AHEAD = 1 << 12

    def __init__(self, fh, path: str) -> None:
        self.fh, self.path = fh, path
        self.size = os.fstat(fh.fileno()).st_size
        self.ahead, self.at = b"", 0  # the bytes read last, from byte ``at``

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, where: slice) -> bytes:
        start, stop, _ = where.indices(self.size)
        stop = max(start, stop)  # (a reversed slice is empty, as a bytes object's)
        inside = self.at <= start and stop <= self.at + len(self.ahead)
        if not inside and stop - start <= self._AHEAD:
            self.ahead, self.at = os.pread(self.fh.fileno(), self._AHEAD, start), start
            inside = stop <= start + len(self.ahead)
        if inside:
            return self.ahead[start - self.at : stop - self.at]
        data = os.pread(self.fh.fileno(), stop - start, start)
        while len(data) < stop - start:
            more = os.pread(self.fh.fileno(), stop - start - len(data), start + len(data))
            if not more:
                raise _damaged(
                    self.path, start + len(data), "the file ends there: it was cut shorter"
                )
            data += more
        return data

    def zeros_from(self, offset: int) -> bool:
        """Whether the file holds only zeros from ``offset`` on."""
        while offset < self.size:
            chunk = self[offset : offset + (1 << 20)]
            if chunk.count(0) != len(chunk):
                return False
            offset += len(chunk)
        return True


def tar_members(shard: FileBytes, path: str, digest) -> list[tuple[str, int, int]]:
    """``(name, data offset, size)`` of each regular file in a tar, in archive order; a hard
    link is the earlier member it names (as tar extracts it, names compared normalised),
    read from that member's data, and one to no earlier member is skipped with a warning.

    Reads POSIX ustar, pax and GNU headers (long names included) and verifies every
    header's checksum; every header block and long name is fed to ``digest``.

    Raises
    ------
    ShardError
        For a header whose checksum fails, a file that ends inside a header or without the
        end-of-archive marker (cut short), or data after that marker (a damaged or
        concatenated tar).
    """
    members, n, offset = [], len(shard), 0
    long_name, long_link, pax, data_of, unlinked = None, None, {}, {}, []
    while offset + _BLOCK <= n:
        header = shard[offset : offset + _BLOCK]
        if header == _ZERO_BLOCK:
            if not shard.zeros_from(offset):
                raise _damaged(path, offset, "data after the end-of-archive marker")
            if unlinked:
                logger.warning(
                    "%s: %d hard %s to no earlier member %s skipped (%s%s).",
                    path,
                    len(unlinked),
                    "link" if len(unlinked) == 1 else "links",
                    "is" if len(unlinked) == 1 else "are",
                    ", ".join(map(repr, unlinked[:3])),
                    ", ..." if len(unlinked) > 3 else "",
                )
            return members
        if not _checksum_ok(header):
            raise _damaged(path, offset, "a tar header with a wrong checksum")
        digest.update(header)
        try:
            kind, size, data = header[156:157], _number(header[124:136]), offset + _BLOCK
        except ValueError:
            raise _damaged(path, offset, "a tar header with an unreadable size") from None
        if kind in (b"x", b"L", b"g", b"K"):
            if data + -(-size // _BLOCK) * _BLOCK > n:  # its padding is part of the header
                raise _damaged(path, offset, "the file ends inside a tar header")
            payload = shard[data : data + size]
            digest.update(payload)
            if kind == b"x":
                try:
                    pax = _pax_records(payload)
                except ValueError:
                    raise _damaged(path, offset, "an unreadable pax header") from None
            elif kind == b"L":
                long_name = payload.split(b"\0", 1)[0].decode("utf-8", "replace")
            elif kind == b"K":
                long_link = payload.split(b"\0", 1)[0].decode("utf-8", "replace")
        else:
            size = int(pax.get("size", size))
            name = header[:100].split(b"\0", 1)[0]
            prefix = header[345:500].split(b"\0", 1)[0]
            if header[257:265] == _POSIX_MAGIC and prefix:
                name = prefix + b"/" + name
            text = pax.get("path") or long_name or name.decode("utf-8", "replace")
            if kind in _REGULAR:
                members.append((text, data, size))
                data_of[posixpath.normpath(text)] = data, size
            elif kind == _HARD_LINK:
                target = pax.get("linkpath") or long_link
                target = target or header[157:257].split(b"\0", 1)[0].decode("utf-8", "replace")
                found = data_of.get(posixpath.normpath(target))
                if found is None:
                    unlinked.append(text)
                else:
                    members.append((text, *found))
                    data_of[posixpath.normpath(text)] = found
                size = 0  # a link has no data of its own
            long_name, long_link, pax = None, None, {}
        offset = data + -(-size // _BLOCK) * _BLOCK
    if offset < n:
        raise _damaged(path, offset, "the file ends inside a tar header")
    # Every tar writer pads each member to whole blocks and ends the archive with zero
    # blocks: without them the file was cut short (a copy or download that stopped), and
    # the samples after the cut are lost.
    if offset > n:
        raise _damaged(path, n, f"the file ends inside the member {text!r}: it was cut short")
    raise _damaged(path, n, "no end-of-archive marker: the file was cut short")


def _member_and_path(label_key: str, members: dict) -> tuple[str | None, list[str]]:
    """Split ``json.label`` into the member (``json``) and the JSON path (``["label"]``)."""
    parts = label_key.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in members:
            return ".".join(parts[:k]), parts[k:]
    return None, []


def _label_text(raw: bytes, path: list[str], where: str, label_key: str, is_json: bool) -> str:
    """A label as text: an integer (class index) or a class name. A JSON member is decoded
    as JSON, as webdataset decodes it, with or without a path into it."""
    if not path and not is_json:
        # utf-8-sig: a byte-order mark, as editors save one, is no part of a name.
        return _storable(raw.decode("utf-8-sig").strip(), where, label_key)
    value = json.loads(raw)
    if not path and isinstance(value, dict | list):  # each whole document became a class
        if isinstance(value, list):
            what, example = "an array", f"e.g. --label-key {label_key}.0"
        else:
            keys = ", ".join(list(value)[:8]) + (", ..." if len(value) > 8 else "")
            what = f"an object (its keys: {keys or 'none'})"
            example = (  # no guess among other keys (img2dataset's url, key, status, ...)
                f"e.g. --label-key {label_key}.label"
                if "label" in value
                else f"--label-key {label_key}.KEY, KEY the one that holds the label"
            )
        raise ShardError(
            f"The {label_key!r} member of the {where} is {what}, not a label; give the "
            f"label's path in it, {example}."
        )
    for part in path:
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:  # what is there, for a misspelt path (json.lable) or an index past the end
            if isinstance(value, dict):
                keys = ", ".join(list(value)[:8]) + (", ..." if len(value) > 8 else "")
                there = f"; {part!r} is not among the keys there ({keys or 'none'})"
            elif isinstance(value, list):
                items = f"{len(value)} {plural(len(value), 'item')}, from 0"
                there = f"; {part!r} is no index of the array there ({items})"
            else:
                there = f"; {part!r} is inside {value!r}, which has no parts"
            raise ShardError(
                f"The {where} has no {label_key!r} label{there}; choose it with --label-key."
            )
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ShardError(
            f"The {label_key!r} label of the {where} is {value!r}; a label is an integer class "
            "index or a class name."
        )
    return _storable(str(value).strip(), where, label_key)


def _storable(text: str, where: str, label_key: str) -> str:
    problem = text_problem(text)
    if problem:
        raise ShardError(
            f"The {label_key!r} label of the {where} is {text!r}, which {problem}: a store "
            "cannot hold it as a class name."
        )
    return text


def _label_key_hint(members: dict) -> str:
    """``, e.g. --label-key cls`` for the usual label members a sample has."""
    usual = {"cls": "cls", "json": "json.label", "txt": "txt"}
    present = [f"--label-key {key}" for ext, key in usual.items() if ext in members]
    return f", e.g. {' or '.join(present)}" if present else ""


def _refuse_members_apart(key: str, members: dict, samples: list, where: str) -> None:
    """Refuse a sample without its label whose key has other members elsewhere in the
    shard (``tar cf s.tar *.jpg *.cls``): it lacks no --label-key, its label lies apart."""
    here = next(i for i, (_, other) in enumerate(samples) if other is members)
    apart = [
        f"{', '.join(ext for k, other in side if k == key for ext in other)} {when}"
        for side, when in ((samples[:here], "earlier"), (samples[here + 1 :], "later"))
        if any(k == key for k, _ in side)
    ]  # (one shard's members were all said to come later, those before it too)
    if apart:
        raise ShardError(
            f"The {where} has its members apart ({', '.join(members)} here; "
            f"{' and '.join(apart)}, other samples' members between): a sample is read "
            "from consecutive members, as WebDataset reads it; write each sample's members "
            "together (e.g. tar --sort=name)."
        )


@dataclass
class _ShardIndex:
    keys: list[str]
    offsets: list[int]
    sizes: list[int]
    labels: list[str]
    first_members: list[str] | None
    digest: str


def _check_label_kinds(labels: list[str], keys: list[str], pattern: str) -> None:
    problem = label_kind_problem(labels)
    if problem:
        i, why = problem
        raise ShardError(
            f"The sample {keys[i]!r} of the webdataset source {pattern!r} has the label "
            f"{labels[i]!r}, {why}; give every sample a class index, or every sample a name."
        )


def index_shard(path: str, image_keys: tuple[str, ...], label_key: str) -> _ShardIndex:
    """The samples of one shard: key, image offset and size (-1: none) and label text."""
    from webdataset.tariterators import base_plus_ext

    digest = hashlib.sha256()
    index = _ShardIndex([], [], [], [], None, "")
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        digest.update(f"{size}\n".encode())
        if size == 0:
            raise ShardError(f"The shard {path!r} is empty; leave it out of the pattern.")
        shard = FileBytes(fh, path)  # (not mapped: see FileBytes)
        samples: list[tuple[str, dict]] = []
        for name, offset, length in tar_members(shard, path, digest):
            if _META.match(name):
                continue
            key, ext = base_plus_ext(name)
            if key is None:
                continue
            ext = ext.lower()
            if not samples or samples[-1][0] != key:
                samples.append((key, {}))
            if ext in samples[-1][1]:
                raise ShardError(f"The shard {path!r} has two {name!r} members in a row.")
            samples[-1][1][ext] = (offset, length)
        for key, members in samples:
            where = f"sample {key!r} of {path!r}"
            member, json_path = _member_and_path(label_key, members)
            if member is None:
                _refuse_members_apart(key, members, samples, where)
                raise ShardError(
                    f"The {where} has no {label_key!r} label (its members: "
                    f"{', '.join(members)}); choose it with --label-key"
                    f"{_label_key_hint(members)}."
                )
            offset, length = members[member]  # within the file: tar_members saw to it
            raw = shard[offset : offset + length]
            digest.update(raw)
            try:
                is_json = member.lower().endswith("json")
                index.labels.append(_label_text(raw, json_path, where, label_key, is_json))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                raise ShardError(
                    f"The {member!r} member of the {where} is unreadable: {err}."
                ) from None
            image = next((members[k] for k in image_keys if k in members), (-1, 0))
            index.keys.append(key)
            index.offsets.append(image[0])
            index.sizes.append(image[1])
        if samples:
            index.first_members = list(samples[0][1])
    index.digest = "sha256:" + digest.hexdigest()
    return index


@dataclass(frozen=True)
class TarSamples(Archive):
    """Samples of tar shards: the image member's byte ``offset`` (-1: none) and ``size``."""

    offset: np.ndarray = None
    size: np.ndarray = None
    image_keys: tuple[str, ...] = IMAGE_KEYS

    per_item: ClassVar[tuple[str, ...]] = ("file", "unit", "offset", "size")

    def read_file(self, path, f, items, state) -> list[bytearray | Exception]:
        out: list[bytearray | Exception] = []
        with open_listed(path, (int(self.sizes[f]), int(self.mtimes[f]))) as fh:
            for i in items:
                offset, size = int(self.offset[i]), int(self.size[i])
                if offset < 0:
                    out.append(
                        LookupError(
                            f"the sample has no {'/'.join(self.image_keys)} member; choose "
                            "the image member with --image-key"
                        )
                    )
                    continue
                data = bytearray(size)
                if os.preadv(fh.fileno(), [data], offset) != size:
                    out.append(EOFError("the shard ends inside this sample (a truncated shard)"))
                else:
                    out.append(data)
        return out


def _index_class_names(root: str) -> tuple[str | None, list[str] | None]:
    """``classnames.txt`` in the shards' folder or its parent, and its lines."""
    for folder in (root, os.path.dirname(root)):
        path = os.path.join(folder, CLASS_NAMES_FILE)
        if os.path.isfile(path):
            try:
                # utf-8-sig: a byte-order mark, as editors save one, is no part of a name.
                # Blank lines after the last name are none; a blank first line is class 0's
                # (stripped, it named class 0 by the second line, each name a class early).
                # Lines as an editor numbers them (newline=None reads \r\n and \r as
                # \n; splitlines also split at \x0c, \x85, \u2028, ...).
                with open(path, encoding="utf-8-sig") as fh:
                    text = fh.read().rstrip()
                names = [line.strip() for line in text.split("\n")] if text else []
            except UnicodeDecodeError as err:
                raise ShardError(
                    f"The class names file {path!r} is not UTF-8 text ({err}); save it as "
                    "UTF-8, one class name per line."
                ) from err
            _warn_of_comment_lines(path, names)
            return path, names
    return None, None


def _warn_of_comment_lines(path: str, names: list[str]) -> None:
    """Say where a line of the class names file looks like a comment ('#' first): it is
    kept as its class's name (a class may be called '#1'), but a comment meant as one
    names a class and shifts every name after it onto the next class."""
    lines = [k + 1 for k, name in enumerate(names) if name.startswith("#")]
    if lines:
        one = len(lines) == 1
        shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
        logger.warning(
            "%s: %s %s (%r) %s with '#' and %s: each line is the name "
            "of one class, in the order of the class indices, and the file has no comment "
            "syntax. A comment line names a class and shifts the names after it onto the "
            "next classes; remove such lines.",
            path,
            plural(len(lines), "line"),
            shown,
            names[lines[0] - 1],
            "starts" if one else "start",
            "is read as a class name" if one else "are read as class names",
        )


_COMPRESSED = (".gz", ".tgz", ".bz2", ".tbz2", ".xz", ".txz", ".zst", ".lz4")
_COMPRESSED_TARS = (".tgz", ".tbz2", ".txz", *(f".tar{suffix}" for suffix in _COMPRESSED))


# The first bytes of gzip, xz and zstd streams, and bzip2's whole signature (a tar's first
# member name may start with "BZh"): a compressed shard named .tar.
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")
_BZIP2 = re.compile(rb"BZh[1-9]1AY&SY")


def _compressed_content(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(10)
    except OSError:  # unreadable: said so where the shard is indexed
        return False
    return head.startswith(_COMPRESSED_MAGIC) or _BZIP2.match(head) is not None


def _shard_paths(pattern: str) -> list[str]:
    if os.path.isdir(pattern):
        # Hidden files (macOS's ._00000.tar beside 00000.tar) are no shards, as a glob's *
        # does not match them either.
        names = sorted(n for n in os.listdir(pattern) if not n.startswith("."))
        # A compressed shard in the folder is refused, not left out with its samples.
        shards = [n for n in names if n.endswith((".tar", *_COMPRESSED_TARS))]
        paths = [os.path.abspath(os.path.join(pattern, n)) for n in shards]
        if not paths:
            raise ValueError(f"The folder {pattern!r} holds no .tar shards.")
    else:
        paths = expand_pattern(pattern, "webdataset")
    compressed = [p for p in paths if p.endswith(_COMPRESSED) or _compressed_content(p)]
    if compressed:
        raise ValueError(
            f"The shard {compressed[0]!r} is compressed, and samples are read by their offset "
            "in the tar: decompress the shards first (e.g. `gunzip shards/*.tar.gz`)."
        )
    return paths


def _refuse_repeated_keys(ids: list[str], file: np.ndarray, paths: list[str]) -> None:
    """A key names one sample: twice (in one shard, apart, or in two shards) the store's
    rows could not tell their images apart, as a list file may not name an image twice."""
    if len(set(ids)) == len(ids):  # (a NumPy string array is as wide as the longest key)
        return
    key, count = collections.Counter(ids).most_common(1)[0]
    where = sorted({paths[f] for f, k in zip(file, ids, strict=True) if k == key})
    raise ShardError(
        f"The sample key {key!r} occurs {count} times, in "
        f"{', '.join(map(repr, where))}: each sample needs a key of its own (the store "
        "names each row by it); rename the repeated samples."
    )


def webdataset_shards(
    pattern: str | os.PathLike, image_key: str | None = None, label_key: str | None = None
) -> ImageSource:
    """Samples of WebDataset tar shards, one row each, in shard and archive order.

    Parameters
    ----------
    pattern : str or path-like
        Shards as WebDataset names them: a brace pattern (``shards/{00000..00127}.tar``),
        a local glob (``shards/*.tar``), several joined by ``::``, or a folder (its
        ``.tar`` files, sorted), e.g. the output folder of ``img2dataset``.
    image_key : str, optional
        The image member's extension, or alternatives separated by ``;`` (``"jpg;png"``),
        the first present being read. Default: the first image extension present
        (``jpg``, ``jpeg``, ``png``, ``webp``, ...). A sample with none of them is kept as
        a failed row.
    label_key : str, optional
        The label's member (default: ``cls``; ``txt``, ...), or a member and a JSON path
        (``json.label``, ``json.meta.class``). Integer labels are class indices (named
        by ``classnames.txt`` beside the shards or in their parent folder, as
        clip_benchmark ships them, else ``"0"``, ``"1"``, ...); other labels are class
        names, sorted. A sample without the label is an error.

    Returns
    -------
    ImageSource
        Ids are the sample keys; the root is the shards' common folder.

    Raises
    ------
    ShardError
        If a shard is damaged (a wrong header checksum, data after the end marker) or a
        sample has no label.
    """
    check_keys(image_key, label_key)  # ("" was read as the default)
    keys = (image_key or ";".join(IMAGE_KEYS)).split(";")
    image_keys = tuple(k.strip().lower() for k in keys if k.strip())  # ("jpg;;png": two)
    if not image_keys:  # (";" was searched for members "k." and said none had "/")
        raise ValueError(
            "The 'image_key' parameter must name a member extension, such as 'jpg', or "
            f"alternatives, such as 'jpg;png'. Got {image_key!r} instead."
        )
    label_key = label_key or "cls"
    # (a pathlib.Path failed on 'startswith'; a folder's ~, as each part of a pattern's)
    pattern = expand_home(os.fsdecode(pattern))
    paths = _shard_paths(pattern)
    root = os.path.dirname(paths[0]) if os.path.isdir(pattern) else container_root(paths)
    sizes, mtimes = stat_containers(paths)
    indexes = [index_shard(p, image_keys, label_key) for p in paths]
    counts = np.array([len(ix.keys) for ix in indexes], np.int64)
    file = np.repeat(np.arange(len(paths), dtype=np.int64), counts)
    offsets = np.array([o for ix in indexes for o in ix.offsets], np.int64)
    if len(offsets) and (offsets < 0).all():
        first = next(ix.first_members for ix in indexes if ix.first_members)
        raise ShardError(
            f"No sample of the webdataset source {pattern!r} has a {'/'.join(image_keys)} "
            f"member (the first has {', '.join(first)}); choose the image with --image-key."
        )
    ids = [k for ix in indexes for k in ix.keys]
    _refuse_repeated_keys(ids, file, paths)
    texts = [t for ix in indexes for t in ix.labels]
    _check_label_kinds(texts, ids, pattern)
    moved = renumbered_decimal(texts)
    if moved is not None:  # (as a list file's are said)
        logger.warning(
            "The sample %r of the webdataset source %r has the label %r, which %s: read as "
            "a class name, as every label then is, %s",
            ids[moved[0]], pattern, texts[moved[0]], _DECIMAL, _AS_TEXT % moved[1:],
        )  # fmt: skip
    # The class-names file names class indices: labels that are names leave it unread.
    indices = all(map(is_index, texts))
    names_file, index_names = _index_class_names(root) if indices else (None, None)
    try:
        labels, class_names = encode_labels(texts, index_names)
    except ValueError as err:  # the class-names file, where one was read
        where = f" ({names_file!r})" if names_file is not None else ""
        raise ShardError(f"{err}{where}") from None
    relative = tuple(os.path.relpath(p, root) for p in paths)
    archive = TarSamples(
        paths=relative,
        sizes=sizes,
        mtimes=mtimes,
        file=file,
        unit=file.copy(),
        offset=offsets,
        size=np.array([s for ix in indexes for s in ix.sizes], np.int64),
        image_keys=image_keys,
    )
    return archive_source(
        archive,
        ids=ids,
        labels=labels,
        class_names=class_names,
        root=root,
        description=f"webdataset:{os.path.join(os.getcwd(), pattern)}",  # as typed, anchored
        identities=[ix.digest for ix in indexes],
        options={"image_key": ";".join(image_keys), "label_key": label_key},
    )
