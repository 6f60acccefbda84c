"""``mr2-probe``'s output folder: checked before any work, and its files replaced together."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

import joblib

from ..front import _final
from ..report import _strict_json
from ._options import _OPTIONS, _dest, _grid, _unread_options
from ._usage import UsageError, _few, _interrupts_held, _one_line

# Every run removes those of an earlier run in the same folder before writing its own.
_FIGURES = ("class_accuracy.png", "groups.png", "margins.png", "front.png", "cv_curve.png")
# Every file a run writes to --out (or removes there, as an earlier run's).
_OUTPUTS = (
    "models.joblib",
    "command.json",
    "report.txt",
    "report.md",
    "report.json",
    "class_names.json",
    *_FIGURES,
)


def _prepare_out(path: str) -> Path:
    """Make sure this run can write the output folder, before any work. A new folder is
    created once the inputs are checked (:func:`_claim_out`): a refused run leaves none."""
    if not path:
        raise UsageError("--out needs a folder; got an empty name")
    out = Path(path)
    for folder in (out, *out.parents):
        if folder.exists() and not folder.is_dir():
            raise UsageError(
                f"--out {path!r} cannot be a folder: {str(folder)!r} is a file; choose "
                "another --out"
            )
        if folder.is_symlink() and not folder.exists():  # (mkdir: "File exists", later)
            raise UsageError(
                f"--out {path!r} cannot be a folder: {str(folder)!r} is a link to "
                f"{os.readlink(folder)!r}, which does not exist; create that folder, or "
                "choose another --out"
            )
    taken = [name for name in _OUTPUTS if (out / name).exists()]
    if taken and not _earlier_run(out):
        why = (
            "its command.json holds no run's options"
            if (out / "command.json").exists()
            else "there is no command.json of one"
        )
        raise UsageError(
            f"--out {path!r} holds {', '.join(taken)}, which this run would replace, and "
            f"no earlier mr2-probe run wrote them ({why}); choose another --out, or move "
            "them away"
        )
    try:  # the folder, or the one that its new folders will be made in
        with tempfile.TemporaryFile(dir=next(f for f in (out, *out.parents) if f.exists())):
            pass
    except OSError as error:
        raise _unwritable(path, error) from error
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise UsageError(
            '--out draws plots, which need matplotlib: pip install "mr2-probe[plot]"'
        ) from error
    return out


def _unwritable(path: str, error: OSError) -> UsageError:
    return UsageError(
        f"cannot write to --out {path!r} ({error.strerror or error}); choose a folder you "
        "can write to"
    )


@contextlib.contextmanager
def _claim_out(out: Path):
    """The output folder (checked by :func:`_prepare_out`), created for the run inside and
    held by it: a second run into it meanwhile is refused, as their files would mix. The
    lock is the folder's own (``flock``, released by the kernel when its holder ends: none
    is left behind by a killed run, nor a lock file in the folder); POSIX systems only, and
    none where the file system has no locks. A run that fails (every fit of a search,
    Ctrl-C) before writing there leaves none of the folders it created."""
    try:
        import fcntl
    except ImportError:  # Windows, whose folders open to no lock
        fcntl = None
    # Innermost first; not "runs/..", which is no folder of its own: "runs" is.
    new = [f for f in (out, *out.parents) if f.name != ".." and not f.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        folder = os.open(out, os.O_RDONLY) if fcntl is not None else None
    except OSError as error:
        raise _unwritable(str(out), error) from error
    try:
        if folder is not None:
            _lock(out, folder, fcntl)
        try:
            yield out
        except BaseException:
            for created in new:  # held by this run: no other run's
                try:
                    created.rmdir()  # only where empty
                except OSError:
                    break
            raise
    finally:
        if folder is not None:
            os.close(folder)  # (and its lock)


def _lock(out: Path, folder: int, fcntl) -> None:
    """Lock ``out`` (its descriptor ``folder``) for this run, or refuse it as another's."""
    try:
        fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UsageError(
            f"--out {str(out)!r} is being written by another mr2-probe run, whose files "
            "this run's would mix with; wait for it to end, or choose another --out"
        ) from None
    except OSError:  # a file system without locks: the run goes on unlocked
        pass


def _earlier_run(out: Path) -> bool:
    """Whether ``out`` holds an earlier run's files: its command.json, the options of a run."""
    try:
        options = json.loads((out / "command.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(options, dict) and {"train", "out"} <= options.keys()


def _once(models: dict) -> dict:
    """``models`` with each model under its first name only: the front's choice of ERM or
    MR² is the model reported under that name, whose search is said once."""
    first = {}
    for name, model in models.items():
        if not any(model is other for other in first.values()):
            first[name] = model
    return first


def _quiet(model):
    """``model`` with verbose=0 in every parameter that sets it (a Pipeline's steps, a
    wrapper's estimator), as it is saved: the progress bars were the command's
    (--no-progress), and a refit from Python prints none. (The searches and the front fit
    their estimators with verbose=0 already.)"""
    keys = [k for k in model.get_params() if k == "verbose" or k.endswith("__verbose")]
    return model.set_params(**dict.fromkeys(keys, 0))


def _write_outputs(
    out: Path,
    report,
    lines: list,
    data: dict,
    front,
    fitted: dict,
    args,
    mr2_name,
    names,
    launched: dict | None = None,
) -> list:
    """Models, class names, options, the three reports (each with the search's choices,
    the notes and the front), then the figures; the names of those that failed, each said
    in one line."""
    from ..plotting import (
        MissingGlyphWarning,
        _caught,
        plot_class_accuracy,
        plot_cv_curve,
        plot_front,
        plot_group_accuracy,
        plot_margins,
    )

    text, markdown = [report.to_text(per_class=True)], [report.to_markdown(per_class=True)]
    if lines:
        text.append("\n".join(lines))
        markdown.append("```text\n" + "\n".join(lines) + "\n```")  # the curves' columns
    if front is not None:
        text.append(front.to_text())
        markdown.append(front.to_markdown())
        data["front"] = front.to_dict()
    # The models and the reports are written whole beside their places, then moved into
    # them together: a run that fails or is killed leaves the earlier run's set, never a
    # truncated model or reports that describe other models.
    files = _model_files(fitted, args, names, launched)
    files |= {
        "report.txt": _text("\n\n".join(text)),
        "report.md": _text("\n\n".join(markdown)),
        "report.json": _text(_strict_json(data, indent=2, ensure_ascii=False)),
    }
    _remove_partials(out)
    # With them, an earlier run's class names (which would describe other data) and its
    # figures go; then the figures are drawn, each whole or not at all.
    stale = [*_FIGURES, *(["class_names.json"] if names is None else [])]
    _replace_together(out, files, stale=stale)
    figures = {
        "class_accuracy.png": lambda path: plot_class_accuracy(report, path, model=mr2_name),
        "groups.png": lambda path: plot_group_accuracy(report, path),
        "margins.png": lambda path: plot_margins(_final(fitted[mr2_name]), path, class_names=names),
    }
    if front is not None:
        figures["front.png"] = lambda path: plot_front(front, path)
    searches = {name: m for name, m in _once(fitted).items() if hasattr(_final(m), "Cs_")}
    if searches:
        figures["cv_curve.png"] = lambda path: plot_cv_curve(searches, path, scoring=args.scoring)
    failed = []
    with _caught(MissingGlyphWarning) as glyphs:
        for name, write in figures.items():
            try:
                _replace_together(out, {name: write})
            except Exception as error:  # that figure is missing; the others are still drawn
                if args.debug:
                    raise
                failed.append(name)
                why = _one_line(error) or type(error).__name__  # AssertionError() says nothing
                print(f"mr2-probe: error: {name} is left out: {why}", file=sys.stderr)
    if glyphs:  # once for all figures, not matplotlib's lines for each character
        # The classes drawn: the report's, and the training classes of margins.png (a class
        # that the test set lacks among them).
        # (a store's codes as its names: one of no row is drawn nowhere)
        trained = list(getattr(_final(fitted[mr2_name]), "classes_", []))
        trained = [names[int(k)] for k in trained] if names is not None else trained
        _warn_of_missing_glyphs(glyphs, [*report.labels, *trained])
    print(f"wrote report, plots and models to {out}/", file=sys.stderr)
    return failed


def _model_files(fitted: dict, args, names, launched: dict | None) -> dict:
    """command.json, models.joblib and (of a store's codes) class_names.json: name ->
    function writing a path, command.json first (it marks the folder as a run's,
    _earlier_run)."""
    # As the run read them: None for what it does not read (a search's --cv without one).
    # Also null: an option whose parameter --grid searched (its value is the default,
    # which no model took; the grid's values are under "grid"). --seed still seeds the
    # splits where the grid searches random_state.
    searched = {_dest(_OPTIONS[name]) for name in _grid(args.grid) if name in _OPTIONS}
    unread = _unread_options(args) | (searched - {"seed"})
    options = {k: None if k in unread else v for k, v in vars(args).items() if k != "scale"}
    options = _rerunnable(options, launched)
    files = {
        "command.json": _text(_strict_json(options, indent=2)),
        "models.joblib": lambda path: joblib.dump({k: _quiet(m) for k, m in fitted.items()}, path),
    }
    if names is not None:
        files["class_names.json"] = _text(json.dumps(names, ensure_ascii=False))
    return files


def _write_models(out: Path, fitted: dict, args, names, launched: dict | None = None) -> None:
    """The fitted models alone (with command.json and class_names.json), where the run
    could not go on to its reports: an earlier run's reports and figures go, which would
    describe other models."""
    files = _model_files(fitted, args, names, launched)
    _remove_partials(out)
    _replace_together(out, files, stale=[name for name in _OUTPUTS if name not in files])


def _remove_partials(out: Path) -> None:
    """A killed run's files half written (this run holds the folder)."""
    for name in _OUTPUTS:
        partial = _partial(out, name)
        if partial.is_symlink() or not partial.is_dir():  # (a folder is none: the user's)
            partial.unlink(missing_ok=True)


#: The options that name files or folders: command.json writes them absolute.
_PATHS = ("train", "test", "labels", "test_labels", "out")


def _rerunnable(options: dict, launched: dict | None) -> dict:
    """command.json's options: the paths absolute, as report.json's ``inputs`` has them
    (typed relative, they named nothing from another folder), after the command line as
    typed and the folder it was typed in (``launched``, from ``_main._launched``)."""
    launched = launched or {"argv": None, "cwd": os.getcwd()}
    cwd = launched["cwd"]

    def absolute(path: str) -> str:
        return path if cwd is None else os.path.normpath(os.path.join(cwd, path))

    paths = {k: absolute(options[k]) for k in _PATHS if options.get(k) is not None}
    return {"argv": launched["argv"], "cwd": cwd, **options, **paths}


def _warn_of_missing_glyphs(glyphs: list, labels) -> None:
    """Say in one line which class names have characters the plot font lacks (the
    figures draw those as boxes)."""
    missing = list(dict.fromkeys(c for warning in glyphs for c in warning.characters))
    affected = list(dict.fromkeys(str(k) for k in labels if any(c in str(k) for c in missing)))
    where = (
        f" (in {len(affected)} class name{'s' if len(affected) > 1 else ''}: {_few(affected)})"
        if affected
        else ""
    )
    print(
        f"mr2-probe: warning: the plot font has no glyph for {_few(missing, 6)}, which "
        f"{'shows as a box' if len(missing) == 1 else 'show as boxes'} in the figures{where}",
        file=sys.stderr,
    )


def _text(content: str):
    # UTF-8 whatever the locale. A lone surrogate (a path or class name that was not UTF-8,
    # as os.listdir and sys.argv decode one) is written as its JSON escape, \udce9: it
    # failed the whole run's writing, models included, after every fit.
    return lambda path: path.write_text(content + "\n", encoding="utf-8", errors="backslashreplace")


def _replace_together(folder: Path, files: dict, stale=()) -> None:
    """Write each file (name -> function writing a path) beside its place, then move them
    all into place and remove the earlier run's ``stale`` files; if a write fails, nothing
    is moved and the error names the file. A Ctrl-C or SIGTERM while they are moved waits
    until all are (one between two renames left new models beside the earlier run's
    reports)."""
    partial = {name: _partial(folder, name) for name in files}
    try:
        for name, write in files.items():
            try:
                write(partial[name])
            except OSError as err:
                message = f"cannot write {folder / name}: {err.strerror or err}"
                raise OSError(err.errno, message) from err
        with _interrupts_held():
            for name in files:
                os.replace(partial[name], folder / name)
            for name in stale:
                (folder / name).unlink(missing_ok=True)
    finally:
        for path in partial.values():
            path.unlink(missing_ok=True)


def _partial(folder: Path, name: str) -> Path:
    """Where the file ``name`` is written whole before it is renamed into its place (a run
    killed meanwhile leaves it: the next run into ``folder`` removes it)."""
    return folder / f".{Path(name).stem}.partial{Path(name).suffix}"
