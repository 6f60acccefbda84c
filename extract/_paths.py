"""A count's noun for messages, and a path's leading ``~``. (What a path that cannot be
read is: mr2_probe._h5's why_missing, which mr2-probe's messages say too.)"""

from __future__ import annotations

import os


def plural(n: int, word: str, words: str | None = None) -> str:
    """``word`` for one, else ``words`` (default: ``word`` + "s"): "1 image", "2 images"."""
    return word if n == 1 else words or word + "s"


def expand_home(path: str | bytes) -> str | bytes:
    """``path`` with a leading ``~`` or ``~user`` expanded to that home folder, as
    torchvision's datasets expand their root (and as a shell does not, after
    ``fashion-mnist:test@`` or in a quoted pattern), unless a file or folder of that name
    exists here (``./~``). A bytes path stays bytes."""
    tilde, sep = ("~", os.sep) if isinstance(path, str) else (b"~", os.fsencode(os.sep))
    if not path.startswith(tilde) or os.path.lexists(path.split(sep, 1)[0]):
        return path
    return os.path.expanduser(path)
