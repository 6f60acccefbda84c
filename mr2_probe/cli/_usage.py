"""The one kind of error ``mr2-probe`` reports in one line, and how it writes one."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib.metadata
import platform
import re
import signal
import threading
import warnings

from .._h5 import one_line as _one_line


class UsageError(ValueError):
    """A mistake in the options or the input files of ``mr2-probe``, told in one line."""


class RunError(Exception):
    """A failure of the run itself, not of its options or inputs (a fit that ran out of
    memory), told in one line with exit status 1."""


def _out_of_memory(error: BaseException) -> str | None:
    """What ``error`` says, short, where it is memory running out: torch's device
    allocators' RuntimeError ("CUDA out of memory. Tried to allocate 2.00 GiB", then a
    paragraph of the device's counts and allocator settings), its CPU allocator's ("can't
    allocate memory") or a MemoryError (NumPy's names the array); None for any other."""
    if isinstance(error, MemoryError):
        return _one_line(error) or type(error).__name__
    text = _one_line(error)
    if not isinstance(error, RuntimeError) or not re.search(
        r"out of memory|can't allocate memory", text
    ):
        return None
    short = re.match(r".*?out of memory\.?(?: Tried to allocate [\d.]+ \w+)?", text)
    return short[0] if short else text


class SuggestingParser(argparse.ArgumentParser):
    """argparse's parser, whose refusal of an unknown option names the closest one, as
    it names the choices of a misspelt value (what Python 3.14's ``suggest_on_error``
    does for choices alone, at the same cutoff: none where none is that close), and of an
    ambiguous abbreviation the option it is in another case (``--c``: ``--C``, which
    argparse's prefixes, case by case, never offer)."""

    def error(self, message):
        options = [option for action in self._actions for option in action.option_strings]
        unknown = message.partition("unrecognized arguments: ")[2].split()
        ambiguous = message.partition("ambiguous option: ")[2].partition(" could match")[0]
        hints = []
        for word in [*unknown, *ambiguous.split()]:
            name = word.partition("=")[0]
            other_case = [option for option in options if option.lower() == name.lower()]
            # (compared without their dashes, which every option shares: with them, --bogus
            # came within difflib's cutoff of --out)
            bare = {option.lstrip("-"): option for option in options}
            # (an option with its value glued on, --C0.1 or --headcosine, is no close
            # spelling of it: the option that takes the rest as its value is meant)
            glued = [
                option
                for action in self._actions
                for option in action.option_strings
                if name.startswith("-")  # (a word without dashes, a file, is no option)
                and name.lstrip("-").startswith(option.lstrip("-"))
                and _takes(action, name.lstrip("-")[len(option.lstrip("-")) :])
            ]
            close = (
                other_case
                or [
                    bare[match]
                    for match in difflib.get_close_matches(name.lstrip("-"), bare, n=1)
                    if name.startswith("-")
                ]
                or sorted(glued, key=len)[-1:]
            )
            hints += [f"{name}: did you mean {close[0]}?"] if close else []
        super().error("; ".join([message, *hints]))


def _takes(action: argparse.Action, text: str) -> bool:
    """Whether ``action``'s option takes ``text`` as its value (--head: cosine, --C: 0.1)."""
    if not text or action.nargs == 0:  # (a flag takes none)
        return False
    if action.choices is not None:
        return text in action.choices
    try:
        (action.type or str)(text)
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        return False
    return True


class _VersionAction(argparse._VersionAction):
    """argparse's ``version`` action, its text made by ``version()`` once asked for: not at
    every parser built (each package's metadata read, a few milliseconds at every run)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if callable(self.version):
            self.version = self.version()
        super().__call__(parser, namespace, values, option_string)


def add_version(parser: argparse.ArgumentParser, packages: tuple[str, ...]) -> None:
    """``--version``: the program's version and those of ``packages`` (distribution names),
    read from their metadata, without importing them; a package not installed is named so.
    """

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    def text() -> str:
        from mr2_probe import __version__  # (the code that runs: a checkout, not installed)

        libraries = ", ".join(f"{name} {version(name)}" for name in packages)
        return f"{parser.prog} {__version__} (Python {platform.python_version()}, {libraries})"

    parser.add_argument(
        "--version", action=_VersionAction, version=text, help="print the versions and exit"
    )


@contextlib.contextmanager
def warnings_in_one_line(prog: str, raw: bool = False):
    """Warnings shown while it runs come out as one line each, ``prog: warning: ...``, and
    each message once: Python's form (the file, line and source line of the warning call)
    repeated a library's warning for every fit of a search. ``raw`` (--debug) keeps
    Python's form. Runs that overlap (in threads) share the one-line form; the last to end
    puts Python's back (a form set meanwhile by another library stays)."""
    if raw:
        yield
        return
    with _one_line_runs["lock"]:
        if not _one_line_runs["progs"]:
            # (ours where something restored it after the last run: its form stays the one)
            if warnings.formatwarning is not _warning_in_one_line:
                _one_line_runs["original"] = warnings.formatwarning
            _one_line_runs["shown"] = set()
            warnings.formatwarning = _warning_in_one_line
        _one_line_runs["progs"].append(prog)
    try:
        yield
    finally:
        with _one_line_runs["lock"]:
            _one_line_runs["progs"].remove(prog)
            if not _one_line_runs["progs"] and warnings.formatwarning is _warning_in_one_line:
                warnings.formatwarning = _one_line_runs["original"]


# The runs of warnings_in_one_line under way (their programs, the latest last), the messages
# they have shown, and the form they replaced: one run's end restored the form that the other
# had replaced, leaving every warning of the process in one line, each once, for good.
_one_line_runs: dict = {
    "lock": threading.Lock(),
    "progs": [],
    "shown": set(),
    "original": warnings.formatwarning,
}


def _warning_in_one_line(message, category, filename, lineno, line=None) -> str:
    """:func:`warnings.formatwarning` while :func:`warnings_in_one_line` runs; the form it
    replaced where it is left in place after the runs (restored so by another library)."""
    text = _one_line(message)
    with _one_line_runs["lock"]:
        prog = _one_line_runs["progs"][-1] if _one_line_runs["progs"] else None
        if prog is not None:
            if text in _one_line_runs["shown"]:
                return ""
            _one_line_runs["shown"].add(text)
    if prog is None:
        return _one_line_runs["original"](message, category, filename, lineno, line)
    return f"{prog}: warning: {text}\n"


def _few(values, n: int = 4, show=repr) -> str:
    shown = ", ".join(show(v) for v in list(values)[:n])
    return shown + (f", ... ({len(values)} in all)" if len(values) > n else "")


@contextlib.contextmanager
def _interrupts_held():
    """A Ctrl-C inside is noted, and raised (KeyboardInterrupt) on leaving, as
    mr2-extract holds it while its libraries import: one inside NumPy's or torch's import
    leaves them half imported (a RecursionError's traceback, an abort in torch's C++). So
    is a SIGTERM where ``mr2-probe`` raises :class:`Terminated` on it
    (:func:`_terminated_as_interrupted`), raised as that on leaving. A second signal is
    raised at once. No change outside the main thread, nor to a signal that has another
    handler (SIGINT ignored, in a job started in the background; SIGTERM's default, or an
    application's own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: _raise_terminated}
    held = [signum for signum, handler in ours.items() if signal.getsignal(signum) is handler]
    noted = []

    def raised(signum):
        return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    def note(signum, frame):
        if noted:
            raise raised(signum)
        noted.append(signum)

    previous = {signum: signal.signal(signum, note) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if noted:
        raise raised(noted[0])


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``timeout``, a batch job's time limit), raised where the run is
    as Ctrl-C's KeyboardInterrupt is, so that it ends as a Ctrl-C does (status 143)."""


@contextlib.contextmanager
def _terminated_as_interrupted(command: bool):
    """A SIGTERM inside raises :class:`Terminated`: it ended the process at once, which
    lost the models a stopped front keeps and left the --out folder it had created. Only
    where ``command`` (``main()`` run as the command, its arguments from ``sys.argv``): a
    program that calls ``main(argv)`` keeps SIGTERM's own meaning, to end it, which a
    status returned to it would not. No change outside the main thread either, nor where
    SIGTERM has a handler of its own (an application that runs the command)."""
    if (
        not command
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_terminated(signum, frame):
    """SIGTERM's handler while :func:`_terminated_as_interrupted` runs."""
    raise Terminated
