"""The list file source (``path,label`` lines): its rows, the folder its paths are read
against, its first line (a header or an image) and the warnings on its rows."""

from __future__ import annotations

import csv
import logging
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from torchvision.datasets.folder import IMG_EXTENSIONS

from ._decoding import NOT_A_FILE
from ._images import ImageSource, stat_files
from ._labels import (
    _AS_TEXT,
    _DECIMAL,
    _is_unlabelled,
    encode_labels,
    is_index,
    label_kind_problem,
    renumbered_decimal,
)
from ._list_lines import (
    _commas_advice,
    _list_format,
    _shell_fields,
    _unquoted_label,
    _warn_of_commas_read_as_csv,
)
from ._paths import expand_home, plural

logger = logging.getLogger(__name__)


def _source_hint(path: Path) -> str:
    """What a file that is not a list file may have been meant as, by its extension."""
    suffix = "".join(path.suffixes[-2:]).lower()
    if suffix.endswith(".tar"):
        return (
            f" For WebDataset shards, write 'webdataset:{path}'; extract an archive of class "
            "folders, and give its folder."
        )
    if suffix.endswith((".tar.gz", ".tgz", ".zip")):  # (webdataset: takes no compressed tar)
        hint = " An archive is no source: extract it, and give its folder of class folders"
        if suffix.endswith(".zip"):  # (WebDataset shards are tar files, never zips)
            return hint + "."
        return hint + " (or decompress WebDataset shards, and write 'webdataset:PATTERN')."
    if suffix.endswith((".parquet", ".arrow")):
        return f" For a Parquet or Arrow file, write 'parquet:{path}'."
    if suffix.endswith(IMG_EXTENSIONS):
        return " A single image is no source: give its folder, or a list file naming it."
    return ""


_AS_A_SHELL = (
    " The list's lines are read as a shell reads them (other lines quote their paths so), "
    "and this one names no file as it stands: quote a path or a label that holds a blank "
    "or a quote ('my dir/1.jpg' 'golden retriever', as shlex.quote writes them)."
)


def _list_rows(
    list_file: Path, folder: Path, text: list[str], delimiter: str | None
) -> Iterator[list]:
    """``[path, label, line number]`` of each line of a list file's ``text``, split as
    ``delimiter`` says (:func:`_list_format`), one line at a time; in a list quoted as a
    shell quotes, a line's path relative to ``folder`` where a file's existence tells two
    readings of it apart (:func:`_shell_fields`)."""
    for number, line in enumerate(text, 1):
        if not line.strip():
            continue
        if "\0" in line:  # no file name holds one (os.stat: "embedded null byte"), nor text
            raise ValueError(f"{list_file}:{number}: the line {line!r} holds a NUL byte.")
        try:
            if delimiter == ",":
                fields = next(csv.reader([line]))
            elif delimiter == "\t":  # (a label quoted as the csv module quotes, unquoted)
                fields = re.split(r"\t+", line.strip())
                fields[1:] = [_unquoted_label(f, shell=False) for f in fields[1:]]
            elif delimiter == "csv-tab":  # (the csv module's quotes, on every field)
                fields = next(csv.reader([line.strip()], delimiter="\t"))
            elif delimiter == "csv-semicolon":
                fields = next(csv.reader([line], delimiter=";"))
            elif delimiter == "shell":
                fields = _shell_fields(folder, line)
            else:  # (a label quoted as a shell quotes, unquoted)
                fields = line.rsplit(None, 1)
                fields[1:] = [_unquoted_label(f, shell=True) for f in fields[1:]]
        except (csv.Error, ValueError) as err:  # e.g. a field over csv's limit: a JSON file
            # given by mistake; a quote left open in a list quoted as a shell does
            raise ValueError(
                f"{list_file}:{number}: not a 'path,label' line ({err})."
                + (_AS_A_SHELL if delimiter == "shell" else _source_hint(list_file))
            ) from None
        if len(fields) > 2 and delimiter == "shell":  # (one field: no label, quoted or not)
            raise ValueError(
                f"{list_file}:{number}: expected 'path,label', got {line!r}." + _AS_A_SHELL
            )
        if len(fields) != 2:
            raise ValueError(
                f"{list_file}:{number}: expected 'path,label', got {line!r} "
                + (
                    "(a list file has no comment syntax: remove the line)."
                    if line.lstrip().startswith("#")  # ('# made by ...', said as CSV's)
                    else _commas_advice(text)
                    if delimiter == "," and len(line.split(None, 1)) == 2
                    else "(a list with a comma is read as CSV: quote a file name that holds "
                    'one, "a,b.jpg",cat).'
                )
                + _source_hint(list_file)
            )
        yield [f.strip() for f in fields] + [number]


def _list_folder_and_rows(list_file: Path, text: list[str]) -> tuple[Path, list[list], str | None]:
    """The folder a list's relative paths are resolved against, its rows
    (:func:`_list_rows`, split where a file's existence decides, in that folder) and how
    they were split there (:func:`_list_format`): the list
    file's, as named; for a list that is a symbolic link to a list elsewhere (a dataset's
    list linked into a project), its target's where the first line whose path names a file
    in one of the two alone names it there, and where its lines are 'path,label' lines
    read there. (A list kept by git-annex or DVC, a link to an object in their store, keeps
    its own folder: no image lies beside the object.) Each line is read once, and read
    both ways as far as that first line alone, where the two folders read it otherwise."""
    named, target = list_file.parent, Path(os.path.realpath(list_file)).parent
    delimiter = _list_format(named, text)
    here = _list_rows(list_file, named, text, delimiter)
    if target == Path(os.path.realpath(named)):
        return named, list(here), delimiter
    other_delimiter = _list_format(target, text)
    # (split alike, with no look-up, the lines are the same rows in either folder)
    there = None
    if other_delimiter != delimiter or delimiter == "shell":
        there = _list_rows(list_file, target, text, other_delimiter)
    rows, other_rows = [], []
    for row in here:
        rows.append(row)
        try:
            other = row if there is None else next(there)
        except ValueError:  # (read beside the target, a line is no 'path,label' line)
            return named, rows + list(here), delimiter
        other_rows.append(other)
        path, other_path = row[0], other[0]
        if os.path.isabs(path) and os.path.isabs(other_path):
            continue
        if os.path.lexists(named / path) == os.path.lexists(target / other_path):
            continue
        if not os.path.lexists(target / other_path):
            return named, rows + list(here), delimiter
        if there is None:
            return target, rows + list(here), delimiter
        try:
            return target, other_rows + list(there), other_delimiter
        except ValueError:  # (as above, on a later line)
            return named, rows + list(here), delimiter
    return named, rows, delimiter


_WORKING_FOLDER_ADVICE = (
    "write its paths relative to the list's folder (or absolute), or move the list into the "
    "working folder"
)


def _working_folder_path(
    folder: str | os.PathLike, ids: list[str], sizes: np.ndarray | None = None
) -> str:
    """The first relative path of a list's ``ids`` where none names a file in the list's
    ``folder`` (``sizes`` there, as :func:`stat_files` gives them; None: looked up) but it
    names one in the working folder (``find data -name '*.png' > lists/train.txt``): its
    paths are read relative to the list's folder all the same. '' where it is not so."""
    relative = [i for i, path in enumerate(ids) if not os.path.isabs(path)]
    # (the sizes given first, then the first path's look-ups: each file's last, if need be)
    if not relative or sizes is not None and (sizes[relative] != NOT_A_FILE).any():
        return ""
    first = ids[relative[0]]
    if not os.path.lexists(first) or not os.path.isdir(folder):
        return ""
    if os.path.samefile(folder, os.curdir):
        return ""
    if sizes is None:
        sizes = stat_files(os.fspath(folder), ids)[0]
    return "" if (sizes[relative] != NOT_A_FILE).any() else first


def _warn_of_working_folder_paths(
    list_file: Path, folder: Path, ids: list[str], sizes: np.ndarray
) -> None:
    """Say why every image of a list will fail (:func:`_working_folder_path`)."""
    first = _working_folder_path(folder, ids, sizes)
    if first:
        logger.warning(
            "%s: no image it lists is found in its folder %s, against which its relative "
            "paths are read, but %r is found in the working folder: %s; its images will be "
            "recorded as failed.",
            list_file, folder, first, _WORKING_FOLDER_ADVICE,
        )  # fmt: skip


def _check_path_first(
    list_file: Path, folder: Path, rows: list, text: list[str], delimiter: str | None
) -> None:
    """Refuse a list whose columns are 'label,path' (a 'label,path' header, or lines
    whose labels name files and whose paths name none, most of the list's): it was refused
    as a header, or read as images named by the labels, every one failed, in classes named
    by the paths. A list whose first image is missing and labelled with the name of a file
    beside it (a class 'notes' beside notes) is no such list: it was refused as one. The
    line refused is shown as written in ``text``, and the columns named in the list's own
    separator (``delimiter``: 'label;path' was shown 'label,path', and the cure 'path,label'
    in a list separated by semicolons)."""
    if rows and [f.lower() for f in rows[0][:2]] == ["path", "label"]:
        rows = rows[1:]  # (the header, its first line after it)
    if not rows:
        return
    path, label, number = rows[0]
    swapped = [path.lower(), label.lower()] == ["label", "path"]
    # (a first path that names a file: the list is the right way round, nothing else read)
    first = 0 if swapped else None if os.path.isfile(folder / path) else _swapped(folder, rows)
    if first is not None:
        number = rows[first][2]
        raise ValueError(
            f"{list_file}:{number}: {text[number - 1].strip()!r} reads as "
            f"{_columns(delimiter, 'label', 'path')}: a list's lines are "
            f"{_columns(delimiter, 'path', 'label')}, the image first; swap the two columns."
        )


def _swapped(folder: Path, rows: list) -> int | None:
    """The first of ``rows`` that reads as 'label,path' (its path names no file, its label
    one) where more than half of them do; None otherwise. Read up to where the count
    decides it, each name looked up once, the label first: a list the right way round,
    its images missing, has its few classes looked up, not its paths (nor a swapped list
    its paths, which are its few classes)."""
    n, explained, first, found = len(rows), 0, None, {}

    def isfile(name: str) -> bool:
        if name not in found:  # (os.path's: a name too long for the file system is none)
            found[name] = os.path.isfile(folder / name)
        return found[name]

    for i, (path, label, _) in enumerate(rows):
        if isfile(label) and not isfile(path):
            explained += 1
            first = i if first is None else first
            if 2 * explained > n:
                return first
        elif 2 * (n - (i + 1 - explained)) <= n:  # the rest cannot make a majority
            return None
    return None


def _warn_of_windows_separators(
    list_file: Path, folder: Path, rows: list, sizes: np.ndarray
) -> None:
    """Say where a list's paths are written with Windows' '\\' between folders (a list
    made by os.path.join on Windows): here '\\' is a character of a file name, and each
    such image failed as a missing file, the cause unsaid. The first missing path with a
    '\\' is looked up with '/' instead."""
    missing = np.flatnonzero(sizes == NOT_A_FILE)
    i = next((i for i in missing.tolist() if "\\" in rows[i][0]), None)
    if i is None:
        return
    path, _, number = rows[i]
    if os.path.isfile(folder / path.replace("\\", "/")):
        logger.warning(
            "%s:%d: %r names no file, but %r does: the list's paths are written with "
            "Windows' '\\' between folders, which is a character of a file name here, and "
            "such images will be recorded as failed. Write the paths with '/' (e.g. `sed -i "
            "'s|\\\\|/|g' %s`).",
            list_file, number, path, path.replace("\\", "/"), shlex.quote(str(list_file)),
        )  # fmt: skip


def _warn_of_comment_lines(list_file: Path, rows: list, sizes: np.ndarray) -> None:
    """Say which lines look like comments ('#' first) and name no file: a list file has
    no comment syntax, and a line commented out is an image all the same, recorded as
    failed under its label (a class of its own where no other line has it)."""
    lines = [row[2] for row, size in zip(rows, sizes, strict=True) if row[0][:1] == "#"
             and size == NOT_A_FILE]  # fmt: skip
    if lines:
        shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
        logger.warning(
            "%s: %s %s (%r) %s with '#' and %s no file: each line is an image and its "
            "label, and a list file has no comment syntax, so %s recorded as failed. "
            "Remove such lines.",
            list_file,
            plural(len(lines), "line"),
            shown,
            next(path for path, _, number in rows if number == lines[0]),
            "starts" if len(lines) == 1 else "start",
            "names" if len(lines) == 1 else "name",
            "its image is" if len(lines) == 1 else "their images are",
        )


def working_folder_hint(folder: str, failed: list[str]) -> str:
    """Why every image of a list failed, its paths of ``failed``, where :func:`image_list`
    warned so (:func:`_working_folder_path`): what to do, or '' where it is not so."""
    first = _working_folder_path(folder, failed)
    if not first:
        return ""
    return (
        f"{first!r} is found in the working folder, not in the list's folder {folder}, "
        f"against which its relative paths are read: {_WORKING_FOLDER_ADVICE}"
    )


def _missing_without_digits(folder: Path, rows: list[list]) -> bool:
    """Whether every path of ``rows`` is named without a digit or an extension ('d', 'katze'),
    as a header's column is and images seldom are (a digit looked for in all at once), and
    names no file in ``folder``: a first line missing above images found is a header
    ('Datei Klasse' above 'katze tier' found). (A look-up a line, up to the first found, for
    such lists alone.)"""
    paths = [path for path, _, _ in rows]
    if re.search(r"\d", "\0".join(paths)) or any(os.path.splitext(p)[1] for p in paths):
        return False
    return not any(os.path.isfile(folder / path) for path in paths)


# Words of a list's column names ('filename', 'image_path', 'ClassName', 'label'), which
# no missing image and its class are named by both (a content-addressed 'scan0001' is).
_COLUMN_WORDS = frozenset(
    {"path", "file", "filename", "filepath", "fname", "name", "image", "img", "picture"}
    | {"photo", "url", "uri", "id", "key", "relpath", "label", "class", "category", "target"}
    | {"tag", "annotation", "y", "idx", "index", "sample", "item", "cls", "classname"}
)


def _column_name(field: str) -> bool:
    """Whether a field reads as a column's name: words of letters (``image_path``,
    ``ClassName``, ``file name``), one of them a column's word, singular or plural."""
    if not re.fullmatch(r"[A-Za-z]+(?:[ _.-][A-Za-z]+)*", field):
        return False
    words = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", field)
    return any(w.lower() in _COLUMN_WORDS or w.lower()[:-1] in _COLUMN_WORDS for w in words)


# The separator of a list's columns as its lines are split (:func:`_list_format`), in the
# header and the columns that errors name: in a list separated by semicolons, 'path,label'
# holds no semicolon, and its lines were read otherwise. (None, "shell": at a blank.)
_SEPARATORS = {",": ",", "csv-semicolon": ";", "\t": "<TAB>", "csv-tab": "<TAB>"}


def _columns(delimiter: str | None, *names: str) -> str:
    """Columns ``names`` as a list split at ``delimiter`` writes them: 'path;label'."""
    return repr(_SEPARATORS.get(delimiter, " ").join(names))


def _check_first_line(
    list_file: Path,
    folder: Path,
    line: str,
    path: str,
    label: str,
    number: int,
    delimiter: str | None,
    rest: list[list],
) -> None:
    """Refuse a list's first ``line`` that names no image (no such file, no extension) with
    a label of its own and reads as a header (column names, 'filename,class', a path without
    a digit above ``rest``, the rows after it, named otherwise, found in ``folder`` or in
    folders, 'sku,breed' or 'Datei,Klasse' above 'cat/000.png,cat', or above 'katze,tier'
    found or 'katzen/minka,katze', or a comment, '# my images'): it became an image of a
    class of its own. Said, and read as an image (recorded as failed as other missing
    images are), where it reads as none: a first image 'scan0001' of a class 'bird' was
    refused as a header. (Column names are words of any language; an image's name without
    an extension, a scan's number or a hash, holds a digit, but in a list whose every
    image is named without either and missing: 'c cat' above 'd dog' reads as its rows do,
    where it was refused as a header, quoted or not, and 'd dog' read as an image.) The
    header either names is written with the list's own separator (``delimiter``)."""
    header = _columns(delimiter, "path", "label")
    comment = path[:1] == "#"
    # (named unlike later images: in no folder where each is in one, 'Datei Klasse' above
    # 'katzen/minka katze', or they have a digit or an extension, or are found)
    digitless = not re.search(r"\d", path) and (
        not os.path.dirname(path)
        and all(os.path.dirname(p) for p, _, _ in rest)
        or not _missing_without_digits(folder, rest)
    )
    if comment or digitless or _column_name(path) or _column_name(label):
        raise ValueError(
            f"{list_file}:{number}: {line.strip()!r} looks like a header (no such image, and "
            f"no other line has its label); a header must be {header}."
            + (
                " A list file has no comment syntax: remove it."
                if comment
                else f" If it is an image, put the header {header} before it."
            )
        )
    logger.warning(
        "%s:%d: %r names no file and no other line has its label %r: it is read as an image "
        "of a class of its own (recorded as failed if it is still missing); if the line is a "
        "header, write it %s.",
        list_file, number, path, label, header,
    )  # fmt: skip


def image_list(list_file: str | os.PathLike) -> ImageSource:
    """Images listed as ``path,label`` lines (CSV, separated by commas or semicolons, or
    tab- or whitespace-separated text).

    Parameters
    ----------
    list_file : path-like
        One ``path,label`` per line. Fields of a blank-separated list may be quoted as a
        shell quotes them (``'my dir/1.jpg' 3``, a name with a comma ``"a,b.jpg" 3``).
        Relative paths are resolved against the list file's folder (a linked list's own
        folder, or its target's where the first relative path that names a file in one of
        the two alone names it there). Labels are class names (sorted into indices), or
        integers (then class ``k`` is named ``"k"``). A first line ``path,label`` (in any
        case) is a header.

    Raises
    ------
    ValueError
        For a line that is not ``path,label``, an empty path or label, an image listed
        twice, a header after the first line, or a first line that looks like another
        header (no such file, no file extension, a label that is not an index and that
        no other line has, and column names, ``filename,class``, a path without a digit
        where a later path has a digit or an extension or names a file, or where it lies
        in no folder and every later one in one, ``sku,breed``, or a ``#`` first): it
        would otherwise become an image of a class of its own. Such a line of no column
        names and a digit in its path (``scan0001,bird``), or above paths all without a
        digit or an extension and missing (``c cat`` above ``d dog``), is an image, said
        in a warning.

    Returns
    -------
    ImageSource
    """
    list_file = Path(expand_home(os.fspath(list_file)))
    # utf-8-sig: a byte-order mark, as spreadsheet programs write one, is not text; nor is
    # one that begins a later line (lists joined: cat a.csv b.csv).
    try:
        with open(list_file, newline="", encoding="utf-8-sig") as fh:
            text = [line.removeprefix("\ufeff") for line in fh.read().splitlines()]
    except UnicodeDecodeError as err:
        raise ValueError(
            f"The image source {os.fspath(list_file)!r} was read as a list file (path,label "
            f"lines) but is not UTF-8 text (byte {err.start}: {err.reason})."
            + (_source_hint(list_file) or " Save the list as UTF-8.")
        ) from None
    folder, rows, delimiter = _list_folder_and_rows(list_file, text)
    _check_path_first(list_file, folder, rows, text, delimiter)
    if rows and [f.lower() for f in rows[0][:2]] == ["path", "label"]:
        rows = rows[1:]
    elif len(rows) > 1 and rows[0][1] not in {label for _, label, _ in rows[1:]}:
        # A header names no file: no such image, no extension, a label that is no index
        # and that no other line has. (A folder is no image: "image,class" beside an
        # image/ folder was an image of a class "class".)
        path, label, number = rows[0]
        # (os.path's isfile: a name too long for the file system is no file, not an error)
        named = os.path.isfile(folder / path) or os.path.splitext(path)[1]
        if not named and not label.isdigit():
            line = text[number - 1]
            _check_first_line(list_file, folder, line, path, label, number, delimiter, rows[1:])
    first_line, resolved = {}, {}
    for path, label, number in rows:
        if [path.lower(), label.lower()] == ["path", "label"]:
            raise ValueError(
                f"{list_file}:{number}: a second header {text[number - 1].strip()!r} (lists "
                "joined with their headers?); a header is the first line only: remove it."
            )
        if not path:  # (it named the list's own folder: a failed image, recorded as '')
            raise ValueError(
                f"{list_file}:{number}: the image labelled {label!r} has an empty path."
            )
        if not label:
            raise ValueError(f"{list_file}:{number}: {path!r} has an empty label.")
        # The entry, however it is spelt (relative or absolute, through linked folders);
        # the file's own link is not followed: two entries that link to one cached object
        # (DVC, git-annex) are two images with the same bytes.
        full = os.path.join(folder, path)  # ".." after a link is the link's
        parent = os.path.dirname(full)  # (resolved once a folder: a look-up per component)
        if parent not in resolved:
            resolved[parent] = os.path.realpath(parent)
        entry = os.path.join(resolved[parent], os.path.basename(full))
        earlier = first_line.setdefault(entry, number)
        if earlier != number:
            raise ValueError(
                f"{list_file}:{number}: {path!r} is listed again (first on line {earlier}, "
                "perhaps spelt otherwise); list each image once (to weight it, use "
                "sample_weight when fitting)."
            )
    texts = [label for _, label, _ in rows]
    problem = label_kind_problem(texts)
    digits = set(filter(is_index, texts))
    # Read as names, as list files always have: said where that renumbers a class, one
    # whose place among the sorted names is not the number it spells.
    order = {text: k for k, text in enumerate(sorted(set(texts)))}
    renumbered = any(order[text] != int(text) for text in digits)
    # A -1 among class indices may mark unlabelled rows, except in a ±1 labelling.
    unlabelled = digits != {"1"} and any(map(_is_unlabelled, texts))
    if problem and (renumbered or unlabelled):
        i, why = problem
        logger.warning(
            "%s:%d: the label %r, %s: a list file then reads every label as a class name, "
            "the classes sorted as text ('10' before '2'), and %r is a class of its own.",
            list_file, rows[i][2], texts[i], why, texts[i],
        )  # fmt: skip
    elif (moved := renumbered_decimal(texts)) is not None:
        logger.warning(
            "%s:%d: the label %r %s: a list file then reads every label as a class name, %s",
            list_file, rows[moved[0]][2], texts[moved[0]], _DECIMAL, _AS_TEXT % moved[1:],
        )  # fmt: skip
    labels, class_names = encode_labels(texts)
    ids = [path for path, _, _ in rows]
    sizes, mtimes = stat_files(str(folder), ids)
    _warn_of_working_folder_paths(list_file, folder, ids, sizes)
    _warn_of_windows_separators(list_file, folder, rows, sizes)
    _warn_of_comment_lines(list_file, rows, sizes)
    _warn_of_commas_read_as_csv(list_file, text, sizes, delimiter)
    return ImageSource(
        ids=ids,
        labels=labels,
        class_names=class_names,
        root=str(folder),
        description=f"list:{list_file.resolve()}",
        source_index=np.arange(len(rows), dtype=np.int64),
        file_size=sizes,
        file_mtime_ns=mtimes,
    )
