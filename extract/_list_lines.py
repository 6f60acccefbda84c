"""How a list file's lines are read: the format that splits them into fields (CSV separated
by commas or semicolons, tab-separated, quoted as the csv module or a shell quotes, or at the
last blank), told apart, where two readings differ, by the one that names files; and what is
said of commas in its names."""

from __future__ import annotations

import collections
import csv
import logging
import os
import re
import shlex
import unicodedata
from collections.abc import Callable
from operator import methodcaller
from pathlib import Path

import numpy as np
from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension

from ._decoding import NOT_A_FILE

logger = logging.getLogger(__name__)


def _tabs_in_its_paths(folder: Path, text: list[str]) -> bool:
    """Whether a list whose every line holds a tab is ``path label`` lines with the tabs in
    their paths: split at its tabs a line names no file, at its last blank one that exists
    (a blank-separated list of files whose names hold tabs, read as the file 'a' of a class
    'b/1.png cat'; two tabs in a name split it into three fields). The first line whose
    splits differ and that names a file one way alone decides: one list, one format, and a
    look-up or two, not two for each line of a tab-separated list of labels with blanks."""

    def readings(line: str):
        at_tab = re.split(r"\t+", line.strip())
        at_blank = line.rsplit(None, 1)
        if len(at_blank) != 2 or len(at_tab) == 2 and at_tab[0].strip() == at_blank[0].strip():
            return None
        return at_tab, at_blank

    return _first_deciding_line(folder, text, readings)


def _quoted_as_csv_quotes(folder: Path, text: list[str]) -> bool:
    """Whether a tab-separated list quotes its fields as the csv module does
    (``csv.writer(f, delimiter="\\t", quoting=csv.QUOTE_ALL)``: ``"cat/000.png"<TAB>"cat"``):
    split at its tabs, such a line named the file ``"cat/000.png"``, quotes included, of a
    class ``"cat"``. The first line whose two readings differ and that names a file one way
    alone decides (a name that holds a quote character is read as it stands where it
    exists)."""

    def readings(line: str):
        if '"' not in line:
            return None
        try:
            quoted = next(csv.reader([line.strip()], delimiter="\t"))
        except csv.Error:
            return None
        plain = re.split(r"\t+", line.strip())
        if len(quoted) != 2 or len(plain) == 2 and plain[0].strip() == quoted[0].strip():
            return None
        return plain, quoted

    return _first_deciding_line(folder, text, readings, _quoted_whole(_CSV_QUOTED))


# A field quoted whole as the csv module quotes it (a quote in it doubled: '"a""b"'), and as
# a shell quotes it (shlex.quote: "'a b'", or in double quotes).
_CSV_QUOTED = r'"(?:[^"]|"")+"'
_SHELL_QUOTED = r"'[^']+'|\"[^\"]+\""


def _quoted_whole(quoted: str) -> Callable[[str], bool | None]:
    """An ``undecided`` of :func:`_first_deciding_line` that gives True where the first line
    of a list whose two readings differ begins with a path quoted whole
    (``"c/img9"<TAB>"cat"``, ``'c/img9' cat``, as the csv module and ``shlex.quote`` write them,
    matched by the pattern ``quoted``): where no file tells the readings apart, its images
    missing, that is quoting, not a name (no extension told, and ``'c/img9'`` was recorded with
    its quotes, where the image found was 'c/img9'; '"a""b"' with them, where found it was
    'a"b'). None: as :func:`_first_deciding_line` decides."""
    whole = re.compile(rf"\s*(?:{quoted})\s")
    return lambda first: True if whole.match(first) else None


def _unquoted_label(label: str, shell: bool) -> str:
    """A label of a tab- or blank-separated list read as its format reads a quoted field
    (``a/1.png<TAB>"cat"``, ``a/1.png 'cat'``, as csv.writer and ``shlex.quote`` quote labels:
    its quotes were kept, a class '"cat"'): a label that starts with a quote is read as the
    csv module reads a field (tab-separated) or as a shell reads a word (blank-separated),
    where that reads it as one field; else, and for a quote within it (``it's``), as written."""
    if label[:1] not in ("'\"" if shell else '"'):
        return label
    try:
        if shell:
            fields = _shell_split(label)
        else:
            fields = next(csv.reader([label], delimiter="\t", strict=True))
    except (ValueError, csv.Error):  # (a quote left open, or text after the closing one)
        return label
    return fields[0] if len(fields) == 1 else label


def _csv_quoting(text: str) -> bool:
    """Whether csv may split ``text`` otherwise than at its delimiters: it holds a quote, a
    line break or a NUL (lines joined, whether any of them does)."""
    return '"' in text or "\r" in text or "\n" in text or "\0" in text


def _csv_fields(line: str, delimiter: str = ",") -> list[str]:
    """``next(csv.reader([line], delimiter=delimiter))``; a line without a quote, a line
    break or a NUL, shorter than csv's field limit, is split at its delimiters without it,
    as csv splits it (a reader a line took about 5 µs: 2.7 s of CPU to tell how to read a
    list of 200,000 lines separated by semicolons). (An empty line is no field: [].)"""
    if _csv_quoting(line) or not line or len(line) >= csv.field_size_limit():
        return next(csv.reader([line], delimiter=delimiter))
    return line.split(delimiter)


# An image's extension, in any case, before a separator (a blank, a comma or a semicolon): a
# list without a quote and without one has no line whose path, split at that separator, is
# an image's (:func:`_an_image_read_otherwise_alone`). (It matches more: a prefilter.)
_EXTENSIONS = "|".join(map(re.escape, IMG_EXTENSIONS))
_AN_IMAGE_BEFORE_A_COMMA = re.compile(rf"(?:{_EXTENSIONS})[\s,]", re.IGNORECASE)
_AN_IMAGE_BEFORE_A_SEMICOLON = re.compile(rf"(?:{_EXTENSIONS})[\s;]", re.IGNORECASE)
_AN_IMAGE_BEFORE_A_SEPARATOR = (_AN_IMAGE_BEFORE_A_SEMICOLON, _AN_IMAGE_BEFORE_A_COMMA)


def _separated_by_semicolons(folder: Path, text: list[str], commas: bool) -> bool:
    """Whether a list is CSV separated by semicolons (``cat/000.png;cat``, as spreadsheet
    programs write CSV where a comma is the decimal separator): every line splits into two
    fields at a semicolon (quoted as the csv module quotes), and the first line whose two
    readings differ names a file that way alone (a file name with a semicolon, in a list
    separated otherwise, is read as it stands), or, where it names none (its images not
    found, or not yet there), a line read otherwise is no ``path label`` line and none
    names an image read otherwise alone, unless its first line is a ``path;label`` header
    or a line names an image read at its semicolons alone, or, where every line reads
    otherwise too, a line names an image read at its semicolons alone and none otherwise.
    ``commas``: the list is read as comma CSV (a comma in it), else at its last blank or
    its tab."""
    lines = [line for line in text if line.strip()]
    if not lines or not all(";" in line for line in lines):
        return False
    # (Split as csv splits them, a line without a quote, a line break or a NUL at each
    # semicolon, shorter than csv's field limit: where every line is one, one semicolon a
    # line is two fields a line.)
    flat = "".join(lines)
    plain = not _csv_quoting(flat)
    if plain and max(map(len, lines)) < csv.field_size_limit():
        if flat.count(";") != len(lines):
            return False
    else:
        try:
            if any(len(_csv_fields(line, ";")) != 2 for line in lines):
                return False
        except csv.Error:
            return False

    def readings(line: str):
        if commas:
            try:
                usual = _csv_fields(line)
            except csv.Error:
                usual = []
        elif "\t" in line.strip():
            usual = re.split(r"\t+", line.strip())
        else:
            usual = line.rsplit(None, 1)
        return usual, _csv_fields(line, ";")

    def refused(line: str) -> bool:  # read otherwise: no comma field, or blank, splits it
        if not commas:
            return len(line.rsplit(None, 1)) != 2  # (a tab in it: at a tab, or in its path)
        try:
            return len(_csv_fields(line)) != 2
        except csv.Error:
            return True

    # (read otherwise, a list of missing images was refused: "expected 'path,label', got
    # 'cat/000.png;cat'", where a comma-separated one records them as failed; a line that
    # names a file whole, 'a;b.png', is a file without a label, refused still)
    # Nor where a line's path read otherwise is an image's and read at its semicolons is
    # none ('x;1.png 3' read as 'x' of a class '1.png 3'): its lines are read otherwise, and
    # the line refused is named ("x;1.png 3\ny;2.png" was refused at line 1 as a header).
    # (Unless its first line is a 'path;label' header, or a line's path read at its
    # semicolons is an image's alone: 'path;label\nx;1.png 3' was refused at its header.)
    # (And where every line reads otherwise too, its labels with blanks, its images are
    # read at its semicolons where a line names an image so alone and none otherwise alone:
    # 'a/1.png;golden retriever' was the image 'a/1.png;golden' of a class 'retriever'.)
    # (Worked out where no file decides alone, both ways in one scan of the lines, each
    # line's two readings worked out once, up to the line that decides (``stop``: the way
    # whose image alone decides; the other way's is the one needed), where each way read
    # every line's readings again; not kept, a list of 200,000 lines' readings. Where no
    # line has an image's extension before a separator, as 'a.png;b c' has none before a
    # blank, no line names an image so, and that way needs no line read.)
    def alone(stop: int) -> list[bool]:  # lines name images read alone: at ';', otherwise
        joined = "\0".join(lines) if plain else ""
        maybe = [not plain or bool(b.search(joined)) for b in _AN_IMAGE_BEFORE_A_SEPARATOR]
        found = [False, False]
        for usual, other in map(readings, lines) if maybe[1 - stop] else ():
            found[0] = found[0] or maybe[0] and _an_image_read_otherwise_alone(other, usual)
            found[1] = found[1] or maybe[1] and _an_image_read_otherwise_alone(usual, other)
            if found[stop] or found[1 - stop] and not maybe[stop]:
                break
        return found

    def undecided(_: str) -> bool:
        first = next(filter(refused, lines), None)
        if first is None:
            semicolons, otherwise = alone(stop=1)
            return semicolons and not otherwise
        if os.path.lexists(folder / first.strip()):
            return False
        if [f.strip().lower() for f in readings(lines[0])[1]] == ["path", "label"]:
            return True
        semicolons, otherwise = alone(stop=0)
        return not otherwise or semicolons

    return _first_deciding_line(folder, lines, readings, undecided=undecided)


def _an_image_read_otherwise_alone(usual: list[str], other: list[str]) -> bool:
    """Whether a line's path names an image (by its extension) read the usual way alone,
    not read the other way (``readings`` of :func:`_first_deciding_line`)."""
    return (
        len(usual) == 2
        and has_file_allowed_extension(usual[0].strip(), IMG_EXTENSIONS)
        and not (other and has_file_allowed_extension(other[0].strip(), IMG_EXTENSIONS))
    )


_BLOCK = 64  # lines of a list read at once by :func:`_first_deciding_line`


def _first_deciding_line(
    folder: Path,
    text: list[str],
    readings,
    undecided: Callable[[str], bool | None] | None = None,
) -> bool:
    """Whether a list's lines are read the other way: ``readings(line)`` gives a line's two
    readings as ``path label`` fields, the usual one and the other (None where they do not
    differ), and the first line whose readings differ decides: the reading that alone
    names a file in ``folder`` (the other: True); where neither does (its images missing)
    and one reading's path alone is an image's by its extension, ``undecided(first)``, given
    the first line whose readings differ (worked out there alone), or where that is None,
    that reading (neither: the next such line, as for a header, '"path"<TAB>"label"', or a
    first image missing of a list whose later ones are there, 'img1;golden retriever'
    before 'img2;dog x'); a list without such a line is read as usual (``undecided(first)``:
    True, the other way). Two look-ups a list, not two a line (every line of a tab- or
    semicolon-separated list of labels with blanks differs: its images missing, 200,000
    lines took 400,000), and for lines that no extension tells apart, a listing of each of
    their folders (:class:`_Lexists`). ``readings`` is asked of a block of lines at a time,
    lines after the one that decides too: it raises nothing."""
    lexists, first = _Lexists(folder), None
    # (Read a block of lines at a time, a block that no line of can decide passed over at
    # once (:func:`_may_decide`). A block of 64: a block's readings alive when the garbage
    # collector runs are moved to its older generations, which it then scans whole; blocks
    # of 4,096 lines made a list of 200,000 slower than one read line by line.)
    for start in range(0, len(text), _BLOCK):
        block = text[start : start + _BLOCK]
        pairs = list(map(readings, block))
        if first is None:
            read = zip(block, pairs, strict=True)
            first = next((line for line, pair in read if pair is not None), None)
        if not _may_decide(pairs, lexists):
            continue
        for pair in pairs:
            if pair is None:
                continue
            named = [len(f) == 2 and lexists(f[0].strip()) for f in pair]
            if named[0] != named[1]:
                return named[1]
            # (where no extension tells them apart, a later line's file does: 'img1;golden
            # retriever' missing, 'img2;dog x' present, read at its blanks at the first line)
            other_alone = _an_image_read_otherwise_alone(*pair[::-1])
            if other_alone or _an_image_read_otherwise_alone(*pair):
                decided = None if undecided is None else undecided(first)
                return other_alone if decided is None else decided
    return first is not None and undecided is not None and bool(undecided(first))


# An image's extension ending a name of names joined by NULs (:func:`_may_decide`).
_AN_IMAGES_NAME = re.compile(rf"(?:{_EXTENSIONS})(?:\0|\Z)", re.IGNORECASE)


def _may_decide(pairs: list, lexists: _Lexists) -> bool:
    """Whether a line of ``readings`` ``pairs`` (:func:`_first_deciding_line`) may decide: a
    reading's path is an image's by its extension, or it may name a file (:meth:`_Lexists.
    none_of`). Asked of a block of lines at once: a list of 200,000 lines of missing images
    without extensions, every line's two readings differing, had each line's paths looked
    up and asked for an extension one by one (1 s of CPU)."""
    paths = [f[0].strip() for pair in pairs if pair is not None for f in pair if len(f) == 2]
    if not paths:
        return False
    return bool(_AN_IMAGES_NAME.search("\0".join(paths))) or not lexists.none_of(paths)


class _Lexists:
    """``os.path.lexists(os.path.join(folder, name))``, the first 64 names of a folder looked
    up one by one (a short list in a folder of a million files lists none, nor a list of one
    image a folder any), later ones in a listing of their folder, one listing a folder (a
    name found there, in any case or Unicode form, as a file system may match it, looked up
    still): a list of 200,000 lines whose images were missing, no extension telling their
    two readings apart ('scans/0001;golden retriever'), took 400,000 look-ups to tell how to
    read it."""

    def __init__(self, folder: str | os.PathLike, one_by_one: int = 64) -> None:
        self.folder, self.one_by_one = os.fspath(folder), one_by_one
        self.listed: dict[str, tuple[set[str], set[str]] | None] = {}
        self.asked: collections.Counter[str] = collections.Counter()

    def none_of(self, names: list[str]) -> bool:
        """Whether no name of ``names`` exists, told without a look-up: each one's folder
        listed (as a call would list it: a folder asked about 64 times), none of them found
        there, in any spelling. False where that cannot be told so (a name looked up one by
        one, or found in its folder's listing)."""
        if os.name == "nt" and ":" in "".join(names):  # (looked up one by one, as below)
            return False
        if os.altsep is not None:
            names = [name.replace(os.sep, os.altsep) for name in names]
        bases_in = collections.defaultdict(list)
        for where, slash, base in map(methodcaller("rpartition", "/"), names):
            bases_in[where + slash].append(base)
        for where, bases in bases_in.items():
            if self.asked[where] < self.one_by_one or {"", ".", ".."}.intersection(bases):
                return False
            listed = self._listing(where)
            if listed is None:
                return False
            if not listed[0]:
                continue
            spelt = _spellings_of(bases)
            if not (spelt[0].isdisjoint(listed[0]) and spelt[1].isdisjoint(listed[1])):
                return False
        return True

    def __call__(self, name: str) -> bool:
        spelt = name if os.altsep is None else name.replace(os.sep, os.altsep)
        where, slash, base = spelt.rpartition("/")  # (its folder as it spells it: 'a/')
        where += slash
        self.asked[where] += 1
        # (one by one too: '.', '..', a folder, or on Windows a name that a drive's working
        # folder may hold, 'C:a.png')
        one_by_one = self.asked[where] <= self.one_by_one
        if one_by_one or base in ("", ".", "..") or os.name == "nt" and ":" in name:
            return os.path.lexists(os.path.join(self.folder, name))
        listed = self._listing(where)
        if listed is not None and not (
            listed[0] and any(map(set.__contains__, listed, _spellings(base)))
        ):
            return False
        return os.path.lexists(os.path.join(self.folder, name))

    def _listing(self, where: str) -> tuple[set[str], set[str]] | None:
        """:func:`_spellings_listed` of the folder ``where`` (as a list spells it: 'a/'),
        listed once."""
        if where not in self.listed:
            self.listed[where] = _spellings_listed(os.path.join(self.folder, where))
        return self.listed[where]


def _spellings(name: str) -> tuple[str, str]:
    """Two spellings alike for names that a file system which ignores case or Unicode forms
    takes for one: case folded, and in capitals (as NTFS compares them: 'ı' is 'I'), each
    decomposed (NFD)."""
    if name.isascii():
        return name.lower(), name.upper()
    name = unicodedata.normalize("NFD", name)
    return tuple(unicodedata.normalize("NFD", f(name)) for f in (str.casefold, str.upper))


def _spellings_listed(folder: str) -> tuple[set[str], set[str]] | None:
    """The :func:`_spellings` of the names in a folder (none where there is no such folder);
    None where it cannot be listed (its names looked up one by one)."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return set(), set()
    except (OSError, ValueError):
        return None
    return _spellings_of(names)


def _spellings_of(names: list[str]) -> tuple[set[str], set[str]]:
    """The :func:`_spellings` of ``names``, as two sets: the case-folded and the capitals."""
    if all(map(str.isascii, names)):
        return set(map(str.lower, names)), set(map(str.upper, names))
    spellings = list(map(_spellings, names))
    return {folded for folded, _ in spellings}, {capitals for _, capitals in spellings}


def _quoted_as_a_shell_does(folder: Path, text: list[str]) -> bool:
    """Whether a blank-separated list quotes its fields as a shell does (``'my dir/1.jpg' 3``,
    ``"a.jpg" "golden retriever"``, as ``shlex.quote`` writes them, or ``my\\ dir/1.jpg 3``,
    as ``printf %q`` and a shell's completion write them): read at the last blank, such a
    line named the file ``'my dir/1.jpg'``, quotes included, recorded as failed. The first
    line whose two readings differ and that names a file one way alone decides (a name
    that holds a quote character, ``"it's".jpg``, is read as it stands where it exists)."""

    def readings(line: str):
        if "'" not in line and '"' not in line and "\\" not in line:
            return None
        try:
            quoted = _shell_split(line)
        except ValueError:  # (no closing quotation: an apostrophe in a name)
            return None
        plain = line.rsplit(None, 1)
        if len(quoted) != 2 or len(plain) == 2 and plain[0].strip() == quoted[0]:
            return None
        return plain, quoted

    return _first_deciding_line(folder, text, readings, _quoted_whole(_SHELL_QUOTED))


def _shell_split(line: str) -> list[str]:
    """``shlex.split(line)``; a line without a quote or a backslash is split at its blanks
    without it (shlex took about 10 µs a line, most of the time a list of 100,000 lines
    took to read where only some of its lines are quoted)."""
    if "'" not in line and '"' not in line and "\\" not in line:
        return re.findall(r"[^ \t\r\n]+", line)  # (shlex's blanks, not str.split's)
    return shlex.split(line)


def _shell_fields(folder: Path, line: str) -> list[str]:
    """The fields of a line of a list quoted as a shell quotes them (``shlex.split``); its
    fields split at its last blank where that names a file and the shell's name differs,
    as for a name written as it stands in such a list, with an apostrophe, a backslash or
    blanks (``it's.png 1``, ``Tom's and Ann's.png``: unquoted, that one named the file
    ``Toms and Anns.png``, recorded as failed). A look-up for a line whose two names differ
    alone.

    Raises
    ------
    ValueError
        From ``shlex.split`` (a quote left open), where the line names no file as it stands.
    """
    plain = line.rsplit(None, 1)
    try:
        quoted, error = _shell_split(line), None
    except ValueError as err:
        quoted, error = None, err
    # (Its name alone: a line whose readings differ in its label alone, 'a.jpg "cat"',
    # is read as a shell reads it, its label unquoted.)
    if len(plain) == 2 and (quoted is None or quoted[:1] != [plain[0].strip()]):
        if os.path.lexists(os.path.join(folder, plain[0].strip())):
            # its label as a shell reads it ("it's.png 'cat'" made a class "'cat'")
            try:
                label = _shell_split(plain[1])
            except ValueError:  # (an apostrophe in a label: read as it stands)
                label = None
            return [plain[0], label[0]] if label and len(label) == 1 else plain
    if error is not None:
        raise error
    return quoted


# A line of a blank-separated list whose path or label, quoted as a shell quotes it, holds
# a comma ('"a,b.png" cat', "\"it's,a.png\" cat", 'a.png "x, y"'): no CSV line ('"a,b.png",cat'
# has its comma after the quote, 'a.png,"x, y"' before it).
_QUOTED_COMMA = re.compile(
    r"""\s*("[^"]*,[^"]*"|'[^']*,[^']*')\s+[^\s,]|.*[^\s,]\s+("[^"]*,[^"]*"|'[^']*,[^']*')\s*$"""
)


def _commas_in_its_names(folder: Path, text: list[str]) -> str | None:
    """Whether a list with a comma is ``path label`` lines separated by blanks, the commas
    in their file names (read as CSV, 'a,b.png cat' was the image 'a' of a class 'b.png
    cat', and a line without a comma refused): every line splits in two at its blanks, and
    the first line with a comma whose two readings differ decides, where its path or its
    label is quoted as a shell quotes it ('"a,b.png" cat', 'a.png "x, y"': "shell", where
    read as CSV the image 'a.png "x' of a class 'y"' failed) or where read at its blanks
    alone it names a file, or, named neither way (its images missing), its path read so
    alone is an image's by its extension ("blank"); None: the list is CSV (where no
    extension tells either, said by :func:`_warn_of_commas_read_as_csv`)."""
    lines = [line for line in text if line.strip()]
    if not all(len(line.split(None, 1)) == 2 for line in lines):
        return None
    for line in lines:
        if "," not in line:
            continue
        if _QUOTED_COMMA.match(line):
            return "shell"
        try:
            usual = next(csv.reader([line]))
        except csv.Error:
            usual = []
        path = line.rsplit(None, 1)[0].strip()
        if len(usual) == 2 and usual[0].strip() == path:
            continue
        # (os.path's isfile: a name too long for the file system is no file, not an error;
        # named neither way, it decides all the same: a CSV list of labels with blanks, its
        # images missing, was looked up twice a line)
        if len(usual) == 2 and os.path.isfile(folder / usual[0].strip()):
            return None
        if os.path.isfile(folder / path):
            return "blank"
        # (its images missing, 'a,b.png cat' was read as CSV, the image 'a' of a class
        # 'b.png cat', where found it was read at its blanks)
        return "blank" if _an_image_read_otherwise_alone(line.rsplit(None, 1), usual) else None
    return None


def _warn_of_commas_read_as_csv(
    list_file: Path, text: list[str], sizes: np.ndarray, delimiter: str | None
) -> None:
    """Say where a list read as CSV may be 'path label' lines with commas in their file
    names (:func:`_commas_in_its_names`): every line splits in two at its blanks, no image
    is found, and at its first line with a comma whose two readings differ no image's
    extension tells them apart ('scan1,x golden' was the image 'scan1' of a class 'x
    golden', unsaid, where 'scan1,x' of a class 'golden' was meant). Not where the path
    read at its blanks holds no comma ('my scans/0001,cat' is no 'my' of a class
    'scans/0001,cat'), or one only at its end ('img1, cat'), or the line quotes its path as
    CSV does ('"my scans/0001",cat'), or a blank follows its comma, as CSV is written by
    hand ('n01, golden retriever': a file 'n01, golden' would have been found, and the list
    read at its blanks; a folder so named is no image)."""
    if delimiter != "," or (sizes != NOT_A_FILE).any():
        return
    if not all(len(line.split(None, 1)) == 2 for line in text if line.strip()):
        return
    for number, line in enumerate(text, 1):
        if "," not in line:
            continue
        usual, blank = next(csv.reader([line])), line.rsplit(None, 1)
        if len(usual) == 2 and usual[0].strip() == blank[0].strip():
            continue
        header = [f.strip().lower() for f in usual] == ["path", "label"]  # ('path, label')
        # (or CSV by its extension or its quotes, or no comma in the name read otherwise but
        # the one that ends it: 'img1, cat', as CSV is written with a blank after its commas)
        csv_alone = _an_image_read_otherwise_alone(usual, blank) or line[:1] == '"'
        if header or csv_alone or "," not in blank[0].strip().rstrip(","):
            return
        # ('n01, golden retriever': every CSV list so written of labels with a blank was said
        # to be the file 'n01, golden' of a class 'retriever')
        if len(usual) > 1 and usual[1][:1].isspace():
            return
        logger.warning(
            "%s:%d: %r is read as CSV, the image %r of a class %r, where at its last blank it "
            "reads as %r of a class %r: no image of the list is found, and no extension tells "
            "the two apart. If its lines are 'path label' lines with a comma in a file name, "
            "quote that name as a shell quotes it (%s); if the list is CSV, put the header "
            "'path,label' before its first line.",
            list_file, number, line.strip(), usual[0].strip(), usual[1].strip(),
            blank[0].strip(), blank[1].strip(), _its_name_quoted(line),
        )  # fmt: skip
        return


def _its_name_quoted(line: str) -> str:
    """A 'path label' line with its path quoted as a shell quotes it, in the quote that its
    path holds none of, and its label as written, quoted where it holds a blank
    ('"x,y.png" "golden retriever"'; '"a,b.jpg" cat' where the line splits no such way)."""
    fields = re.fullmatch(r"""(.+?)\s+("[^"]*"|'[^']*'|\S+)""", line.strip())
    path, label = fields.groups() if fields else ("a,b.jpg", "cat")
    quote = "'" if '"' in path else '"'
    return f"{quote}{path}{quote} {label}"


def _commas_advice(text: list[str]) -> str:
    """What to do where a line of a list read as CSV (a comma in it) is no 'path,label'
    line but a 'path label' one: write it as CSV; or, for 'path label' lines with a comma
    in a file name (the first line with a comma named), quote that name as a shell quotes
    it, which reads the list as blank-separated (:func:`_commas_in_its_names`). The first
    cure alone where another line is a CSV line and no 'path label' one (no blank splits
    it, 'a.png,cat', or its path read as CSV alone is an image's, 'a.png,golden
    retriever'): that cure, quoting 'a.png,golden' as a name, applied to no line of it."""
    csv_line = next(((n, line) for n, line in enumerate(text, 1) if _a_csv_line_alone(line)), None)
    if csv_line is not None:
        number, line = csv_line
        return (
            f"(the list is read as CSV, as line {number}, {line.strip()!r}, is: write each "
            "line 'path,label', a file name with a comma quoted, \"a,b.jpg\",cat)."
        )
    number, line = next((n, line) for n, line in enumerate(text, 1) if "," in line)
    return (
        f"(the list is read as CSV, as line {number}, {line.strip()!r}, holds a comma: write "
        "each line 'path,label', a file name with a comma quoted, \"a,b.jpg\",cat; or, for "
        "'path label' lines with a comma in a file name, quote that name as a shell quotes "
        f"it, {_its_name_quoted(line)})."
    )


def _a_csv_line_alone(line: str) -> bool:
    """Whether a line is a 'path,label' line of CSV and no 'path label' one with a comma in
    its path: no blank splits it in two, or its path read as CSV alone is an image's (by its
    extension: 'a.png,golden retriever', not 'a,b.png cat')."""
    if "," not in line:
        return False
    try:
        fields = next(csv.reader([line]))
    except csv.Error:
        return False
    if len(fields) != 2:
        return False
    return len(line.split(None, 1)) != 2 or _an_image_read_otherwise_alone(
        fields, line.rsplit(None, 1)
    )


def _list_format(folder: Path, text: list[str]) -> str | None:
    """How the lines of a list file's ``text`` split into fields, its paths relative to
    ``folder`` where a file's existence tells two readings apart: ",", "csv-semicolon",
    "\t", "csv-tab", "shell" or None (at the last blank)."""
    # A comma anywhere makes the list CSV (a file name with a comma is then quoted), but in
    # the file names of 'path label' lines (:func:`_commas_in_its_names`); a tab on every
    # line, a list of tab-separated fields, whose labels may hold blanks ("golden
    # retriever" was split at its blank, its path taking "golden" after the tab). A tab
    # that begins or ends a line (an indented list, a trailing tab) separates no fields,
    # nor one in a file name of a blank-separated list (:func:`_tabs_in_its_paths`). A
    # semicolon on every line may separate its fields, as spreadsheet programs write CSV
    # where a comma is the decimal separator (:func:`_separated_by_semicolons`).
    commas = any("," in line for line in text)
    if _separated_by_semicolons(folder, text, commas):
        return "csv-semicolon"
    if commas:
        blank = _commas_in_its_names(folder, text)
        if blank is None:
            return ","
        if blank == "shell":
            return "shell"
    if all("\t" in line.strip() for line in text if line.strip()) and not _tabs_in_its_paths(
        folder, text
    ):
        return "csv-tab" if _quoted_as_csv_quotes(folder, text) else "\t"
    return "shell" if _quoted_as_a_shell_does(folder, text) else None
