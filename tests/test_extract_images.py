"""Image sources and decoding."""

import numpy as np
import pytest
import torch
from PIL import Image

from extract import fashion_mnist, image_folder, image_list, open_source
from extract._images import ItemDataset, load_image, to_rgb
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
    ],
)
def test_image_list(folder, lines, class_names, labels):
    list_file = folder / "list.csv"
    list_file.write_text("\n".join(lines) + "\n")
    src = image_list(list_file)
    assert (src.class_names, src.labels.tolist()) == (class_names, labels)
    # Relative paths resolve against the list file's folder.
    assert all(load_image(src, i).size == (40, 36) for i in range(len(src)))


def test_image_list_bad_line(tmp_path):
    (tmp_path / "l.csv").write_text("a.jpg,cat,extra\n")
    with pytest.raises(ValueError, match="l.csv:1: expected 'path,label'"):
        image_list(tmp_path / "l.csv")


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


def test_dataset_records_unreadable_images(folder):
    src = image_folder(folder)
    ds = ItemDataset(src, lambda im: torch.from_numpy(np.array(im)).permute(2, 0, 1))
    reasons = {src.ids[i]: ds[i][2] for i in range(len(src))}
    assert "UnidentifiedImageError" in reasons.pop("cat/corrupt.jpg")
    assert "truncated" in reasons.pop("cat/truncated.jpg").lower()
    assert set(reasons.values()) == {None}
    assert ds[src.ids.index("cat/grey.jpg")][1].shape[0] == 3


def test_dataset_returns_jpeg_bytes_for_device_decoding(folder):
    src = image_folder(folder)
    ds = ItemDataset(src, lambda im: torch.zeros(3, 2, 2), jpeg_bytes=True)
    jpeg, png = ds[src.ids.index("cat/001.jpg")][1], ds[src.ids.index("cat/000.png")][1]
    assert jpeg.dtype == torch.uint8 and jpeg.ndim == 1 and bytes(jpeg[:2]) == b"\xff\xd8"
    assert png.shape == (3, 2, 2)  # non-JPEG files are decoded in the worker


def test_a_png_named_jpg_is_decoded_by_pil_not_dropped(folder):
    Image.new("RGB", (5, 4), (10, 200, 30)).save(folder / "cat" / "really_png.jpg", format="PNG")
    src = image_folder(folder)
    ds = ItemDataset(src, lambda im: torch.tensor(im.size), jpeg_bytes=True)
    _, tensor, reason = ds[src.ids.index("cat/really_png.jpg")]
    assert reason is None and tensor.tolist() == [5, 4]


@pytest.fixture
def idx_root(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.tile(np.arange(10), 5)  # 50 images, 5 per class
    write_idx(tmp_path, "train", rng.integers(0, 255, (50, 28, 28)), labels)
    write_idx(tmp_path, "t10k", rng.integers(0, 255, (20, 28, 28)), labels[:20])
    return tmp_path


def test_fashion_mnist_idx(idx_root):
    src = fashion_mnist("train", idx_root)
    assert len(src) == 50 and src.pixels.shape == (50, 28, 28)
    assert src.class_names[0] == "T-shirt/top" and src.ids[3] == "train/00003"
    assert load_image(src, 0).mode == "RGB"
    np.testing.assert_array_equal(np.asarray(load_image(src, 0))[..., 1], src.pixels[0])
    assert len(open_source(f"fashion-mnist:test@{idx_root}")) == 20


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


@pytest.mark.parametrize(
    "source, error, match",
    [
        ("fashion-mnist:val", ValueError, "split must be 'train' or 'test'"),
        ("fashion-mnist:train@/nonexistent", FileNotFoundError, "dataset-fashion-mnist"),
        ("/nonexistent/images", FileNotFoundError, "neither a folder"),
    ],
)
def test_open_source_errors(source, error, match):
    with pytest.raises(error, match=match):
        open_source(source)
