"""An image's bytes and pixels: files read against their listing, JPEG sizes from their
headers, the pixel limit, RGB conversion, extreme aspects trimmed, and a failure told in
one line."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import warnings

import numpy as np
from PIL import Image

from mr2_probe._h5 import why_missing

from ._schema import shorten

# The EXIF orientation tag is not applied: pixels are embedded as stored, as open_clip's
# and timm's transforms (PIL's Image.open, torchvision's ImageFolder) and torchvision's
# decode_jpeg (its default) read them, so that features are those of the backbone's usual
# pipeline. Recorded in the store's preprocessing.
APPLY_EXIF_ORIENTATION = False
NOT_A_FILE = -1  # file_size / file_mtime_ns of in-memory items and of files missing when listed
_JPEG_MAGIC = b"\xff\xd8\xff"  # start-of-image marker and the next marker's prefix
# Start-of-frame markers (they carry the image size): C0..CF except DHT, JPG and DAC.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE_MARKERS = frozenset([0x01, *range(0xD0, 0xD8)])  # TEM, RST0..7: no length field
# 16-bit greyscale modes (PIL opens 16-bit PNG, TIFF and PGM files in one of them; "I" is
# PIL's 32-bit container, which 16-bit files also use).
_HIGH_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


class FileChangedError(OSError):
    """An image file differs from the one listed when the extraction started, or changed
    while it was read: ``before`` and ``after`` are its ``(size, mtime_ns)`` then and now
    (None where not known)."""

    def __init__(
        self,
        message: str,
        before: tuple[int, int] | None = None,
        after: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.before, self.after = before, after


def jpeg_size(data: bytes | bytearray | memoryview | np.ndarray) -> tuple[int, int]:
    """``(width, height)`` of a JPEG, read from its start-of-frame (SOF) marker.

    Only the headers are read, so a file whose header claims a huge image costs nothing.

    Raises
    ------
    ValueError
        If the data is not a JPEG or ends, or reaches the image data, before a frame header.
    """
    data = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else data
    n = len(data)
    if n < 2 or data[0] != 0xFF or data[1] != 0xD8:
        raise ValueError("not a JPEG file (no start-of-image marker)")
    i = 2
    while i < n:
        while i < n and data[i] != 0xFF:  # stray bytes, which libjpeg and PIL skip too
            i += 1
        while i < n and data[i] == 0xFF:  # fill bytes may precede a marker
            i += 1
        if i + 2 >= n:
            break
        marker, i = int(data[i]), i + 1
        if marker == 0x00 or marker in _STANDALONE_MARKERS:  # 0xFF00: a stuffed zero byte
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header came
            raise ValueError("corrupt JPEG: image data before the frame header")
        length = int(data[i]) << 8 | int(data[i + 1])
        if marker in _SOF_MARKERS and i + 7 <= n:
            height = int(data[i + 3]) << 8 | int(data[i + 4])
            width = int(data[i + 5]) << 8 | int(data[i + 6])
            if not width or not height:
                raise ValueError(f"JPEG frame header gives a {width}x{height} image")
            return width, height
        if length < 2:
            raise ValueError(f"corrupt JPEG header (segment length {length} at byte {i})")
        i += length
    raise ValueError("truncated JPEG: the file ends before its frame header")


def check_pixel_limit(width: int, height: int) -> None:
    """Refuse an image of more than ``PIL.Image.MAX_IMAGE_PIXELS`` pixels before decoding.

    The same limit applies to every decoding path (PIL in the workers, ``decode_jpeg`` on
    the device), so that a file whose header claims a huge size is recorded as a failure
    instead of exhausting memory. Raise ``PIL.Image.MAX_IMAGE_PIXELS`` (or set it to None)
    to read larger images.

    Raises
    ------
    PIL.Image.DecompressionBombError
    """
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        raise Image.DecompressionBombError(
            f"the image is {width}x{height} = {width * height} pixels, more than the limit of "
            f"{limit} (PIL.Image.MAX_IMAGE_PIXELS, mr2-extract --max-image-pixels); raise it "
            "to read the image"
        )


def _unchecked_size(data: bytes | bytearray) -> tuple[int, int] | None:
    """The size an image file's header gives, read without PIL's pixel limit (which
    refused it past twice the limit, naming the pixels alone); None if PIL cannot say.

    Image.open checks the limit once a format's plugin has read the header: the plugins are
    called here as it calls them, without the check. (Setting PIL.Image.MAX_IMAGE_PIXELS to
    None for the moment would lift the limit for every thread decoding meanwhile.)"""
    size = _webp_size(data)  # (PIL's WebP plugin checks the limit as it reads the header)
    if size is not None:
        return size
    prefix = bytes(data[:16])
    Image.init()
    for name in list(Image.ID):
        factory, accept = Image.OPEN[name]
        found = accept(prefix) if accept else True
        if not found or isinstance(found, str):  # (a str: PIL's warning, no match)
            continue
        try:
            with factory(io.BytesIO(data), "") as image:  # (the header alone: nothing decoded)
                return image.size
        except Exception:
            continue
    return None


def _webp_size(data: bytes | bytearray) -> tuple[int, int] | None:
    """``(width, height)`` of a WebP file, read from the header of its first chunk (VP8X:
    the canvas; VP8L, VP8: the image); None if it is no WebP or its header is cut."""
    if len(data) < 30 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return None
    chunk, head = bytes(data[12:16]), bytes(data[20:30])
    if chunk == b"VP8X":  # flags and reserved (4 bytes), then 24-bit width - 1, height - 1
        return 1 + int.from_bytes(head[4:7], "little"), 1 + int.from_bytes(head[7:10], "little")
    if chunk == b"VP8L" and head[0] == 0x2F:  # signature, then 14-bit width - 1, height - 1
        bits = int.from_bytes(head[1:5], "little")
        return 1 + (bits & 0x3FFF), 1 + (bits >> 14 & 0x3FFF)
    if chunk == b"VP8 " and head[3:6] == b"\x9d\x01\x2a":  # frame tag, start code, sizes
        width, height = (int.from_bytes(head[k : k + 2], "little") & 0x3FFF for k in (6, 8))
        return width, height
    return None


def _scale_to_8_bits(image: Image.Image) -> Image.Image:
    """8-bit greyscale of a 16-bit image: 0..65535 mapped onto 0..255 (rounded)."""
    values = np.asarray(image)
    if image.mode == "I" and values.size and (values.min() < 0 or values.max() > 65535):
        raise ValueError(
            "integer pixels outside 0..65535 (PIL mode I) have no defined brightness scale; "
            "save the image with 8 or 16 bits per channel"
        )
    grey = (values.astype(np.uint32) * 255 + 32767) // 65535  # round(v / 257)
    return Image.fromarray(grey.astype(np.uint8), "L")


def _32_bit_integers(image: Image.Image) -> bool:
    """Whether an opened (not yet loaded) image's file holds 32-bit integer pixels (TIFF's
    ``I;32S``, ``I;32N``, ...): PIL opens them in mode ``I`` as 16-bit files (PGM, signed
    TIFF), and only the raw mode its decoder is given tells them apart."""
    return image.mode == "I" and any(mode.startswith("I;32") for mode in _raw_modes(image))


def _raw_modes(image: Image.Image) -> list[str]:
    """The raw modes that an opened image's tiles give their decoder: each tile's 4th field
    (its ``args`` from Pillow 11, a plain tuple before), a mode or a tuple led by one."""
    return [str(t[3] if isinstance(t[3], str) else (t[3] or ("",))[0]) for t in image.tile]


def _signed_integers(image: Image.Image) -> bool:
    """Whether an opened TIFF holds signed integer pixels (``SampleFormat`` 2, numpy's
    ``int8`` and ``int16``): PIL opens 8-bit ones in mode ``L`` as unsigned bytes (-1 read
    as 255, -128 as 128) and 16-bit ones in mode ``I``, scaled then as unsigned ones
    (32767 as 127), or refused as outside 0..65535 where a value is negative."""
    formats = getattr(image, "tag_v2", {}).get(339, ())  # (TIFF's SampleFormat tag)
    return 2 in np.atleast_1d(formats).tolist()


def _white_is_zero(image: Image.Image) -> bool:
    """Whether an opened TIFF of 16-bit greyscale pixels counts brightness down
    (PhotometricInterpretation 0, WhiteIsZero): PIL inverts 8-bit ones as it reads them
    (raw mode ``L;I``) and 16-bit ones not, which came out as their 8-bit twin's negative."""
    if not image.mode.startswith("I;16") or getattr(image, "tag_v2", {}).get(262) != 0:
        return False
    # (Read by a raw mode of PIL's that keeps the values: one day it may invert them.)
    return all(mode in ("I;16", "I;16B", "I;16R", "I;16N") for mode in _raw_modes(image))


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB copy of a PIL image; transparent pixels are composited on white.

    16-bit greyscale images (modes ``I;16*`` and ``I``) are scaled to 8 bits, not clipped;
    floating-point images (mode ``F``) have no defined range and are refused, as are files
    of 32-bit integers and TIFFs of signed integers (by :func:`decode_image`: PIL opens them
    in mode ``I`` too, or ``L`` for 8 bits).
    """
    if image.mode in _HIGH_BIT_MODES:
        grey = _scale_to_8_bits(image)
        key = image.info.get("transparency")  # a 16-bit grey value (PNG's tRNS)
        if isinstance(key, int):  # its pixels composited on white, as the 8-bit twin's
            values = np.array(grey)
            values[np.asarray(image) == key] = 255
            grey = Image.fromarray(values, "L")
        return grey.convert("RGB")
    if image.mode == "F":
        raise ValueError(
            "floating-point images (PIL mode F) have no defined brightness range; save the "
            "image with 8 or 16 bits per channel"
        )
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if has_alpha:
        image = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image).convert("RGB")
    return image.convert("RGB")


# Transforms that resize the shorter side, then keep a centred square (``mode`` "center"),
# use the middle of a long strip alone, but the resize makes all of it (a 1 x 20,000 PNG of
# 138 bytes became 235 x 4.7 million pixels, 4.5 GB). For them, beyond this ratio the long
# side is cut, centred, to this many times the short side before any resize. Transforms
# that squash or pad the whole image (timm's "squash" and "border", open_clip's "squash"
# and "longest") see all of it and never enlarge it: theirs is cut only beyond the ratio
# their preprocessing records as ``max_aspect`` (their input's long side, past which a
# kept-ratio resize leaves the short side under one pixel).
MAX_ASPECT = 16


def aspect_window(width: int, height: int, max_aspect: int = MAX_ASPECT) -> tuple[int, int]:
    """``(width, height)`` of the centred window kept of an image: itself, or its long side
    cut to ``max_aspect`` times its short side, plus one pixel where that leaves an odd
    number to cut. The same number of pixels then goes from each end: the window has the
    image's own centre, which the transforms' centre crop keeps, and every decoding path
    (PIL, or a crop of a decoded tensor) cuts the same pixels."""
    short = max(min(width, height), 1)
    w, h = min(width, max_aspect * short), min(height, max_aspect * short)
    return w + (width - w) % 2, h + (height - h) % 2


def trim_aspect(image: Image.Image, max_aspect: int = MAX_ASPECT) -> Image.Image:
    """The centred :func:`aspect_window` of a PIL image (the image itself if it fits)."""
    width, height = image.size
    w, h = aspect_window(width, height, max_aspect)
    if (w, h) == (width, height):
        return image
    left, top = (width - w) // 2, (height - h) // 2
    return image.crop((left, top, left + w, top + h))


def decode_image(
    data: bytes | bytearray, name: str = "<bytes>", max_aspect: int = MAX_ASPECT
) -> Image.Image:
    """Decode an image file's bytes with PIL, fully (so truncation surfaces here), as RGB,
    cut to its :func:`aspect_window` of ``max_aspect``.

    ``name`` (the file's path) stands for the data in error messages.
    """
    if not len(data):  # PIL says only that it cannot identify it
        raise Image.UnidentifiedImageError(
            f"cannot identify image file {name!r}: it is empty (0 bytes)"
        )
    with warnings.catch_warnings():
        # PIL only warns between MAX_IMAGE_PIXELS and twice that; check_pixel_limit refuses.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            opened = Image.open(io.BytesIO(data))
        except Image.UnidentifiedImageError:
            # PIL would name the in-memory buffer (with its address) instead of the file.
            raise Image.UnidentifiedImageError(f"cannot identify image file {name!r}") from None
        except Image.DecompressionBombError:
            # PIL's own check, past twice the limit, names twice the limit and no remedy:
            # said as check_pixel_limit says it on every other path (the size, the limit).
            size = _unchecked_size(data)
            if size is None:
                raise
            check_pixel_limit(*size)
            raise  # (not over the limit after all: the limit changed meanwhile)
        with opened as image:
            check_pixel_limit(*image.size)
            if _32_bit_integers(image):
                # (Read as 16 bits, 8-bit values in them came out black; torchvision's
                # convert("RGB") clips at 255, white for 16-bit values: no scale is right.)
                raise ValueError(
                    "32-bit integer pixels (a TIFF's) have no defined brightness range; save "
                    "the image with 8 or 16 bits per channel"
                )
            if _signed_integers(image):
                raise ValueError(
                    "signed integer pixels (a TIFF's int8 or int16) have no defined "
                    "brightness range; save the image with unsigned 8 or 16 bits per channel"
                )
            key = _16_bit_colour_key(image)
            white_is_zero = _white_is_zero(image)
            image.load()
            if white_is_zero:  # (as PIL reads an 8-bit one: 0 is white)
                image = Image.fromarray(65535 - np.asarray(image).astype(np.uint16))
            rgb = to_rgb(image)
            if key is not None:
                rgb = _key_on_white(rgb, data, key)
            return trim_aspect(rgb, max_aspect)


def _16_bit_colour_key(image: Image.Image) -> tuple[int, int, int] | None:
    """The transparent colour (tRNS) of an opened 16-bit RGB PNG, taken out of its info:
    PIL gives it in 16 bits and compares it with its 8-bit pixels (their high bytes), so
    that the colour's pixels were left as they are and others, whose high bytes spell
    the key, made white."""
    key = image.info.get("transparency")
    if image.mode != "RGB" or not isinstance(key, tuple):
        return None
    if not any(t[3] == "RGB;16B" for t in image.tile):  # (PNG's raw mode of 16 bits)
        return None
    del image.info["transparency"]
    return key


def _key_on_white(rgb: Image.Image, data: bytes | bytearray, key: tuple) -> Image.Image:
    """``rgb`` with the pixels of a 16-bit PNG (``data``) that are ``key`` made white, as
    :func:`to_rgb` composites the transparent colour of an 8-bit one."""
    import torch
    from torchvision.io import ImageReadMode, decode_png

    with warnings.catch_warnings():  # (torchvision >= 0.29: decoders deprecated)
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        wide = decode_png(raw, ImageReadMode.UNCHANGED).numpy()  # (3, H, W), uint16
    values = np.array(rgb)
    values[(wide == np.array(key, np.uint16)[:, None, None]).all(axis=0)] = 255
    return Image.fromarray(values, "RGB")


def check_listed(
    path: str, st: os.stat_result, listed: tuple[int, int] | None, container: bool = False
) -> None:
    """Refuse a file whose size or modification time differ from ``listed``. The message
    of a ``container`` (a tar shard, a Parquet / Arrow file) says --force: its rows'
    identity is the container's, and --retry-failed takes a changed container back only
    where the rows done before hold its bytes as they are (it was only touched), rarely so
    for a change during a run, which fails only the rows read after it.

    Raises
    ------
    FileChangedError
        If ``listed`` is given and the file's ``(st_size, st_mtime_ns)`` differ from it (or
        the file was missing when listed).
    """
    if listed is None or (st.st_size, st.st_mtime_ns) == listed:
        return
    size, mtime_ns = listed
    change = (
        "it was missing then"
        if size == NOT_A_FILE
        else f"{size} -> {st.st_size} bytes"
        if size != st.st_size
        else "modified since, same size"
    )
    remedy = (
        "once it no longer changes, --force extracts the store again (a changed shard or "
        "Parquet file is not taken back row by row)"
        if container
        else "--retry-failed extracts it again once it no longer changes"
    )
    raise FileChangedError(
        f"{path} is not the file listed when the extraction started ({change}); {remedy}",
        (size, mtime_ns),
        (st.st_size, st.st_mtime_ns),
    )


def read_file(path: str, listed: tuple[int, int] | None = None) -> bytearray:
    """The bytes of ``path``, refused if it is not the file listed as ``(size, mtime_ns)``.

    Raises
    ------
    FileChangedError
        If ``listed`` is given and the file's size or modification time differ from it (or
        the file was missing when listed), or if the file changes while it is read.
    """
    # Opened without blocking, then refused unless it is a regular file: a FIFO named like
    # an image blocked the open (and the whole run) until something wrote into it. Checked
    # before fdopen, whose error for a folder named the descriptor ("Is a directory: 5")
    # and left it open.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError as err:
        if not os.path.islink(path):
            raise
        # (a link that reaches nothing: "No such file or directory" named a path that ls
        # lists, not the target that is missing)
        raise FileNotFoundError(f"{path} {why_missing(path)}") from err
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device)", path)
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        check_listed(path, st, listed)
        data = bytearray(st.st_size)
        n = fh.readinto(data)
        # Rewritten in place as it was read (its size kept), its bytes are part old, part
        # new: its size and modification time after the read tell.
        after = os.fstat(fh.fileno())
    if n != st.st_size or (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        raise FileChangedError(
            f"{path} changed while it was read; --retry-failed extracts it again once it no "
            "longer changes",
            (st.st_size, st.st_mtime_ns),
            (after.st_size, after.st_mtime_ns),
        )
    return data


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def failure_reason(err: Exception) -> str:
    """A failed item's recorded reason: the exception's type and message, in 200 bytes
    (:func:`~extract._schema.shorten`: a long path in the middle is left out first)."""
    return shorten(f"{type(err).__name__}: {err}")
