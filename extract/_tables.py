"""Parquet and Arrow files of encoded images as an indexed image source (``parquet:PATTERN``).

Opening the source reads each file's metadata and its label column only; every row then
becomes a row of the source, located by (file, row group, row). The images are read a
loader block at a time: each worker streams the row group it is in (record batches of
``_STREAM_ROWS`` rows, pages read as needed), so that neither a file nor a whole row group
is ever held in memory. Arrow files (the ``data-*.arrow`` streams that Hugging Face
``datasets`` writes with ``save_to_disk``) are memory-mapped, their record batches playing
the part of row groups.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import itertools
import json
import logging
import mmap
import os
import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ._archives import Archive, archive_source, container_root, expand_pattern, stat_containers
from ._decoding import check_listed
from ._images import ImageSource, check_keys
from ._labels import encode_labels, label_kind_problem, numbers_sorted_as_text, text_problem
from ._paths import expand_home

logger = logging.getLogger(__name__)

HF_METADATA = b"huggingface"  # the schema metadata key holding the datasets Features
_STREAM_ROWS = 64  # rows per record batch when streaming a row group
_READ_BUFFER = 1 << 20  # bytes read at a time from a column chunk
_SPLIT = re.compile(
    r"(train|training|test|testing|validation|valid|val|dev|eval)(?:$|[-._ 0-9])", re.I
)


class TableError(ValueError):
    """A Parquet / Arrow source cannot be read as images with labels."""


def _is_arrow(path: str) -> bool:
    return path.endswith(".arrow")


# The end of an Arrow IPC stream: a continuation marker and a message of length 0, or, in
# the format before Arrow 0.15 (whose messages have no continuation marker), the length 0.
_END_OF_STREAM = (b"\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00\x00")


class _Table:
    """One Parquet file (row groups) or Arrow stream (record batches), opened from ``fh``."""

    def __init__(self, path: str, fh) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path, self.fh = path, fh
        try:
            if _is_arrow(path):
                # The file opened (and checked) as ``fh``, not its path's: replaced there
                # since, by a rename, the mapping held the new file's bytes.
                size = os.fstat(fh.fileno()).st_size
                mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
                self.buffer = pa.BufferReader(pa.py_buffer(mapped))
                self.schema = pa.ipc.open_stream(self.buffer).schema
                self.parquet = None
            else:
                # Streamed page by page; CRCs checked where the writer stored them.
                self.parquet = pq.ParquetFile(
                    fh, buffer_size=_READ_BUFFER, pre_buffer=False, page_checksum_verification=True
                )
                self.schema = self.parquet.schema_arrow
        except (pa.ArrowInvalid, OSError) as err:
            kind = "an Arrow stream" if _is_arrow(path) else "a Parquet file"
            raise TableError(f"{path!r} is not {kind}: {err}") from None

    def _batches(self, columns: list[str]):
        import pyarrow as pa

        self.buffer.seek(0)
        for batch in pa.ipc.open_stream(self.buffer):
            yield batch.select(columns)

    def group_rows(self) -> list[int]:
        if self.parquet is None:
            return [batch.num_rows for batch in self._batches([])]
        meta = self.parquet.metadata
        return [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]

    def column(self, name: str):
        import pyarrow as pa

        if self.parquet is None:
            chunks = [batch.column(0) for batch in self._batches([name])]
            return pa.chunked_array(chunks, type=self.schema.field(name).type)
        return self.parquet.read(columns=[name], use_threads=False).column(0)

    def identity(self) -> str:
        """sha256 of the file's size and its footer (Parquet) or message headers (Arrow);
        a TableError for an Arrow stream cut short or damaged."""
        import pyarrow as pa

        size = os.fstat(self.fh.fileno()).st_size
        digest = hashlib.sha256(f"{size}\n".encode())
        if self.parquet is not None:
            self.fh.seek(-8, os.SEEK_END)
            length = int.from_bytes(self.fh.read(4), "little")
            self.fh.seek(-8 - length, os.SEEK_END)
            digest.update(self.fh.read(length))
        else:
            self.buffer.seek(0)
            last = 0  # where the last message ends
            try:
                for message in pa.ipc.MessageReader.open_stream(self.buffer):
                    digest.update(message.metadata)
                    last = self.buffer.tell()
            except (pa.ArrowInvalid, OSError) as err:  # cut or damaged inside a message
                raise self._damaged(self.buffer.tell(), " ".join(str(err).split())) from None
            # pyarrow ends a stream at the end of the file as at its end-of-stream marker,
            # which every writer writes when it closes: without it the writer stopped or a
            # copy was cut short, between two record batches.
            end = self.buffer.tell()
            self.buffer.seek(0)
            legacy = self.buffer.read(4) != _END_OF_STREAM[0][:4]  # no continuation markers
            self.buffer.seek(last)
            if self.buffer.read(end - last) != _END_OF_STREAM[legacy]:
                raise self._damaged(last, "no end-of-stream marker: the file was cut short")
            rest = np.frombuffer(self.buffer.read(), np.uint8) if end < size else None
            if rest is not None and rest.any():  # zeros after it: padding, as in a tar
                raise self._damaged(end, "data after the end-of-stream marker")
        return "sha256:" + digest.hexdigest()

    def _damaged(self, offset: int, what: str) -> TableError:
        return TableError(
            f"The Arrow stream {self.path!r} is damaged at byte {offset} ({what}); the record "
            "batches after it cannot be read: write the file again or leave it out of the "
            "pattern."
        )

    def stream(self, group: int, column: str):
        """Image bytes (and Hugging Face image paths) of row group ``group``, batch by batch."""
        import pyarrow as pa

        if self.parquet is None:
            # Copied out of the mapping _STREAM_ROWS rows at a time, each after the cursor
            # checked the file: rewritten in place later, the bytes of rows not taken yet
            # changed or, cut shorter, crashed the process. (Not a whole record batch at
            # once: a stream written as one batch was copied whole by each worker.)
            batches = (
                pa.record_batch(
                    [pa.concat_arrays([batch.column(0).slice(start, _STREAM_ROWS)])],
                    names=[column],
                )
                for batch in itertools.islice(self._batches([column]), group, group + 1)
                for start in range(0, batch.num_rows, _STREAM_ROWS)
            )
        else:
            batches = self.parquet.iter_batches(
                _STREAM_ROWS, row_groups=[group], columns=[column], use_threads=False
            )
        for batch in batches:
            values = batch.column(0)
            if not hasattr(values, "flatten"):
                yield values, None
                continue
            # A struct (Hugging Face's Image feature); flatten() keeps null rows null.
            fields = dict(zip([f.name for f in values.type], values.flatten(), strict=True))
            yield fields["bytes"], fields.get("path")


class _Cursor:
    """A worker's place in one row group, moving forward a record batch at a time.

    Its file is checked to be the one listed when opened and after each row is taken: a
    file rewritten in place since (between two blocks, or as a page was read) gives the
    rows taken after it a FileChangedError, as a tar shard does, never bytes of its other
    version."""

    def __init__(self, key: tuple[int, int], path: str, listed: tuple[int, int], column: str):
        self.key, self.start, self.values, self.paths = key, 0, None, None
        self.path, self.listed = path, listed
        self.fh = open(path, "rb")
        try:
            self.check()
            self.batches = _Table(path, self.fh).stream(key[1], column)
        except BaseException:
            self.fh.close()
            raise

    def close(self) -> None:
        fh = getattr(self, "fh", None)  # (none where open() itself failed)
        if fh is not None:
            fh.close()

    # A reader dropped mid-row-group (a run's end, a worker's exit) closes its file itself,
    # rather than leave it to the collector's "unclosed file" warning.
    __del__ = close

    def check(self) -> None:
        check_listed(self.path, os.fstat(self.fh.fileno()), self.listed, container=True)

    def take(self, row: int) -> bytearray | Exception:
        try:
            taken = self._take(row)
        except Exception:
            self.check()  # a file changed as it was read: that, rather than what it broke
            raise
        self.check()
        return taken

    def _take(self, row: int) -> bytearray | Exception:
        while self.values is None or row >= self.start + len(self.values):
            if self.values is not None:
                self.start += len(self.values)
            self.check()  # before an Arrow batch is copied out of a mapping cut shorter
            batch = next(self.batches, None)
            if batch is None:
                raise EOFError(f"row group {self.key[1]} ends before its row {row}")
            self.values, self.paths = batch
        data = self.values[row - self.start].as_py()
        if data is not None:
            return bytearray(data)
        path = None if self.paths is None else self.paths[row - self.start].as_py()
        where = f" (it refers to {path!r} instead)" if path else ""
        return LookupError(f"the row holds no image bytes{where}")


@dataclass(frozen=True)
class TableRows(Archive):
    """Rows of Parquet / Arrow files: the ``group`` (row group, record batch) and the
    ``row`` within it of each item, and the ``column`` holding the images."""

    group: np.ndarray = None
    row: np.ndarray = None
    column: str = "image"

    per_item: ClassVar[tuple[str, ...]] = ("file", "unit", "group", "row")

    def local_id(self, i: int, item_id: str) -> str:
        return item_id.rpartition(":")[2]  # ids are "<file>:<row in file>"

    def read_file(self, path, f, items, state) -> list[bytearray | Exception]:
        out: list[bytearray | Exception] = []
        for i in items:  # in source order: rows only move forward within a row group
            key, row = (f, int(self.group[i])), int(self.row[i])
            cursor = state.get("cursor")
            # Opened in the try: a file changed within the block fails its rows from the
            # change on, not those taken before it too.
            try:
                if cursor is None or cursor.key != key or row < cursor.start:
                    _drop_cursor(state)
                    listed = (int(self.sizes[f]), int(self.mtimes[f]))
                    cursor = state["cursor"] = _Cursor(key, path, listed, self.column)
                out.append(cursor.take(row))
            except Exception as err:  # a damaged page: this row fails, the next reopens
                _drop_cursor(state)
                out.append(err)
        return out


def _drop_cursor(state: dict) -> None:
    cursor = state.pop("cursor", None)
    if cursor is not None:
        cursor.close()


# datasets' cache files: <builder>-<split>.arrow, or <builder>-<split>-00000-of-00003.arrow.
_CACHE_SPLIT = re.compile(r".+-(train|test|validation)(?:-\d{5}-of-\d{5})?$", re.I)


# Hugging Face's shard names, <split>-00000-of-00004: the split (any name: query,
# gallery, in_domain) and the shard's place in its split.
_HF_SHARD = re.compile(r"^([A-Za-z][\w.]*?)-(\d{5})-of-(\d{5})$")


def _split_of(relative: str) -> str | None:
    """The split a file of a Hugging Face dataset folder belongs to, from its path: a
    shard's name that names a split (``train-00000-of-00004``), else the first folder of
    its path that does (``test/0000.parquet``, ``train/data-00000-of-00002.arrow``), else a
    shard's name of any split (``query-00000-of-00001``), else a ``datasets`` cache file's
    (``beans-train-00000-of-00002``)."""
    parts = relative.split(os.sep)
    parts[-1] = os.path.splitext(parts[-1])[0]
    shard = _HF_SHARD.match(parts[-1])  # (not beans-train-...: a cache file, below)
    prefix = shard.group(1) if shard else ""
    named = _SPLIT.fullmatch(prefix)
    if named:  # train-00000-of-00004 under dev_set/ is train's
        return named.group(1).lower()
    for part in parts[:-1] if shard else parts:  # train/images-00000-of-00001 is train's
        match = _SPLIT.match(part)
        if match:
            return match.group(1).lower()
    if shard:  # a split of another name: query-00000-of-00001
        return prefix.lower()
    match = _CACHE_SPLIT.match(parts[-1])
    return match.group(1).lower() if match else None


def _split_pattern(group: list[str], split: str | None, files: list[str]) -> str:
    """A glob, escaped, of the ``group`` of ``files`` (one split's, in one folder): the
    split's name where their names start with it, else their longest common stem, and
    their extension; the first file itself if that would match other files."""
    folder, extension = os.path.dirname(group[0]), os.path.splitext(group[0])[1]
    stems = [os.path.splitext(os.path.basename(f))[0] for f in group]
    named = split is not None and all(stem.lower().startswith(split) for stem in stems)
    prefix = stems[0][: len(split)] if named else os.path.commonprefix(stems)
    pattern = os.path.join(glob.escape(folder), f"{glob.escape(prefix)}*{extension}")
    if any(fnmatch.fnmatchcase(f, pattern) for f in set(files) - set(group)):
        return glob.escape(group[0])
    return pattern


def _check_one_split(where: str, base: str, files: list[str], configs: bool) -> None:
    """Refuse ``files`` (paths under ``base``) of several splits (train and test), or,
    with ``configs`` (a dataset folder), of one split in several folders: a repository's
    configs, each a copy of its images. A pattern may name several folders on purpose."""
    by_split: dict[str | None, list[str]] = {}
    for f in files:
        by_split.setdefault(_split_of(os.path.relpath(f, base)), []).append(f)
    named = sorted(s for s in by_split if s is not None)
    split = "train" if "train" in by_split else (named[0] if named else None)
    first = os.path.dirname(by_split[split][0])
    group = [f for f in by_split[split] if os.path.dirname(f) == first]
    example = _split_pattern(group, split, files)
    if len(by_split) > 1:
        names = sorted(str(s) for s in by_split)
        raise TableError(f"{where} holds the splits {names}; read one, e.g. parquet:{example}.")
    folders = sorted({os.path.relpath(os.path.dirname(f), base) for f in files})
    if configs and len(folders) > 1:
        raise TableError(
            f"{where} holds files of one split in several folders {folders[:4]}, as a "
            "dataset's configs (each a copy of its images) are; read one (or several, with a "
            f"pattern that names them), e.g. parquet:{example}."
        )
    _check_shard_counts(where, files, every=configs)


def _check_shard_counts(where: str, files: list[str], every: bool) -> None:
    """Refuse shards of one split named as of several counts (``-of-00001`` beside
    ``-of-00002``: another revision's, every row twice), and, with ``every`` (a folder,
    whose files no one chose), a split missing some of its shards."""
    shards: dict[tuple[str, str], dict[int, set[int]]] = {}
    for f in files:
        name = _HF_SHARD.match(os.path.splitext(os.path.basename(f))[0])
        if name:
            key = (os.path.dirname(f), name.group(1).lower())
            shards.setdefault(key, {}).setdefault(int(name.group(3)), set()).add(int(name.group(2)))
    for (folder, split), counts in sorted(shards.items()):
        shown = os.path.join(folder, f"{split}-*")
        if len(counts) > 1:
            raise TableError(
                f"{where} holds shards {shown!r} of {sorted(counts)} shards each: two "
                "shardings of one split (a revision's files left beside another's), whose "
                "rows would be read twice; keep one."
            )
        ((count, present),) = counts.items()
        missing = sorted(set(range(count)) - present)
        if every and missing and present != set(range(1, count + 1)):  # (or from 1)
            raise TableError(
                f"{where} lacks shard {missing[0]} of the {count} of {shown!r} "
                f"({len(missing)} missing): a download cut short? Fetch them, or name the "
                "shards to read with a pattern."
            )


def _saved_arrow_files(state: str) -> list[str] | None:
    """The Arrow files that ``Dataset.save_to_disk``'s ``state.json`` lists, or None when
    there is no such file or it is not datasets' (a training run's state.json, say: the
    folder is then read as a folder of Parquet files)."""
    try:
        with open(state, encoding="utf-8") as fh:
            state_data = json.load(fh)
        data = state_data.get("_data_files")
        files = [d["filename"] for d in data]
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return None
    if not (files and all(isinstance(f, str) for f in files)):
        return None
    # datasets before 1.15 saved a selection (a split, a filter, a shuffle) as its parent's
    # whole table beside an indices file, and the 2020 nlp library slices of its files:
    # read as they are, every row of the parent was extracted.
    # (datasets 1.0-1.5 wrote skip 0 and take of every row for whole files too.)
    sliced = any(isinstance(d, dict) and d.get("skip") not in (None, 0) for d in data)
    if state_data.get("_indices_data_files") or sliced:
        raise TableError(
            f"{os.path.dirname(state)!r} was saved by an old datasets release as a selection "
            "of its files' rows (an indices file, or slices), which is not read here: load it "
            "with datasets, call flatten_indices(), and save it again (save_to_disk)."
        )
    return files


def _dataset_folder(folder: str) -> list[str]:
    """The data files of a Hugging Face dataset folder, one split only."""
    if os.path.isfile(path := os.path.join(folder, "dataset_dict.json")):
        try:
            with open(path) as fh:
                splits = json.load(fh)["splits"]
            if not (isinstance(splits, list) and all(isinstance(x, str) for x in splits)):
                raise TypeError(f"its 'splits' are {splits!r}")
        except (OSError, ValueError, TypeError, KeyError) as err:
            raise TableError(
                f"{path!r} is not the dataset_dict.json of a DatasetDict (a list of its split "
                f"folders, 'splits'): {err!r}; give one split's folder."
            ) from err
        example = os.path.join(folder, splits[0]) if splits else folder
        raise TableError(
            f"{folder!r} holds the splits {splits} of a DatasetDict; give one split's folder, "
            f"e.g. parquet:{example}."
        )
    listed = _saved_arrow_files(os.path.join(folder, "state.json"))
    if listed is not None:  # Dataset.save_to_disk: Arrow streams listed in order
        return [os.path.abspath(os.path.join(folder, f)) for f in listed]
    files = sorted(glob.glob(os.path.join(glob.escape(folder), "**", "*.parquet"), recursive=True))
    if not files:
        raise TableError(f"The folder {folder!r} holds no .parquet files.")
    _check_one_split(f"The folder {folder!r}", folder, files, configs=True)
    return [os.path.abspath(f) for f in files]


def _is_image_type(t) -> bool:
    import pyarrow as pa

    binary = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
    if pa.types.is_struct(t):
        index = t.get_field_index("bytes")
        return index >= 0 and any(test(t.field(index).type) for test in binary)
    return any(test(t) for test in binary)


def _image_column(schema, image_key: str | None, path: str) -> str:
    names = list(schema.names)
    if image_key is None:
        candidates = [n for n in names if _is_image_type(schema.field(n).type)]
        image_key = "image" if "image" in names else candidates[0] if len(candidates) == 1 else ""
        if not image_key:
            raise TableError(
                f"{path!r} has no 'image' column and {len(candidates)} columns of image bytes "
                f"({', '.join(candidates) or 'none'}) among {names}; choose it with --image-key."
            )
    if image_key not in names:
        raise TableError(
            f"{path!r} has no column {image_key!r} (its columns: {names}); choose the image "
            "column with --image-key."
        )
    if not _is_image_type(schema.field(image_key).type):
        raise TableError(
            f"The column {image_key!r} of {path!r} is {schema.field(image_key).type}, not encoded "
            "images (binary, or a struct with 'bytes' as Hugging Face's Image feature writes)."
        )
    return image_key


def hf_class_names(schema, column: str) -> list[str] | None:
    """The ClassLabel names of ``column`` in a Hugging Face ``datasets`` schema, if any."""
    raw = (schema.metadata or {}).get(HF_METADATA)
    if raw is None:
        return None
    try:  # a schema written by hand may hold anything: then it names no classes
        feature = (json.loads(raw).get("info") or {}).get("features", {}).get(column)
    except (ValueError, AttributeError):
        return None
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
        names = feature.get("names")
        if isinstance(names, list) and all(isinstance(name, str) for name in names):
            return list(names)
    return None


def _holds_text(kind) -> bool:
    """Whether an Arrow type holds strings (plain, large, views, or dictionary-encoded)."""
    import pyarrow as pa

    kind = kind.value_type if pa.types.is_dictionary(kind) else kind
    view = getattr(pa.types, "is_string_view", lambda _: False)(kind)  # pyarrow >= 16
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or view


def _label_texts(values, column: str, path: str, names: list[str] | None) -> list[str]:
    """Labels of one file as text: integer class indices, or class names."""
    import pyarrow as pa
    import pyarrow.compute as pc

    # (pc.is_null, not null_count: a dictionary-encoded column can hold its null in the
    # dictionary, which became a class "None", or "nan" of integers. Of the values, not the
    # indices: pyarrow 21's is_null of a dictionary column sees only the indices' nulls.)
    decoded = values
    if pa.types.is_dictionary(values.type):
        decoded = pc.cast(values, values.type.value_type)
    missing = pc.is_null(decoded)
    if pc.any(missing).as_py():
        row = int(pc.index(missing, True).as_py())
        raise TableError(f"Row {row} of {path!r} has no {column!r} label.")
    kind = values.type.value_type if pa.types.is_dictionary(values.type) else values.type
    if pa.types.is_integer(kind):
        numbers = values.to_numpy()
        bad = np.flatnonzero((numbers < 0) | (names is not None and numbers >= len(names)))
        if len(bad):
            row, label = int(bad[0]), int(numbers[bad[0]])
            unlabelled = " (-1 marks an unlabelled row, as in test splits)" if label < 0 else ""
            raise TableError(
                f"Row {row} of {path!r} has the {column!r} label {label}, which is no class"
                f"{unlabelled}; "
                + (f"the classes are 0..{len(names) - 1}." if names else "labels are >= 0.")
            )
        return numbers.astype(str).tolist()
    if _holds_text(values.type):
        try:
            texts = [str(v).strip() for v in values.to_pylist()]
        except UnicodeDecodeError as err:  # a string column of bytes that are not UTF-8
            row = next(i for i, v in enumerate(values) if not _decodes(v))
            raise TableError(
                f"Row {row} of {path!r} has a {column!r} label that is not UTF-8 text ({err})."
            ) from None
        for row, text in enumerate(texts):
            problem = text_problem(text)
            if problem:
                raise TableError(
                    f"Row {row} of {path!r} has the {column!r} label {text!r}, which "
                    f"{problem}: a store cannot hold it as a class name."
                )
        return texts
    raise TableError(
        f"The {column!r} column of {path!r} is {values.type}; a label column holds integer "
        "class indices or class names. Choose it with --label-key."
    )


def _decodes(scalar) -> bool:
    try:
        scalar.as_py()
    except UnicodeDecodeError:
        return False
    return True


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each of consecutive runs of ``counts`` items starts."""
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


@dataclass
class _FileIndex:
    labels: list[str]
    group_rows: list[int]
    names: list[str] | None
    identity: str
    text: bool  # the labels were strings: class names, digits or not


def _index_file(path: str, image_key: str | None, label_key: str) -> tuple[_FileIndex, str]:
    with open(path, "rb") as fh:
        table = _Table(path, fh)
        identity = table.identity()  # first: it refuses a damaged or cut Arrow stream
        image = _image_column(table.schema, image_key, path)
        if label_key not in table.schema.names:
            raise TableError(
                f"{path!r} has no column {label_key!r} (its columns: {list(table.schema.names)});"
                " choose the label column with --label-key."
            )
        names = hf_class_names(table.schema, label_key)
        column = table.column(label_key)
        labels = _label_texts(column, label_key, path, names)
        text = _holds_text(column.type)
        return _FileIndex(labels, table.group_rows(), names, identity, text), image


def parquet_files(
    pattern: str | os.PathLike, image_key: str | None = None, label_key: str | None = None
) -> ImageSource:
    """Rows of Parquet files (or of a Hugging Face ``datasets`` folder) of encoded images.

    Parameters
    ----------
    pattern : str or path-like
        Parquet files as a brace pattern or local glob
        (``data/train-{00000..00003}-of-00004.parquet``, ``data/train-*.parquet``), or a
        folder: a Hugging Face dataset repository or export (its ``.parquet`` files,
        sorted, which must belong to one split), or a folder written by
        ``Dataset.save_to_disk`` (its Arrow files, in ``state.json``'s order). Files ending
        in ``.arrow`` are read as Arrow IPC streams.
    image_key : str, optional
        The image column: binary, or a struct with a ``bytes`` field (Hugging Face's
        ``Image`` feature). Default: ``image``, else the only such column.
    label_key : str, optional
        The label column (default: ``label``): integers (class indices) or strings
        (class names, sorted). Integer classes are named by the Hugging Face
        ``ClassLabel`` names in the schema's ``huggingface`` metadata when present, else
        ``"0"``, ``"1"``, ...

    Returns
    -------
    ImageSource
        Ids are ``<file>:<row in file>``; the root is the files' common folder.

    Raises
    ------
    TableError
        If a file is not Parquet / Arrow, a column is missing or of the wrong type, a label
        is missing or negative, the files disagree on the class names, or a folder holds
        several splits.
    """
    check_keys(image_key, label_key)  # ("" was read as the default)
    label_key = label_key or "label"
    # (a pathlib.Path failed on 'startswith'; a folder's ~, as each part of a pattern's)
    pattern = expand_home(os.fsdecode(pattern))
    folder = os.path.isdir(pattern)
    paths = _dataset_folder(pattern) if folder else expand_pattern(pattern, "parquet")
    root = os.path.abspath(pattern) if folder else container_root(paths)
    if not folder:
        _check_one_split(f"The pattern {pattern!r}", root, paths, configs=False)
    sizes, mtimes = stat_containers(paths)
    indexes, columns = zip(*(_index_file(p, image_key, label_key) for p in paths), strict=True)
    if len(set(columns)) > 1:
        raise TableError(f"The files hold their images in different columns: {set(columns)}.")
    if len({ix.text for ix in indexes}) > 1:
        raise TableError(
            f"The files of {pattern!r} disagree on the {label_key!r} labels: class indices "
            "(integers) in some, class names (strings) in others."
        )
    as_names = indexes[0].text  # a string column holds names, digits or not
    # ClassLabel names name integer labels: labels that are names leave them unread.
    named = set() if as_names else {tuple(ix.names) for ix in indexes if ix.names is not None}
    if len(named) > 1 or (named and any(ix.names is None for ix in indexes)):
        raise TableError(f"The files of {pattern!r} disagree on the {label_key!r} class names.")
    texts = [t for ix in indexes for t in ix.labels]
    problem = label_kind_problem(texts, as_names)
    if problem:
        i, why = problem
        raise TableError(
            f"Row {i} of the parquet source {pattern!r} (counting across its files) has the "
            f"{label_key!r} label {texts[i]!r}, {why}; give every row a class index, or every "
            "row a name."
        )
    moved = numbers_sorted_as_text(texts) if as_names else None
    if moved is not None:  # ("2" was class 4 of 12, without a word)
        logger.warning(
            "Row %d of the parquet source %r (counting across its files) has the %r label "
            "%r, a string of digits: read as a class name, as every string label is, the "
            "classes sorted as text (class %d is %r); store the labels as integers to read "
            "them as class indices.",
            moved[0], pattern, label_key, texts[moved[0]], moved[1], moved[2],
        )  # fmt: skip
    try:
        labels, class_names = encode_labels(
            texts, list(named.pop()) if named else None, as_names=as_names
        )
    except ValueError as err:  # the ClassLabel names of the files
        raise TableError(f"The {label_key!r} labels of {pattern!r}: {err}") from None
    # Row groups (record batches) are numbered across files: the units ranks divide.
    group_rows = np.array([n for ix in indexes for n in ix.group_rows], np.int64)
    n_groups = np.array([len(ix.group_rows) for ix in indexes], np.int64)
    unit = np.repeat(np.arange(len(group_rows)), group_rows)
    file = np.repeat(np.arange(len(paths)), n_groups)[unit]
    row = np.arange(len(unit)) - _starts(group_rows)[unit]
    position = np.arange(len(unit)) - _starts(np.bincount(file, minlength=len(paths)))[file]
    relative = tuple(os.path.relpath(p, root) for p in paths)
    archive = TableRows(
        paths=relative,
        sizes=sizes,
        mtimes=mtimes,
        file=file,
        unit=unit,
        group=unit - _starts(n_groups)[file],
        row=row,
        column=columns[0],
    )
    return archive_source(
        archive,
        ids=[f"{relative[f]}:{p}" for f, p in zip(file.tolist(), position.tolist(), strict=True)],
        labels=labels,
        class_names=class_names,
        root=root,
        description=f"parquet:{os.path.join(os.getcwd(), pattern)}",  # as typed, anchored
        identities=[ix.identity for ix in indexes],
        options={"image_key": columns[0], "label_key": label_key},
    )
