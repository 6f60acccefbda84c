"""Image sources and decoding."""

import csv
import gzip
import hashlib
import io
import logging
import os
import re
import shlex
import shutil
import struct
import threading
import unicodedata
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps, TiffImagePlugin
from torchvision.datasets.folder import IMG_EXTENSIONS

from extract import fashion_mnist, image_folder, image_list, open_source
from extract._decoding import check_pixel_limit, decode_image, jpeg_size, to_rgb
from extract._images import ItemDataset, collate_items, load_image
from extract._list_lines import _shell_split
from extract._schema import shorten
from extract._testing import make_image_folder, write_idx


@pytest.fixture
def folder(tmp_path):
    return make_image_folder(tmp_path / "data", n_per_class=4)


def test_image_folder_lists_every_file_in_sorted_order(folder):
    src = image_folder(folder)
    assert src.class_names == ["cat", "dog"]
    assert len(src) == 4 + 4 + 4  # the special files join class 'cat'
    assert src.ids == sorted(src.ids)
    assert src.labels.tolist() == [0] * 8 + [1] * 4
    assert "cat/corrupt.jpg" in src.ids and "cat/alpha.png" in src.ids
    np.testing.assert_array_equal(src.source_index, np.arange(12))


@pytest.mark.parametrize(
    "lines, class_names, labels",
    [
        (["path,label", "cat/000.png,cat", "dog/001.jpg,dog"], ["cat", "dog"], [0, 1]),
        (["dog/001.jpg,dog", "cat/000.png,cat"], ["cat", "dog"], [1, 0]),
        (["cat/000.png,2", "dog/001.jpg,0"], ["0", "1", "2"], [2, 0]),
        (["cat/000.png 1", "", "dog/001.jpg 0"], ["0", "1"], [1, 0]),
        # -1 is no class index: the labels are names.
        (["cat/000.png,-1", "dog/001.jpg,3"], ["-1", "3"], [0, 1]),
        # Blanks around a field (a CSV written "path, label") are no part of it.
        (["cat/000.png, cat", " dog/001.jpg ,dog "], ["cat", "dog"], [0, 1]),
    ],
)
def test_image_list(folder, lines, class_names, labels):
    list_file = folder / "list.csv"
    list_file.write_text("\n".join(lines) + "\n")
    src = image_list(list_file)
    assert (src.class_names, src.labels.tolist()) == (class_names, labels)
    # Relative paths resolve against the list file's folder.
    assert all(load_image(src, i).size == (40, 36) for i in range(len(src)))


@pytest.mark.parametrize("beside", [False, True])
def test_a_list_whose_paths_are_the_working_folder_s_says_so(
    folder, tmp_path, monkeypatch, caplog, beside
):
    # `find data -name '*.png' > lists/train.txt`: every image failed, the reason unsaid.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lists").mkdir()
    list_file = tmp_path / "lists" / "train.txt"
    list_file.write_text("data/cat/000.png cat\ndata/dog/001.jpg dog\n")
    if beside:  # found beside the list too: read there, without a word
        shutil.copytree(folder, tmp_path / "lists" / "data")
    caplog.set_level(logging.WARNING, logger="extract")
    src = image_list(list_file)
    assert src.root == str(list_file.parent)  # read against the list's folder all the same
    if beside:
        assert not caplog.records
    else:
        assert len(caplog.records) == 1
        assert "'data/cat/000.png' is found in the working folder" in caplog.text


@pytest.mark.parametrize(
    "labels, warning",
    [
        (["1", "2"], r"indices 0..2, and 1 of these classes has no image \(0\).*counted from 1"),
        (["0", "3"], r"indices 0..3, and 2 of these classes have no image \(1, 2\)"),
        (["01", "1", "0"], r"The labels '01' and '1' are one class index, 1"),
        (["0", "1"], None),
    ],
)
def test_class_indices_that_leave_classes_empty_or_merge_are_said(folder, caplog, labels, warning):
    # A list of labels counted from 1 made an empty class 0, silently (it reaches the
    # probe's class-wise reports as a class without samples).
    images = ["cat/000.png", "dog/001.jpg", "cat/002.png"]
    (folder / "list.csv").write_text(
        "".join(f"{p},{y}\n" for p, y in zip(images[: len(labels)], labels, strict=True))
    )
    caplog.set_level(logging.WARNING, logger="extract")
    src = image_list(folder / "list.csv")
    assert src.class_names == [str(k) for k in range(int(max(labels)) + 1)]
    if warning is None:
        assert not caplog.records
    else:
        assert len(caplog.records) == 1 and re.search(warning, caplog.text)


@pytest.mark.parametrize(
    "labels, warning",
    [
        (["0", "2", "10", "-1"], r"list.csv:4: the label '-1', which is no class index"),
        (["2", "cat", "10"], r"list.csv:2: the label 'cat', a class name, where other"),
        (["cat", "dog", "-1"], None),  # names alone, "-1" one of them
        (["+1", "-1", "-1"], None),
        (["1", "-1", "1", "-1"], None),  # "1" is class 1 as a name too: nothing renumbered
        # Nothing renumbered, but -1 may mark unlabelled rows: said (it was, then was not).
        (["-1", "1", "2", "2"], r"list.csv:1: the label '-1', which is no class index"),
        # Integers written as decimals (pandas, in a column that held a NaN): renumbered.
        (["1.0", "2.0", "1.0", "2.0"], r"list.csv:1: the label '1.0' is a whole number"),
        (["0.0", "10.0", "1.0", "2.0"], r"list.csv:2: the label '10.0' is a whole number"),
        (["0.0", "1.0", "1.0", "0.0"], None),  # classes 0 and 1 either way
        (["0.5", "1.0", "1.0", "0.5"], None),  # not integers: names
        # -1.0 sorted first (pandas' -1 of unlabelled rows): "0.0" was class 1, unsaid.
        (["-1.0", "0.0", "1.0", "0.0"], r"list.csv:2: the label '0.0' is a whole number"),
        (["-1.0", "1.0", "1.0", "-1.0"], None),  # a ±1 labelling: "1.0" is class 1
    ],
)
def test_a_list_that_mixes_indices_with_names_says_it_reads_them_as_names(
    folder, caplog, labels, warning
):
    # Its classes were renumbered as sorted text ("2" became class 4), without a word.
    images = ["cat/000.png", "dog/001.jpg", "cat/002.png", "dog/004.jpg"]
    (folder / "list.csv").write_text(
        "".join(f"{p},{y}\n" for p, y in zip(images, labels, strict=False))
    )
    caplog.set_level(logging.WARNING, logger="extract")
    src = image_list(folder / "list.csv")
    assert src.class_names == sorted(set(labels))
    if warning is None:
        assert not caplog.records
    else:
        assert len(caplog.records) == 1 and re.search(warning, caplog.text)
        assert "every label as a class name, the classes sorted as text" in caplog.text


def test_files_the_image_folder_leaves_out_are_said(folder, caplog):
    # A .gif, a file without an extension and an image beside the class folders were left
    # out of the store without a word.
    caplog.set_level(logging.WARNING, logger="extract")
    before = image_folder(folder).ids
    assert not caplog.records  # (corrupt.jpg has an image's extension: it is listed)
    for name in ("cat/anim.gif", "dog/scan", "dog/notes.txt", "stray.jpg", "cat/.DS_Store"):
        (folder / name).write_bytes(b"x")
    (folder / ".DS_Store").write_bytes(b"x")
    (folder / "cat" / ".ipynb_checkpoints").mkdir()  # a hidden folder's files are not said
    (folder / "cat" / ".ipynb_checkpoints" / "x-checkpoint.ipynb").write_bytes(b"x")
    assert image_folder(folder).ids == before
    assert [r.getMessage() for r in caplog.records] == [
        "3 files in the class folders are left out ('cat/anim.gif', 'dog/notes.txt', "
        f"'dog/scan'): only files with an image extension are read ({', '.join(IMG_EXTENSIONS)}).",
        f"1 file in {str(folder)!r} itself is left out ('stray.jpg'): images are read from "
        "its class folders only.",
    ]


@pytest.mark.parametrize("splits", [("train", "val"), ("Test", "Train")])
def test_split_folders_given_as_the_source_are_said(tmp_path, caplog, splits):
    # A dataset's folder holding train/ and val/, each with class folders, made a store
    # whose classes were the splits (every image of both, a probe taught to tell them
    # apart), without a word.
    for split in splits:
        make_image_folder(tmp_path / "ds" / split, n_per_class=1, special=False)
    caplog.set_level(logging.WARNING, logger="extract")
    src = image_folder(tmp_path / "ds")
    assert src.class_names == sorted(splits)  # read as torchvision reads it
    first = os.path.join(tmp_path / "ds", sorted(splits)[0])
    assert [r.getMessage() for r in caplog.records] == [
        f"The class folders of {str(tmp_path / 'ds')!r} are "
        f"{', '.join(map(repr, sorted(splits)))}, names of splits: each is read as one class "
        f"of every image under it. To extract a split, give its folder (e.g. {first!r})."
    ]


def test_a_folder_above_the_class_folders_given_as_the_source_is_said(tmp_path, caplog):
    # An archive unpacked into a folder of its own name (ds/photos/cat, ds/photos/dog), ds
    # given: one class 'photos' of every image, without a word.
    make_image_folder(tmp_path / "ds" / "photos", n_per_class=1, special=False)
    caplog.set_level(logging.WARNING, logger="extract")
    src = image_folder(tmp_path / "ds")
    assert src.class_names == ["photos"]  # read as torchvision reads it
    assert [r.getMessage() for r in caplog.records] == [
        f"{str(tmp_path / 'ds')!r} holds one class folder, 'photos', and it holds no image "
        "itself but sub-folders ('cat', 'dog'): every image is read as of one class. To read "
        f"them as the classes, give its folder, {str(tmp_path / 'ds' / 'photos')!r}."
    ]
    caplog.clear()  # one class of images of its own, or two classes: nothing to say
    shutil.copy(tmp_path / "ds/photos/cat/000.png", tmp_path / "ds/photos/x.png")
    assert image_folder(tmp_path / "ds").class_names == ["photos"] and not caplog.records
    make_image_folder(tmp_path / "ds" / "more", n_per_class=1, special=False)
    assert image_folder(tmp_path / "ds").class_names == ["more", "photos"] and not caplog.records


@pytest.mark.slow
def test_class_indices_beyond_the_bound_are_taken_where_their_names_are_given():
    # The bound is for indices without names (ids taken for indices); with a name for
    # each class the indices are the names' positions, however many.
    from extract._labels import MAX_CLASS_INDEX, encode_labels

    names = [f"c{k}" for k in range(MAX_CLASS_INDEX + 1)]
    labels, classes = encode_labels(["0", str(MAX_CLASS_INDEX)], names)
    assert labels.tolist() == [0, MAX_CLASS_INDEX] and classes == names
    with pytest.raises(ValueError, match="only 3 class names are given"):
        encode_labels(["0", "3"], names[:3])
    with pytest.raises(ValueError, match=f"the largest, {MAX_CLASS_INDEX}, would make"):
        encode_labels(["0", str(MAX_CLASS_INDEX)])  # without names: the bound is refused


def test_hidden_folders_and_files_are_no_classes_nor_images(folder):
    # A hidden folder beside the classes (.thumbs) became class 0, every index shifted;
    # an empty one (.ipynb_checkpoints) refused the folder; hidden files in a class
    # (macOS's ._x.jpg) were its images.
    before = image_folder(folder)
    for name in (".thumbs/t.jpg", "cat/._000.jpg", "cat/.ipynb_checkpoints/x-checkpoint.jpg"):
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes((folder / before.ids[0]).read_bytes())
    (folder / ".ipynb_checkpoints").mkdir()
    after = image_folder(folder)
    assert (after.ids, after.class_names) == (before.ids, before.class_names)
    np.testing.assert_array_equal(after.labels, before.labels)


def test_a_macosx_folder_is_no_class_nor_images(folder, caplog):
    # A folder unzipped from a Finder archive holds __MACOSX/<class>/._x.jpg beside its
    # classes: refused as "Found no valid file for the classes __MACOSX" (or, holding an
    # image, taken for class 0).
    caplog.set_level(logging.WARNING, logger="extract")
    before = image_folder(folder)
    image = (folder / before.ids[0]).read_bytes()
    for name in ("__MACOSX/cat/._000.jpg", "__MACOSX/dog/notes.txt", "cat/__MACOSX/x.jpg"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(image)
    after = image_folder(folder)
    assert (after.ids, after.class_names) == (before.ids, before.class_names)
    np.testing.assert_array_equal(after.labels, before.labels)
    assert not caplog.records  # left out without a word, as hidden files are


@pytest.mark.parametrize(
    "system", ["lost+found", "System Volume Information", "$RECYCLE.BIN", "$Recycle.Bin"]
)
def test_a_file_system_s_own_folder_is_no_class(folder, caplog, system):
    # Class folders at the root of a mounted disk lie beside its file system's folders
    # (ext4's lost+found, a Windows-written drive's System Volume Information): refused as
    # "Found no valid file for the classes lost+found" (or, holding images, a class).
    caplog.set_level(logging.WARNING, logger="extract")
    before = image_folder(folder)
    (folder / system).mkdir()
    (folder / system / "IndexerVolumeGuid").write_bytes(b"x")
    after = image_folder(folder)
    assert (after.ids, after.class_names) == (before.ids, before.class_names)
    (folder / system / "#1234.jpg").write_bytes((folder / before.ids[0]).read_bytes())
    assert image_folder(folder).class_names == before.class_names and not caplog.records


def test_a_synology_thumbnail_folder_is_no_class_nor_images(folder, caplog):
    # A Synology NAS writes @eaDir/<image>/SYNOFILE_THUMB_*.jpg beside every image (and
    # an @eaDir beside the classes): each class held its images' thumbnails as images
    # of its own, and @eaDir was a class.
    caplog.set_level(logging.WARNING, logger="extract")
    before = image_folder(folder)
    image = (folder / before.ids[0]).read_bytes()
    for name in ("cat/@eaDir/000.png/SYNOFILE_THUMB_M.jpg", "@eaDir/cat@SynoEAStream"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(image)
    after = image_folder(folder)
    assert (after.ids, after.class_names) == (before.ids, before.class_names)
    assert not caplog.records


@pytest.mark.parametrize("bin_name", ["#recycle", "@Recycle"])
def test_a_nas_share_s_recycle_bin_is_no_class(folder, caplog, bin_name):
    # Class folders at the root of a Synology (#recycle) or QNAP (@Recycle) share lie
    # beside its recycle bin, which keeps deleted images in their folders: they were a
    # class of their own.
    caplog.set_level(logging.WARNING, logger="extract")
    before = image_folder(folder)
    (folder / bin_name / "cat").mkdir(parents=True)
    (folder / bin_name / "cat" / "x.jpg").write_bytes((folder / before.ids[0]).read_bytes())
    after = image_folder(folder)
    assert (after.ids, after.class_names) == (before.ids, before.class_names)
    assert not caplog.records


def test_a_folder_that_cannot_be_listed_is_refused(folder, monkeypatch):
    # os.walk left it out, and its images with it, without a word (a folder of another
    # user's, unreadable).
    private = folder / "cat" / "private"
    private.mkdir()
    scandir = os.scandir

    def denied(path="."):
        if os.fspath(path) == os.fspath(private):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    with pytest.raises(OSError, match=r"Cannot list the folder '.*private' under .*Permission"):
        image_folder(folder)


@pytest.mark.parametrize(
    "name, target, why",
    [("zebra", "missing/dog", r"is a symbolic link to '.*missing/dog', which does not exist"),
     ("zebra", "zebra", "is a symbolic link in a loop of links"),
     # (a class named with a dot, as CUB-200's are, is no file)
     ("002.Zebra", "missing/002.Zebra", r"is a symbolic link to '.*/002.Zebra', which does")],
)  # fmt: skip
def test_a_class_folder_link_that_reaches_nothing_is_refused(folder, name, target, why):
    # A class linked to a share not mounted was left out without a word: one class fewer,
    # every index after it shifted.
    os.symlink(folder / target, folder / name)
    with pytest.raises(FileNotFoundError, match=f"'.*{name}' under .* {why}.*: it may be a class"):
        image_folder(folder)


@pytest.mark.parametrize("target", ["more", "2019.06.01"])  # (a folder named with dots too)
def test_a_folder_link_in_a_class_that_reaches_nothing_is_refused(folder, caplog, target):
    # A link to a share not mounted inside a class left its images out, said only as "a
    # file ... left out: only files with an image extension are read".
    os.symlink(folder / "missing" / target, folder / "cat" / "more")
    why = f"is a symbolic link to '.*missing/{target}', which does not exist: it may be a"
    with pytest.raises(FileNotFoundError, match=f"'.*cat/more' under .* {why} folder of the class"):
        image_folder(folder)
    # A link named as an image is listed, and recorded as a failed image when read.
    os.remove(folder / "cat" / "more")
    os.symlink(folder / "missing.jpg", folder / "cat" / "gone.jpg")
    caplog.set_level(logging.WARNING, logger="extract")
    assert "cat/gone.jpg" in image_folder(folder).ids and not caplog.records


@pytest.mark.parametrize("where", ["cat/LICENSE", "LICENSE"])
def test_a_broken_file_link_without_extension_is_said_to_be_perhaps_a_folder(folder, where):
    # A plain link to a file that is gone, named without an extension, was said to be "a
    # folder ... that cannot be reached": the message now says that it is a broken link,
    # where it leads, and that a folder cannot be told from a file there.
    os.symlink(folder.parent / "elsewhere/LICENSE", folder / where)
    link, target = re.escape(str(folder / where)), re.escape(str(folder.parent / "elsewhere"))
    with pytest.raises(FileNotFoundError) as error:
        image_folder(folder)
    assert re.match(
        f"'{link}' under .* is a symbolic link to '{target}/LICENSE', which does not",
        str(error.value),
    )
    assert "cannot tell a folder from a file" in str(error.value)


_ANNEXED = "../.git/annex/objects/Xx/Yy/SHA256E-s12--ab/SHA256E-s12--ab"


@pytest.mark.parametrize(
    "name, target",
    [("000.json", _ANNEXED), ("annotations.xml", _ANNEXED),
     # Files without an extension were refused as folders out of reach: one annexed (a
     # key without an extension, of git-annex's SHA256E or SHA256 backends), or a DVC
     # object.
     ("LICENSE", _ANNEXED), ("NOTES", "../.git/annex/objects/Xx/Yy/SHA256-s9--cd/SHA256-s9--cd"),
     ("labels", "../../.dvc/cache/files/md5/ab/cdef0123456789"),
     # (a DVC cache shared on a server, outside the project: dvc cache dir /srv/dvc-cache)
     ("labels", "/srv/dvc-cache/files/md5/ab/" + "cdef0123456789" * 2 + "ab")],
)  # fmt: skip
def test_a_file_link_in_a_class_that_reaches_nothing_is_left_out_as_before(
    folder, caplog, name, target
):
    # A git-annex or DVC dataset whose images were fetched and annotations not: each
    # annotation is a link to an object not in the cache. Left out with a warning as any
    # file without an image extension, not refused as a folder out of reach.
    before = image_folder(folder)
    os.symlink(target, folder / "cat" / name)
    caplog.set_level(logging.WARNING, logger="extract")
    after = image_folder(folder)
    assert (after.ids, after.class_names) == (before.ids, before.class_names)
    assert f"'cat/{name}'" in caplog.text and "left out" in caplog.text


@pytest.mark.parametrize(
    "name, target",
    [("README.md", ".git/annex/objects/Xx/Yy/SHA256E-s12--ab.md/SHA256E-s12--ab.md"),
     ("LICENSE", ".git/annex/objects/Xx/Yy/SHA256E-s9--cd/SHA256E-s9--cd"),
     ("LICENSE", "/srv/dvc-cache/ab/" + "cdef0123456789" * 2 + "ab")],  # (DVC 2)
)  # fmt: skip
def test_a_file_link_beside_the_classes_that_reaches_nothing_is_left_out(
    folder, caplog, name, target
):
    # A git-annex (DataLad) dataset whose README.md was not fetched: the link was refused
    # as a class folder out of reach, and with it the whole source.
    before = image_folder(folder)
    os.symlink(target, folder / name)
    caplog.set_level(logging.WARNING, logger="extract")
    after = image_folder(folder)
    assert (after.ids, after.class_names) == (before.ids, before.class_names)
    assert f"1 file in {str(folder)!r} itself is left out ('{name}')" in caplog.text


def test_a_hidden_link_that_reaches_nothing_is_no_class_and_not_refused(folder):
    # An editor's lock file beside the classes (Emacs writes .#name as a link to
    # user@host.pid, which does not exist) is hidden, as left out as a hidden folder.
    before = image_folder(folder)
    os.symlink("user@host.4242:1700000000", folder / ".#notes.txt")
    after = image_folder(folder)
    assert (after.ids, after.class_names) == (before.ids, before.class_names)


@pytest.mark.parametrize(
    "names, said",
    [
        ([str(k) for k in range(12)], "class 2 is the folder '10'"),
        ([str(k) for k in range(1, 13)], "class 1 is the folder '10'"),
        # In the order of their numbers: nothing to say.
        ([f"{k:02d}" for k in range(12)], None),
        (["1", "2", "3"], None),
        (["10", "7"], "class 0 is the folder '10'"),
        (["cat", "10", "2"], None),  # names, not numbers
    ],
)
def test_class_folders_named_by_numbers_sorted_as_text_are_said(tmp_path, caplog, names, said):
    # '0' ... '11' sorted as text, as torchvision sorts them: the folder '10' was class 2,
    # which a list file's label 10 (and the user) numbers 10, without a word.
    root = make_image_folder(tmp_path / "d", tuple(names), n_per_class=1, special=False)
    caplog.set_level(logging.WARNING, logger="extract")
    src = image_folder(root)
    assert src.class_names == sorted(names)  # torchvision's order, as before
    if said is None:
        assert not caplog.records
        return
    (message,) = [r.getMessage() for r in caplog.records]
    assert "are numbers, sorted as text as torchvision's ImageFolder sorts them" in message
    assert said in message and "leading zeros to 2 digits" in message


@pytest.mark.parametrize(
    "numbers",
    [range(12), range(1, 11), range(1, 101), [3, 20, 7]],
    ids=["0-11", "1-10", "1-100", "3-7-20"],
)
def test_the_advice_on_class_folders_sorted_as_text_sorts_them_when_followed(
    tmp_path, caplog, numbers
):
    # "Give the names leading zeros of one width ('02', '10')": padded to 2 digits, '1' ...
    # '100' still sorted '100' before '11'; and '01' ... '10' were said to number the
    # classes as their folders, where class 0 is '01'.
    root = tmp_path / "d"
    for k in numbers:
        (root / str(k)).mkdir(parents=True)
        (root / str(k) / "a.jpg").write_bytes(b"")
    caplog.set_level(logging.WARNING, logger="extract")
    image_folder(root)
    (message,) = [r.getMessage() for r in caplog.records]
    advice = re.search(r"leading zeros to (\d+) digits \('(\d+)' \.\.\. '(\d+)'\)", message)
    width = int(advice[1])
    assert (advice[2], advice[3]) == (f"{min(numbers):0{width}d}", f"{max(numbers):0{width}d}")
    for k in numbers:  # the advice, followed
        (root / str(k)).rename(root / f"{k:0{width}d}")
    caplog.clear()
    src = image_folder(root)
    assert not caplog.records
    assert [int(name) for name in src.class_names] == sorted(numbers)
    if min(numbers):
        assert message.endswith(f"; class 0 is then the folder {src.class_names[0]!r}.")
    else:
        assert "class 0 is then" not in message


@pytest.mark.parametrize(
    "names, short, long",
    [(["1", "01", "2", "10"], "1", "01"), (["1", "01", "2"], "1", "01"),
     (["10", "010", "2", "7"], "10", "010")],
)  # fmt: skip
def test_class_folders_spelling_one_number_are_named_with_a_cure_that_works(
    tmp_path, caplog, names, short, long
):
    # '1' and '01', two classes of one number: the advice to pad every name to 2 digits
    # made '1' the name '01' of the other folder (or said nothing, in their numbers' order).
    root = tmp_path / "d"
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / f"{name}.jpg").write_bytes(b"")
    caplog.set_level(logging.WARNING, logger="extract")
    image_folder(root)
    (message,) = [r.getMessage() for r in caplog.records]
    assert f"the folders {short!r} and {long!r} spell one number, {int(short)}: 2 classes" in (
        message
    )
    cure = re.search(r"move the images of '(\d+)' into '(\d+)' and remove '(\d+)'", message)
    assert cure.groups() == (short, long, short)
    for path in (root / short).iterdir():  # the advice, followed
        path.rename(root / long / path.name)
    (root / short).rmdir()
    pad = re.search(r"leading zeros to (\d+) digits", message)
    if pad:
        for name in os.listdir(root):
            (root / name).rename(root / f"{int(name):0{int(pad[1])}d}")
    caplog.clear()
    src = image_folder(root)
    assert not caplog.records
    assert [int(name) for name in src.class_names] == sorted({int(name) for name in names})
    assert len(src) == len(names)


def test_class_folders_spelling_several_numbers_twice_are_all_named(tmp_path, caplog):
    # '1' and '01', '2' and '02': the first alone was named, and the advice followed (its
    # images moved, every name padded to 2 digits) renamed '2' onto the folder '02'.
    root = tmp_path / "d"
    for name in ["1", "01", "2", "02", "10"]:
        (root / name).mkdir(parents=True)
        (root / name / f"{name}.jpg").write_bytes(b"")
    caplog.set_level(logging.WARNING, logger="extract")
    image_folder(root)
    (message,) = [r.getMessage() for r in caplog.records]
    pairs = re.findall(r"'(\d+)' and '(\d+)'", message)
    assert {(short, long) for short, long in pairs} == {("1", "01"), ("2", "02")}
    for short, long in set(pairs):  # the advice, followed for each
        for path in (root / short).iterdir():
            path.rename(root / long / path.name)
        (root / short).rmdir()
    width = int(re.search(r"leading zeros to (\d+) digits", message)[1])
    for name in os.listdir(root):
        (root / name).rename(root / f"{int(name):0{width}d}")
    caplog.clear()
    src = image_folder(root)
    assert not caplog.records and src.class_names == ["01", "02", "10"] and len(src) == 5


def test_image_folder_walks_a_folder_linked_again_once(folder):
    # A link to its own class folder: os.walk(followlinks=True) listed every image once
    # per level, down to the system's link limit (41 times).
    before = image_folder(folder)
    (folder / "elsewhere").mkdir()
    for name in ("000.png", "001.png"):
        shutil.copy(folder / "cat" / "000.png", folder / "elsewhere" / name)
    os.symlink(folder / "cat", folder / "cat" / "loop")
    os.symlink(folder / "elsewhere", folder / "cat" / "more")  # another folder: walked
    # A link to the root (or above it) walked every class again, labelled cat.
    os.symlink(folder, folder / "cat" / "up")
    os.symlink(folder.parent, folder / "cat" / "more" / "upper")
    with pytest.raises(ValueError, match="the class folders 'cat' and 'elsewhere' reach one"):
        image_folder(folder)  # (elsewhere/ is a class of its own too)
    os.rename(folder / "elsewhere", folder.parent / "elsewhere")
    os.remove(folder / "cat" / "more")
    os.symlink(folder.parent / "elsewhere", folder / "cat" / "more")
    after = image_folder(folder)
    cats = [i for i in before.ids if i.startswith("cat/")]
    dogs = [i for i in before.ids if i.startswith("dog/")]
    # Folder by folder in sorted order (torchvision's make_dataset order), each once.
    assert after.ids == cats + ["cat/more/000.png", "cat/more/001.png"] + dogs


@pytest.mark.parametrize(
    "link, target, first, then",
    [
        ("kitty", "cat", "'cat' and 'kitty'", "'cat' and 'kitty' are one folder"),
        ("aardvark", "dog", "'aardvark' and 'dog'", "'aardvark' and 'dog' are one folder"),
        # A link inside a class to another class's folder, or to a folder inside it.
        ("cat/dogs", "dog", "'cat' and 'dog'", "'cat/dogs' and 'dog' are one folder"),
        ("dog/sub/cats", "cat", "'cat' and 'dog'", "'cat' and 'dog/sub/cats' are one folder"),
        ("cat/inner", "dog/inner", "'cat' and 'dog'", "'cat/inner' and 'dog/inner' are one"),
    ],
)
def test_one_folder_of_images_in_two_classes_is_refused(folder, link, target, first, then):
    # A class folder linked to another's (kitty -> cat), or a link inside a class to
    # another's folder, listed each image under both classes, with two labels (as
    # torchvision's ImageFolder does), without a word.
    (folder / "dog" / "inner").mkdir()
    shutil.copy(folder / "cat" / "000.png", folder / "dog" / "inner" / "x.png")
    (folder / link).parent.mkdir(exist_ok=True)
    os.symlink(folder / target, folder / link)
    with pytest.raises(ValueError) as info:
        image_folder(folder)
    message = str(info.value)
    assert f"the class folders {first} reach one folder of images" in message
    assert then in message and repr(os.path.realpath(folder / target)) in message
    assert "listed in both classes, with two labels" in message


def test_a_file_system_without_inode_numbers_lists_every_class(folder, monkeypatch):
    # Some FUSE mounts give every file st_ino = 0: every class folder was one folder, said
    # to be reached from two classes, and a class's inner folders were not walked.
    (folder / "dog" / "inner").mkdir()
    shutil.copy(folder / "cat" / "000.png", folder / "dog" / "inner" / "x.png")
    expected = image_folder(folder).ids
    stat = os.stat

    class NoInode:
        st_ino = 0

        def __init__(self, st):
            self._st = st

        def __getattr__(self, name):
            return getattr(self._st, name)

    monkeypatch.setattr(os, "stat", lambda *args, **kwargs: NoInode(stat(*args, **kwargs)))
    assert image_folder(folder).ids == expected and "dog/inner/x.png" in expected


def test_an_image_of_one_class_linked_into_another_is_refused(folder):
    # dog/cat0.png -> ../cat/000.png listed one image under both classes, without a word.
    os.symlink("../cat/000.png", folder / "dog" / "cat0.png")
    with pytest.raises(ValueError) as info:
        image_folder(folder)
    assert str(info.value) == (
        f"Under {str(folder)!r}, 'dog/cat0.png' is a link to 'cat/000.png': one image in the "
        "classes 'cat' and 'dog', with two labels. Give each class its own images: remove "
        "the link, or copy the image."
    )
    # Links of two classes to one file elsewhere (git-annex or DVC objects of two images
    # with the same bytes), hard links and links within a class are images of their own.
    os.remove(folder / "dog" / "cat0.png")
    objects = folder.parent / "annex"
    objects.mkdir()
    shutil.copy(folder / "cat" / "000.png", objects / "SHA256E-s1--ab.png")
    for name in ("cat/annexed.png", "dog/annexed.png"):
        os.symlink(objects / "SHA256E-s1--ab.png", folder / name)
    os.link(folder / "cat" / "000.png", folder / "dog" / "hard.png")
    os.symlink("000.png", folder / "cat" / "again.png")
    ids = image_folder(folder).ids
    assert {"cat/annexed.png", "dog/annexed.png", "dog/hard.png", "cat/again.png"} <= set(ids)


def test_a_link_into_another_class_is_refused_where_the_image_is_itself_a_link(folder):
    # In a git-annex checkout every image is a link to its object: dog/cat0.png ->
    # ../cat/annexed.png -> the object ends where no image is listed, and was let through.
    objects = folder.parent / "annex"
    objects.mkdir()
    shutil.copy(folder / "cat" / "000.png", objects / "SHA256E-s1--ab.png")
    os.symlink(objects / "SHA256E-s1--ab.png", folder / "cat" / "annexed.png")
    os.symlink("../cat/annexed.png", folder / "dog" / "cat0.png")
    with pytest.raises(ValueError, match="'dog/cat0.png' is a link to 'cat/annexed.png'"):
        image_folder(folder)


def test_a_folder_without_images_may_be_linked_from_two_classes(folder):
    # (a folder of notes or annotations gives no image two labels)
    (folder.parent / "notes").mkdir()
    (folder.parent / "notes" / "README.txt").write_text("x")
    before = image_folder(folder)
    for name in ("cat", "dog"):
        os.symlink(folder.parent / "notes", folder / name / "notes")
    assert image_folder(folder).ids == before.ids


def test_image_folder_order_is_torchvision_s_whatever_the_listing_order(folder, reversed_listing):
    # Folders are walked in the order the file system lists them: their images came in
    # that order, not in torchvision's make_dataset order (sorted by folder, then name).
    for name in ("cat/z/000.png", "cat/b/000.png", "cat/b/a/000.png"):
        (folder / name).parent.mkdir(exist_ok=True)
        shutil.copy(folder / "cat/000.png", folder / name)
    ids = image_folder(folder).ids
    assert ids[:3] == ["cat/000.png", "cat/001.jpg", "cat/002.jpg"]
    assert ids[8:11] == ["cat/b/000.png", "cat/b/a/000.png", "cat/z/000.png"]


@pytest.mark.parametrize("reverse", [False, True])
def test_a_folder_linked_twice_in_a_class_keeps_the_first_name_in_sorted_order(
    folder, request, reverse
):
    # One folder reached under two names (photos, and links a_link and b_link to it) was
    # walked under the name the file system listed first: ext4 (by hash) and tmpfs kept
    # 'cat/b_link/...' and 'cat/a_link/...' for the same tree, so a store made on one copy
    # was refused on the other as made from other images.
    if reverse:  # (else the file system's own order)
        request.getfixturevalue("reversed_listing")
    (folder / "cat" / "photos").mkdir()
    shutil.copy(folder / "cat/000.png", folder / "cat/photos/x.png")
    for name in ("b_link", "a_link"):
        os.symlink("photos", folder / "cat" / name)
    ids = [i for i in image_folder(folder).ids if i.endswith("x.png")]
    assert ids == ["cat/a_link/x.png"]


def test_image_folder_without_images_in_a_class_is_refused(folder):
    (folder / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no valid file for the classes empty") as info:
        image_folder(folder)
    # What to do, too (torchvision's words said only what was missing).
    assert str(info.value).endswith(
        "is a class: put its images in it, or move it out of the source"
    )


@pytest.mark.parametrize("hidden", [False, True])
def test_a_class_s_own_folder_given_as_the_source_is_told_to_give_the_one_above(folder, hidden):
    # torchvision's "Couldn't find any class folder in data/cat." left it at that.
    cat = sorted(folder.iterdir())[0]
    if hidden:  # a hidden folder beside the images is no class either
        (cat / ".ipynb_checkpoints").mkdir()
    images = sorted(p.name for p in cat.iterdir() if not p.name.startswith("."))
    with pytest.raises(FileNotFoundError) as info:
        open_source(str(cat))
    message = str(info.value)
    assert f"holds {len(images)} images itself (such as {images[0]!r})" in message
    assert "give the folder that holds the class folders" in message
    empty = folder.parent / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"Couldn't find any class folder in .*empty\.$"):
        image_folder(empty)  # nothing to say of images


def test_sources_in_a_folder_whose_name_is_not_utf8_are_refused_by_name(folder, tmp_path):
    # Only the names below the root were checked: h5py refused the root after the model
    # was loaded ("surrogates not allowed").
    root = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    shutil.copytree(folder, os.fsdecode(root))
    with open(os.path.join(root, b"list.csv"), "w") as fh:
        fh.write("cat/000.png,cat\n")
    for source in (root, os.path.join(root, b"list.csv")):
        with pytest.raises(ValueError, match=r"The path '.*caf\\\\xe9' of the image source is not"):
            open_source(os.fsdecode(source))


def test_image_folder_refuses_names_that_are_not_utf8(folder):
    bad = os.path.join(os.fsencode(folder / "cat"), b"bad\xff\xfename.jpg")
    with open(bad, "wb") as fh:
        fh.write((folder / "cat" / "000.png").read_bytes())
    with pytest.raises(ValueError, match=r"1 file or folder names .* not valid UTF-8: 'cat/bad"):
        image_folder(folder)


def test_class_folders_of_one_name_in_two_unicode_forms_are_refused(folder):
    # 'café' typed on Linux (composed) beside 'café' copied from macOS (decomposed) made two
    # classes that print alike, which mr2-probe, matching names in NFC, then refused.
    for name in ("caf\u00e9", "cafe\u0301"):
        shutil.copytree(folder / "cat", folder / name)
    match = r"'cafe\\u0301' and 'caf\\xe9' \(an accent composed in one and decomposed"
    with pytest.raises(ValueError, match=match):
        image_folder(folder)
    shutil.rmtree(folder / "cafe\u0301")  # one form alone is a class as any other
    assert image_folder(folder).class_names == ["caf\u00e9", "cat", "dog"]


@pytest.mark.parametrize("sep", [",", " "])
def test_list_labels_of_one_name_in_two_unicode_forms_are_refused(folder, sep):
    # 'café' composed on one line, decomposed on another: two classes that printed alike.
    (folder / "list.csv").write_text(f"cat/000.png{sep}caf\u00e9\ndog/001.jpg{sep}cafe\u0301\n")
    with pytest.raises(
        ValueError, match=r"The labels .* two Unicode forms, 'cafe\\u0301' and 'caf\\xe9'"
    ):
        image_list(folder / "list.csv")


def test_a_whitespace_separated_list_takes_file_names_with_blanks(folder):
    # The label is the last field: the rest of the line, blanks included, is the path.
    shutil.copy(folder / "cat/000.png", folder / "cat/my photo.png")
    (folder / "list.txt").write_text("cat/my photo.png 1\ndog/001.jpg\t0\n")
    src = image_list(folder / "list.txt")
    assert src.ids == ["cat/my photo.png", "dog/001.jpg"] and src.labels.tolist() == [1, 0]
    assert src.file_size[0] == (folder / "cat/my photo.png").stat().st_size


@pytest.mark.parametrize(
    "line",
    ['"my cat/0 1.png" 1', "'my cat/0 1.png' 1", "'my cat/0 1.png' '1'", 'my\\ cat/"0 1.png" 1',
     "my\\ cat/0\\ 1.png 1"],
)  # fmt: skip
def test_a_blank_separated_list_takes_paths_quoted_as_a_shell_quotes_them(folder, line):
    # The quotes were taken as part of the name: '"my cat/0 1.png"' named no file, and was
    # recorded as failed; so were the backslashes of a name escaped as printf %q writes it.
    (folder / "my cat").mkdir()
    shutil.copy(folder / "cat/000.png", folder / "my cat/0 1.png")
    (folder / "list.txt").write_text(f"dog/001.jpg 0\n{line}\n")
    src = image_list(folder / "list.txt")
    assert src.ids == ["dog/001.jpg", "my cat/0 1.png"] and src.labels.tolist() == [0, 1]
    assert load_image(src, 1).size == (40, 36)


@pytest.mark.parametrize(
    "line",
    ["a b", " a\tb\r ", "'my cat/0 1.png' '1'", '"a \\" b" c', '"a\\\\b" c', '"a\\xb" c',
     "my\\ cat/0\\ 1.png 1", "a'b c'd e", "'' x", 'x ""', "a\u00a0b c", "a\x0bb c", "#a b",
     "'it'\"'\"'s' 1", "'open", '"open', "end\\", '"end\\"', "", "  "],
)  # fmt: skip
def test_a_line_quoted_as_a_shell_quotes_is_split_as_shlex_splits_it(line):
    # shlex's own parser took 15-25 µs a line, most of the time a quoted list took to read.
    assert _split_or_error(_shell_split, line) == _split_or_error(shlex.split, line)


def test_lines_of_quotes_blanks_and_backslashes_are_split_as_shlex_splits_them():
    rng = np.random.default_rng(0)
    characters = np.array(list("ab \t'\"\\é"))
    for codes in rng.integers(0, len(characters), (3000, 12)):
        line = "".join(characters[codes[: codes[0] + 4]])
        assert _split_or_error(_shell_split, line) == _split_or_error(shlex.split, line), line


def _split_or_error(split, line: str) -> list[str] | str:
    try:
        return split(line)
    except ValueError as err:
        return str(err)


def test_a_name_with_quote_characters_is_read_as_it_stands_where_it_exists(folder):
    # An apostrophe or quotes in a file name that exists are characters of the name; in a
    # list quoted as a shell quotes, labels are unquoted too, and a quote left open is said.
    for name in ("it's.png", '"a".png'):
        shutil.copy(folder / "cat/000.png", folder / name)
    (folder / "list.txt").write_text('"a".png 1\nit\'s.png 0\n')
    assert image_list(folder / "list.txt").ids == ['"a".png', "it's.png"]
    (folder / "list.txt").write_text("'dog/001.jpg' 'golden retriever'\n'a\"b.png 1\n")
    with pytest.raises(ValueError, match=r"list.txt:2: not a 'path,label' line \(No closing"):
        image_list(folder / "list.txt")


@pytest.mark.parametrize(
    "name", ["it's 1.png", "Tom's and Ann's.png", "a\\b.png", "my photo.png", 'say "hi".png']
)
def test_a_name_written_as_it_stands_in_a_list_quoted_as_a_shell_quotes_is_read_so(folder, name):
    # Beside a quoted line, a name written as it stands was read as a shell reads it: an
    # apostrophe or a blank refused the list ("No closing quotation", "expected
    # 'path,label' ... read as CSV"), a backslash or two apostrophes made another name
    # ('ab.png', 'Toms and Anns.png'), recorded as failed.
    (folder / "my cat").mkdir()
    shutil.copy(folder / "cat/000.png", folder / "my cat/0 1.png")
    shutil.copy(folder / "cat/000.png", folder / name)
    (folder / "list.txt").write_text(f"'my cat/0 1.png' 1\n{name} 0\ndog/001.jpg owner's\n")
    src = image_list(folder / "list.txt")
    assert src.ids == ["my cat/0 1.png", name, "dog/001.jpg"]
    assert src.class_names == ["0", "1", "owner's"] and src.file_size.min() > 0
    # A line that names no file as it stands is read as a shell reads it, and refused so.
    (folder / "list.txt").write_text("'my cat/0 1.png' 1\nmy gone.png 0\n")
    message = r"list.txt:2: expected 'path,label', got 'my gone.png 0'. The list's lines are"
    with pytest.raises(ValueError, match=message):
        image_list(folder / "list.txt")
    # So is a label with a blank, unquoted: the message said to quote the path alone.
    (folder / "list.txt").write_text("'my cat/0 1.png' 1\ndog/001.jpg golden retriever\n")
    with pytest.raises(ValueError, match=r"quote a path or a label that holds a blank"):
        image_list(folder / "list.txt")
    # A line without a label, its file there, was said to name no file as it stands.
    (folder / "list.txt").write_text("'my cat/0 1.png' 1\ndog/001.jpg\n")
    with pytest.raises(ValueError, match=r"got 'dog/001.jpg' \(a list") as refused:
        image_list(folder / "list.txt")
    assert "names no file" not in str(refused.value)


@pytest.mark.parametrize(
    "label, name", [("'1'", "1"), ('"1"', "1"), ("'owner'\"'\"'s'", "owner's")]
)
def test_a_label_quoted_as_a_shell_quotes_it_after_a_name_as_it_stands_is_read_unquoted(
    folder, label, name
):
    # In a list quoted as a shell quotes, a line whose name needs no quotes (it exists
    # either way) was read as it stands, label too: 'a.jpg "1"' made a class '"1"' of its
    # own, beside the class '1' of the quoted lines.
    (folder / "my cat").mkdir()
    shutil.copy(folder / "cat/000.png", folder / "my cat/0 1.png")
    (folder / "list.txt").write_text(f"'my cat/0 1.png' {label}\ndog/001.jpg {label}\n")
    src = image_list(folder / "list.txt")
    assert src.ids == ["my cat/0 1.png", "dog/001.jpg"]
    assert [src.class_names[k] for k in src.labels] == [name, name]


@pytest.mark.parametrize("stands", ["it's.png", "Tom's and Ann's.png", "a\\b.png"])
@pytest.mark.parametrize("label, name", [("'1'", "1"), ('"1"', "1"), ("1", "1")])
def test_a_label_quoted_after_a_name_that_needs_quotes_as_it_stands_is_read_unquoted(
    folder, stands, label, name
):
    # A name as it stands that a shell reads otherwise (an apostrophe, a backslash) kept
    # its quoted label's quotes: "it's.png '1'" made a class "'1'" of its own.
    (folder / "my cat").mkdir()
    shutil.copy(folder / "cat/000.png", folder / "my cat/0 1.png")
    shutil.copy(folder / "cat/000.png", folder / stands)
    (folder / "list.txt").write_text(f"'my cat/0 1.png' 1\n{stands} {label}\n")
    src = image_list(folder / "list.txt")
    assert src.ids == ["my cat/0 1.png", stands]
    assert [src.class_names[k] for k in src.labels] == ["1", name]


@pytest.mark.parametrize("beside", ["target", "target, quoted", "link", "annex"])
def test_a_linked_list_reads_the_images_beside_it_or_beside_its_target(folder, tmp_path, beside):
    # A dataset's list linked into a project read its images beside the link: none there,
    # every image recorded as failed (the store named the target as its list). A list kept
    # by git-annex links to an object in its store: its images lie beside the link.
    (tmp_path / "work").mkdir()
    lines = "cat/000.png cat\ndog/001.jpg dog\n"
    if "quoted" in beside:  # (quotes that name a file beside the target alone)
        lines = "'cat/000.png' cat\n'dog/001.jpg' dog\n"
    if beside.startswith("target"):
        (folder / "list.txt").write_text(lines)
        os.symlink(folder / "list.txt", tmp_path / "work/list.txt")
        linked, expected = tmp_path / "work/list.txt", folder
    else:
        objects = tmp_path / ("work/.git/annex/objects/ab/cd" if beside == "annex" else "work")
        objects.mkdir(parents=True, exist_ok=True)
        (objects / "SHA256E-s30--ef.txt").write_text(lines)
        os.symlink(objects / "SHA256E-s30--ef.txt", folder / "list.txt")
        linked, expected = folder / "list.txt", folder
    src = image_list(linked)
    assert src.root == str(expected) and src.file_size.min() > 0
    assert all(load_image(src, i).size == (40, 36) for i in range(len(src)))


@pytest.mark.parametrize("beside", ["target", "link"])
def test_a_linked_list_is_read_once(folder, tmp_path, monkeypatch, beside):
    # Its lines were read twice, beside the link and beside its target, to decide which
    # folder it names: 0.23 s of CPU for 100,000 lines, not 0.11.
    lines = ["cat/000.png,cat", *(f"{k}.png,dog" for k in range(50))]
    (tmp_path / "work").mkdir()
    list_file, expected = tmp_path / "work/list.csv", folder
    if beside == "target":
        (folder / "list.csv").write_text("\n".join(lines) + "\n")
        os.symlink(folder / "list.csv", list_file)
    else:
        (tmp_path / "l.csv").write_text("\n".join(lines) + "\n")
        list_file, expected = folder / "list.csv", folder
        os.symlink(tmp_path / "l.csv", list_file)
    read, reader = [], csv.reader
    monkeypatch.setattr(
        csv, "reader", lambda lines, **kw: read.append(lines) or reader(lines, **kw)
    )
    src = image_list(list_file)
    assert src.root == str(expected) and len(src) == 51 and src.file_size[0] > 0
    assert len(read) == 51


def test_a_tab_separated_list_takes_labels_with_blanks(folder):
    # A tab on every line: the label is the field after it. "golden retriever/1.png<TAB>
    # golden retriever" was the image 'golden retriever/1.png<TAB>golden' (no such file,
    # recorded as failed) of a class 'retriever'.
    (folder / "golden retriever").mkdir()
    shutil.copy(folder / "cat/000.png", folder / "golden retriever/1.png")
    lines = ["golden retriever/1.png\tgolden retriever", "dog/001.jpg\t\tdog "]
    (folder / "list.tsv").write_text("\n".join(lines) + "\n")
    src = image_list(folder / "list.tsv")
    assert src.ids == ["golden retriever/1.png", "dog/001.jpg"]
    assert src.class_names == ["dog", "golden retriever"] and src.labels.tolist() == [1, 0]


@pytest.mark.parametrize("header", [False, True])
def test_a_tab_separated_list_quoted_as_the_csv_module_quotes_is_read_unquoted(folder, header):
    # csv.writer(f, delimiter="\t", quoting=csv.QUOTE_ALL): its quotes were kept, every
    # image '"cat/000.png"' failed, of a class '"cat"' (a header: refused as "looks like one").
    rows = [["path", "label"]] * header + [
        ["cat/000.png", "golden retriever"],
        ["dog/001.jpg", "dog"],
    ]
    with open(folder / "list.tsv", "w", newline="") as f:
        csv.writer(f, delimiter="\t", quoting=csv.QUOTE_ALL).writerows(rows)
    src = image_list(folder / "list.tsv")
    assert (src.ids, src.class_names) == (
        ["cat/000.png", "dog/001.jpg"],
        ["dog", "golden retriever"],
    )
    assert src.file_size.min() > 0


@pytest.mark.parametrize(
    "text",
    [
        '"c/9.png"\t"golden retriever"\n"c/8.png"\t"cat"\n',
        "'c/9.png' 'golden retriever'\n'c/8.png' cat\n",
        '"c/9"\t"golden retriever"\n"c/8"\t"cat"\n',
        "'c/9' 'golden retriever'\n'c/8' cat\n",
        '"c/9" cat\n"c/8" "golden retriever"\n',
    ],
)
def test_a_quoted_list_of_missing_images_is_read_unquoted(tmp_path, text):
    # Its images missing (not yet there), no line told its readings apart: read with its
    # quotes, the image '"c/9.png"' of a class '"cat"' (or "'c/9.png' 'golden" of a class
    # "retriever'"), where the same list read with its images present was unquoted. Without
    # an extension to tell its readings apart, a path quoted whole is read unquoted too: it
    # was recorded as "'c/9'" (in a class '"cat"'), and said so in the store's failures and
    # the warnings, where the image found was 'c/9', as the csv module and a shell read it.
    (tmp_path / "l.txt").write_text(text)
    missing = image_list(tmp_path / "l.txt")
    ids = ["c/9.png", "c/8.png"] if ".png" in text else ["c/9", "c/8"]
    assert (missing.ids, missing.class_names) == (ids, ["cat", "golden retriever"])
    (tmp_path / "c").mkdir()
    for path in ids:
        (tmp_path / path).write_bytes(b"not decoded here")
    found = image_list(tmp_path / "l.txt")
    assert (found.ids, found.class_names) == (missing.ids, missing.class_names)
    assert (found.file_size > 0).all()


@pytest.mark.parametrize(
    "line, module, name",
    [("a/{}.png 'cat'", shlex, "split"), ('a/{}.png\t"cat"', csv, "reader")],
)
def test_a_list_whose_labels_alone_are_quoted_is_parsed_once_a_line(
    tmp_path, monkeypatch, line, module, name
):
    # No line's two readings differ in its path: each line was parsed twice, once to find
    # whether the first line that differs quotes its path whole, which only a list that no
    # file or extension tells how to read asks.
    from extract._list_lines import _list_format

    lines = [line.format(k) for k in range(200)]
    parsed, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kw: parsed.append(args) or real(*args, **kw))
    assert _list_format(tmp_path, lines) == (None if module is shlex else "\t")
    assert len(parsed) == len(lines)


@pytest.mark.parametrize(
    "text, class_names",
    [
        ("a/1.png 'cat'\nb/2.png 'dog'\n", ["cat", "dog"]),
        ('a/1.png\t"cat"\nb/2.png\t"dog"\n', ["cat", "dog"]),
        ('a/1.png "cat"\nb/2.png dog\n', ["cat", "dog"]),
        ("a/1.png " + shlex.quote("it's") + "\nb/2.png dog\n", ["dog", "it's"]),
        ('a/1.png\t"it\'s"\nb/2.png\t"5"" screen"\n', ['5" screen', "it's"]),
        # A quote within a label, or one that opens it alone, is the label's: as written.
        ("a/1.png it's\nb/2.png 'dog\n", ["'dog", "it's"]),
        ('a/1.png\tit\'s\nb/2.png\tthe "dog"\n', ["it's", 'the "dog"']),
        ('a/1.png\t"big" cat\nb/2.png\tdog\n', ['"big" cat', "dog"]),
    ],
)
def test_labels_alone_quoted_are_read_unquoted(tmp_path, text, class_names):
    # Quoted as csv.writer (QUOTE_ALL, QUOTE_NONNUMERIC) or shlex.quote quote labels, with
    # paths that need no quotes: the quotes were kept, the classes "'cat'" and "'dog'".
    (tmp_path / "l.txt").write_text(text)
    missing = image_list(tmp_path / "l.txt")
    assert (missing.ids, missing.class_names) == (["a/1.png", "b/2.png"], class_names)
    for path in missing.ids:
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_bytes(b"not decoded here")
    found = image_list(tmp_path / "l.txt")
    assert (found.ids, found.class_names) == (missing.ids, class_names)


@pytest.mark.parametrize("text", ['"c/9""x"\t"cat"\n"c/8"\t"dog"\n', '"c/9""x.png"\tcat\n'])
def test_a_path_quoted_whole_with_a_doubled_quote_is_read_as_the_csv_module_reads_it(
    tmp_path, text
):
    # A quote doubled in a path quoted whole as the csv module quotes it: its images
    # missing, the list was read with its quotes kept, the image '"c/9""x"' of a class
    # '"cat"' (a first line without a digit refused as a header), where with them found it
    # was read as 'c/9"x'.
    (tmp_path / "l.tsv").write_text(text)
    missing = image_list(tmp_path / "l.tsv")
    ids = [next(csv.reader([line], delimiter="\t"))[0] for line in text.splitlines()]
    assert missing.ids == ids
    (tmp_path / "c").mkdir()
    for path in ids:
        (tmp_path / path).write_bytes(b"not decoded here")
    found = image_list(tmp_path / "l.tsv")
    assert (found.ids, found.class_names) == (missing.ids, missing.class_names)
    assert (found.file_size > 0).all()


def test_a_quote_in_the_names_of_a_tab_separated_list_is_read_as_it_stands(folder):
    # Read as the csv module reads it, '"a".png' was the file 'a.png' (no such file).
    shutil.copy(folder / "cat/000.png", folder / '"a".png')
    (folder / "list.tsv").write_text('"a".png\t"cat"\ndog/001.jpg\tdog\n')
    src = image_list(folder / "list.tsv")
    assert src.ids == ['"a".png', "dog/001.jpg"] and src.file_size.min() > 0


@pytest.mark.parametrize("line", ["\t{path} {label}", "{path} {label}\t", "{path} \t {label}"])
def test_a_tab_around_a_blank_separated_line_is_no_separator(folder, line):
    # A tab that begins or ends every line (an indented list, a trailing tab) is no field
    # separator: the lines were refused as "expected 'path,label'".
    pairs = [("cat/000.png", "cat"), ("dog/001.jpg", "dog")]
    lines = [line.format(path=path, label=label) for path, label in pairs]
    (folder / "list.txt").write_text("\n".join(lines) + "\n")
    src = image_list(folder / "list.txt")
    assert (src.ids, src.class_names) == (["cat/000.png", "dog/001.jpg"], ["cat", "dog"])


@pytest.mark.parametrize("n_lines", [1, 2])
@pytest.mark.parametrize("name", ["{}.png", "{}\tc.png"])  # (two tabs: three fields at tabs)
def test_a_tab_in_the_file_names_of_a_blank_separated_list_is_no_separator(folder, n_lines, name):
    # Every path holding a tab made every line hold one: the list was read as tab-separated,
    # the image 'a' of a class 'b/0.png cat' (or refused, its first line taken for a header).
    (folder / "a\tb").mkdir()
    pairs = [("a\tb/" + name.format(0), "cat"), ("a\tb/" + name.format(1), "dog")][:n_lines]
    for path, _ in pairs:
        shutil.copy(folder / "cat/000.png", folder / path)
    (folder / "list.txt").write_text("".join(f"{path} {label}\n" for path, label in pairs))
    src = image_list(folder / "list.txt")
    assert (src.ids, src.class_names) == ([p for p, _ in pairs], [y for _, y in pairs])


@pytest.mark.parametrize("sep", ["\t", ";"])
@pytest.mark.parametrize("first", ["cat/000.png", "cat/999.png"])
def test_a_tab_separated_list_is_told_from_one_with_tabs_in_its_paths_at_once(
    folder, monkeypatch, sep, first
):
    # Labels with blanks split two ways on every line: both paths of each line were looked
    # up, two look-ups for each image of a list of 100,000 (5.9 s of CPU, not 2.7), where
    # its first line names no file either way (its images missing: 400,000 look-ups for
    # 200,000 lines); its first line decides, by the file it names, else by the reading
    # whose path is an image's ('cat/999.png', not 'cat/999.png<TAB>golden'). Separated by
    # semicolons, its images missing, the list was read at its blanks: the image
    # 'cat/999.png;golden' of a class 'retriever'.
    lines = [f"{first}{sep}golden retriever", *(f"{k}.png{sep}pug dog" for k in range(50))]
    (folder / "list.txt").write_text("\n".join(lines) + "\n")
    looked_up = []
    for name in ("lexists", "isfile"):
        real = getattr(os.path, name)
        monkeypatch.setattr(
            os.path, name, lambda path, real=real: looked_up.append(str(path)) or real(path)
        )
    src = image_list(folder / "list.txt")
    assert src.class_names == ["golden retriever", "pug dog"] and len(src) == 51
    assert src.ids[:2] == [first, "0.png"]
    read_at_blanks = [p for p in looked_up if p.endswith((f"{sep}golden", f"{sep}pug"))]
    assert len(read_at_blanks) <= 1, read_at_blanks[:3]  # (the first line's, at most)


@pytest.mark.parametrize("first, later", [("img1", "img2"), ("a/1.gif", "b/2.gif")])
def test_a_semicolon_list_whose_first_image_is_missing_is_read_at_a_later_one(
    tmp_path, first, later
):
    # No image's extension tells its first line's readings apart, and it names no file
    # either way: a later line whose image is there decides, where the list was read at
    # its blanks, the images 'img1;golden' and 'img2;dog' of classes 'retriever' and 'x'.
    (tmp_path / later).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / later).write_bytes(b"x")
    (tmp_path / "l.txt").write_text(f"{first};golden retriever\n{later};dog x\n")
    src = image_list(tmp_path / "l.txt")
    assert (src.ids, src.class_names) == ([first, later], ["dog x", "golden retriever"])


@pytest.mark.parametrize("sep, ids, class_names", [
    (";", ["scans/0000;golden", "scans/0001;golden"], ["retriever"]),
    ("\t", ["scans/0000", "scans/0001"], ["golden retriever"]),
])  # fmt: skip
def test_a_list_of_missing_images_without_extensions_is_told_how_to_read_in_a_few_look_ups(
    tmp_path, monkeypatch, sep, ids, class_names
):
    # No extension tells a line's two readings apart and no file either: both paths of every
    # line were looked up (200,000 lines, 400,000 look-ups); the folder they name is listed.
    (tmp_path / "l.txt").write_text(
        "".join(f"scans/{k:04d}{sep}golden retriever\n" for k in range(2000))
    )
    looked_up = []
    for module, name in [(os.path, "lexists"), (os.path, "isfile"), (os, "listdir"),
                         (os, "scandir")]:  # fmt: skip
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *path, real=real: looked_up.append(path) or real(*path)
        )
    src = image_list(tmp_path / "l.txt")
    assert (src.ids[:2], src.class_names, len(src)) == (ids, class_names, 2000)
    assert len(looked_up) <= 70, looked_up[:72]  # (64 one by one, then a listing)


def test_a_list_of_one_image_a_folder_lists_no_folder(tmp_path, monkeypatch):
    # Its images missing, no extension telling its readings apart, each line in a folder
    # of its own (a patient's, a sample's): after its first 64 names, each was looked up
    # in a listing of its folder, made for it alone (a listing a line, slower than the two
    # look-ups it replaced, and kept).
    from extract._list_lines import _list_format

    lines = [f"scans/{k:03d}/img;golden retriever" for k in range(200)]
    for k in range(200):
        (tmp_path / f"scans/{k:03d}").mkdir(parents=True)
    listed, real = [], os.listdir
    monkeypatch.setattr(os, "listdir", lambda *path: listed.append(path) or real(*path))
    assert _list_format(tmp_path, lines) is None
    assert listed == []


@pytest.mark.parametrize("there, ids, class_names", [
    ("img{};dog", ["img0;golden", "img{};dog"], ["retriever", "x"]),
    ("img{}", ["img0", "img{}"], ["dog x", "golden retriever"]),
    ("IMG{}", None, None),  # (the same file where the file system ignores case)
])  # fmt: skip
@pytest.mark.parametrize("n", [40, 64, 100, 128])  # (blocks of 64 lines read at once)
def test_a_later_line_of_a_long_list_decides_by_its_file_in_its_folders_listing(
    tmp_path, there, ids, class_names, n
):
    # Its first lines' images missing, later lines are looked up in their folder's listing:
    # the file that one reading alone names decides, as each line's look-ups decided, in
    # whichever block of lines it is (a block where none can decide is passed over).
    (tmp_path / there.format(n)).write_bytes(b"x")
    if ids is None:  # (a file system that ignores case finds 'img40' all the same)
        named = os.path.lexists(tmp_path / f"img{n}")
        ids = ["img0", "img{}"] if named else ["img0;golden", "img{};dog"]
        class_names = ["dog x", "golden retriever"] if named else ["retriever", "x"]
    lines = [f"img{k};golden retriever" for k in range(n)] + [f"img{n};dog x"]
    (tmp_path / "l.txt").write_text("\n".join(lines) + "\n")
    src = image_list(tmp_path / "l.txt")
    assert ([src.ids[0], src.ids[-1]], src.class_names) == (
        [ids[0], ids[1].format(n)],
        class_names,
    )


def _nfd_casefold(name):
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", name).casefold())


def _simple_upper(name):  # (NTFS: each character's one-character capital, if any)
    return "".join(c.upper() if len(c.upper()) == 1 else c for c in name)


@pytest.mark.parametrize("stored, name", [
    ("IMG40", "img40"), ("img40", "IMG40"), ("img41", "img40"),
    ("e\u0301te\u0301.png", "\u00e9t\u00e9.png"), ("\u00c9T\u00c9.PNG", "e\u0301te\u0301.png"),
    ("\u0131.png", "I.PNG"), ("\u017f.png", "S.PNG"), ("\u212a.png", "k.png"),
    ("stra\u00dfe", "STRASSE"), ("\u00c5", "\u212b"), ("\u03c3", "\u03c2"),
])  # fmt: skip
@pytest.mark.parametrize("fold", [_nfd_casefold, _simple_upper, str.lower])
def test_a_folders_listing_finds_what_a_file_system_that_ignores_case_or_forms_finds(
    monkeypatch, stored, name, fold
):
    # A file system that ignores case or Unicode forms (APFS, NTFS, ext4's casefold) finds
    # a name spelt otherwise; a listing must find it too, or a later line of a long list
    # read another way than its look-ups read it. (The file systems simulated: the tests'
    # own may tell case apart.)
    from extract._list_lines import _Lexists

    monkeypatch.setattr(os, "listdir", lambda folder: ["other.png", stored])
    monkeypatch.setattr(
        os.path, "lexists", lambda path: fold(os.path.basename(path)) in {fold(stored)}
    )
    assert _Lexists("/x", one_by_one=0)(f"d/{name}") == (fold(name) == fold(stored))
    # Nor is a block of a long list's names passed over as naming no file where one does.
    if fold(name) == fold(stored):
        assert not _Lexists("/x", one_by_one=0).none_of([f"d/{name}", "d/gone.png"])


@pytest.mark.parametrize("line, there, delimiter", [
    ("img/{}.png;golden retriever", True, "csv-semicolon"),
    ("img/{}.png;golden retriever", False, "csv-semicolon"),
    ("img/{}.png;retriever, gold", False, "csv-semicolon"),  # (read otherwise as CSV)
    ("scans/{};golden retriever", True, "csv-semicolon"),
    ("scans/{};golden retriever", False, None),
])  # fmt: skip
def test_a_semicolon_list_is_told_how_to_read_without_the_csv_module_where_unquoted(
    tmp_path, monkeypatch, line, there, delimiter
):
    # Every line was parsed by a csv reader two to four times to tell how to read the list
    # (a reader a line: 2.7 s of CPU for 200,000 lines); a line without a quote is split at
    # its semicolons (and commas) as csv splits it.
    from extract._list_lines import _list_format

    lines = [line.format(k) for k in range(2000)]
    if there:
        path = tmp_path / lines[0].split(";")[0]
        path.parent.mkdir()
        path.write_bytes(b"x")
    parsed, real = [], csv.reader
    monkeypatch.setattr(csv, "reader", lambda *args, **kw: parsed.append(args) or real(*args, **kw))
    assert _list_format(tmp_path, lines) == delimiter
    assert len(parsed) <= 2, parsed[:3]


@pytest.mark.parametrize("line", [
    "", " ", ";", "a;", ";b", "a;;b", "a;b;", "a b;c d", "é;日本", "a\tb;c", "a'b;c", "a\\;b",
    'a;"b"', '"a;b";c', 'a"b;c', '"a""b";c', '"a;b', "a\rb;c", "a;b\r", "a\x00;b",
    "x" * 131_071 + ";y", "x" * 131_073 + ";y",
])  # fmt: skip
@pytest.mark.parametrize("delimiter", [";", ","])
def test_csv_fields_splits_a_line_as_the_csv_module_does(line, delimiter):
    # Split without a reader where csv would split it at its delimiters alone: the same
    # fields, or the same error (an empty line is no field, as csv reads it).
    from extract._list_lines import _csv_fields

    def split(how):
        try:
            return how()
        except csv.Error as err:
            return str(err)

    expected = split(lambda: next(csv.reader([line], delimiter=delimiter)))
    assert split(lambda: _csv_fields(line, delimiter)) == expected


def test_image_list_joined_from_lists_with_byte_order_marks(folder):
    # "CSV UTF-8" lists joined (cat a.csv b.csv): the second list's mark began a line, its
    # header became an image '\ufeffpath' of a class 'label', a path '\ufeffdog/...'
    # named no file.
    bom = "\ufeff"
    (folder / "l.csv").write_text(f"{bom}cat/000.png,cat\n{bom}dog/001.jpg,dog\n")
    src = image_list(folder / "l.csv")
    assert (src.ids, src.class_names) == (["cat/000.png", "dog/001.jpg"], ["cat", "dog"])
    (folder / "l.csv").write_text(f"{bom}path,label\ncat/000.png,cat\n{bom}path,label\n")
    with pytest.raises(ValueError, match="l.csv:3: a second header 'path,label'"):
        image_list(folder / "l.csv")


def test_image_list_with_a_byte_order_mark(folder):
    # Spreadsheet programs save "CSV UTF-8" with a BOM: the header is still the header.
    (folder / "bom.csv").write_text(
        "path,label\r\ncat/000.png,cat\r\ndog/001.jpg,dog\r\n", encoding="utf-8-sig"
    )
    src = image_list(folder / "bom.csv")
    assert (src.ids, src.class_names) == (["cat/000.png", "dog/001.jpg"], ["cat", "dog"])


def test_image_list_bad_line(tmp_path):
    (tmp_path / "l.csv").write_text("a.jpg,cat,extra\n")
    with pytest.raises(ValueError, match="l.csv:1: expected 'path,label'"):
        image_list(tmp_path / "l.csv")
    # A NUL byte: os.stat's bare "embedded null byte", or a class name holding one.
    for text in ("a.jpg\0 cat\n", "b.jpg,cat\na.jpg,cat\0\n"):
        (tmp_path / "l.csv").write_text(text)
        with pytest.raises(ValueError, match=r"l.csv:\d: the line .* holds a NUL byte"):
            image_list(tmp_path / "l.csv")


@pytest.mark.parametrize("name, content, match", [
    # A Latin-1 list: "'utf-8' codec can't decode byte 0xff in position 512", no file named.
    ("l.csv", "caf\xe9.jpg,cat\n".encode("latin-1"), r"l.csv' was read as a list file .* "
     r"not UTF-8 text \(byte 3: invalid .*Save the list as UTF-8"),
    # A tar shard or a Parquet file given without its prefix.
    ("s.tar", b"x" * 100 + b"\xff" * 12, r"write 'webdataset:.*s.tar'"),
    ("t.parquet", b"PAR1\x15\x04\xff", r"write 'parquet:.*t.parquet'"),
    ("one.jpg", b"\xff\xd8\xff\xe0", "A single image is no source"),
    ("s.tar", b"a,b,c\n", r"expected 'path,label'.*write 'webdataset:.*s.tar'"),
    # An archive of class folders: "Save the list as UTF-8" (zip), or a webdataset: source
    # that refuses a compressed tar, then one whose members have no 'cls' label.
    ("photos.zip", b"PK\x03\x04\x14\x00\x00\x00\x08\x00\xff", r"An archive is no source: "
     r"extract it, and give its folder of class folders\.$"),  # (no shards are zips)
    ("photos.tgz", b"\x1f\x8b\x08\x00", "An archive is no source: extract it, and give its "
     r"folder of class folders \(or decompress WebDataset"),
])  # fmt: skip
def test_a_file_that_is_no_list_says_what_it_was_read_as(tmp_path, name, content, match):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=match):
        open_source(tmp_path / name)


@pytest.mark.parametrize(
    "lines, match",
    [
        # Another header: it became an image of a class "label", and turned the integer
        # labels into names sorted as text ("10" before "2").
        (["filename,label", "cat/000.png,0", "dog/001.jpg,1"], r"l.csv:1: 'filename,label' looks"),
        (["cat/000.png,cat", "dog/001.jpg,"], "l.csv:2: 'dog/001.jpg' has an empty label"),
        # Lists joined with their headers (cat a.csv b.csv): the second header was an image
        # 'path' of a class 'label' (with index labels, every class read as a name).
        (["path,label", "cat/000.png,0", "Path,Label", "dog/001.jpg,1"], r"l.csv:3: a second"),
        # A line without a path was an image (the list's own folder), recorded as failed.
        (["cat/000.png,cat", " ,dog"], "l.csv:2: the image labelled 'dog' has an empty path"),
        (["cat/000.png,cat", "./cat/000.png,dog"], r"l.csv:2: './cat/000.png' is listed again"),
        # A third column is refused, not read as a file name with commas.
        (["a.jpg,cat,taken in 2020", "b.jpg,dog,taken in 2020"], "l.csv:1: expected 'path,"),
        # A field over csv's limit (a JSON file given by mistake): csv.Error, a traceback.
        (['{"x": "' + "y" * 150_000 + '", "l": [1, 2]}'], r"l.csv:1: not a 'path,label' line"),
        # Ids taken for class indices: every index below them became a class name (2.98
        # GiB for 400000002, "use a smaller --batch-size"), and one beyond int64 overflowed.
        (["cat/000.png,400000000", "dog/001.jpg,400000001"], r"the largest, 400000001, would"),
        (["cat/000.png,1", "dog/001.jpg,12345678901234567890"], r"would make 1234567890123456"),
    ],
)
def test_image_list_refuses_what_would_become_wrong_rows(folder, lines, match):
    (folder / "l.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=match):
        image_list(folder / "l.csv")


def test_image_list_header_naming_a_folder_beside_the_list_is_refused(folder):
    # "image,class" above rows of image/...: a folder named image beside the list made
    # the header an image (the folder, recorded as failed) of a class "class", sorted
    # between cat and dog, whose index it shifted.
    (folder / "image").mkdir()
    (folder / "l.csv").write_text("image,class\ncat/000.png,cat\ndog/001.jpg,dog\n")
    with pytest.raises(ValueError, match=r"l.csv:1: 'image,class' looks like a header"):
        image_list(folder / "l.csv")


def test_a_comment_looking_line_of_a_list_is_an_image_and_said(folder, caplog):
    # A line commented out ('#dog/001.jpg,dog') was an image all the same, of a file that
    # does not exist, recorded as failed at the end of the run without a word here.
    caplog.set_level(logging.WARNING, logger="extract")
    (folder / "l.csv").write_text("cat/000.png,cat\n#dog/001.jpg,dog\n# x.png,bird\n")
    src = image_list(folder / "l.csv")
    assert src.ids == ["cat/000.png", "#dog/001.jpg", "# x.png"]
    (said,) = [r.getMessage() for r in caplog.records]
    assert "l.csv: lines 2, 3 ('#dog/001.jpg') start with '#' and name no file" in said
    assert "a list file has no comment syntax" in said
    # A file whose name starts with '#' is an image like any other: nothing to say.
    caplog.clear()
    shutil.copy(folder / "cat" / "000.png", folder / "#1.png")
    (folder / "l.csv").write_text("cat/000.png,cat\n#1.png,dog\n")
    assert image_list(folder / "l.csv").ids == ["cat/000.png", "#1.png"]
    assert not caplog.records
    # A first line such as '# my images' is refused as a header would be, and said so.
    (folder / "l.txt").write_text("# my images\ncat/000.png cat\ndog/001.jpg dog\n")
    with pytest.raises(ValueError, match=r"looks like a header .* no comment syntax: remove it"):
        image_list(folder / "l.txt")
    # In a comma-separated list, a comment line without a comma was said to need quoting.
    (folder / "l.csv").write_text("# made by export.py\ncat/000.png,cat\ndog/001.jpg,dog\n")
    with pytest.raises(ValueError, match=r"l.csv:1: .* list file has no comment syntax: remove"):
        image_list(folder / "l.csv")


@pytest.mark.parametrize("name, sep", [("l.csv", ","), ("l.txt", " ")])
def test_a_list_of_windows_paths_says_so(folder, caplog, name, sep):
    # A list written on Windows (os.path.join: 'cat\\000.png'): every image failed as a
    # missing file, the cause unsaid ('\\' is a character of a file name here).
    caplog.set_level(logging.WARNING, logger="extract")
    (folder / name).write_text(f"cat\\000.png{sep}cat\ndog\\001.jpg{sep}dog\n")
    src = image_list(folder / name)
    assert src.ids == ["cat\\000.png", "dog\\001.jpg"]  # read as written, as before
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(
        f"{folder / name}:1: 'cat\\\\000.png' names no file, but 'cat/000.png' does: the list's "
        "paths are written with Windows' '\\' between folders"
    )
    assert "Write the paths with '/'" in said
    # A file whose name holds a '\\', or a missing one that '/' does not find: unsaid.
    caplog.clear()
    shutil.copy(folder / "cat" / "000.png", folder / "a\\b.png")
    (folder / name).write_text(f"a\\b.png{sep}cat\nx\\gone.png{sep}dog\n")
    assert image_list(folder / name).ids == ["a\\b.png", "x\\gone.png"]
    assert not caplog.records


@pytest.mark.parametrize(
    "text, sep",
    [
        ("label,path\ncat,cat/000.png\ndog,dog/001.jpg\n", ","),
        ("cat,cat/000.png\ndog,dog/001.jpg\n", ","),
        ("cat cat/000.png\ndog dog/001.jpg\n", " "),
        ("Path,Label\ndog,dog/001.jpg\n", ","),
        ("cat;cat/000.png\ndog;dog/001.jpg\n", ";"),
        ("label;path\ncat;cat/000.png\n", ";"),
        ("cat\tcat/000.png\ndog\tdog/001.jpg\n", "<TAB>"),
    ],
)
def test_a_list_of_label_path_lines_is_refused_as_such(folder, text, sep):
    # The columns the other way round: refused as "looks like a header" (without one), or,
    # behind a 'label,path' header, said to be a header of another kind. The line is shown
    # as written, and the columns in the list's own separator: 'cat;cat/000.png' was shown
    # 'cat,cat/000.png', its cure 'path,label', which a list separated by semicolons is not.
    (folder / "l.csv").write_text(text)
    with pytest.raises(ValueError) as info:
        image_list(folder / "l.csv")
    number = 2 if text.startswith("Path") else 1
    line = text.splitlines()[number - 1]
    assert str(info.value) == (
        f"{folder / 'l.csv'}:{number}: {line!r} reads as 'label{sep}path': a list's lines "
        f"are 'path{sep}label', the image first; swap the two columns."
    )


def test_a_list_is_taken_as_label_path_only_where_most_lines_read_so(tmp_path):
    # Its first line alone decided: a missing first image labelled with the name of a file
    # beside the list refused the whole list as 'label,path'; and a 'label,path' list
    # whose first image was missing was not refused as one ("'cat' is listed again").
    root = make_image_folder(tmp_path / "d", n_per_class=2, special=False)
    (root / "bird").write_text("notes on birds")  # a file named as a class
    (root / "l.csv").write_text("gone.png,bird\ncat/000.png,cat\ndog/001.jpg,dog\n")
    src = image_list(root / "l.csv")
    assert src.ids == ["gone.png", "cat/000.png", "dog/001.jpg"]
    assert src.class_names == ["bird", "cat", "dog"]
    (root / "l.csv").write_text("cat,cat/gone.png\ncat,cat/000.png\ndog,dog/001.jpg\n")
    with pytest.raises(ValueError) as info:
        image_list(root / "l.csv")
    assert str(info.value) == (
        f"{root / 'l.csv'}:2: 'cat,cat/000.png' reads as 'label,path': a list's lines are "
        "'path,label', the image first; swap the two columns."
    )
    # Half the lines so (one of two): a list the right way round, its images missing.
    (root / "l.csv").write_text("gone.png,bird\ndog/001.jpg,dog\n")
    assert image_list(root / "l.csv").ids == ["gone.png", "dog/001.jpg"]


def test_a_list_of_missing_images_is_not_looked_up_line_by_line_for_swapped_columns(
    tmp_path, monkeypatch
):
    # A list whose first image is missing (every image, say: paths written from another
    # folder) had each path looked up for 'label,path' columns, half the list, before its
    # images were: only lines whose label names a file can read so, and its labels name
    # its few classes.
    from extract import _image_list

    root = tmp_path / "d"
    root.mkdir()
    lines = [f"img/{i:03d}.jpg,{('cat', 'dog')[i % 2]}\n" for i in range(200)]
    (root / "l.csv").write_text("".join(lines))
    looked_up = []
    isfile = os.path.isfile

    def counted(path):
        looked_up.append(os.fspath(path))
        return isfile(path)

    monkeypatch.setattr(_image_list.os.path, "isfile", counted)
    assert len(image_list(root / "l.csv")) == 200
    assert len(looked_up) <= 4, looked_up[:6]


def test_image_list_refuses_one_file_under_two_spellings(folder):
    for second in (folder / "cat" / "000.png", "dog/../cat/000.png"):
        (folder / "l.csv").write_text(f"cat/000.png,cat\ndog/001.jpg,dog\n{second},dog\n")
        with pytest.raises(ValueError, match=r"l.csv:3: .* is listed again \(first on line 1"):
            image_list(folder / "l.csv")
    # Through a linked folder, ".." is the link target's parent: another file (refused as
    # the same when ".." was taken lexically), or the same one under another name.
    (folder / "other" / "deep").mkdir(parents=True)
    shutil.copy(folder / "cat" / "000.png", folder / "img.png")
    shutil.copy(folder / "cat" / "000.png", folder / "other" / "img.png")
    (folder / "link").symlink_to(folder / "other" / "deep", target_is_directory=True)
    (folder / "l.csv").write_text("img.png,cat\nlink/../img.png,dog\n")
    assert len(image_list(folder / "l.csv")) == 2
    (folder / "l.csv").write_text("other/img.png,cat\nlink/../img.png,dog\n")
    with pytest.raises(ValueError, match=r"l.csv:2: .* is listed again \(first on line 1"):
        image_list(folder / "l.csv")
    # Two entries that link to one object (a content-addressed cache) are two images.
    for name in ("a.png", "b.png"):
        (folder / name).symlink_to(folder / "cat" / "000.png")
    (folder / "l.csv").write_text("a.png,cat\nb.png,dog\n")
    assert image_list(folder / "l.csv").ids == ["a.png", "b.png"]


def test_a_list_resolves_the_folder_of_its_images_once(folder, monkeypatch):
    # Each line's folder was resolved to tell spellings of one file apart (a look-up for
    # each part of its path): 2.7 s of CPU for a list of 100,000 images, not 0.7.
    lines = [f"cat/{k}.png,cat" for k in range(30)] + [f"dog/{k}.jpg,dog" for k in range(30)]
    (folder / "l.csv").write_text("\n".join(lines) + "\n")
    resolved, real = [], os.path.realpath
    monkeypatch.setattr(os.path, "realpath", lambda p, **k: resolved.append(str(p)) or real(p, **k))
    assert len(image_list(folder / "l.csv")) == 60
    assert sorted(p for p in resolved if p.endswith(("cat", "dog"))) == [
        str(folder / "cat"),
        str(folder / "dog"),
    ]


def test_file_names_with_commas_are_quoted_csv(folder):
    shutil.copy(folder / "cat" / "000.png", folder / "cat" / "a,b.png")
    (folder / "l.csv").write_text('"cat/a,b.png",cat\ndog/001.jpg,dog\n')
    src = image_list(folder / "l.csv")
    assert (src.ids, src.class_names) == (["cat/a,b.png", "dog/001.jpg"], ["cat", "dog"])
    # A blank-separated list of it: read as CSV, its line 2 was refused (and a list of such
    # names alone read as the images 'cat/a' of a class 'b.png cat'). Its path names the file.
    for text in ("cat/a,b.png cat\ndog/001.jpg dog\n", "cat/a,b.png cat\ncat/a,b.png,x dog\n"):
        (folder / "l.txt").write_text(text)
        assert image_list(folder / "l.txt").ids[0] == "cat/a,b.png"


@pytest.mark.parametrize(
    "text",
    ['cat/000.png "x, y"\ndog/001.jpg dog\n', "cat/000.png 'x, y'\ndog/001.jpg 'p, q'\n"],
)
def test_a_blank_separated_list_quoting_a_label_with_a_comma_is_read_as_a_shell_does(folder, text):
    # Read as CSV: refused at its line without a comma, its advice to quote the name
    # ('"cat/000.png" "x, y"') refused again; or, every label so, the images
    # 'cat/000.png "x' of a class 'y"', each failed, said nowhere.
    (folder / "l.txt").write_text(text)
    src = image_list(folder / "l.txt")
    assert src.ids == ["cat/000.png", "dog/001.jpg"] and min(src.file_size) > 0
    assert src.class_names[src.labels[0]] == "x, y"
    # A CSV line with a blank after its comma, such a label quoted: three fields, refused.
    (folder / "l.txt").write_text('cat/000.png, "x, y"\ndog/001.jpg, dog\n')
    with pytest.raises(ValueError, match=r"l.txt:1: expected 'path,label'"):
        image_list(folder / "l.txt")


@pytest.mark.parametrize("first", ["cat/000.png", "cat/999.png"])
def test_a_csv_list_with_blanks_in_its_labels_is_told_from_commas_in_names_at_once(
    folder, monkeypatch, first
):
    # Split at its last blank too, each line may be a name with a comma: its first line
    # decides, read as CSV naming a file or neither way naming one (one look-up of a name
    # read so, not one a line: its images missing, 100,000 lines took 200,000 look-ups).
    lines = [f"{first},golden retriever", *(f"{k}.png,pug dog" for k in range(50))]
    (folder / "l.csv").write_text("\n".join(lines) + "\n")
    looked_up, real = [], os.path.isfile
    monkeypatch.setattr(os.path, "isfile", lambda path: looked_up.append(path) or real(path))
    src = image_list(folder / "l.csv")
    assert src.class_names == ["golden retriever", "pug dog"] and len(src) == 51
    read_so = [p for p in map(str, looked_up) if p.endswith((",golden", ",pug"))]
    assert read_so in ([], [str(folder / f"{first},golden")])


@pytest.mark.parametrize(
    "missing, label",
    [("cat/x,1", "cat"), ("my dir/x,1", "cat"), ("a,b,1", "cat"),
     # A quote of the other kind in the name, a label quoted for its blank: the advice
     # quoted "it's,1" (not read as quoted: the list was refused again), and took
     # 'retriever' for the label ('"x,y.png \'golden" retriever\'').
     ("it's,1", "cat"), ('say "hi",1', "cat"), ("x,y.png", "'golden retriever'")],
)  # fmt: skip
def test_a_blank_separated_list_with_a_comma_in_a_missing_name_is_told_a_cure_that_works(
    folder, missing, label
):
    # Read as CSV, its line without a comma was refused, and the advice (a file name with
    # a comma quoted: "a,b.jpg",cat) rewrote the whole list as CSV; quoted so in this list,
    # the name was refused all the same. (Names that no extension tells from CSV's reading:
    # 'cat/x,1.png cat' is read at its blanks, below.)
    (folder / "l.txt").write_text(f"{missing} {label}\ndog/001.jpg dog\n")
    with pytest.raises(ValueError) as info:
        image_list(folder / "l.txt")
    said = str(info.value)
    assert "as line 1, " in said and "holds a comma" in said
    cure = re.search(r"quote that name as a shell quotes it, (.*)\)\.$", said)[1]
    quote = "'" if '"' in missing else '"'
    assert cure == f"{quote}{missing}{quote} {label}"
    (folder / "l.txt").write_text(f"{cure}\ndog/001.jpg dog\n")  # the advice, followed
    src = image_list(folder / "l.txt")
    (name,) = shlex.split(label)
    assert (src.ids, src.class_names) == ([missing, "dog/001.jpg"], sorted([name, "dog"]))
    assert src.file_size[0] < 0 < src.file_size[1]  # recorded as failed, as it is missing
    # So is its other cure, the list written as CSV.
    with open(folder / "l.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([[missing, name], ["dog/001.jpg", "dog"]])
    assert image_list(folder / "l.csv").ids == [missing, "dog/001.jpg"]


@pytest.mark.parametrize(
    "text",
    [
        "a,b.png cat\nc,d.png cat\ne,f.png dog\n",
        "cat/x,y.png cat\ndog/001.jpg dog\n",
        "my dir/x,y.png cat\nit's,a.png dog\na,b,c.png dog\n",
    ],
)
def test_a_blank_separated_list_with_commas_in_missing_names_is_read_as_when_found(
    tmp_path, caplog, text
):
    # Its images missing, it was read as CSV, the images 'a', 'c' and 'e' of classes
    # 'b.png cat', ..., without a word (or refused at a line without a comma), where with
    # its images found it was read at its blanks: the path read so alone is an image's.
    caplog.set_level(logging.WARNING, logger="extract")
    (tmp_path / "l.txt").write_text(text)
    rows = [line.rsplit(None, 1) for line in text.splitlines()]
    missing = image_list(tmp_path / "l.txt")
    assert missing.ids == [path for path, _ in rows] and (missing.file_size < 0).all()
    assert missing.class_names == sorted({label for _, label in rows})
    assert not caplog.records
    for path, _ in rows:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"not decoded here")
    found = image_list(tmp_path / "l.txt")
    assert (found.ids, found.class_names) == (missing.ids, missing.class_names)


def test_a_list_that_reads_as_csv_or_at_its_blanks_alike_is_said(tmp_path, caplog):
    # Every line splits in two at a comma and at its last blank, no image is found and no
    # extension tells the readings apart: read as CSV, the image 's1' of a class
    # 'x golden', without a word; with its images found it was read at its blanks.
    caplog.set_level(logging.WARNING, logger="extract")
    text = "s1,x golden\ns2,x golden\ns3,y pug\n"
    (tmp_path / "l.txt").write_text(text)
    assert image_list(tmp_path / "l.txt").ids == ["s1", "s2", "s3"]
    (said,) = [r.getMessage() for r in caplog.records]
    assert said == (
        f"{tmp_path / 'l.txt'}:1: 's1,x golden' is read as CSV, the image 's1' of a class "
        "'x golden', where at its last blank it reads as 's1,x' of a class 'golden': no "
        "image of the list is found, and no extension tells the two apart. If its lines are "
        "'path label' lines with a comma in a file name, quote that name as a shell quotes "
        "it (\"s1,x\" golden); if the list is CSV, put the header 'path,label' before its "
        "first line."
    )
    # Either cure, followed, reads the list its way, unsaid.
    for cure, ids in [
        ('"s1,x" golden\n"s2,x" golden\n"s3,y" pug\n', ["s1,x", "s2,x", "s3,y"]),
        ("path,label\n" + text, ["s1", "s2", "s3"]),
        ("Path, Label\n" + text, ["s1", "s2", "s3"]),
    ]:
        caplog.clear()
        (tmp_path / "l.txt").write_text(cure)
        assert image_list(tmp_path / "l.txt").ids == ids
        assert not caplog.records
    # A CSV list of labels with blanks whose paths are images': CSV, unsaid.
    (tmp_path / "l.txt").write_text("s1.png,x golden\ns2.png,x golden\n")
    assert image_list(tmp_path / "l.txt").ids == ["s1.png", "s2.png"]
    assert not caplog.records
    # Its images found, at its blanks, as before.
    for name in ("s1,x", "s2,x", "s3,y"):
        (tmp_path / name).write_bytes(b"not decoded here")
    (tmp_path / "l.txt").write_text(text)
    assert image_list(tmp_path / "l.txt").ids == ["s1,x", "s2,x", "s3,y"]
    assert not caplog.records


@pytest.mark.parametrize(
    "text",
    [
        "my scans/0001,cat\nmy scans/0002,cat\n",
        "scan 1,dog\nscan 2,dog\n",
        "img1, cat\nimg2, cat\n",  # (CSV written with a blank after its commas)
        '"my scans/0001",cat\n"my scans/0002",cat\n',
        '"n01,a",golden retriever\n"n02,b",golden retriever\n',
    ],
)
def test_an_ordinary_csv_list_of_missing_images_is_not_said_to_read_at_its_blanks(
    tmp_path, caplog, text
):
    # Its images missing, no extension: the path read at its last blank holds no comma
    # ('my' of a class 'scans/0001,cat'), or one only at its end ('img1,' of a class 'cat'),
    # or the path is quoted as CSV quotes it. Such a list was said to be 'path label' lines
    # with commas in their file names, and told to quote the name as a shell does ('"my"
    # scans/0001,cat'), a cure that read it as CSV.
    caplog.set_level(logging.WARNING, logger="extract")
    (tmp_path / "l.csv").write_text(text)
    src = image_list(tmp_path / "l.csv")
    assert src.ids == [next(csv.reader([line]))[0] for line in text.splitlines()]
    assert not [r for r in caplog.records if "is read as CSV" in r.getMessage()]


@pytest.mark.parametrize("found", [False, True])
def test_a_csv_list_with_a_blank_after_its_commas_is_not_said_to_read_at_its_blanks(
    tmp_path, caplog, found
):
    # CSV written by hand, a blank after its comma, of labels with a blank, its images
    # missing: every such list was said to be, perhaps, the file 'n01, golden' of a class
    # 'retriever'. Nor where a folder is so named: it is no image, and quoting its name, the
    # cure the warning gave, did nothing for it.
    caplog.set_level(logging.WARNING, logger="extract")
    (tmp_path / "l.csv").write_text("n01, golden retriever\nn02, golden retriever\n")
    if found:
        (tmp_path / "n01, golden").mkdir()
    src = image_list(tmp_path / "l.csv")
    assert (src.ids, src.class_names) == (["n01", "n02"], ["golden retriever"])
    said = [r.getMessage() for r in caplog.records if "is read as CSV" in r.getMessage()]
    assert said == []


@pytest.mark.parametrize(
    "first", ["cat/000.png,golden retriever", "cat/999.png,golden retriever", "cat/000.png,cat"]
)
def test_a_line_mistyped_in_a_csv_list_is_told_the_csv_cure_alone(folder, first):
    # Its other lines CSV (a label with a blank, the image read so alone, or no blank):
    # the advice told a second cure too, for 'path label' lines with a comma in a name
    # ('"cat/000.png,golden" retriever'), which applies to no line of it.
    (folder / "l.csv").write_text(f"{first}\ndog/001.jpg dog\n")
    with pytest.raises(ValueError, match=r"l.csv:2: expected 'path,label'") as info:
        image_list(folder / "l.csv")
    said = str(info.value)
    assert f"as line 1, {first!r}, is: write each line 'path,label'" in said
    assert "shell" not in said and "'path label' lines" not in said
    (folder / "l.csv").write_text(f"{first}\ndog/001.jpg,dog\n")  # the advice, followed
    assert image_list(folder / "l.csv").ids == [first.split(",")[0], "dog/001.jpg"]


@pytest.mark.parametrize(
    "lines, ids, class_names",
    [
        (["cat/000.png;cat", "dog/001.jpg;dog"], ["cat/000.png", "dog/001.jpg"], ["cat", "dog"]),
        (["Path;Label", "cat/000.png;cat"], ["cat/000.png"], ["cat"]),
        # Quoted as csv quotes a name with a semicolon; a label with a blank; a name with
        # a comma, left unquoted as semicolons separate.
        (['"cat/a;b.png";golden retriever', "cat/a,b.png;cat"], ["cat/a;b.png", "cat/a,b.png"],
         ["cat", "golden retriever"]),
    ],
)  # fmt: skip
def test_a_list_separated_by_semicolons_is_read_as_csv(folder, lines, ids, class_names):
    # CSV as spreadsheet programs write it where a comma is the decimal separator was
    # refused: "expected 'path,label', got 'cat/000.png;cat'".
    for name in ("a;b.png", "a,b.png"):
        shutil.copy(folder / "cat/000.png", folder / "cat" / name)
    (folder / "l.csv").write_text("\n".join(lines) + "\n")
    src = image_list(folder / "l.csv")
    assert (src.ids, src.class_names) == (ids, class_names)
    assert src.file_size.min() > 0


@pytest.mark.parametrize(
    "lines, ids",
    [
        (["cat/000.png;cat", "dog/001.jpg;dog"], ["cat/000.png", "dog/001.jpg"]),
        (['"a,b.png";cat', "c.png;dog"], ["a,b.png", "c.png"]),
        # Split at its blanks as it stands: a semicolon in its names.
        (["a;0.png cat", "a;1.png dog"], ["a;0.png", "a;1.png"]),
    ],
)
def test_a_list_separated_by_semicolons_of_missing_images_records_them_as_failed(
    tmp_path, lines, ids
):
    # No line named a file either way: read at its blanks, it was refused ("expected
    # 'path,label', got 'cat/000.png;cat'"), where a comma-separated one records them.
    (tmp_path / "l.csv").write_text("\n".join(lines) + "\n")
    src = image_list(tmp_path / "l.csv")
    assert (src.ids, src.class_names) == (ids, ["cat", "dog"])
    assert (src.file_size < 0).all()
    # A file named with a semicolon, listed without a label: refused as before.
    (tmp_path / "a;b.png").write_bytes(b"")
    (tmp_path / "n.csv").write_text("a;b.png\n")
    with pytest.raises(ValueError, match=r"n.csv:1: expected 'path,label', got 'a;b.png'"):
        image_list(tmp_path / "n.csv")


@pytest.mark.parametrize(
    "lines, ids, names",
    [
        (["path;label", "a;1.png 3"], ["a"], ["1.png 3"]),
        (["PATH;Label", "a;1.png\t3", "b;2.png"], ["a", "b"], ["1.png\t3", "2.png"]),
        (["b.jpg;golden retriever", "x;1.png,3"], ["b.jpg", "x"], ["1.png,3", "golden retriever"]),
    ],
)
def test_a_list_of_missing_images_with_a_semicolon_header_or_image_is_read_at_semicolons(
    tmp_path, lines, ids, names
):
    # A path read at its blanks (or commas) an image's, 'x;1.png', made it read so, its
    # 'path;label' header, or the image 'b.jpg' read at its semicolons, refused at line 1.
    (tmp_path / "l.txt").write_text("\n".join(lines) + "\n")
    src = image_list(tmp_path / "l.txt")
    assert (src.ids, src.class_names) == (ids, names)


@pytest.mark.parametrize(
    "lines, number, line",
    [(["x;1.png 3", "y;2.png"], 2, "y;2.png"), (["x;1.png\t3", "y;2.png"], 2, "y;2.png")],
)
def test_a_line_without_its_label_in_a_list_with_semicolons_in_its_names_is_named(
    tmp_path, lines, number, line
):
    # Its images missing, it was read at its semicolons (line 2 no 'path label' line) and
    # refused at line 1 as a header 'x,1.png 3': a path read otherwise is an image's.
    (tmp_path / "l.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"l.txt:{number}: expected 'path,label', got {line!r}"):
        image_list(tmp_path / "l.txt")


@pytest.mark.parametrize(
    "line, label",
    [("{},cat", "cat"), ("{}\tgolden retriever", "golden retriever"), ("{} cat", "cat"),
     ("'{}' 'cat'", "cat")],
)  # fmt: skip
def test_a_semicolon_in_the_names_of_a_list_separated_otherwise_is_read_as_it_stands(
    folder, line, label
):
    # (a folder 'a' too: read at its semicolons, each line names it all the same)
    (folder / "a").mkdir()
    names = ["a;0.png", "a;1.png"]
    for name in names:
        shutil.copy(folder / "cat/000.png", folder / name)
    (folder / "l.txt").write_text("".join(line.format(name) + "\n" for name in names))
    src = image_list(folder / "l.txt")
    assert src.ids == names and src.class_names == [label]


@pytest.mark.parametrize(
    "lines",
    [
        ["missing.jpg,dog", "cat/000.png,cat", "dog/001.jpg,cat"],  # a file name
        ["missing,3", "cat/000.png,0", "dog/001.jpg,1"],  # an index
        # No extension, but a label that another line has: no header's column name.
        ["missing,cat", "cat/000.png,cat", "dog/001.jpg,dog"],
        # An image without an extension (a content-addressed name) that is there.
        ["cat/0001,dog", "cat/000.png,cat", "dog/001.jpg,cat"],
        # A name too long for the file system (an OSError, 'File name too long', refused
        # the list): a failed image when read, as other lines' are.
        ["x" * 300 + ".jpg,dog", "cat/000.png,cat", "dog/001.jpg,cat"],
    ],
)
def test_a_first_image_missing_with_its_own_label_is_no_header(folder, lines):
    shutil.copy(folder / "cat/000.png", folder / "cat/0001")
    (folder / "l.csv").write_text("\n".join(lines) + "\n")
    assert image_list(folder / "l.csv").ids[0] == lines[0].split(",")[0]


@pytest.mark.parametrize("name, sep", [("l.txt", " "), ("l.csv", ","), ("l.csv", ";")])
def test_a_first_image_without_extension_missing_with_its_own_label_is_a_row(
    folder, caplog, name, sep
):
    # A content-addressed name ('scan0001', no extension) missing, of a class no other line
    # has: the line was taken for a header and the list refused, not read as an image.
    caplog.set_level(logging.WARNING, logger="extract")
    lines = [f"scan0001{sep}bird", f"cat/000.png{sep}cat", f"dog/001.jpg{sep}dog"]
    (folder / name).write_text("\n".join(lines) + "\n")
    src = image_list(folder / name)
    assert (src.ids, src.class_names) == (["scan0001", "cat/000.png", "dog/001.jpg"],
                                          ["bird", "cat", "dog"])  # fmt: skip
    assert src.file_size.tolist()[0] < 0 and min(src.file_size.tolist()[1:]) > 0  # failed
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"{folder / name}:1: 'scan0001' names no file and no other line")
    assert said.endswith(f"if the line is a header, write it 'path{sep}label'.")  # (its separator)


@pytest.mark.parametrize(
    "first", ["filename,class", "image_path,species", "ImageFile,breed", "id,Label", "img,y"]
)
def test_a_first_line_of_column_names_is_refused_as_a_header(folder, first):
    (folder / "l.csv").write_text(f"{first}\ncat/000.png,cat\ndog/001.jpg,dog\n")
    with pytest.raises(ValueError, match=rf"l.csv:1: '{first}' looks like a header"):
        image_list(folder / "l.csv")


@pytest.mark.parametrize(
    "name, first, rest",
    [("l.csv", "sku,breed", "cat/000.png,cat\ndog/001.jpg,dog"),
     ("l.csv", "Datei,Klasse", "cat/000.png,cat\ndog/001.jpg,dog"),
     ("l.csv", "sku;breed", "cat/000.png;cat\ndog/001.jpg;dog"),
     ("l.csv", "FILE_NAME;LABEL", "cat/000.png;cat\ndog/001.jpg;dog"),
     ("l.tsv", "sku\tbreed", "cat/000.png\tcat\ndog/001.jpg\tdog"),
     ("l.txt", "deadbeef bird", "cat/000.png cat\ndog/001.jpg dog")],
)  # fmt: skip
def test_a_first_line_without_a_digit_in_its_path_is_refused_as_a_header(folder, name, first, rest):
    # Column names of words not in the list of column words ('sku,breed', another
    # language's): read as an image of a class 'breed', class 0, each class one further.
    (folder / name).write_text(f"{first}\n{rest}\n")
    with pytest.raises(ValueError, match=r":1: .* looks like a header") as info:
        image_list(folder / name)
    # The line as written ('FILE_NAME;LABEL' was shown 'FILE_NAME,LABEL'), and its cure
    # where the line is an image (a name without a digit, 'deadbeef') followed as said: in
    # the list's own separator ('path,label' before a list separated by semicolons made it
    # a comma-separated one, its next line refused).
    assert f":1: {first!r} looks like a header" in str(info.value)
    header = re.search(r"If it is an image, put the header '(.+?)' before it\.", str(info.value))
    (folder / name).write_text(f"{header[1].replace('<TAB>', chr(9))}\n{first}\n{rest}\n")
    sep = re.search("[,;\t ]", first)[0]
    assert image_list(folder / name).ids == [first.split(sep)[0], "cat/000.png", "dog/001.jpg"]


@pytest.mark.parametrize("name, lines", [
    ("l.txt", ["c cat", "d dog", "e dog"]),
    ("l.tsv", ["c\tcat", "d\tdog", "e\tdog"]),
    ("l.tsv", ['"c"\t"cat"', '"d"\t"dog"', '"e"\t"dog"']),  # (as csv.writer quotes them)
    ("l.txt", ["'c' cat", "'d' dog", "'e' dog"]),  # (as shlex.quote quotes them)
    ("l.csv", ["c,cat", "d,dog", "e,dog"]),
    ("l.csv", ["c;cat", "d;dog", "e;dog"]),
])  # fmt: skip
def test_a_first_line_named_as_every_later_image_is_a_row(folder, caplog, name, lines):
    # Images named without a digit or an extension, all missing (not there yet): the first
    # line was refused as a header, quoted or not, where each later one, named the same
    # way, was an image. It is an image, said as a first image 'scan0001' is.
    caplog.set_level(logging.WARNING, logger="extract")
    (folder / name).write_text("\n".join(lines) + "\n")
    src = image_list(folder / name)
    assert (src.ids, src.class_names) == (["c", "d", "e"], ["cat", "dog"])
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"{folder / name}:1: 'c' names no file and no other line has its")
    # A header before it is a header still, and the first line an image, unsaid.
    caplog.clear()
    sep = re.search(r"[,;\t ]", lines[0])[0]
    (folder / name).write_text("\n".join([f"path{sep}label", *lines]) + "\n")
    src = image_list(folder / name)
    assert (src.ids, src.class_names) == (["c", "d", "e"], ["cat", "dog"])
    assert not caplog.records


@pytest.mark.parametrize("name, lines", [
    ("l.txt", ["c cat", "d1 dog", "e dog"]),  # (a later image named with a digit)
    ("l.tsv", ['"c"\t"cat"', '"d.png"\t"dog"', '"e"\t"dog"']),  # (or an extension)
    ("l.txt", ["sku breed", "katze1 cat", "hund dog"]),
    ("l.txt", ["filename class", "d dog", "e cat"]),  # (column names, whatever follows)
    ("l.txt", ["Datei Klasse", "katzen/minka katze", "hunde/rex hund"]),  # (in folders)
])  # fmt: skip
def test_a_first_line_named_unlike_later_images_is_refused_as_a_header(folder, name, lines):
    # Its path without a digit or an extension, where a later image's has one: no image's
    # name, a header (of words not among the column words), refused with its cure.
    (folder / name).write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r":1: .* looks like a header") as info:
        image_list(folder / name)
    assert f":1: {lines[0]!r} looks like a header" in str(info.value)
    header = re.search(r"If it is an image, put the header '(.+?)' before it\.", str(info.value))
    (folder / name).write_text("\n".join([header[1].replace("<TAB>", "\t"), *lines]) + "\n")
    src = image_list(folder / name)
    assert src.ids == [re.split(r"[\t ]", line)[0].strip('"') for line in lines]


@pytest.mark.parametrize("lines, there", [
    (["Datei Klasse", "katze tier", "hund tier"], "katze hund"),
    (["sku\tbreed", '"hund"\t"cat"', '"imgs/maus"\t"cat"'], "hund imgs/maus"),
    (["c cat", "d dog", "e dog"], "d e"),
    (["c cat", "d dog", "e dog"], "e"),  # (one later image found is enough)
])  # fmt: skip
def test_a_first_line_missing_above_images_found_is_refused_as_a_header(folder, lines, there):
    # Named as every later image is, without a digit or an extension, but the later images
    # are found and it is not: a header (column names in other words than the column
    # words), not an image of a class of its own. Refused, with its cure, which works.
    for later in there.split():
        (folder / later).parent.mkdir(exist_ok=True)
        (folder / later).write_bytes((folder / "cat/000.png").read_bytes())
    name = "l.tsv" if "\t" in lines[0] else "l.txt"
    (folder / name).write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r":1: .* looks like a header") as info:
        image_list(folder / name)
    header = re.search(r"If it is an image, put the header '(.+?)' before it\.", str(info.value))
    (folder / name).write_text("\n".join([header[1].replace("<TAB>", "\t"), *lines]) + "\n")
    src = image_list(folder / name)
    assert src.ids == [re.split(r"[\t ]", line)[0].strip('"') for line in lines]


def test_image_list_header_in_any_case(folder):
    (folder / "l.csv").write_text("Path,Label\ncat/000.png,cat\ndog/001.jpg,dog\n")
    assert image_list(folder / "l.csv").ids == ["cat/000.png", "dog/001.jpg"]


def test_alpha_is_composited_on_white_and_grey_becomes_rgb():
    rgba = Image.new("RGBA", (2, 1))
    rgba.putpixel((0, 0), (10, 20, 30, 0))  # fully transparent
    rgba.putpixel((1, 0), (10, 20, 30, 255))  # opaque
    rgb = to_rgb(rgba)
    assert rgb.mode == "RGB"
    assert rgb.getpixel((0, 0)) == (255, 255, 255)
    assert rgb.getpixel((1, 0)) == (10, 20, 30)
    grey = to_rgb(Image.new("L", (1, 1), 77))
    assert grey.mode == "RGB" and grey.getpixel((0, 0)) == (77, 77, 77)
    la = Image.new("LA", (2, 1), (40, 0))  # greyscale with alpha: transparent, then opaque
    la.putpixel((1, 0), (40, 255))
    assert [to_rgb(la).getpixel((x, 0)) for x in range(2)] == [(255, 255, 255), (40, 40, 40)]


def test_dataset_records_unreadable_images(folder):
    (folder / "cat/empty.jpg").write_bytes(b"")  # PIL: "cannot identify image file"
    src = image_folder(folder)
    ds = ItemDataset(src, lambda im: torch.from_numpy(np.array(im)).permute(2, 0, 1))
    reasons = {src.ids[i]: ds[i][2] for i in range(len(src))}
    assert "UnidentifiedImageError" in reasons.pop("cat/corrupt.jpg")
    # (Under a long tmp_path, a TMPDIR such as macOS's, the end was cut off: see
    # test_a_long_reason_keeps_its_start_and_its_cause.)
    assert reasons.pop("cat/empty.jpg").endswith("empty.jpg': it is empty (0 bytes)")
    # Cut in its image data, not in its headers ("OSError: Truncated File Read"): so the
    # decoders are shown the cut a half-copied file has.
    assert reasons.pop("cat/truncated.jpg").startswith("OSError: image file is truncated")
    assert set(reasons.values()) == {None}
    assert ds[src.ids.index("cat/grey.jpg")][1].shape[0] == 3


def test_a_listed_image_that_is_missing_fails_alone(folder):
    # The images listed after a missing one are read: each keeps the size and time it had
    # when listed, so that none of them is taken for a file that changed since.
    listed = folder / "list.csv"
    listed.write_text("cat/gone.jpg,cat\ncat/000.png,cat\ndog/001.jpg,dog\n")
    src = image_list(listed)
    ds = ItemDataset(src, lambda im: torch.from_numpy(np.array(im)).permute(2, 0, 1))
    reasons = [ds[i][2] for i in range(len(src))]
    assert reasons[0].startswith("FileNotFoundError") and reasons[1:] == [None, None]
    assert src.file_size[0] == -1 and src.file_size[2] == (folder / "dog/001.jpg").stat().st_size


@pytest.mark.parametrize("target", ["/nowhere/gone.jpg", "../moved/gone.jpg"])
def test_an_image_that_is_a_link_to_nothing_fails_naming_where_the_link_points(folder, target):
    # Its reason was a bare "No such file or directory" for a path that is there (ls lists
    # it): the link's target is what is missing.
    os.symlink(target, folder / "cat" / "zz.jpg")
    src = image_folder(folder)
    ds = ItemDataset(src, lambda im: torch.from_numpy(np.array(im)).permute(2, 0, 1))
    link = src.path(src.ids.index("cat/zz.jpg"))
    pointed = os.path.realpath(folder / "cat" / target)
    said = f"FileNotFoundError: {link} is a symbolic link to {pointed!r}, which does not exist"
    assert ds[src.ids.index("cat/zz.jpg")][2] == shorten(said)


def test_a_fifo_named_like_an_image_is_a_failure_not_a_hang(tmp_path):
    # open() of a FIFO waits for a writer: the run hung for ever on it.
    folder = make_image_folder(tmp_path / "data", n_per_class=2, special=False)
    pipe = folder / "dog" / "pipe.jpg"
    os.mkfifo(pipe)

    def release():  # should the read block, a writer comes after 10 s: a failure, no hang
        try:
            os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader waits
            pass

    timer = threading.Timer(10, release)
    timer.start()
    src = image_folder(folder)
    ds = ItemDataset(src, lambda im: torch.zeros(3, 2, 2))
    reasons = {src.ids[i]: ds[i][2] for i in range(len(src))}
    timer.cancel()
    assert "not a regular file" in reasons.pop("dog/pipe.jpg")
    assert set(reasons.values()) == {None}


def test_a_folder_listed_as_an_image_is_named_in_its_reason(tmp_path):
    # The reason named the file descriptor ("Is a directory: 5"), which was left open.
    from extract._decoding import failure_reason, read_file

    open_fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(IsADirectoryError) as info:
            read_file(str(tmp_path))
    assert failure_reason(info.value) == (
        f"IsADirectoryError: [Errno 21] Is a directory: {str(tmp_path)!r}"
    )
    assert len(os.listdir("/proc/self/fd")) == open_fds


def test_dataset_returns_jpeg_bytes_for_device_decoding(folder):
    src = image_folder(folder)
    ds = ItemDataset(src, lambda im: torch.zeros(3, 2, 2), jpeg_bytes=True)
    jpeg, png = ds[src.ids.index("cat/001.jpg")][1], ds[src.ids.index("cat/000.png")][1]
    assert jpeg.dtype == torch.uint8 and jpeg.ndim == 1 and bytes(jpeg[:2]) == b"\xff\xd8"
    assert png.shape == (3, 2, 2)  # non-JPEG files are decoded in the worker


def test_a_block_arrives_with_its_decoded_images_stacked(tmp_path):
    # Stacked in the worker, so that a GPU run's loader pins the one tensor it copies (each
    # item's tensor was pinned, then stacked into pageable memory: a synchronous copy).
    folder = make_image_folder(tmp_path / "data", n_per_class=4, special=False)
    src = image_folder(folder)
    ds = ItemDataset(src, lambda im: torch.full((3, 2, 2), float(im.size[0])), jpeg_bytes=True)
    (folder / "dog" / "001.jpg").write_bytes(b"broken")
    index, decoded, raw, reasons, _ = collate_items(ds.__getitems__(list(range(len(src)))))
    names = [src.ids[i] for i in index]
    kinds = [
        "failed" if r else "raw" if t is not None else "decoded"
        for t, r in zip(raw, reasons, strict=True)
    ]
    assert kinds == [
        "failed" if n == "dog/001.jpg" else "raw" if n.endswith(".jpg") else "decoded"
        for n in names
    ]
    assert {"raw", "decoded", "failed"} <= set(kinds)
    assert decoded.shape == (kinds.count("decoded"), 3, 2, 2)
    assert all(bytes(t[:2]) == b"\xff\xd8" for t in raw if t is not None)


def test_a_block_s_images_reach_the_backbone_in_its_rows_order(tmp_path):
    # Images decoded in the worker (PNG) and on the device (JPEG) are put back in the
    # block's order, without the rows that failed (in the worker, or on the device): a
    # failed JPEG between them must shift no image onto another row (and its label).
    from torchvision.transforms import v2 as T

    from extract._batches import _assemble

    files = {"0.png": (255, 0, 0), "1.jpg": None, "2.jpg": (0, 255, 0), "3.png": None}
    files["4.png"] = (0, 0, 255)
    lines = []
    for name, colour in files.items():
        image = Image.new("RGB", (8, 8), colour or (0, 0, 0))
        image.save(tmp_path / name, format="PNG" if name.endswith("png") else "JPEG")
        lines.append(f"{name},a")
    whole = _jpeg(8, 8)
    (tmp_path / "1.jpg").write_bytes(whole[: len(whole) - 20])  # cut: fails on the device
    (tmp_path / "3.png").write_bytes(b"not a png")  # fails in the worker
    src = image_list(_write_list(tmp_path, lines))
    pre = {"interpolation": "bilinear", "resize": 8, "crop": 8, "mean": [0.0] * 3, "std": [1.0] * 3}
    ds = ItemDataset(src, lambda im: T.functional.to_image(im).float() / 255, jpeg_bytes=True)
    _, decoded, raw, reasons, _ = collate_items(ds.__getitems__(list(range(len(src)))))
    assert raw[1] is not None and [r is None for r in reasons] == [True, True, True, False, True]
    x, reasons = _assemble(decoded, raw, reasons, pre, torch.device("cpu"))
    assert reasons[1].startswith("RuntimeError") and reasons[3].startswith("Unidentified")
    assert [r is None for r in reasons] == [True, False, True, False, True]
    assert x.shape == (3, 3, 8, 8)
    assert x.mean(dim=(2, 3)).argmax(dim=1).tolist() == [0, 1, 2]  # red, green, blue


def test_a_png_named_jpg_is_decoded_by_pil_not_dropped(folder):
    Image.new("RGB", (5, 4), (10, 200, 30)).save(folder / "cat" / "really_png.jpg", format="PNG")
    src = image_folder(folder)
    ds = ItemDataset(src, lambda im: torch.tensor(im.size), jpeg_bytes=True)
    _, tensor, reason, _ = ds[src.ids.index("cat/really_png.jpg")]
    assert reason is None and tensor.tolist() == [5, 4]


@pytest.fixture
def idx_root(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.tile(np.arange(10), 5)  # 50 images, 5 per class
    write_idx(tmp_path, "train", rng.integers(0, 255, (50, 28, 28)), labels)
    write_idx(tmp_path, "t10k", rng.integers(0, 255, (20, 28, 28)), labels[:20])
    return tmp_path


def test_a_relative_fashion_mnist_folder_is_recorded_as_an_absolute_one(idx_root, monkeypatch):
    # "fashion-mnist:test@fm" was the store's source (and report.json's) as typed: it named
    # the files read only from the folder the command ran in.
    monkeypatch.chdir(idx_root.parent)
    src = open_source(f"fashion-mnist:test@{idx_root.name}")
    assert src.description == f"fashion-mnist:test@{idx_root}"
    assert open_source(f"fashion-mnist:test@{idx_root}").description == src.description


def _damage(root, name, change):
    path = root / name
    path.write_bytes(change(path.read_bytes()))


@pytest.mark.parametrize(
    "damage, match",
    [
        # The training labels beside the test images: 50 labels for 20 images, stored as
        # complete with the wrong labels (or an IndexError at image 20).
        (
            lambda r: _damage(
                r,
                "t10k-labels-idx1-ubyte.gz",
                lambda _: (r / "train-labels-idx1-ubyte.gz").read_bytes(),
            ),
            r"do not belong together: t10k-images-idx3-ubyte.gz holds 20 x 28 x 28 pixels "
            r"and t10k-labels-idx1-ubyte.gz 50 labels",
        ),
        (  # a download cut short: an EOFError traceback
            lambda r: _damage(r, "t10k-images-idx3-ubyte.gz", lambda b: b[: len(b) // 2]),
            "t10k-images-idx3-ubyte.gz' is not a complete gzip file",
        ),
        (
            lambda r: _damage(
                r,
                "t10k-images-idx3-ubyte.gz",
                lambda _: gzip.compress(struct.pack(">IIII", 2051, 20, 28, 28) + bytes(100)),
            ),
            r"holds 100 bytes of data, not the 15680 its header announces \(20 x 28 x 28\)",
        ),
        (  # more pixels than announced: not the file the header describes
            lambda r: _damage(
                r,
                "t10k-images-idx3-ubyte.gz",
                lambda b: gzip.compress(gzip.decompress(b) + bytes(100)),
            ),
            r"holds 15780 bytes of data, not the 15680 its header announces \(20 x 28 x 28\)",
        ),
        (  # a label 10 would be a class without a name among Fashion-MNIST's ten
            lambda r: write_idx(
                r, "t10k", np.zeros((20, 28, 28)), np.r_[np.arange(10), np.arange(1, 11)]
            ),
            r"expected n x 28 x 28 and n labels in 0..9",
        ),
        (  # the labels file where the images belong
            lambda r: _damage(
                r,
                "t10k-images-idx3-ubyte.gz",
                lambda _: (r / "t10k-labels-idx1-ubyte.gz").read_bytes(),
            ),
            "is not an IDX file of unsigned bytes in 3 dimensions",
        ),
    ],
)
def test_damaged_or_mismatched_idx_files_are_refused(idx_root, damage, match):
    damage(idx_root)
    with pytest.raises(ValueError, match=match):
        fashion_mnist("test", idx_root)


def test_fashion_mnist_idx(idx_root):
    src = fashion_mnist("train", idx_root)
    assert len(src) == 50 and src.pixels.shape == (50, 28, 28)
    assert src.class_names[0] == "T-shirt/top" and src.ids[3] == "train/00003"
    assert load_image(src, 0).mode == "RGB"
    np.testing.assert_array_equal(np.asarray(load_image(src, 0))[..., 1], src.pixels[0])
    assert len(open_source(f"fashion-mnist:test@{idx_root}")) == 20


def test_fashion_mnist_idx_files_uncompressed_are_read(idx_root, tmp_path):
    # Kaggle's copy holds the IDX files uncompressed alone: "IDX files not found in ...".
    plain = tmp_path / "plain"
    plain.mkdir()
    for gz in idx_root.glob("*.gz"):
        (plain / gz.stem).write_bytes(gzip.decompress(gz.read_bytes()))
    for split in ("train", "test"):
        src, gzipped = fashion_mnist(split, plain), fashion_mnist(split, idx_root)
        np.testing.assert_array_equal(src.pixels, gzipped.pixels)
        np.testing.assert_array_equal(src.labels, gzipped.labels)
        assert list(src.files) == [f"{gz.removesuffix('.gz')}" for gz in gzipped.files]
    # torchvision's download keeps them under FashionMNIST/raw: named where it is not given.
    (tmp_path / "tv" / "FashionMNIST").mkdir(parents=True)
    plain.rename(tmp_path / "tv" / "FashionMNIST" / "raw")
    with pytest.raises(FileNotFoundError) as info:
        fashion_mnist("test", tmp_path / "tv")
    assert str(info.value).endswith(
        f"They are in {str(tmp_path / 'tv/FashionMNIST/raw')!r}: pass that folder."
    )


@pytest.mark.parametrize(
    "spec, n",
    [("~/data", 12), ("~/data/list.txt", 2), ("fashion-mnist:test@~", 20),
     ("webdataset:~/shards/{000000..000001}.tar", 6), ("parquet:~/pq/*.parquet", 6),
     ("webdataset:~/shards", 6), ("parquet:~/pq", 6)],
)  # fmt: skip
def test_a_source_in_the_home_folder_is_read_as_torchvision_reads_one(
    folder, idx_root, monkeypatch, spec, n
):
    # torchvision's datasets expand a root's ~ (ImageFolder("~/data")); a shell does not
    # after 'fashion-mnist:test@' nor in a quoted pattern: "'~/data' does not exist". A
    # folder of shards or Parquet files was "the shard '/home/u/pq' ... does not exist",
    # and a pattern's store recorded its source as 'parquet:/where/it/ran/~/pq/*.parquet'.
    pytest.importorskip("webdataset")
    pytest.importorskip("pyarrow")
    from extract._testing import write_parquet, write_webdataset

    small = make_image_folder(idx_root / "small", n_per_class=3, special=False)
    write_webdataset(small, idx_root / "shards/%06d.tar", maxcount=3)
    write_parquet(small, idx_root / "pq/a.parquet")
    shutil.move(folder, idx_root / "data")
    (idx_root / "data/list.txt").write_text("cat/000.png 0\ndog/001.jpg 1\n")
    monkeypatch.setenv("HOME", str(idx_root))
    monkeypatch.chdir(idx_root / "pq")
    src = open_source(spec)
    assert len(src) == n and "~" not in src.description and str(idx_root) in src.description
    (idx_root / "pq/~").mkdir()  # (a folder named ~ here is that folder)
    with pytest.raises(FileNotFoundError, match="'~/data' does not exist"):
        open_source("~/data")


@pytest.mark.parametrize(
    "n_per_class, n, expected",
    [(2, None, 20), (None, 7, 7), (1, 4, 4), (10, None, 50)],
)
def test_subset_keeps_order_and_first_items_per_class(idx_root, n_per_class, n, expected):
    src = fashion_mnist("train", idx_root).subset(n_per_class, n)
    assert len(src) == expected
    assert np.all(np.diff(src.source_index) > 0)
    if n_per_class:
        assert np.bincount(src.labels).max() <= n_per_class
        # The first items of each class: class k's j-th image is source item 10 j + k.
        np.testing.assert_array_equal(src.source_index, np.sort(src.source_index))
        assert src.source_index[: min(10, expected)].tolist() == list(range(min(10, expected)))
    # The fingerprint identifies the item list: equal only when nothing was dropped.
    same = src.fingerprint() == fashion_mnist("train", idx_root).fingerprint()
    assert same == (expected == 50)


def test_a_subset_of_a_subset_keeps_each_item_s_place_and_file(folder):
    # An ImageSource subset by the caller and given to extract_features with --per-class or
    # --max-items is subset again: its items keep their positions in the full source (the
    # store's indices) and their own files' sizes and times, not those of the first items.
    full = image_folder(folder)  # cat: items 0..7, dog: 8..11
    again = full.subset(n_per_class=3).subset(n_per_class=1)
    assert again.ids == ["cat/000.png", "dog/000.png"]
    assert again.source_index.tolist() == [0, 8]
    np.testing.assert_array_equal(again.labels, [0, 1])
    stats = [os.stat(folder / item) for item in again.ids]
    assert again.file_size.tolist() == [st.st_size for st in stats]
    assert again.file_mtime_ns.tolist() == [st.st_mtime_ns for st in stats]


@pytest.mark.parametrize("spec", ["fashion-mnist", "webdataset", "parquet"])
def test_a_folder_named_like_a_source_spec_is_a_folder(tmp_path, monkeypatch, spec):
    # A folder named webdataset or parquet (no colon: no spec) was refused as that spec's
    # 'empty pattern', as a folder named fashion-mnist is not.
    for name in (f"{spec}-photos", spec):
        make_image_folder(tmp_path / name, n_per_class=2, special=False)
    monkeypatch.chdir(tmp_path)
    for name in (f"{spec}-photos", spec, f"./{spec}"):
        src = open_source(name)
        assert src.ids == ["cat/000.png", "cat/001.jpg", "dog/000.png", "dog/001.jpg"], name


@pytest.mark.parametrize(
    "source, error, match",
    [
        ("fashion-mnist:val", ValueError, "split must be 'train' or 'test'. Got 'val' instead.$"),
        # No split was read as train, whatever set the user meant.
        *[
            (spec, ValueError, f"The image source '{spec}' names no Fashion-MNIST split; use")
            for spec in ("fashion-mnist", "fashion-mnist:", "fashion-mnist:@/data/fm")
        ],
        ("fashion-mnist:train@/nonexistent", FileNotFoundError, "dataset-fashion-mnist"),
        # A path that is not there says so first.
        ("/nonexistent/images", FileNotFoundError, "'/nonexistent/images' does not exist; a"),
        ("/dev/null", FileNotFoundError, "'/dev/null' is neither a folder nor a file; a source"),
    ],
)
def test_open_source_errors(source, error, match):
    with pytest.raises(error, match=match):
        open_source(source)


@pytest.mark.parametrize(
    "change, match",
    [
        # Labels beyond the class names: extracted whole, then refused by load_features
        # ("'labels' holds values outside 0..1 ...; rebuild it").
        (dict(labels=np.array([0, 5])), r"must be class indices, integers in 0..1 .* Got 5"),
        (dict(labels=np.array([0, -1])), r"must be class indices, integers in 0..1 .* Got -1"),
        (dict(labels=np.array([0.0, 0.5])), r"must be class indices, .* Got 0.5"),
        (dict(labels=np.array([0.0, np.nan])), r"must be class indices, .* Got nan"),
        (dict(labels=["cat", "dog"]), r"must be class indices, .* Got 'cat'"),
        (dict(labels=np.array([0, None])), r"must be class indices, .* Got None"),
        (dict(labels=np.array([True, False])), r"must be class indices, .* Got True"),
        # Counts apart: zip()'s "argument 3 is shorter than arguments 1-2".
        (dict(labels=np.array([0])), r"has 2 ids, 1 labels and 2 source indices; it needs one"),
        # A class named twice was stored so: its per-class results could not be told apart.
        (dict(class_names=["cat", "cat"]), r"The class names give 'cat' 2 times"),
        # So was one name in two Unicode forms, which printed alike.
        (
            dict(class_names=["caf\u00e9", "cafe\u0301"]),
            r"The class names .* two Unicode forms, 'caf\\xe9' and 'cafe\\u0301'",
        ),
        # Names that are no text: AttributeError ("'int' object has no attribute 'strip'").
        (
            dict(class_names=[0, 1]),
            r"class names of the ImageSource 'mine' must be str. Got 0 \(int",
        ),
        (dict(class_names=["cat", None]), r"must be str. Got None \(NoneType\) instead"),
        # A name that is not UTF-8: a UnicodeEncodeError writing the store.
        (dict(ids=["cat/000.png", "dog/\udcff.jpg"]), r"not valid UTF-8: 'dog/.+xff.jpg'"),
        # Source indices out of order: shards are merged in their order, and [1, 0] failed
        # in h5py ("Step must be >= 1 (got -1)"), [2, 0, 1] merged in an order of its own.
        (
            dict(source_index=np.array([1, 0])),
            r"source indices of the ImageSource 'mine' must be increasing integers >= 0 .* "
            r"Got 0 at item 1 instead; number the items in order",
        ),
        (dict(source_index=np.array([3, 3])), r"must be increasing integers .* Got 3 at item 1"),
        (dict(source_index=np.array([-1, 0])), r"must be increasing integers .* Got -1 at item 0"),
        (dict(source_index=np.array([0.0, 0.5])), r"must be increasing .* Got 0.5 at item 1"),
        (dict(source_index=["0", "1"]), r"must be increasing integers .* Got '0' at item 0"),
        # Beyond int64: 2**63 became -2**63 in the store without a word.
        (
            dict(source_index=np.array([0, 2**63], dtype=np.uint64)),
            r"must be increasing integers .* Got 9223372036854775808 at item 1",
        ),
        (dict(source_index=np.array([0.0, 1e20])), r"must be increasing .* Got 1e\+20 at item 1"),
        # A column (2, 1): it was said as 'Got 0 at item 0', an index in order.
        (dict(source_index=np.array([[0], [1]])), r"Got an array of shape \(2, 1\) instead"),
    ],
)
def test_an_image_source_built_by_hand_is_refused_where_its_store_could_not_be(
    folder, change, match
):
    from extract import ImageSource

    mine = dict(
        ids=["cat/000.png", "dog/001.jpg"],
        labels=np.array([0, 1]),
        class_names=["cat", "dog"],
        root=str(folder),
        description="mine",
        source_index=np.arange(2),
    )
    with pytest.raises(ValueError, match=match):
        open_source(ImageSource(**(mine | change)))
    # Labels as a list, or whole numbers in floats (a DataFrame's column), are indices; so
    # are numpy integers in an object array (they were refused as "Got 0").
    numpy_ints = np.array([np.int64(0), np.uint8(1)], dtype=object)
    for labels in ([0, 1], np.array([0.0, 1.0]), np.array([0, 1], dtype=object), numpy_ints):
        src = open_source(ImageSource(**(mine | dict(labels=labels))))
        assert src.labels.dtype == np.int64 and src.labels.tolist() == [0, 1]
    # Source indices as a list, in order with gaps (a subset's), are taken as int64.
    for index in ([0, 1], [4, 9], np.array([0.0, 7.0])):
        src = open_source(ImageSource(**(mine | dict(source_index=index))))
        assert src.source_index.dtype == np.int64 and src.source_index.tolist() == list(index)


@pytest.mark.parametrize("key", ["image_key", "label_key"])
def test_a_blank_key_is_refused_not_read_as_the_default(folder, key):
    message = f"^The '{key}' parameter must name a member or column, or be None for the default. "
    with pytest.raises(ValueError, match=message + "Got ' ' instead.$"):
        open_source(folder, **{key: " "})


def test_a_broken_symbolic_link_source_names_where_its_chain_ends(tmp_path):
    (tmp_path / "images").symlink_to(tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match=r"images' is a symbolic link to '/.*moved', which"):
        open_source(str(tmp_path / "images"))
    # A chain of links: its last target is missing, not the link in between.
    (tmp_path / "chain").symlink_to("images")
    with pytest.raises(FileNotFoundError, match=r"chain' is a symbolic link to '/.*moved', which"):
        open_source(str(tmp_path / "chain"))
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(FileNotFoundError, match=r"'/.*/a' is a symbolic link in a loop of links;"):
        open_source(str(tmp_path / "a"))


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I"])
def test_16_bit_greyscale_is_scaled_not_clipped(mode):
    grey = np.random.default_rng(0).integers(0, 256, (6, 7)).astype(np.uint8)
    wide = grey.astype(np.uint32) * 257  # the 16-bit twin: 255 -> 65535
    dtype = {"I;16": "<u2", "I;16B": ">u2", "I": "<i4"}[mode]
    image = Image.frombytes(mode, (7, 6), wide.astype(dtype).tobytes())
    rgb = np.asarray(to_rgb(image))
    np.testing.assert_array_equal(rgb, np.repeat(grey[..., None], 3, axis=2))
    # Values between two 8-bit levels go to the nearest (round(v / 257)), not down.
    between = np.array([[128, 129, 32896 + 128, 65535 - 128]], np.uint32)
    image = Image.frombytes(mode, (4, 1), between.astype(dtype).tobytes())
    assert np.asarray(to_rgb(image))[0, :, 0].tolist() == [0, 1, 128, 255]


@pytest.mark.parametrize("transparent", [False, True])
def test_16_bit_png_file_decodes_like_its_8_bit_twin(tmp_path, transparent):
    # With a grey value marked transparent (tRNS), the 16-bit file's were left black.
    grey = np.random.default_rng(1).integers(0, 256, (9, 8)).astype(np.uint8)
    grey[:3, :3] = 0
    key = dict(transparency=0) if transparent else {}
    Image.fromarray(grey, "L").save(tmp_path / "8.png", **key)
    Image.fromarray(grey.astype(np.uint16) * 257).save(tmp_path / "16.png", **key)
    assert Image.open(tmp_path / "16.png").mode == "I;16"
    src = image_list(_write_list(tmp_path, ["8.png,a", "16.png,a"]))
    eight, sixteen = (np.asarray(load_image(src, k)) for k in (0, 1))
    np.testing.assert_array_equal(sixteen, eight)
    assert (eight[:3, :3] == (255 if transparent else 0)).all()


def _rgb_png_16_bits(pixels: np.ndarray, key: tuple) -> bytes:
    """A 16-bit RGB PNG of ``pixels`` (H, W, 3) whose colour ``key`` is transparent (tRNS),
    which PIL does not write."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in pixels)
    height, width, _ = pixels.shape
    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)  # 16 bits, RGB
    chunks = [
        (b"IHDR", header),
        (b"tRNS", struct.pack(">3H", *key)),
        (b"IDAT", zlib.compress(rows)),
    ]
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunk(*c) for c in [*chunks, (b"IEND", b"")])


@pytest.mark.parametrize("key", [(0x1234, 0x5678, 0x9ABC), (0, 0, 0)])
def test_16_bit_rgb_png_s_transparent_colour_is_composited_on_white(key):
    # PIL gives the key in 16 bits and compares it with its 8-bit pixels: the key's pixels
    # stayed as they were, and others whose 8 bits spelt the key (0x00FF for 0) went white.
    pixels = np.zeros((2, 3, 3), np.uint16)
    pixels[0] = [(65535, 0, 0), key, (0x00FF, 0, 0)]
    pixels[1] = [(0x1200, 0x5600, 0x9A00), (12, 34, 56), key]
    rgb = np.asarray(decode_image(_rgb_png_16_bits(pixels, key)))
    expected = (pixels >> 8).astype(np.uint8)  # (PIL's 8 bits of each pixel)
    expected[(pixels == key).all(axis=2)] = 255
    np.testing.assert_array_equal(rgb, expected)


@pytest.mark.parametrize(
    "image, match",
    [
        (Image.new("F", (2, 2), 0.5), "floating-point images"),
        (Image.frombytes("I", (1, 1), np.int32(70000).tobytes()), "outside 0..65535"),
    ],
)
def test_images_without_a_brightness_scale_are_refused(image, match):
    with pytest.raises(ValueError, match=match):
        to_rgb(image)


@pytest.mark.parametrize("scale", [1, 257])
def test_a_tiff_of_32_bit_integers_is_refused_not_darkened(scale):
    # PIL opens it in mode I, as 16-bit files: its values were read as 16-bit ones, and 8-bit
    # values in it (numpy's int32 saved by PIL) came out black (255 -> 1) without a word.
    grey = np.arange(256, dtype=np.int32).reshape(16, 16) * scale
    data = io.BytesIO()
    Image.fromarray(grey, "I").save(data, format="TIFF")
    with pytest.raises(ValueError, match=r"^32-bit integer pixels \(a TIFF's\) have no defined"):
        decode_image(data.getvalue(), "x.tif")
    # Files of 16 bits opened in mode I too are scaled as before: a PGM of maxval 4095.
    pgm = b"P5 2 1 4095\n" + np.array([0, 4095], ">u2").tobytes()
    assert Image.open(io.BytesIO(pgm)).mode == "I"
    assert np.asarray(decode_image(pgm))[0, :, 0].tolist() == [0, 255]


@pytest.mark.parametrize(
    "dtype, values", [(np.int16, [0, 1000, 32767]), (np.int16, [-1, 0, 9]), (np.int8, [-1, 0, 5])]
)
def test_a_tiff_of_signed_integers_is_refused_not_read_as_unsigned(dtype, values):
    # SampleFormat 2 (numpy's int16, int8): 16-bit values were scaled as unsigned (32767 a
    # mid grey), or refused as "outside 0..65535, save with 8 or 16 bits", which they had;
    # PIL reads signed bytes as unsigned (-1 white).
    pixels = np.array([values], dtype)
    info = TiffImagePlugin.ImageFileDirectory_v2()
    info[339] = 2  # SampleFormat: signed integers
    data = io.BytesIO()
    Image.fromarray(pixels.view(np.dtype(dtype).str.replace("i", "u"))).save(
        data, format="TIFF", tiffinfo=info
    )
    assert Image.open(data).tag_v2[339] in (2, (2,))
    with pytest.raises(ValueError, match=r"^signed integer pixels \(a TIFF's int8 or int16\)"):
        decode_image(data.getvalue(), "x.tif")
    # Unsigned ones are read as before.
    data = io.BytesIO()
    Image.fromarray(np.abs(pixels).view(np.dtype(dtype).str.replace("i", "u"))).save(data, "TIFF")
    assert decode_image(data.getvalue()).size == (3, 1)


def test_a_16_bit_white_is_zero_tiff_decodes_like_its_8_bit_twin():
    # WhiteIsZero (PhotometricInterpretation 0, as scanners and MONOCHROME1 exports write
    # it): PIL inverts 8-bit pixels as it reads them, and not 16-bit ones, which came out
    # as the negative of their 8-bit twin.
    grey = np.array([[0, 64, 255]], np.uint8)
    info = TiffImagePlugin.ImageFileDirectory_v2()
    info[262] = 0  # WhiteIsZero: Pillow writes 8 bits inverted, as the tag says
    eight, sixteen = io.BytesIO(), io.BytesIO()
    Image.fromarray(grey).save(eight, "TIFF", tiffinfo=info)
    # (Pillow writes 16 bits as they are: stored inverted here, as other writers do)
    Image.fromarray(65535 - grey.astype(np.uint16) * 257).save(sixteen, "TIFF", tiffinfo=info)
    assert Image.open(sixteen).tag_v2[262] == 0
    for data in (eight, sixteen):
        assert np.asarray(decode_image(data.getvalue()))[0, :, 0].tolist() == [0, 64, 255]


def _write_list(folder, lines):
    (folder / "list.csv").write_text("\n".join(lines) + "\n")
    return folder / "list.csv"


@pytest.mark.parametrize("path", ["pil", "tensor"])
def test_an_exif_orientation_tag_is_not_applied_on_either_decode_path(path):
    # Pixels are embedded as stored, as open_clip's and timm's transforms read them (the
    # store records apply_exif_orientation: false): a wide image tagged to be turned a
    # quarter (Orientation 6, a phone held upright) stays wide, its left half red.
    pixels = np.zeros((8, 16, 3), np.uint8)
    pixels[:, :8] = (220, 20, 20)
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(
        buffer, format="JPEG", exif=exif.tobytes(), quality=95, subsampling=0
    )
    data = buffer.getvalue()
    assert ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size == (8, 16)  # the tag acts
    if path == "pil":
        decoded = np.asarray(decode_image(data))
        backbones = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))  # open_clip's, timm's
        np.testing.assert_array_equal(decoded, backbones)
    else:
        from extract._batches import _decode_jpegs

        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        [decoded] = _decode_jpegs([raw], torch.device("cpu"))
        decoded = decoded.permute(1, 2, 0).numpy()  # (H, W, 3)
    assert decoded.shape == (8, 16, 3)
    np.testing.assert_allclose(decoded, pixels, atol=12)  # (JPEG's rounding)


def _encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def _noise(width: int = 48, height: int = 40, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), np.uint8))


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_encoded(_noise().convert("CMYK"), "JPEG"), id="cmyk-jpeg"),
        pytest.param(  # the first frame, as PIL opens it
            _encoded(_noise(), "GIF", save_all=True, append_images=[_noise(seed=1)]),
            id="animated-gif",
        ),
        pytest.param(
            _encoded(_noise(), "PNG", save_all=True, append_images=[_noise(seed=1)]),
            id="animated-png",
        ),
        pytest.param(_encoded(_noise(), "WEBP"), id="webp"),
        pytest.param(_encoded(_noise(), "WEBP", lossless=True), id="webp-lossless"),
        pytest.param(_encoded(_noise().convert("1"), "PNG"), id="1-bit-png"),
        pytest.param(_encoded(_noise(1, 1), "PNG"), id="1x1-png"),
        pytest.param(_encoded(_noise(1, 1), "JPEG"), id="1x1-jpeg"),
    ],
)
def test_formats_users_meet_decode_as_the_backbones_read_them(data):
    # open_clip's and timm's own pipelines: Image.open(...).convert("RGB").
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    np.testing.assert_array_equal(np.asarray(decode_image(data)), expected)
    if data[:3] == b"\xff\xd8\xff":  # the tensor path's (torchvision's libjpeg-turbo) too
        from extract._batches import _decode_jpegs

        [tensor] = _decode_jpegs(
            [torch.frombuffer(bytearray(data), dtype=torch.uint8)], torch.device("cpu")
        )
        np.testing.assert_allclose(tensor.permute(1, 2, 0).numpy(), expected, atol=2)


@pytest.mark.parametrize(
    "whole",
    [
        pytest.param(_encoded(_noise(), "JPEG"), id="jpeg"),
        pytest.param(_encoded(_noise(), "JPEG", progressive=True), id="progressive-jpeg"),
        pytest.param(_encoded(_noise(), "PNG"), id="png"),
        pytest.param(_encoded(_noise(), "GIF"), id="gif"),
        pytest.param(_encoded(_noise(), "WEBP"), id="webp"),
    ],
)
def test_an_image_cut_in_half_is_refused_not_filled_in(whole):
    # Half the bytes of a file copied in part: every decoding path fails it (recorded as
    # failed), none fills the rest in grey.
    half = whole[: len(whole) // 2]
    with pytest.raises(OSError, match="truncated|decoder"):
        decode_image(half, "half")
    if half[:3] == b"\xff\xd8\xff":
        from extract._batches import _decode_jpegs

        raw = torch.frombuffer(bytearray(half), dtype=torch.uint8)
        [reason] = _decode_jpegs([raw], torch.device("cpu"))
        assert isinstance(reason, str) and "truncated" in reason


def _jpeg(width=40, height=36) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(buffer, format="JPEG")
    return buffer.getvalue()


def _claiming(data: bytes, width: int, height: int) -> bytes:
    """The same JPEG with a frame header claiming another size (a decompression bomb)."""
    sof = data.index(b"\xff\xc0")
    return data[: sof + 5] + struct.pack(">HH", height, width) + data[sof + 9 :]


def _stray(data: bytes, marker: bytes, stray: bytes = b"\x00\x00") -> bytes:
    """The same JPEG with ``stray`` bytes before its first ``marker`` (a valid image that
    libjpeg decodes with a warning): once refused as a corrupt header on the tensor path."""
    at = data.index(marker)
    changed = data[:at] + stray + data[at:]
    assert Image.open(io.BytesIO(changed)).size == Image.open(io.BytesIO(data)).size
    return changed


def _stuffed_then_fake_frame(data: bytes) -> bytes:
    """A stuffed zero (0xFF00) right after the start of image, then the JPEG with a comment
    holding a 2 x 2 frame header after its own. Read as a marker with a length, the stuffed
    zero jumped into the comment, and its fake frame gave the size that the pixel limit was
    checked against."""
    sof = data.index(b"\xff\xc0")
    end = sof + 2 + int.from_bytes(data[sof + 2 : sof + 4], "big")
    fake = b"\xff\xc0\x00\x11\x08\x00\x02\x00\x02\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    comment = b"\xff\xfe" + (10 + len(fake)).to_bytes(2, "big") + bytes(8) + fake
    jump = (end + 8).to_bytes(2, "big")  # from the stuffed zero's "length" into the comment
    changed = data[:2] + b"\xff\x00" + jump + data[2:end] + comment + data[end:]
    assert Image.open(io.BytesIO(changed)).size == (40, 36)
    return changed


@pytest.mark.parametrize(
    "data, expected",
    [
        (_jpeg(40, 36), (40, 36)),
        (_claiming(_jpeg(), 60000, 60000), (60000, 60000)),
        (b"\xff\xd8\xff\xff\xe0" + _jpeg()[4:], (40, 36)),  # fill byte before a marker
        (_stray(_jpeg(), b"\xff\xc0"), (40, 36)),  # stray bytes, skipped by libjpeg and PIL
        (_stray(_jpeg(), b"\xff\xdb"), (40, 36)),
        (_stray(_jpeg(), b"\xff\xc0", b"\xff\x00"), (40, 36)),  # a stuffed zero, no marker
        (_stuffed_then_fake_frame(_jpeg()), (40, 36)),
        (b"\x89PNG\r\n", "not a JPEG"),
        (_jpeg()[:30], "truncated JPEG"),
        (b"\xff\xd8\xff\xda\x00\x02", "image data before the frame header"),
        # A frame header that the data ends with, its size whole: read (the pixel limit
        # applies); one cut in its size, a marker without its length: truncated.
        (b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x24\x00\x28", (40, 36)),
        # Arithmetic coding (SOF9), which libjpeg-turbo decodes, has its size too.
        (_jpeg().replace(b"\xff\xc0", b"\xff\xc9", 1), (40, 36)),
        (b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x24\x00", "truncated JPEG"),
        (b"\xff\xd8\xff\xe0\x00", "truncated JPEG"),
        # A height of 0 (defined later by a DNL marker, which libjpeg does not read).
        (b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x00\x00\x28", "gives a 40x0 image"),
        (b"\xff\xd8\xff\xe0\x00\x01" + bytes(10), r"corrupt JPEG header \(segment length 1 at"),
    ],
)
def test_jpeg_size_reads_the_frame_header(data, expected):
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            jpeg_size(data)
    else:
        assert jpeg_size(data) == expected
        assert jpeg_size(np.frombuffer(data, np.uint8)) == expected


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("width", [1200, 1201, 1202, 1203])
def test_a_long_strip_keeps_its_middle_and_transforms_as_before(width):
    """A 1 x 20,000 PNG (a few hundred bytes) resized as a whole became 235 x 4.7 million
    pixels; now its long side is cut, centred, to 16 times its short side first. Both
    decoding paths (PIL, and the crop of a decoded tensor) keep the same pixels. What the
    transforms keep, the centred square of the resized image, is the same as before where
    the resize maps both widths to whole pixels (1200 → 1600, 384 → 512); elsewhere it
    differs from the whole strip's by the resize's rounding of the width (under a pixel)."""
    from torchvision.transforms import v2 as T

    from extract._batches import _tensor_batch

    strip = decode_image(_png(np.full((20_000, 1, 3), 200, np.uint8)))
    assert strip.size == (1, 16)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (24, width, 3), dtype=np.uint8)  # 50 : 1
    trimmed = decode_image(_png(pixels))
    # 16 × 24 = 384 columns, one more where the rest is odd: as many cut from either end.
    kept = 384 + (width - 384) % 2
    assert trimmed.size == (kept, 24)
    cut = (width - kept) // 2
    np.testing.assert_array_equal(np.asarray(trimmed), pixels[:, cut : cut + kept])
    transform = T.Compose([T.PILToTensor(), T.Resize(32, antialias=True), T.CenterCrop(28)])
    full = transform(Image.fromarray(pixels)).float()
    pil = transform(trimmed).float()
    if width == 1200:
        np.testing.assert_allclose(pil, full, atol=1.0)
    pre = {
        "interpolation": "bilinear",
        "resize": 32,
        "crop": 28,
        "mean": [0.0] * 3,
        "std": [1.0] * 3,
    }
    on_device = _tensor_batch([torch.from_numpy(pixels).permute(2, 0, 1)], pre, torch.device("cpu"))
    np.testing.assert_allclose(on_device[0] * 255, pil, atol=1.0)


def test_a_long_strip_is_kept_whole_for_transforms_that_see_all_of_it(tmp_path):
    # Strips were cut to 16:1 for every backbone, though timm's "squash" and "border" and
    # open_clip's "squash" and "longest" transforms see the whole image (and never enlarge
    # it): the store embedded the middle third of a 60 x 1500 strip of three colours. They
    # are cut at their input's long side (a 1 x 2000 strip padded to 224 px would be
    # 0 px high), which their preprocessing records.
    from types import SimpleNamespace

    from extract._backbones import _normalised_preprocess
    from extract._loading import _loader
    from extract._sources import open_source

    pixels = np.zeros((60, 1500, 3), np.uint8)
    for third in range(3):
        pixels[:, 500 * third : 500 * (third + 1), third] = 255
    assert decode_image(_png(pixels), max_aspect=224).size == (1500, 60)
    (tmp_path / "strips" / "a").mkdir(parents=True)
    Image.fromarray(pixels).save(tmp_path / "strips" / "a" / "strip.png")
    Image.fromarray(np.zeros((1, 2000, 3), np.uint8)).save(tmp_path / "strips" / "a" / "thin.png")
    source = open_source(str(tmp_path / "strips"))
    seen = {}
    for mode in ("center", "squash"):
        preprocess = _normalised_preprocess(
            (3, 224, 224), 224, "bicubic", [0] * 3, [1] * 3, mode=mode
        )
        assert ("max_aspect" in preprocess) == (mode != "center")
        backbone = SimpleNamespace(
            transform=lambda image: torch.tensor([image.size]), preprocess=preprocess
        )
        loader = _loader(source, backbone, [np.array([0, 1])], 0, "pil", torch.device("cpu"))
        seen[mode] = next(iter(loader))[1][:, 0].tolist()
    assert seen == {"center": [[16 * 60, 60], [16, 1]], "squash": [[1500, 60], [224, 1]]}


def test_pixel_limit_is_pil_s():
    check_pixel_limit(9000, 9000)  # 81 M pixels: under PIL's default 89.5 M
    with pytest.raises(Image.DecompressionBombError, match="60000x60000.*MAX_IMAGE_PIXELS"):
        check_pixel_limit(60000, 60000)


@pytest.mark.parametrize("jpeg_bytes", [True, False])
def test_huge_jpeg_header_is_a_failure_on_every_path(tmp_path, jpeg_bytes):
    (tmp_path / "bomb.jpg").write_bytes(_claiming(_jpeg(), 60000, 60000))
    src = image_list(_write_list(tmp_path, ["bomb.jpg,a"]))
    ds = ItemDataset(src, lambda im: torch.zeros(3, 2, 2), jpeg_bytes=jpeg_bytes)
    _, tensor, reason, digest = ds[0]
    assert tensor is None and reason.startswith("DecompressionBombError")
    assert digest == hashlib.sha256((tmp_path / "bomb.jpg").read_bytes()).hexdigest()


@pytest.mark.parametrize("jpeg_bytes", [True, False])
def test_pixel_limit_applies_to_the_pil_and_tensor_paths_alike(tmp_path, monkeypatch, jpeg_bytes):
    # PIL itself only warns between MAX_IMAGE_PIXELS and twice that: the limit is the same here.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    (tmp_path / "big.jpg").write_bytes(_jpeg(40, 36))  # 1440 pixels
    src = image_list(_write_list(tmp_path, ["big.jpg,a"]))
    ds = ItemDataset(src, lambda im: torch.zeros(3, 2, 2), jpeg_bytes=jpeg_bytes)
    assert "40x36 = 1440 pixels, more than the limit of 1000" in ds[0][2]


@pytest.mark.parametrize("jpeg_bytes", [True, False])
@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_an_image_past_twice_the_limit_is_said_as_any_over_it(
    tmp_path, monkeypatch, jpeg_bytes, fmt
):
    # PIL refuses it itself: reworded, its message named the pixels alone ('the image is
    # 2400 pixels'), where every other path says 'the image is 60x40 = 2400 pixels'.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    Image.new("RGB", (60, 40)).save(tmp_path / "big.img", format=fmt)
    src = image_list(_write_list(tmp_path, ["big.img,a"]))
    # The size is read without lifting the limit, even for a moment: other threads
    # decoding meanwhile would go unchecked.
    limits, open_image = [], Image.open

    def open_recording_the_limit(*args, **kwargs):
        limits.append(Image.MAX_IMAGE_PIXELS)
        return open_image(*args, **kwargs)

    monkeypatch.setattr(Image, "open", open_recording_the_limit)
    reason = ItemDataset(src, lambda im: torch.zeros(3, 2, 2), jpeg_bytes=jpeg_bytes)[0][2]
    assert set(limits) <= {1000}  # (none where the JPEG header gives the size)
    assert reason == (
        "DecompressionBombError: the image is 60x40 = 2400 pixels, more than the limit of 1000 "
        "(PIL.Image.MAX_IMAGE_PIXELS, mr2-extract --max-image-pixels); raise it to read the image"
    )
    assert Image.MAX_IMAGE_PIXELS == 1000  # as it was


@pytest.mark.parametrize("mode, lossless", [("RGB", False), ("RGB", True), ("RGBA", False)])
def test_a_webp_past_twice_the_limit_is_said_as_any_over_it(monkeypatch, mode, lossless):
    # PIL's WebP plugin refuses it as it reads the header, so its size went unread and
    # PIL's message (the pixels alone, twice the limit, no remedy) was recorded.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    buffer = io.BytesIO()  # (lossy: a VP8 chunk; lossless: VP8L; lossy with alpha: VP8X)
    Image.new(mode, (60, 40)).save(buffer, format="WEBP", lossless=lossless)
    with pytest.raises(Image.DecompressionBombError, match=r"^the image is 60x40 = 2400 pixels"):
        decode_image(buffer.getvalue(), "big.webp")


@pytest.mark.parametrize("jpeg_bytes", [True, False])
def test_the_pixel_limit_is_the_one_set_when_the_dataset_was_made(
    tmp_path, monkeypatch, jpeg_bytes
):
    # Workers started by spawn or forkserver import PIL afresh: the limit a user (or
    # mr2-extract --max-image-pixels) set went unseen there, and the default applied.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    (tmp_path / "big.jpg").write_bytes(_jpeg(40, 36))  # 1440 pixels
    src = image_list(_write_list(tmp_path, ["big.jpg,a"]))
    ds = ItemDataset(src, lambda im: torch.zeros(3, 2, 2), jpeg_bytes=jpeg_bytes)
    Image.MAX_IMAGE_PIXELS = 89478485  # as a fresh worker process has it
    reason = ds[0][2]
    assert "1440 pixels, more than the limit of 1000" in reason
    assert "mr2-extract --max-image-pixels); raise it to read the image" in reason
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # no limit at all
    ds = ItemDataset(src, lambda im: torch.zeros(3, 2, 2), jpeg_bytes=jpeg_bytes)
    Image.MAX_IMAGE_PIXELS = 1000
    assert ds[0][2] is None


def test_a_worker_refuses_truncated_files_whatever_the_main_module_set(tmp_path, monkeypatch):
    # A worker started by spawn or forkserver imports the main module afresh: a script's
    # top-level ImageFile.LOAD_TRUNCATED_IMAGES = True, turned off before extract_features,
    # came back there, and a truncated file was decoded with its missing part grey.
    from PIL import ImageFile

    whole = _encoded(_noise(), "JPEG")
    (tmp_path / "half.jpg").write_bytes(whole[: len(whole) // 2])
    src = image_list(_write_list(tmp_path, ["half.jpg,a"]))
    ds = ItemDataset(src, lambda im: torch.zeros(3, 2, 2))
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # as the worker has it
    assert ds[0][2].startswith("OSError: image file is truncated")


def test_a_worker_refuses_truncated_files_in_tar_shards_whatever_the_main_module_set(
    tmp_path, monkeypatch
):
    # Items of container files are read a block at a time (__getitems__), the path of a
    # worker reading tar shards or Parquet files: it, too, turns PIL's switch off.
    pytest.importorskip("webdataset")
    from PIL import ImageFile

    from extract._testing import write_webdataset

    whole = _encoded(_noise(), "JPEG")
    (tmp_path / "data/a").mkdir(parents=True)
    (tmp_path / "data/a/half.jpg").write_bytes(whole[: len(whole) // 2])
    write_webdataset(tmp_path / "data", tmp_path / "shards/%05d.tar")
    ds = ItemDataset(open_source(f"webdataset:{tmp_path}/shards/00000.tar"), lambda im: im)
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # as the worker has it
    [(_, _, reason, _)] = ds.__getitems__([0])
    assert reason.startswith("OSError: image file is truncated")


def test_device_jpeg_decoding_checks_the_pixel_limit(monkeypatch):
    from extract._batches import _decode_jpegs

    small = torch.frombuffer(bytearray(_jpeg(8, 8)), dtype=torch.uint8)
    big = torch.frombuffer(bytearray(_jpeg(40, 36)), dtype=torch.uint8)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    decoded = _decode_jpegs([small, big], torch.device("cpu"))
    assert decoded[0].shape == (3, 8, 8)
    assert decoded[1].startswith("DecompressionBombError") and "1440 pixels" in decoded[1]


def _nvjpeg_like(monkeypatch, message):
    """decode_jpeg that fails with ``message`` on any device but the CPU, as nvJPEG does for
    the JPEGs it does not support (CMYK, arithmetic coding) or on a device error."""
    import torchvision.io

    real = torchvision.io.decode_jpeg

    def decode_jpeg(data, mode=torchvision.io.ImageReadMode.UNCHANGED, device="cpu"):
        if torch.device(device).type != "cpu":
            raise RuntimeError(message)
        return real(data, mode=mode)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", decode_jpeg)


def test_jpegs_the_device_cannot_decode_are_decoded_on_the_cpu(monkeypatch):
    from extract._batches import _decode_jpegs

    _nvjpeg_like(monkeypatch, "Error while decoding JPEG images: unsupported")
    good = torch.frombuffer(bytearray(_jpeg(8, 8)), dtype=torch.uint8)
    bad = torch.frombuffer(bytearray(_jpeg(8, 8)[:40]), dtype=torch.uint8)  # truncated
    decoded = _decode_jpegs([good, bad], torch.device("meta"))
    assert decoded[0].shape == (3, 8, 8) and decoded[0].device.type == "meta"
    assert isinstance(decoded[1], str)  # unreadable on every path: a failure


@pytest.mark.parametrize("message, error", [
    ("Error while decoding JPEG images: CUDA out of memory", torch.OutOfMemoryError),
    # A sticky CUDA error fails every later call: each image of the run was recorded as
    # unreadable, the rows marked failed, and the run went on.
    ("CUDA error: an illegal memory access was encountered", RuntimeError),
])  # fmt: skip
def test_device_errors_while_decoding_are_not_unreadable_images(monkeypatch, message, error):
    from extract._batches import _decode_jpegs

    _nvjpeg_like(monkeypatch, message)
    good = torch.frombuffer(bytearray(_jpeg(8, 8)), dtype=torch.uint8)
    with pytest.raises(error, match=message.split(": ")[-1]):
        _decode_jpegs([good], torch.device("meta"))


def test_dataset_hashes_what_it_reads_and_refuses_changed_files(folder):
    def reason(name, change):  # its start and its end (a long path's middle may be left out)
        remedy = "--retry-failed extracts it again once it no longer changes"
        return ("FileChangedError: ", f"started ({change}); {remedy}")

    src = image_folder(folder)
    ds = ItemDataset(src, lambda im: torch.zeros(3, 2, 2))
    i = src.ids.index("dog/001.jpg")
    expected = hashlib.sha256((folder / "dog/001.jpg").read_bytes()).hexdigest()
    assert ds[i][2] is None and ds[i][3] == expected
    size = (folder / "dog/001.jpg").stat().st_size
    (folder / "dog/001.jpg").write_bytes((folder / "dog/002.jpg").read_bytes() + b"\0")
    new = (folder / "dog/001.jpg").stat().st_size
    start, end = reason("dog/001.jpg", f"{size} -> {new} bytes")
    assert ds[i][2].startswith(start) and ds[i][2].endswith(end)
    # Rewritten to the same size (an editor saving over it): its time tells.
    i = src.ids.index("dog/002.jpg")
    st = (folder / "dog/002.jpg").stat()
    os.utime(folder / "dog/002.jpg", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    start, end = reason("dog/002.jpg", "modified since, same size")
    assert ds[i][2].startswith(start) and ds[i][2].endswith(end)


@pytest.mark.parametrize("letter", ["a", "é", "猫"])
def test_a_long_reason_keeps_its_start_and_its_cause(letter):
    # Cut at its end to 200 characters (then bytes), a reason under a long folder lost its
    # cause and remedy: "it is empty (0 bytes)", "--retry-failed extracts it again".
    from extract._decoding import failure_reason
    from extract._schema import _truncate

    path = "/data/" + letter * 300 + "/cat/empty.jpg"
    err = ValueError(f"cannot identify image file {path!r}: it is empty (0 bytes)")
    reason = failure_reason(err)
    assert len(reason.encode()) <= 200 and _truncate(reason) == reason.encode()
    assert reason.startswith("ValueError: cannot identify image file '/data/")
    assert reason.endswith("/cat/empty.jpg': it is empty (0 bytes)") and "..." in reason
    short = ValueError("it is empty (0 bytes)")
    assert failure_reason(short) == "ValueError: it is empty (0 bytes)"
    # An undecodable byte of a name (a lone surrogate) is written as its escape.
    odd = failure_reason(OSError("cannot read /data/\udcff.jpg"))
    assert odd == "OSError: cannot read /data/\\udcff.jpg" and _truncate(odd) == odd.encode()


def test_a_file_that_shrinks_while_it_is_read_is_refused(folder, monkeypatch):
    # Its bytes past the new end would be zeros, decoded (a JPEG's lower part grey).
    from extract._decoding import FileChangedError, read_file

    fstat = os.fstat

    def larger(fd):  # the size when opened: 10 bytes more than are left to read
        st = fstat(fd)
        return os.stat_result((*st[:6], st.st_size + 10, *st[7:10]))

    monkeypatch.setattr(os, "fstat", larger)
    with pytest.raises(FileChangedError, match="001.jpg changed while it was read; --retry"):
        read_file(str(folder / "dog/001.jpg"))


def test_a_file_rewritten_while_it_is_read_is_refused(folder, monkeypatch):
    # Its size kept (an editor saving over it), its bytes read were part old, part new, and
    # hashed as the file's: its modification time after the read tells.
    from extract._decoding import FileChangedError, read_file

    path = folder / "dog" / "001.jpg"
    old = path.read_bytes()
    st = path.stat()
    fdopen = os.fdopen

    def opened(fd, *args, **kwargs):  # opened, its size and time taken: then it changes
        fh = fdopen(fd, *args, **kwargs)
        path.write_bytes(bytes(b ^ 0xFF for b in old))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return fh

    monkeypatch.setattr(os, "fdopen", opened)
    with pytest.raises(FileChangedError, match="001.jpg changed while it was read") as raised:
        read_file(str(path), (st.st_size, st.st_mtime_ns))
    assert raised.value.before == (st.st_size, st.st_mtime_ns)
    assert raised.value.after == (st.st_size, st.st_mtime_ns + 10**9)


def test_fingerprint_covers_file_identity_and_idx_files(folder, tmp_path):
    before = image_folder(folder).fingerprint()
    path = folder / "cat" / "001.jpg"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    assert image_folder(folder).fingerprint() != before  # same name, same size, newer
    # The same images and class indices under other class names: another source.
    named = [image_list(_write_list(folder, [f"cat/000.png,{c}", f"dog/001.jpg,{d}"]))
             for c, d in (("cat", "dog"), ("kitten", "puppy"))]  # fmt: skip
    assert named[0].labels.tolist() == named[1].labels.tolist() == [0, 1]
    assert named[0].fingerprint() != named[1].fingerprint()
    rng = np.random.default_rng(0)
    write_idx(tmp_path, "t10k", rng.integers(0, 255, (4, 28, 28)), np.arange(4))
    first = fashion_mnist("test", tmp_path)
    write_idx(tmp_path, "t10k", rng.integers(0, 255, (4, 28, 28)), np.arange(4))
    second = fashion_mnist("test", tmp_path)
    assert first.ids == second.ids and first.fingerprint() != second.fingerprint()
    assert set(second.files) == {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}
    assert second.resolved_root() == str(tmp_path.resolve())


def test_a_device_error_while_decoding_one_image_at_a_time_is_raised(monkeypatch):
    # A device error while decoding images one at a time (after nvJPEG refused the batch) is
    # raised, not swallowed with the image decoded on the CPU instead.
    import torchvision.io

    from extract._batches import _decode_jpegs

    real = torchvision.io.decode_jpeg

    def decode_jpeg(data, mode=torchvision.io.ImageReadMode.UNCHANGED, device="cpu"):
        if torch.device(device).type == "cpu":
            return real(data, mode=mode)
        if isinstance(data, list):  # a file nvJPEG refuses: each is then decoded alone
            raise RuntimeError("Error while decoding JPEG images: unsupported")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torchvision.io, "decode_jpeg", decode_jpeg)
    good = torch.frombuffer(bytearray(_jpeg(8, 8)), dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _decode_jpegs([good, good], torch.device("meta"))


def test_fashion_mnist_with_one_of_its_files_missing_says_how_to_install_them(tmp_path):
    # A Fashion-MNIST folder missing one of its two files says how to install them, as one
    # missing both does, instead of a bare FileNotFoundError.
    write_idx(tmp_path, "t10k", np.zeros((2, 28, 28), np.uint8), np.arange(2))
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        fashion_mnist("test", tmp_path)


def test_an_image_of_exactly_the_pixel_limit_is_read(monkeypatch):
    # An image of exactly MAX_IMAGE_PIXELS is read, as PIL itself allows (it refuses "more
    # than" the limit); one column more is refused.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40 * 36)
    check_pixel_limit(40, 36)
    with pytest.raises(Image.DecompressionBombError):
        check_pixel_limit(41, 36)
