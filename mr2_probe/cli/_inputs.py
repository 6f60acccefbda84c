"""``mr2-probe``'s input files: training and test data read, and data that cannot be one task
refused."""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

from .._data import as_given
from ._feature_files import (
    _NAME_KEYS,
    _STORE,
    _load_features,
    _load_xy,
    _nfc,
    _rows,
    feature_format,
)
from ._usage import UsageError, _few, _one_line

# What report.json records of a store, so that a per-class result can be traced to the
# features it was measured on.
_RECORDED_PROVENANCE = (
    "backbone", "weights", "preprocessing", "compute", "dtype", "normalize", "source",
    "source_root", "source_fingerprint", "shard_rank", "shard_world_size",
)  # fmt: skip


def _sources(args) -> dict:
    """Each input file's absolute path and, for a store, its provenance and the failed
    images left out (the test set's, or None for one held out of the training data)."""

    def record(path, labels_path) -> dict:
        entry = {"path": os.path.abspath(path)}
        if labels_path is not None:
            entry["labels"] = os.path.abspath(labels_path)
        if feature_format(path) in _STORE:
            with _load_features(path) as store:
                metadata, failed = store.metadata, len(store.failures)
            entry["provenance"] = {k: metadata[k] for k in _RECORDED_PROVENANCE if k in metadata}
            entry["failed_images_left_out"] = failed
        return entry

    test = None if args.test is None else record(args.test, args.test_labels)
    return {"train": record(args.train, args.labels), "test": test}


def _inputs_record(sources: dict, args, y, y_test, names) -> dict:
    """What the report was measured on: the files (:func:`_sources`) and how many samples
    of each class it counted; for a held-out test set, the split that made it."""

    def counts(labels) -> dict:
        values, n = np.unique(labels, return_counts=True)
        shown = values if names is None else np.asarray(names, dtype=object)[values]
        return {str(v): int(k) for v, k in zip(shown, n, strict=True)}

    train = sources["train"] | {"samples": int(len(y)), "samples_per_class": counts(y)}
    test = sources["test"] or {
        "held_out_of": train["path"],
        "test_size": args.test_size,
        "seed": args.seed,
    }
    test = test | {"samples": int(len(y_test)), "samples_per_class": counts(y_test)}
    return {"train": train, "test": test}


def _inputs(args, stack=None):
    """Training and test data, checked to describe one task; the class names, if any; the
    files' records (:func:`_sources`, read now: a store replaced during the fit is not
    described). With ``stack`` a store's features above the memory limit stay in its
    file (:func:`_load_xy`), open until ``stack`` closes; the part held out by --test-size
    is then a row view of them, as the rest."""
    X, y, names = _load_xy(args.train, args.labels, stack=stack)
    repeated = _repeated(names)
    names = _distinct(names)
    classes = np.unique(y)
    if len(classes) < 2:  # refused here, before any fit (scikit-learn's own error came after)
        only = names[classes[0]] if names is not None else classes[0].item()
        raise UsageError(
            f"{args.train} holds samples of one class only ({only!r}); a classifier needs at "
            "least 2"
        )
    if args.test is None:
        try:
            # Each part in the file's order: a store's rows are read in it, a block at a
            # time (a shuffled order read the whole store for every block).
            parts = train_test_split(
                np.arange(len(y)), test_size=args.test_size, stratify=y, random_state=args.seed
            )
        except ValueError as error:
            why = _single_sample_classes(y, names) or (
                f"{_one_line(error).rstrip('.')}; choose a --test-size that leaves each class "
                "at least one sample in both parts (or pass --test)"
            )
            raise UsageError(
                f"cannot hold out --test-size {as_given(args.test_size)} of {args.train} with "
                f"every class in both parts: {why}"
            ) from error
        train, test = (np.sort(part) for part in parts)
        X, X_test, y, y_test = _rows(X, train), _rows(X, test), y[train], y[test]
        # A stratified split can still leave a small class no sample to train on (all its
        # samples held out): the probe would never predict it, and be scored 0% on it.
        missing = np.setdiff1d(classes, y)
        if len(missing):
            first = names[missing[0]] if names is not None else missing[0].item()
            raise UsageError(
                f"cannot hold out --test-size {as_given(args.test_size)} of {args.train} with "
                f"every class in both parts: it leaves {len(missing)} of the {len(classes)} "
                f"classes no sample to train on (the first: {first!r}); choose a smaller "
                "--test-size, give those classes more samples, or pass --test"
            )
        # (the file's rows of each part, which name a row of either: _check_scaled_test)
        return X, y, X_test, y_test, names, _sources(args) | {"held_out": (train, test)}
    _check_not_the_training_data(args.train, args.test)
    X_test, y_test, test_names = _load_xy(args.test, args.test_labels, "--test-labels", stack)
    # Stores of two backbones are named by them first, rather than by their widths.
    sources = _sources(args)
    _check_same_extraction(args.train, args.test, sources)
    if X_test.shape[1] != X.shape[1]:
        raise UsageError(
            f"the test features have {X_test.shape[1]} columns and the training features "
            f"{X.shape[1]}; use features of the same backbone and settings"
        )
    repeated += _repeated(test_names)
    test_names = _distinct(test_names)
    if names is None and test_names is None:  # a .npz's class names beside integer labels
        y, y_test = _codes_of_named(y, y_test, args)
        classes = np.unique(y)
    y_test, matched = _match_by_name(y, names, y_test, test_names, repeated, args)
    unseen = sorted(set(np.unique(y_test).tolist()) - set(classes.tolist()), key=str)
    if unseen:
        shown = unseen
        advice = "label train and test alike (both class names or both the same integer codes)"
        if matched and names is not None:  # codes of the training store's list
            shown = [names[k] for k in unseen]
            them = "them" if len(unseen) > 1 else "it"
            advice = f"{args.train} lists {them} among its classes but holds no sample of {them}"
        elif matched:  # text training labels: the test store's names
            advice = "a probe cannot predict classes it was not trained on"
        raise UsageError(
            f"the test labels hold {len(unseen)} class{'es' if len(unseen) > 1 else ''} absent "
            "from the training labels "
            f"({_few(shown)}); {advice}"
        )
    return X, y, X_test, y_test, names, sources


def _as_codes(numbers: str, store: str, names) -> None:
    """Say that the integer labels of ``numbers`` are taken as codes of ``store``'s
    class ``names``, not matched by name."""
    listed = _few(list(enumerate(names)), show=lambda code: f"{code[0]} {code[1]!r}")
    print(
        f"mr2-probe: warning: the integer labels of {numbers} are taken as codes of "
        f"{store}'s class names ({listed}), not matched by name: label {numbers} with "
        "class names to match them",
        file=sys.stderr,
    )


def _codes_of_named(y, y_test, args):
    """``y`` and ``y_test``, integer labels of a NumPy file beside a .npz whose class_names
    named its labels (:func:`_named`) taken as codes of those names, as integer labels beside
    a store are taken as its codes (with its warning line)."""
    for plain, labelled, numbers, named in (
        (y_test, y, args.test_labels or args.test, args.train),
        (y, y_test, args.labels or args.train, args.test),
    ):
        if plain.dtype.kind not in "iu" or labelled.dtype.kind != "U":
            continue
        listed = _npz_class_names(named)
        if listed is None:
            continue
        if plain.size and (plain.min() < 0 or plain.max() >= len(listed)):
            raise UsageError(
                f"the integer labels of {numbers} hold codes outside 0..{len(listed) - 1}, "
                f"the classes that {named}'s class names list; label {numbers} with class names"
            )
        _as_codes(numbers, named, listed.tolist())
        if plain is y:
            return listed[y], y_test
        return y, listed[y_test]
    return y, y_test


def _npz_class_names(path: str):
    """The class names that a .npz lists for its integer labels (:func:`_named`), or None
    (another kind of file, or none listed)."""
    if feature_format(path) != ".npz":
        return None
    with np.load(path, allow_pickle=False) as data:
        key = next((key for key in _NAME_KEYS if key in data.files), None)
        if key is None:
            return None
        names = data[key]  # (checked as the file was read)
    return np.char.decode(names, "utf-8") if names.dtype.kind == "S" else names


def _match_by_name(y, names, y_test, test_names, repeated: list[str], args):
    """The test labels in the training labels' terms, matched by class name where the two
    name their classes differently; and whether they were (or are codes of one list).

    A store's labels are codes into its own class names: test codes of a store that lists
    its classes in another order (or only those it holds, as a list source's does) are
    translated by name, and so are text labels of a NumPy file against a training store;
    a store's test codes against text training labels become their names.
    """

    def text(labels):
        return labels.dtype.kind in "USO"

    # Booleans are neither codes of a store's class names nor names (they were taken for
    # codes, then indexed the names as a mask, after every fit).
    for labels, source, store in (
        (y_test, args.test_labels or args.test, args.train if names is not None else None),
        (y, args.labels or args.train, args.test if test_names is not None else None),
    ):
        if store is not None and labels.dtype.kind == "b":
            raise UsageError(
                f"the labels of {source} are booleans (True/False), which name no class of "
                f"{store}: label them with its class names or their integer codes"
            )
    if names is not None:
        if test_names is not None and names != test_names:
            held = [test_names[k] for k in np.unique(y_test).tolist()]  # not failed classes
        elif test_names is None and text(y_test):
            held = [str(v) for v in np.unique(y_test)]
        else:  # two stores of one list of names (codes alike), or integer test labels
            if test_names is None:
                _as_codes(args.test_labels or args.test, args.train, names)
            return y_test, test_names is not None
    elif test_names is None or not text(y):
        if test_names is not None:
            _as_codes(args.labels or args.train, args.test, test_names)
        elif _strings(y) and _strings(y_test):  # text labels on both sides
            return _spelt_as_trained(y, y_test, args.train), False
        return y_test, False
    if repeated:  # two classes of one name: which is which cannot be read off names
        both = names is not None and test_names is not None
        remedy = (
            "extract both stores with one list of class names"
            if both
            else "label both files alike (both class names or both the same integer codes)"
        )
        raise UsageError(
            f"{args.train} and {args.test} name their classes differently, and the class "
            f"names {_few(sorted(set(repeated)))} name several classes: the test labels "
            f"cannot be matched to the training classes by name; {remedy}"
        )
    if names is None:  # text training labels: the test codes' names, checked as labels
        named = _as_trained(test_names, y, args.train)
        return np.asarray(named, dtype=object)[y_test].astype(str), True
    code = _codes_by_name(names, args.train)
    foreign = [name for name in held if _nfc(name) not in code]
    if foreign:
        raise UsageError(
            f"{args.test} has {len(foreign)} class{'es' if len(foreign) > 1 else ''} that "
            f"{args.train} does not "
            f"({_few(foreign)}); a probe cannot predict classes it was not trained on"
            + _near_names(foreign, names)
        )
    if test_names is None:  # text labels: codes of their distinct values
        values, inverse = np.unique(y_test, return_inverse=True)
        return np.array([code[_nfc(str(v))] for v in values], dtype=y.dtype)[inverse], True
    # -1 marks a class the test store lists but holds no label of (none is read).
    table = np.array([code.get(_nfc(name), -1) for name in test_names], dtype=np.int64)
    return table[y_test].astype(y.dtype), True


def _near_names(foreign: list[str], names: list[str]) -> str:
    """``" (did you mean 'bag' for 'Bag'?)"``: training class names that differ from the
    test's unknown ones in case, or in a letter or two, for the first three of them."""
    folded = {}  # (in NFC, as names are matched: 'CAFÉ' for a decomposed 'Café' too)
    for name in names:
        folded.setdefault(_nfc(name).casefold(), name)
    pairs = []
    for name in foreign[:3]:
        near = folded.get(_nfc(name).casefold()) or next(
            iter(difflib.get_close_matches(name, names, n=1, cutoff=0.8)), None
        )
        if near is not None:
            pairs.append(f"{near!r} for {name!r}")
    return f" (did you mean {', '.join(pairs)}?)" if pairs else ""


def _strings(labels: np.ndarray) -> bool:
    """Whether every label is a str (a str array, or an object array of str alone)."""
    if labels.dtype.kind != "O":
        return labels.dtype.kind == "U"
    try:
        values = np.unique(labels)
    except TypeError:  # labels of several types do not sort
        return False
    return all(isinstance(v, str) for v in values.tolist())


def _spelt_as_trained(y: np.ndarray, y_test: np.ndarray, train: str) -> np.ndarray:
    """Text test labels spelt as the training labels they equal in NFC (:func:`_nfc`), as
    a store's class names are matched: 'ñandú' in decomposed accents was a class absent
    from training, though it printed alike. Others are left as they are."""
    values, inverse = np.unique(y_test, return_inverse=True)
    spelt = np.asarray(_as_trained(values.tolist(), y, train), dtype=object)[inverse]
    return spelt.astype(str) if y_test.dtype.kind == "U" else spelt


def _as_trained(names: list[str], y: np.ndarray, train: str) -> list[str]:
    """Each name spelt as the text training label it equals in NFC (:func:`_nfc`), or as
    it is where none does; training labels that are one name in two Unicode forms are
    refused (:func:`_codes_by_name`), as a test name cannot be matched to either."""
    trained = [str(v) for v in np.unique(y)]
    code = _codes_by_name(trained, train)
    return [trained[code[_nfc(v)]] if _nfc(v) in code else v for v in names]


def _codes_by_name(names: list[str], path: str) -> dict[str, int]:
    """Each class name's code, keyed by :func:`_nfc`; two names spelt alike in NFC (one
    name in two Unicode forms) are refused, as no test label can be matched to either."""
    code = {}
    for k, name in enumerate(names):
        other = code.setdefault(_nfc(name), k)
        if other != k:
            raise UsageError(
                f"{path} lists the class names {names[other]!r} and {name!r}, which are "
                "one name in two Unicode forms (composed and decomposed accents): the test "
                "labels cannot be matched to the training classes by name; rename one of them"
            )
    return code


def _repeated(names: list[str] | None) -> list[str]:
    """The class names that name several classes (ImageNet's lists name two 'crane')."""
    if names is None:
        return []
    values, counts = np.unique(np.asarray(names, dtype=object), return_counts=True)
    return [str(v) for v in values[counts > 1]]


def _distinct(names: list[str] | None) -> list[str] | None:
    """Class names with a repeated one told apart by its code, 'crane (134)': mapped to
    names, the predictions of two classes of one name were scored as one class."""
    repeated = set(_repeated(names))
    if not repeated:
        return names
    # 'crane (1)' may be another class's own name already: then 'crane (code 1)'.
    for form in ("{} ({})", "{} (code {})"):
        told = [form.format(name, k) if name in repeated else name for k, name in enumerate(names)]
        if not _repeated(told):
            return told
    while repeated := set(_repeated(told)):  # names made to defeat both forms
        told = [f"{name} ({k})" if name in repeated else name for k, name in enumerate(told)]
    return told


def _check_not_the_training_data(train: str, test: str) -> None:
    """Refuse a --test that is the training file itself, or a store of the same images or
    of some of them: its accuracy would be training accuracy. Stores that record each
    image's sha256 (extract's) are compared by content: a test store of other images is
    taken even where the listings look alike, and one of training images is refused
    however it was listed; a few images shared by two sources are only said."""
    shared = "the training images" if _same_file(train, test) else None
    if not shared and {feature_format(train), feature_format(test)} <= set(_STORE):
        # The same image list, and the same shard of it (shards of one list are disjoint).
        keys = ("source_fingerprint", "shard_rank", "shard_world_size")
        # Or stores of one source (its root and container files; and its list file: two
        # lists in one folder are two sources) whose images overlap: subsets of it
        # (--per-class, --max-items) taken twice.
        origin = ("source_root", "source_files", "source")
        with _load_features(train) as a, _load_features(test) as b:
            mine, theirs = (
                [_compared(k, s.metadata.get(k)) for k in keys + origin] for s in (a, b)
            )
            same_list = mine[0] is not None and mine[:3] == theirs[:3]
            same_source = bool(mine[3]) and mine[3:] == theirs[3:]
            common = _common_images(a, b)
            if common is not None:  # by content
                n_common, n_test = common
                if n_common and (n_common == n_test or same_list or same_source):
                    shared = "the training images" if n_common == n_test else (
                        f"{n_common} of the training images"
                    )  # fmt: skip
                elif n_common:
                    are = (
                        "is a byte for byte image" if n_common == 1 else "are byte for byte images"
                    )
                    print(
                        f"mr2-probe: warning: {n_common} of the {n_test} images of --test "
                        f"{test} {are} of {train}",
                        file=sys.stderr,
                    )
            elif same_list:
                shared = "the training images"
            elif same_source:
                both = sorted(set(a.paths) & set(b.paths))
                shared = f"{len(both)} of the training images ({_few(both, 2)})" if both else None
    if shared:
        raise UsageError(
            f"--test {test} holds {shared} of {train}, so its accuracy would be "
            "training accuracy; pass a store of other images, or leave --test out to hold "
            "out --test-size of the training data"
        )


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file: by its device and inode (a hard link, a link, a
    path spelt otherwise), else by name."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def _compared(key: str, value):
    """A store's attribute ``key`` as the sources are compared: its ``source`` description
    only for a list file (``list:<path>``); other sources are told apart by their root and
    files, where a folder's description may name it through another path."""
    if key != "source" or (isinstance(value, str) and value.startswith("list:")):
        return value
    return None


def _common_images(train, test) -> tuple[int, int] | None:
    """``(n, n_test)``: how many of the test store's usable images are, byte for byte,
    images of the training store (by the sha256 both record); None where either store
    records no digests (stores written by other tools)."""
    digests = []
    for store in (train, test):
        if store.file is None or "content_sha256" not in store.file:
            return None
        found = store.file["content_sha256"][:][store.rows]
        if not len(found) or (found == b"").any():
            return None
        digests.append(found)
    return int(np.isin(digests[1], digests[0]).sum()), len(digests[1])


def _single_sample_classes(y, names, after_test_split: bool = False) -> str:
    """Where a class has a single sample, which no split puts on both sides: what to do
    (naming the first such class as the report would; ``after_test_split``: ``y`` is what
    the --test-size split left for training); "" otherwise."""
    classes, counts = np.unique(y, return_counts=True)
    single = classes[counts < 2]
    if not len(single):
        return ""
    first = names[single[0]] if names is not None else single[0].item()
    left = " left by the --test-size split" if after_test_split else ""
    remedy = ", or pass --test FILE to train on all of them" if after_test_split else ""
    return (
        f"{len(single)} {'class has' if len(single) == 1 else 'classes have'} a single "
        f"sample{left} (the first: {first!r}), which no split puts on both sides: drop "
        f"those samples or add more of their classes{remedy}"
    )


# What a store's features depend on (extract's provenance): the decoding path ("decode")
# and the compute precision change them by rounding only, and may differ between stores.
_FEATURE_PROVENANCE = ("backbone", "weights", "normalize", "preprocessing")


def _feature_provenance(record: dict) -> dict | None:
    """The entries of a store's provenance (its :func:`_sources` record) that define its
    features; None for NumPy files."""
    metadata = record.get("provenance")
    if metadata is None:
        return None
    flat = {}
    for key in _FEATURE_PROVENANCE:
        value = metadata.get(key)
        if isinstance(value, dict):
            flat |= {f"{key}.{k}": v for k, v in value.items() if k not in ("decode", "transform")}
        elif value is not None:
            flat[key] = value
    return flat


def _check_same_extraction(train: str, test: str, sources: dict) -> None:
    """Refuse train and test stores whose features come from different backbones, weights
    or preprocessing (entries recorded in both are compared)."""
    old, new = (_feature_provenance(sources[key]) for key in ("train", "test"))
    if old is None or new is None:
        return
    for path, mine, other in ((train, old, new), (test, new, old)):
        unknown = [k for k in ("backbone", "weights") if k in other and k not in mine]
        if unknown:  # a store written by another tool: nothing to compare with
            print(
                f"mr2-probe: warning: {path} records no {' or '.join(unknown)}, so whether "
                "its features are comparable with the other store's cannot be checked",
                file=sys.stderr,
            )
        tag = mine.get("weights")
        if isinstance(tag, str) and str(other.get("weights")).startswith(f"{tag} params-sha256:"):
            # A hub tag (or random weights) recorded before the weights were hashed: the
            # same name, not necessarily the same weights (another revision of the tag,
            # another library's initialisation).
            print(
                f"mr2-probe: warning: {path} records its weights by name alone "
                f"({tag!r}), so whether both stores used the same weights cannot be "
                "checked; extract it again with --force to record their hash",
                file=sys.stderr,
            )
            mine["weights"] = other["weights"]
    differ = [k for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]
    if differ:
        shown = "; ".join(f"{k}: {old[k]!r} and {new[k]!r}" for k in differ[:3])
        raise UsageError(
            f"{train} and {test} were extracted differently ({shown}), so their features "
            "are not comparable; extract both with the same backbone and settings"
        )
