"""HDF5 filters a dataset needs that this HDF5 cannot load, and external raw data files
or virtual datasets' sources missing, for the errors of both the estimators' reads
(``_data.read_h5``, ``check_h5_open``) and extract's stores (``extract._store.damaged``);
and why a path to read is not there (a link to nothing, a file named as a folder), for the
errors of both packages' readers (``load_features``, ``mr2-probe``'s); and a store's
failed images, as both packages' messages name them (:func:`name_failures`).

Light on purpose: no torch, scikit-learn or NumPy, and h5py only where it is called (with
an h5py object, so it is there), as ``load_features`` imports neither torch nor
scikit-learn.
"""

from __future__ import annotations

import errno
import os

# Failed images named in a message: the first few, each with its reason.
_NAMED_FAILURES = 3


def name_failures(n_failed: int, first: list[tuple]) -> str:
    """The first failed images of ``n_failed`` with their reasons, in parentheses, as in
    ``(the first 3: 'a.jpg': OSError: ...; 'b.png': ...; 'c.png': ...)``. Each of ``first``
    ends with (path, reason): a store's ``failures`` pairs, or extract's ``failed_rows``.
    A reason is said on one line (another tool's store may hold several), cut at 1000
    characters, and one that a store did not record as "no reason recorded" (not a
    dangling colon: ``('a.jpg': )``)."""
    first = first[:_NAMED_FAILURES]
    named = "; ".join(
        f"{path!r}: {one_line(reason or '') or 'no reason recorded'}" for *_, path, reason in first
    )
    if len(first) >= n_failed:
        return f"({named})"
    return f"(the first, {named})" if len(first) == 1 else f"(the first {len(first)}: {named})"


def one_line(error, limit: int = 1000) -> str:
    """An error's (or warning's) message on one line, cut at ``limit`` characters (some
    messages print a whole array)."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def why_missing(path: str) -> str:
    """Why ``path``, which is not there to read, is not: "does not exist", or, for a
    symbolic link, where its chain of links ends (a target that does not exist, named as
    the chain reaches it) or that the chain is a loop."""
    if not os.path.islink(path):
        return "does not exist"
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a symbolic link in a loop of links"
    return f"is a symbolic link to {os.path.realpath(path)!r}, which does not exist"


def file_named_as_folder(path) -> str | None:
    """Why ``path``, which does not exist, cannot be read, where it names a file as a
    folder: ``s1.h5/`` ("names the file 's1.h5' as a folder: ..."), ``notes.txt/run.npz``;
    None where no part of it is a file. Its readers said that ``s1.h5/`` did not exist,
    beside an ``s1.h5`` that does."""
    text = os.fsdecode(path)  # (bytes too, as h5py takes them)
    head = text.rstrip(os.sep + (os.altsep or ""))
    if head != text and os.path.isfile(head):
        return f"names the file {head!r} as a folder: pass it without the trailing {text[-1]!r}"
    folder = os.path.dirname(head)
    while folder and not os.path.isdir(folder):  # (the root is a folder)
        if os.path.isfile(folder):
            return f"names the file {folder!r} as a folder; check the path"
        folder = os.path.dirname(folder)
    return None


# What to do about the filters that missing_filters names, in both packages' errors.
PLUGIN_ADVICE = (
    "Install their plugin (pip install hdf5plugin, then import hdf5plugin before reading "
    "it) or name its folder in HDF5_PLUGIN_PATH"
)


def missing_filters(source) -> list[str]:
    """The filters (compression) of the HDF5 dataset ``source``, or of the datasets at the
    root of the HDF5 file ``source``, that this HDF5 cannot load: a plugin not installed,
    as hdf5plugin's Blosc or Zstd for a file that another tool wrote."""
    import h5py

    if isinstance(source, h5py.Dataset):
        datasets = [source]
    else:
        links = ((name, source.get(name, getlink=True)) for name in source)
        objects = (source[name] for name, link in links if isinstance(link, h5py.HardLink))
        datasets = [obj for obj in objects if isinstance(obj, h5py.Dataset)]
    missing = {}
    for dataset in datasets:
        dcpl = dataset.id.get_create_plist()
        for i in range(dcpl.get_nfilters()):
            code, flags, _, name = dcpl.get_filter(i)
            if h5py.h5z.filter_avail(code):
                continue
            if flags & h5py.h5z.FLAG_OPTIONAL and not optional_filter_applied(dataset, i):
                continue  # skipped when written (HDF5 could not load it then either)
            missing[code] = f"{name.decode(errors='replace') or 'filter'} (id {code})"
    return list(missing.values())


def optional_filter_applied(dataset, index: int) -> bool:
    """Whether the optional filter at ``index`` of the HDF5 ``dataset``'s pipeline was
    applied to a chunk: a writer that cannot load such a filter skips it, marking each chunk
    so (its filter mask), and HDF5 then reads them without it. (One chunk index walk, on an
    error's path.)"""
    if dataset.chunks is None:
        return True
    dsid = dataset.id
    masks = [dsid.get_chunk_info(i).filter_mask for i in range(dsid.get_num_chunks())]
    return any(not mask & (1 << index) for mask in masks)


def missing_virtual_source(path, dataset) -> str | None:
    """The first source of the virtual dataset ``dataset`` (of the file ``path``) that
    cannot be opened, as "'file' (dataset 'name') cannot be opened, and HDF5 reads its rows
    as the fill value (0.0), without an error", or that is short of the rows mapped from
    it, as "'file' (dataset 'name') has shape (40, 4), short of the (60, 4) mapped from
    it, ..." (what HDF5 does with them: :func:`_short_source`); None for a dataset that is
    not virtual, or whose sources all open and hold what is mapped (shards of a virtual
    features dataset, one deleted or left behind by a move, or written again with fewer
    rows).
    Looked for where HDF5 looks: its HDF5_VDS_PREFIX, the store's folder (that of the link it
    is read through, and its real one), the name as given."""
    import h5py

    if not dataset.is_virtual:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    folders = dict.fromkeys([folder, os.path.dirname(os.path.realpath(path))])
    # HDF5_VDS_PREFIX twice, as HDF5 reads it: as it is now, each of its folders taken as
    # written; and as it was when HDF5 started, in one piece, its ${ORIGIN} the store's
    # folder (read as such in both, HDF5's zeros were loaded without a word).
    prefixes = [p for p in os.environ.get("HDF5_VDS_PREFIX", "").split(os.pathsep) if p]
    started = os.fsdecode(dataset.id.get_access_plist().get_virtual_prefix())
    prefixes += [started.replace("${ORIGIN}", folder)] if started else []
    opened: dict = {}  # name → its h5py.File, None where none opens
    try:
        for source in dataset.virtual_sources():
            name, inside = source.file_name, source.dset_name
            if "%b" in name or "%b" in inside:  # a printf-style name HDF5 numbers itself
                continue
            if name == ".":  # the store itself
                if not isinstance(dataset.file.get(inside), h5py.Dataset):
                    return f"{inside!r} (in the store itself) cannot be opened" + _as_fill(dataset)
                short = _short_source(source, dataset.file[inside], dataset)
                if short:
                    return f"{inside!r} (in the store itself) {short}"
                continue
            if name not in opened:
                opened[name] = None
                base = name if os.path.isabs(name) else None
                relative = os.path.basename(name) if base else name
                candidates = [base] if base else []
                candidates += [os.path.join(p, relative) for p in prefixes]
                candidates += [os.path.join(f, relative) for f in folders] + [name]
                for candidate in candidates:
                    try:
                        opened[name] = h5py.File(candidate, "r")
                        break
                    except OSError:
                        continue
            if opened[name] is None or not isinstance(opened[name].get(inside), h5py.Dataset):
                return f"{name!r} (dataset {inside!r}) cannot be opened" + _as_fill(dataset)
            short = _short_source(source, opened[name][inside], dataset)
            if short:
                return f"{name!r} (dataset {inside!r}) {short}"
    finally:
        for source_file in opened.values():
            if source_file is not None:
                source_file.close()
    return None


def _as_fill(dataset) -> str:
    """What HDF5 reads for the rows of a source of the virtual ``dataset`` that cannot be
    opened: its fill value, without an error."""
    fill = dataset.fillvalue
    fill = fill.tolist() if hasattr(fill, "tolist") else fill  # (NumPy's scalar: its value)
    return f", and HDF5 reads its rows as the fill value ({fill!r}), without an error"


def _short_source(source, found, dataset) -> str | None:
    """Why the dataset ``found`` cannot give what the mapping ``source`` of the virtual
    ``dataset`` takes from it ("has shape (40, 4), short of the (60, 4) mapped from it"),
    and what HDF5 does then: a mapping of the whole source fails to be read; rows mapped
    past its end are read as its fill values, without an error, where its rows are
    chunked, and where they lie in one piece from the bytes that follow them in its file
    (another dataset's), failing only where the file ends. None where it can.
    Mappings of a dataset that grows (a dimension unlimited) take what is there."""
    import h5py

    if None in (dataset.maxshape or ()) or found.shape is None:
        return None
    space = source.src_space
    read = (
        ", and HDF5 reads the rows past its end as its fill values, without an error"
        if found.chunks
        else ", and HDF5 reads the rows past its end from whatever follows it in its file, "
        "without an error, or fails where the file ends (an error that names no source)"
    )
    if space.get_select_type() == h5py.h5s.SEL_HYPERSLABS:
        reach = tuple(int(stop) + 1 for stop in space.get_select_bounds()[1])
    elif space.get_select_type() == h5py.h5s.SEL_ALL:  # the whole source, in its place's shape
        vspace = source.vspace
        if vspace.get_select_type() == h5py.h5s.SEL_HYPERSLABS and vspace.is_regular_hyperslab():
            _, _, count, block = vspace.get_regular_hyperslab()  # (every other row: its count)
            reach = tuple(int(c) * int(b) for c, b in zip(count, block, strict=True))
        else:
            first, last = vspace.get_select_bounds()
            reach = tuple(int(b) - int(a) + 1 for a, b in zip(first, last, strict=True))
        read = ", and HDF5 fails to read the virtual dataset (an error that names no source)"
    else:
        return None
    if len(reach) != len(found.shape):
        return None
    if all(r <= n for r, n in zip(reach, found.shape, strict=True)):
        return None
    return f"has shape {found.shape}, short of the {reach} mapped from it{read}"


# Where HDF5 looks for a dataset's external raw data files, for the errors that name one.
EXTERNAL_ADVICE = (
    "HDF5 looks for a relative name from the current folder, or from HDF5_EXTFILE_PREFIX "
    "where that was set when it started, ${ORIGIN} there meaning the HDF5 file's folder"
)


def missing_external_file(dataset) -> str | None:
    """The first external raw data file of the HDF5 ``dataset`` (``create_dataset(...,
    external=[...])``) that is not a file there, as "'name', which is not there" (with the
    path HDF5 opens where that differs; "which is a folder, not a file" for a folder, which
    was called not there); None for a dataset whose raw data lies in its own file, or whose
    external files are all there. Looked for where HDF5 looks: under the dataset's external
    file prefix (HDF5_EXTFILE_PREFIX, resolved when the dataset was opened), else as named."""
    for name, full, _offset, _held in _external_files(dataset):
        if not os.path.isfile(full):
            shown = os.path.abspath(full)
            named = repr(name) if shown == name else f"{name!r} (looked for as {shown!r})"
            if os.path.isdir(full):
                return f"{named}, which is a folder, not a file"
            if os.path.exists(full):
                return f"{named}, which is not a regular file (a pipe, a device or a socket)"
            return f"{named}, which is not there"
    return None


def short_external_file(dataset) -> str | None:
    """The first external raw data file of the HDF5 ``dataset`` that is shorter than the
    rows it holds there, as "'name' (40 of its 96 bytes)"; None where each holds all of
    them (or is not there: :func:`missing_external_file`). HDF5 reads the bytes past a
    file's end as zeros, without an error (a copy cut short, a disk that filled)."""
    for name, full, offset, held in _external_files(dataset):
        if not os.path.isfile(full):  # (a folder's size is none of its rows)
            continue
        try:
            found = os.path.getsize(full) - offset
        except OSError:
            continue
        if found < held:
            return f"{name!r} ({max(found, 0)} of its {held} bytes)"
    return None


def _external_files(dataset) -> list[tuple[str, str, int, int]]:
    """``(name, path, offset, held)`` of each external raw data file of ``dataset`` that
    holds some of its rows (``held`` bytes of them, from ``offset`` on): its name as
    recorded and the path HDF5 opens (under the dataset's external file prefix,
    HDF5_EXTFILE_PREFIX resolved when the dataset was opened, else as named). The files
    past its rows (an extendible dataset's next, not yet written) are none: HDF5 reads
    none of them."""
    if not dataset.external:  # (None: its rows lie in its own file)
        return []
    prefix = os.fsdecode(dataset.id.get_access_plist().get_efile_prefix())
    left = (dataset.size or 0) * dataset.id.get_type().get_size()
    files = []
    for name, offset, size in dataset.external:
        held = min(size, left)  # the bytes of the rows in this file
        left -= held
        if not held:
            continue
        name = os.fsdecode(name)
        full = name if os.path.isabs(name) or not prefix else os.path.join(prefix, name)
        files.append((name, full, offset, held))
    return files
