"""Words for messages: what a path that cannot be read is, and a count's noun."""

from __future__ import annotations

import errno
import os


def plural(n: int, word: str, words: str | None = None) -> str:
    """``word`` for one, else ``words`` (default: ``word`` + "s"): "1 image", "2 images"."""
    return word if n == 1 else words or word + "s"


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


def expand_home(path: str) -> str:
    """``path`` with a leading ``~`` or ``~user`` expanded to that home folder, as
    torchvision's datasets expand their root (and as a shell does not, after
    ``fashion-mnist:test@`` or in a quoted pattern), unless a file or folder of that name
    exists here (``./~``)."""
    if not path.startswith("~") or os.path.lexists(path.split(os.sep, 1)[0]):
        return path
    return os.path.expanduser(path)
