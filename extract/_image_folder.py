"""The image folder source (``root/<class name>/...``, the ImageFolder convention) and its
checks: symbolic links, hidden and system folders, class names in two Unicode forms or not
UTF-8, files left out."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import numpy as np
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, has_file_allowed_extension

from mr2_probe._h5 import why_missing

from ._images import ImageSource, stat_files
from ._labels import _two_forms, is_index, nfc_twins, numbers_sorted_as_text
from ._paths import expand_home, plural

logger = logging.getLogger(__name__)


def image_folder(root: str | os.PathLike) -> ImageSource:
    """Images in ``root/<class name>/...`` (the ImageFolder convention), in sorted order.

    Parameters
    ----------
    root : path-like
        Folder with one sub-folder per class.

    Returns
    -------
    ImageSource
        Ids are paths relative to ``root``; classes are the sorted sub-folder names. Hidden
        folders and files (``.ipynb_checkpoints``, macOS's ``._x.jpg``), the
        ``__MACOSX`` folders of an unzipped Finder archive, a file system's own folders
        (``lost+found``, ``System Volume Information``, ``$RECYCLE.BIN``,
        ``$Recycle.Bin``), a Synology NAS's ``@eaDir`` thumbnails and a NAS share's
        recycle bin (``#recycle``, ``@Recycle``) are left out, at every level.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from PIL import Image
    >>> from extract import image_folder
    >>> root = Path(tempfile.mkdtemp())
    >>> for name in ("cat/1.png", "cat/2.png", "dog/1.png"):
    ...     (root / name).parent.mkdir(exist_ok=True)
    ...     Image.new("RGB", (8, 8)).save(root / name)
    >>> source = image_folder(root)
    >>> source.ids, source.labels.tolist(), source.class_names
    (['cat/1.png', 'cat/2.png', 'dog/1.png'], [0, 0, 1], ['cat', 'dog'])
    """
    root = expand_home(os.fspath(root))
    _check_dangling_links(root)
    # A hidden folder (.ipynb_checkpoints, a file manager's .thumbs, .git, an unzipped
    # __MACOSX) is no class: taken as one, it shifted every class index after it.
    try:
        classes = [name for name in find_classes(root)[0] if not _hidden(name)]
    except FileNotFoundError:  # no folder in root at all: said below, as hidden ones alone
        classes = []
    _check_one_form(classes, root)
    if not classes:
        images = [
            entry.name
            for entry in os.scandir(root)
            if entry.is_file() and not _hidden(entry.name)
            and has_file_allowed_extension(entry.name, IMG_EXTENSIONS)
        ]  # fmt: skip
        # (A class's own folder given as the source, most likely.)
        held = (
            f"; it holds {len(images)} {plural(len(images), 'image')} itself "
            f"(such as {min(images)!r}), but images are read from its class sub-folders only "
            f"({os.path.join(root, 'CLASS', min(images))}): give the folder that holds the "
            "class folders, or a 'path,label' list file"
            if images
            else ""
        )
        raise FileNotFoundError(f"Couldn't find any class folder in {root}{held}.")
    # Listed by extension only: a corrupt file is kept so that it is recorded as a failure.
    items = _folder_items(root, classes)
    ids = [os.path.relpath(p, root) for p, _ in items]
    if all(name.lower() in _SPLIT_NAMES for name in classes):
        # (A dataset's folder given instead of a split's: the classes were the splits.)
        logger.warning(
            "The class folders of %r are %s, names of splits: each is read as one class of "
            "every image under it. To extract a split, give its folder (e.g. %r).",
            root,
            ", ".join(map(repr, classes)),
            os.path.join(root, classes[0]),
        )
    elif len(classes) == 1 and _in_sub_folders_alone(ids):
        # (A folder given one level above the class folders, as an archive unpacked into a
        # folder of its own name leaves them: one class of every image, without a word.)
        inner = sorted({i.split(os.sep)[1] for i in ids})
        logger.warning(
            "%r holds one class folder, %r, and it holds no image itself but sub-folders "
            "(%s): every image is read as of one class. To read them as the classes, give "
            "its folder, %r.",
            root,
            classes[0],
            ", ".join(map(repr, inner[:3])) + (", ..." if len(inner) > 3 else ""),
            os.path.join(root, classes[0]),
        )
    _warn_of_numbers_sorted_as_text(classes, root)
    _check_utf8([*classes, *ids], root)
    labels = np.array([y for _, y in items], dtype=np.int64)
    inodes = np.full((len(ids), 2), -1, np.int64)
    sizes, mtimes = stat_files(root, ids, inodes)
    _refuse_links_across_classes(root, ids, labels, classes, inodes)
    return ImageSource(
        ids=ids,
        labels=labels,
        class_names=list(classes),
        root=root,
        description=f"folder:{os.path.abspath(root)}",
        source_index=np.arange(len(items), dtype=np.int64),
        file_size=sizes,
        file_mtime_ns=mtimes,
    )


def _warn_of_numbers_sorted_as_text(classes: list[str], root: str) -> None:
    """Say where class folders named by numbers ('0' ... '11') are, sorted as text as
    torchvision sorts them, out of their numbers' order: '10' is class 2, which a list
    file or a model's own labels number 10. ('1' ... '9', classes 0 ... 8, keep it.) The
    advice names the width that sorts them (3 digits for '1' ... '100', which '02' padded
    to 2), and where the numbers do not start at 0, that class 0 is the first: '01' ...
    '10' sort in their numbers' order, but are classes 0 ... 9, not their numbers, as the
    advice said. Folders that spell one number ('1' and '01') are named, two classes of
    one number, which leading zeros made one name (two folders of one name, where the
    advice was followed): the images of one are to move into the other, or one to be
    renamed, first; every such number is named, as padding renamed one left onto its
    twin."""
    moved = numbers_sorted_as_text(classes)
    spelt_twice = _numbers_spelt_twice(classes)
    twins = spelt_twice[0] if spelt_twice else None
    if moved is None and twins is None:
        return
    numbers = sorted(int(name) for name in classes)
    said, args = "The class folders of %r are numbers", [root]
    if moved is not None:
        said += (
            ", sorted as text as torchvision's ImageFolder sorts them ('10' before '2'): "
            "class %d is the folder %r. The store names each class by its folder"
        )
        args += [moved[1], moved[2]]
    if twins is not None:
        others = _and(twins[:-1])
        said += (
            "; the folders %s spell one number, %d: %d classes, which leading zeros would "
            "make one name. Where they are one class, move the images of %s into %r and "
            "remove %s; else rename %s to a number no other folder spells"
        )
        args += [
            _and(twins), int(twins[0]), len(twins), others, twins[-1], others,
            "one" if len(twins) == 2 else "all but one",
        ]  # fmt: skip
        if len(spelt_twice) > 1:  # (each named: padded, '2' was renamed onto its '02')
            said += "; likewise for the folders %s"
            args.append("; ".join(map(_and, spelt_twice[1:])))
    if moved is not None:
        width = max(len(str(numbers[-1])), *(len(name) for name in classes))
        low, high = f"{numbers[0]:0{width}d}", f"{numbers[-1]:0{width}d}"
        said += (
            "; %sto sort the classes in their numbers' order, give every name leading zeros "
            "to %d digits (%r ... %r)%s"
        )
        offset = "" if numbers[0] == 0 else f"; class 0 is then the folder {low!r}"
        args += ["then, " if twins else "", width, low, high, offset]
    logger.warning(said + ".", *args)


def _and(names: list[str]) -> str:
    """``'a'``, ``'a' and 'b'``, ``'a', 'b' and 'c'``."""
    quoted = list(map(repr, names))
    return " and ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)


def _numbers_spelt_twice(names: list[str]) -> list[list[str]]:
    """The spellings, shortest first, of each number that two or more of ``names`` (all of
    them numbers) spell ('1' and '01'), in the numbers' order; [] where there is none."""
    if not names or not all(map(is_index, names)):
        return []
    spellings: dict[int, list[str]] = {}
    for name in sorted(names, key=lambda name: (len(name), name)):
        spellings.setdefault(int(name), []).append(name)
    return [texts for _, texts in sorted(spellings.items()) if len(texts) > 1]


def _in_sub_folders_alone(ids: list[str]) -> bool:
    """Whether the images of one class lie in two or more of its sub-folders, none in
    the class folder itself (``class/sub/x.jpg``, not ``class/x.jpg``)."""
    parts = [i.split(os.sep) for i in ids]
    return all(len(p) > 2 for p in parts) and len({p[1] for p in parts}) > 1


# Folder names of a dataset's splits (compared in lower case), which no class is named.
_SPLIT_NAMES = frozenset({"train", "training", "test", "testing", "val", "valid", "validation"})


_SYSTEM_FOLDERS = frozenset(
    {"__MACOSX", "lost+found", "System Volume Information", "$RECYCLE.BIN", "@eaDir"}
    | {"$Recycle.Bin"}  # (the recycle bin's spelling on an NTFS drive)
    | {"#recycle", "@Recycle"}  # a NAS share's recycle bin (Synology, QNAP)
)


def _hidden(name: str) -> bool:
    """Whether a file or folder of an image folder is left out as no image or class: a
    hidden one (its name starts with a dot), the ``__MACOSX`` folder of resource forks
    that unzipping an archive made by macOS's Finder leaves beside its folders, the
    folders of a file system's own at its root (``lost+found`` of ext2/3/4, ``System
    Volume Information`` and ``$RECYCLE.BIN`` (``$Recycle.Bin`` on NTFS) of a drive
    Windows wrote to: class folders on a mounted disk), the ``@eaDir`` folders of
    thumbnails that a Synology NAS writes in every folder of images, or a NAS share's
    recycle bin of deleted files (``#recycle``, ``@Recycle``)."""
    return name.startswith(".") or name in _SYSTEM_FOLDERS


def _check_one_form(classes: list[str], root: str) -> None:
    """Refuse two class folders whose names are one name in two Unicode forms (an
    accent composed, 'caf\\xe9', and decomposed, 'cafe\\u0301', as a copy from macOS
    spells it): two classes that print alike, and that mr2-probe matches by name in NFC
    as one, so that it refused the store's class names."""
    twins = nfc_twins(classes)
    if twins:
        raise ValueError(
            f"Under {root!r}, the class folders {_two_forms(*twins)}: they would be two "
            "classes that print alike. Move the images of one into the other, or rename one "
            "of them."
        )


def _check_dangling_links(root: str) -> None:
    """Refuse a symbolic link beside the class folders whose target does not exist (a
    share not mounted, a folder moved): ``find_classes`` left it out without a word, and
    its class with it, every class index after it shifted. One to a git-annex or DVC
    object (:func:`_a_file_s`), a file not fetched such as a dataset's README.md, is no
    class: left out, with the other files beside the class folders."""
    for entry in sorted(os.scandir(root), key=lambda entry: entry.name):
        if (
            entry.is_symlink()
            and not _hidden(entry.name)
            and not os.path.exists(entry.path)
            and not _a_file_s(entry.path, by_name=False)
        ):
            raise FileNotFoundError(
                f"{entry.path!r} under {root!r} {why_missing(entry.path)}: it may be a "
                "class folder, which would be left out with its class (a link that reaches "
                "nothing cannot tell a folder from a file). Restore its target, or remove "
                "the link"
            )


def _folder_items(root: str, classes: list[str]) -> list[tuple[str, int]]:
    """(path, class index) of the images under ``root/<class>``, in torchvision's
    ``make_dataset`` order, each once: a folder reached again through a symbolic link (a
    link to a folder above it, a loop) is not walked again (of two names of one folder,
    the first in sorted order is kept), nor the root or a folder above
    it from inside a class. Hidden files and folders (their names start with a dot),
    ``__MACOSX`` folders and the other system folders of :func:`_hidden` are left out.

    Raises FileNotFoundError, as ``make_dataset`` does, for a class without images (and
    for a link in a class whose target does not exist, unless it is a file's
    (:func:`_a_file_s`): one named as an image is listed, and recorded as a failed image,
    another is left out as any file without an image extension), OSError for a folder
    that cannot be listed, and ValueError for a folder of images reached from two classes
    (a class folder linked to another's, or a link inside one class to a folder of
    another): torchvision lists its images under both, each image with two labels.
    """

    def inode(path: str | Path) -> tuple[int, int | str]:
        st = os.stat(path)
        # (a file system without inode numbers, st_ino = 0 on some FUSE mounts: every folder
        # was one, walked once and said to be reached from two classes; its path resolved)
        return st.st_dev, st.st_ino or os.path.realpath(path)

    # Never walked from inside a class: the root and the folders above it (every class
    # again, under this class's label).
    starts = {Path(os.path.abspath(root)), Path(os.path.realpath(root))}
    above = {inode(folder) for start in starts for folder in (start, *start.parents)}

    def unreadable(error: OSError):
        # os.walk leaves out a folder it cannot list, and its images with it, without a word.
        raise OSError(
            error.errno,
            f"Cannot list the folder {error.filename!r} under {root!r} ({error.strerror}): its "
            "images would be left out. Make it readable, or move it out of the class folders",
        ) from error

    items, empty, other = [], [], []
    owner: dict[tuple[int, int | str], tuple[str, str]] = {}  # folder of images: (class, path)
    for index, name in enumerate(classes):
        seen, walked = set(above), []
        walk = os.walk(os.path.join(root, name), onerror=unreadable, followlinks=True)
        for top, dirs, files in walk:
            key = inode(top)
            if key in seen:
                dirs[:] = []  # walked already: neither its files nor its folders again
                continue
            seen.add(key)
            # Hidden files and folders (macOS's ._x.jpg, .ipynb_checkpoints) are no images
            # of the class, as a glob's * does not match them either. Walked in sorted
            # order, not the file system's (ext4 lists by hash): of two names of one folder
            # (a link to it beside it), the one kept is the first sorted, on any copy.
            dirs[:] = sorted(d for d in dirs if not _hidden(d))
            files = [f for f in files if not _hidden(f)]
            if any(has_file_allowed_extension(f, IMG_EXTENSIONS) for f in files):
                _refuse_two_classes(root, owner.setdefault(key, (name, top)), (name, top))
            walked.append((top, files))
        listed = [os.path.join(top, f) for top, files in sorted(walked) for f in sorted(files)]
        found = [(p, index) for p in listed if has_file_allowed_extension(p, IMG_EXTENSIONS)]
        if not found:
            empty.append(name)
        items += found
        others = [p for p in listed if not has_file_allowed_extension(p, IMG_EXTENSIONS)]
        for path in others:
            if os.path.islink(path) and not os.path.exists(path) and not _a_file_s(path):
                # (os.walk lists a link it cannot follow as a file: said as no image. One
                # to a file, an annotation of git-annex or DVC not fetched, is one.)
                raise FileNotFoundError(
                    f"{path!r} under {root!r} {why_missing(path)}: it may be a folder of "
                    f"the class {name!r}, whose images would be left out (a link that "
                    "reaches nothing cannot tell a folder from a file, and its name has no "
                    "extension). Restore its target, or remove the link"
                )
        other += others
    if empty:
        raise FileNotFoundError(
            f"Found no valid file for the classes {', '.join(sorted(empty))}. "
            f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}. Each folder under "
            f"{root!r} is a class: put its images in it, or move it out of the source"
        )
    _warn_of_left_out(root, other)
    return items


def _refuse_links_across_classes(
    root: str, ids: list[str], labels: np.ndarray, classes: list[str], inodes: np.ndarray
) -> None:
    """Refuse an image of one class that a symbolic link in another class names
    (``dog/1.png`` to ``../cat/1.png``): one image with two labels. Two links to one file
    (git-annex or DVC objects of two images with the same bytes) and hard links (a
    deduplicated copy) are two images, as in a list file."""
    order = np.lexsort((inodes[:, 1], inodes[:, 0]))  # (N,) by (st_dev, st_ino)
    ranked = inodes[order]
    same = (ranked[1:] == ranked[:-1]).all(axis=1) & (ranked[1:, 1] >= 0)  # (N - 1,)
    twice = np.zeros(len(order), bool)
    twice[1:] |= same
    twice[:-1] |= same
    shared = order[twice]  # (B,) files listed under several names
    if not len(shared):
        return
    by_file: dict[tuple[int, int], list[int]] = {}
    for i in shared.tolist():
        by_file.setdefault(tuple(inodes[i]), []).append(i)
    for names in by_file.values():
        # Each name with its folders resolved and itself not (a link stays a link): a link,
        # and each link it leads to in turn (dog/1.png -> ../cat/1.png, itself a git-annex
        # link), is looked up among the names listed, not only the file it ends at.
        links = [i for i in names if os.path.islink(os.path.join(root, ids[i]))]
        if not links:  # (hard links alone: no path resolved)
            continue
        place = {_unlinked_folders(os.path.join(root, ids[i])): i for i in names}
        other, first = next(
            ((i, j) for i in links for j in _links_named(os.path.join(root, ids[i]), place)
             if labels[i] != labels[j]),
            (None, None),
        )  # fmt: skip
        if other is not None:
            raise ValueError(
                f"Under {root!r}, {ids[other]!r} is a link to {ids[first]!r}: one image in "
                f"the classes {classes[labels[first]]!r} and {classes[labels[other]]!r}, with "
                "two labels. Give each class its own images: remove the link, or copy the "
                "image."
            )


def _unlinked_folders(path: str) -> str:
    """``path`` with its folders' symbolic links resolved, its last name kept as it is."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _links_named(path: str, place: dict[str, int]):
    """The items of ``place`` (a name with :func:`_unlinked_folders`: item) that the
    symbolic link ``path`` names, directly or through the links it leads to in turn."""
    for _ in range(40):  # (the kernel follows at most 40 links)
        if not os.path.islink(path):
            return
        path = _unlinked_folders(os.path.join(os.path.dirname(path), os.readlink(path)))
        if path in place:
            yield place[path]


def _refuse_two_classes(root: str, first: tuple[str, str], then: tuple[str, str]) -> None:
    """Refuse one folder of images walked under two classes (``(class, path)`` each):
    every image in it would be listed twice, with two labels, which no single-label
    training set can hold (torchvision's ImageFolder lists it so, without a word)."""
    (one, one_path), (other, other_path) = first, then
    if one == other:
        return
    one_path, other_path = (os.path.relpath(p, root) for p in (one_path, other_path))
    raise ValueError(
        f"Under {root!r}, the class folders {one!r} and {other!r} reach one folder of images "
        f"({one_path!r} and {other_path!r} are one folder, {os.path.realpath(first[1])!r}): "
        "each of its images would be listed in both classes, with two labels. Give each "
        "class its own images: remove the link, or copy the folder."
    )


# Where git-annex and DVC keep the objects their links name: files, never folders. (A DVC
# cache outside the project, as one shared on a server is, by its objects' names: an md5
# in hex, its first 2 digits a folder, ``files/md5/ab/cdef...`` in DVC 3.)
_OBJECT_STORES = re.compile(
    r"(^|/)(\.git/annex/objects|annex/objects|\.dvc/cache)/|/[0-9a-f]{2}/[0-9a-f]{30}$"
)


def _a_file_s(link: str, by_name: bool = True) -> bool:
    """Whether a symbolic link whose target does not exist is a file's, rather than a
    folder's (``more``): its target is a git-annex or DVC object (``LICENSE`` to
    ``.git/annex/objects/.../SHA256E-s12--ab``), a file not fetched, or, ``by_name``, its
    name has an extension (``gone.jpg``, ``000.json``). (A target's name is no sign: folders
    are named with dots, ``2019.06.01``, as classes are beside the class folders, CUB-200's
    ``001.Black_footed_Albatross``.)"""
    if _OBJECT_STORES.search(os.readlink(link)):
        return True
    return by_name and bool(os.path.splitext(os.path.basename(link))[1])


def _warn_of_left_out(root: str, other: list[str]) -> None:
    """Say which files the ImageFolder convention leaves out: those in the class folders
    whose extension is not an image's, and those in the root itself, outside every class
    (hidden files, such as .DS_Store, and those in hidden folders, such as
    .ipynb_checkpoints, are left out without a word)."""
    # (with links to files that are not there: those to folders were refused)
    in_root = sorted(
        e.path for e in os.scandir(root) if e.is_file() or e.is_symlink() and not e.is_dir()
    )
    for files, where, why in (
        (
            other,
            "in the class folders",
            "only files with an image extension are read (" + ", ".join(IMG_EXTENSIONS) + ")",
        ),
        (in_root, f"in {root!r} itself", "images are read from its class folders only"),
    ):
        files = [
            f
            for f in files
            if not any(_hidden(part) for part in Path(os.path.relpath(f, root)).parts)
        ]
        if files:
            logger.warning(
                "%d %s %s %s left out (%s%s): %s.",
                len(files),
                "file" if len(files) == 1 else "files",
                where,
                "is" if len(files) == 1 else "are",
                ", ".join(repr(os.path.relpath(f, root)) for f in files[:3]),
                ", ..." if len(files) > 3 else "",
                why,
            )


def _not_utf8(names) -> list[str]:
    """The names that are not valid UTF-8 (file names of other encodings, which Python
    holds as surrogates), each shown with its bytes escaped."""
    bad = []
    for name in names:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            bad.append(os.fsencode(name).decode("utf-8", "backslashreplace"))
    return bad


def _check_utf8(names: list[str], root: str) -> None:
    """Refuse file and folder names that are not UTF-8: the store keeps paths and class
    names as UTF-8 strings."""
    bad = _not_utf8(names)
    if bad:
        shown = ", ".join(repr(b) for b in bad[:5]) + (
            f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        )
        raise ValueError(
            f"{len(bad)} file or folder names under {root!r} are not valid UTF-8: {shown}. "
            "The store records every path as UTF-8 text; rename them (e.g. with convmv)."
        )
