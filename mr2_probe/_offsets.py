"""Per-class logit offsets tuned on held-out data: a multiclass TunedThresholdClassifierCV.

:func:`tune_class_offsets` (``_offset_search``) is the pure search on held-out decision
values; :class:`TunedOffsetsClassifierCV` produces those values by cross-validation, tunes
the offsets on them and refits the inner classifier on all the data.
"""

from __future__ import annotations

import functools
import warnings
from numbers import Integral, Real

import numpy as np
from scipy.special import expit, log_expit, log_softmax, softmax
from sklearn.base import BaseEstimator, ClassifierMixin, MetaEstimatorMixin, _fit_context, clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import StratifiedShuffleSplit, check_cv
from sklearn.utils import _safe_indexing, get_tags, metadata_routing
from sklearn.utils._param_validation import Interval, RealNotInt, StrOptions
from sklearn.utils.metadata_routing import MetadataRouter, MethodMapping, process_routing
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.parallel import Parallel, delayed
from sklearn.utils.validation import (
    _check_method_params,
    _check_sample_weight,
    _check_y,
    check_is_fitted,
    has_fit_parameter,
    indexable,
)

from ._classifier import MR2LinearClassifier
from ._data import (
    check_2d,
    check_dense_tensor,
    check_h5_open,
    check_no_missing_labels,
    cv_folds,
    empty_fold,
    is_h5_dataset,
    is_torch_tensor,
    numpy_if_tensor,
    plain,
    read_h5,
    routing_enabled,
    summable_weights,
    whole_or_unchanged,
)
from ._nesting import (
    _check_baggable,
    _check_candidates_decide,
    _check_decides,
    _check_members_predict,
    _check_per_class_decision,
    _decides,
    _DecidesOnceFitted,
)
from ._offset_search import OBJECTIVES, scoring_function, tune_class_offsets


# ---------------------------------------------------------------------------- estimator
def _inner_has(attr: str):
    """available_if check: the (fitted) inner estimator has ``attr``."""
    return lambda self: hasattr(getattr(self, "estimator_", self.estimator), attr)


def _decision(estimator, X, classes: np.ndarray) -> np.ndarray:
    """The inner estimator's decision values as a float64 (n_samples, n_classes) array."""
    return _decision_and_dtype(estimator, X, classes)[0]


def _returned_dtype(values: np.ndarray) -> np.dtype:
    """The dtype in which to return values computed from the estimator's ``values``:
    float32 where they are float32 (a model fitted on float32 features, as scikit-learn's
    linear models keep it), float64 otherwise (integer, half or double values)."""
    return np.dtype(np.float32 if values.dtype == np.float32 else np.float64)


def _decision_and_dtype(estimator, X, classes: np.ndarray) -> tuple[np.ndarray, np.dtype]:
    """:func:`_decision`, and the dtype in which the estimator gave them
    (:func:`_returned_dtype`)."""
    # (the fitted one's: a search's best estimator, which its parameter space chose)
    _check_decides(estimator)
    _check_per_class_decision(estimator, len(classes))
    seen = np.asarray(getattr(estimator, "classes_", classes))
    if not np.array_equal(seen, classes):
        if len(seen) == len(classes) and set(seen.tolist()) == set(classes.tolist()):
            raise ValueError(
                f"The estimator's classes_ {seen.tolist()} are not in sorted order "
                f"({classes.tolist()}), as scikit-learn's classifiers keep them: its decision "
                "values' columns cannot be matched to the labels in cross-validation. Sort "
                "its classes_ (and columns), or tune it with cv='prefit'."
            )
        raise ValueError(
            f"The estimator was fitted on classes {seen.tolist()}, not on all of "
            f"{classes.tolist()}. Every class needs samples in every training fold: use "
            "a stratified cv, fewer folds, or more samples of the rare classes."
        )
    decision = estimator.decision_function(X)
    decision = np.asarray(numpy_if_tensor(decision, "decision_function's output"))
    dtype = _returned_dtype(decision)
    decision = decision.astype(np.float64)
    if decision.ndim == 1 and len(classes) == 2:
        decision = np.column_stack([np.zeros_like(decision), decision])
    if decision.shape[1:] != (len(classes),):
        raise ValueError(
            f"The estimator's decision_function returned shape {decision.shape}, expected "
            f"(n_samples, {len(classes)}): one column per class (e.g. not SVC's 'ovo')."
        )
    return decision, dtype


FOLDS_ADVICE = (
    "Every class needs samples in every training fold: use a stratified cv, fewer folds, or "
    "more samples of the rare classes."
)


def offsets_splits(cv, X, y, groups=None, random_state=None, split_params=None) -> list:
    """The (train, test) index pairs of :class:`TunedOffsetsClassifierCV`'s ``cv``: a
    fraction is one stratified shuffled split of that validation share (``random_state``),
    anything else goes through :func:`~sklearn.model_selection.check_cv`. Each part in
    increasing order, as an HDF5 dataset is indexed (a shuffled split's is not). The
    splitter's ``split`` gets ``groups``, or under metadata routing the ``split_params``
    routed to it."""
    if isinstance(cv, Real) and 0 < cv < 1:
        cv = StratifiedShuffleSplit(n_splits=1, test_size=cv, random_state=random_state)
    else:
        cv = check_cv(cv, y, classifier=True)
    params = {"groups": groups} if split_params is None else split_params
    return [tuple(map(np.sort, fold)) for fold in cv_folds(cv, X, y, **params)]


def check_training_folds(
    y_index: np.ndarray, classes: np.ndarray, splits, advice: str = FOLDS_ADVICE, names=None
) -> None:
    """Refuse, before any fit, ``splits`` whose training part lacks a class (the offsets
    need every class's decision value from every fold's estimator), with ``advice``, or
    whose held-out part is empty.
    ``y_index`` holds each sample's index into ``classes``; ``names``, if given, names
    them in the message (a store's class names for its integer codes)."""
    shown = classes if names is None else np.asarray(names, dtype=object)
    for n, (train, test) in enumerate(splits):
        if not len(test):  # (the estimator refused it after a fit, as X of 0 samples)
            raise empty_fold(n, "held-out")
        missing = np.flatnonzero(np.bincount(y_index[train], minlength=len(classes)) == 0)
        if len(missing):
            # (names given as a list of NumPy's strings stay theirs in an object array:
            # shown as 'emu', not np.str_('emu'))
            listed = [plain(v) for v in shown[missing][:5]]
            raise ValueError(
                f"The training part of fold {n} of the cv holds no sample of the classes "
                f"{listed}{' ...' if len(missing) > 5 else ''} "
                f"({len(missing)} of {len(classes)}). {advice}".rstrip()
            )


def _log_gap(q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Largest |log q − log p| of each row over the entries where p is positive (inf where
    q underflows there), the distance of probabilities q from p in their logarithms."""
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.abs(np.log(q) - np.log(p))
    return np.where(p > 0, gap, 0.0).max(1)


def _fold_decision(estimator, X, y, train, test, fit_params, classes, keep):
    """Fit on the training part of a fold; decision values on its held-out part."""
    fit_params = _check_method_params(X, fit_params, indices=train)
    estimator.fit(_rows(X, train, estimator), _safe_indexing(y, train), **fit_params)
    return _decision(estimator, _rows(X, test, estimator), classes), (estimator if keep else None)


def _rows(X, index, estimator):
    """``X``'s rows at ``index`` (sorted, see :func:`offsets_splits`). Of an HDF5 dataset
    (or a row view of one) for an MR² probe: a lazy view of those rows, which it streams as
    it streams the dataset (h5py's indexing read a fold's training rows into memory, 80% of
    a store at cv=5). For any other estimator, which reads its X whole (and a search in
    worker processes pickles it, which no dataset can be): the rows, each read once, as
    h5py takes no repeated index (a bootstrap's)."""
    if is_h5_dataset(X) and isinstance(estimator, MR2LinearClassifier):
        try:  # (extract's stores lock with fcntl: POSIX only)
            from extract._reading import RowView
        except ImportError:  # read into memory, as for another estimator
            RowView = None
        if RowView is not None:
            return RowView.of(X, index)
    if not is_h5_dataset(X):
        return _safe_indexing(X, index)
    # (h5py's error reading a damaged file named none: read_h5's names it)
    if np.all(np.diff(index) > 0):
        return read_h5(X, np.asarray(index))
    unique, inverse = np.unique(index, return_inverse=True)
    return read_h5(X, unique)[inverse]


def _fitted_inside(estimator):
    """What ``estimator`` fits: itself, or the estimator a search (GridSearchCV, ...) fits,
    to which it passes the ``**params`` of its ``fit``."""
    from sklearn.model_selection._search import BaseSearchCV

    while isinstance(estimator, BaseSearchCV):
        estimator = estimator.estimator
    return estimator


def _fit_takes_sample_weight(estimator) -> bool:
    """Whether ``estimator.fit`` takes ``sample_weight``: it names it, or it is a search
    over an estimator that does. Other ``**params`` (a Pipeline's, OneVsRestClassifier's)
    refuse it."""
    return has_fit_parameter(_fitted_inside(estimator), "sample_weight")


class TunedOffsetsClassifierCV(ClassifierMixin, MetaEstimatorMixin, BaseEstimator):
    """Classifier whose per-class logit offsets are tuned on held-out folds.

    Wraps a classifier with ``decision_function``, learns one additive offset per class
    on cross-validated (out-of-fold) decision values to maximise a class-wise objective,
    optionally within a bound on the loss of overall accuracy, and refits the classifier
    on all the data. It predicts ``classes_[argmax(decision_function(X) + offsets_)]``:
    a multiclass counterpart of
    :class:`~sklearn.model_selection.TunedThresholdClassifierCV`.

    Parameters
    ----------
    estimator : estimator instance
        The classifier, fitted or not (cloned unless ``cv="prefit"``). It must implement
        ``fit`` and ``decision_function`` with one column per class (a binary problem's
        1-D decision values are read as the columns [0, z]). A search's best estimator
        too: one without, which its parameter space put in, is refused once it is fitted
        (a fitted search's clone searches again, unless ``cv="prefit"``), and before any
        fit where its parameter space puts in no candidate with one; where a candidate
        has one, whatever its template holds in its place is no matter. A search of
        ``refit=False`` keeps no best estimator, and is refused, here or inside another
        (a search's template, a Pipeline's last step, a StackingClassifier's final
        estimator, a OneVsRestClassifier's estimator, ...) unless a search's parameter
        space replaces it, and among a StackingClassifier's estimators, which it reads
        predictions of. So is a
        BaggingClassifier of an unfitted StackingClassifier of ``final_estimator=None``,
        which BaggingClassifier refuses: give the stack
        ``final_estimator=LogisticRegression()``; and, before any fit, an estimator of a
        StackingClassifier without the method its ``stack_method`` reads (which
        scikit-learn asks of it unfitted: an unfitted stack of ``final_estimator=None``
        has none), or of a VotingClassifier among them without the one its ``voting``
        reads (``SVC()``, of ``probability=False``, with ``voting="soft"``).
    scoring : str or callable, default="worst_class"
        The objective, greater is better: ``"worst_class"``, ``"balanced_accuracy"``
        (mean per-class accuracy), ``"hard_tercile"`` or ``"accuracy"`` as defined in
        :mod:`mr2_probe.metrics`; a scorer made by :func:`~sklearn.metrics.make_scorer`
        on predicted labels, such as :data:`mr2_probe.metrics.worst_class_scorer` or the
        negated :data:`mr2_probe.metrics.class_std_scorer`; or a callable
        ``metric(y_true, y_pred) -> float``.
    max_accuracy_drop : float or None, default=None
        Largest loss of overall accuracy on the held-out data that the offsets may cause,
        as a fraction in [0, 1) (0.005 is half a point), relative to no offsets. ``None``:
        no bound.
    cv : int, float, cross-validation generator, iterable or "prefit", default=5
        Where the held-out decision values come from:

        - an int: that many folds of :class:`~sklearn.model_selection.StratifiedKFold`;
        - a float in (0, 1): one stratified train / validation split with that
          validation fraction, shuffled with ``random_state``;
        - a splitter or an iterable of (train, validation) index arrays; a sample held
          out in several splits counts once per split;
        - ``"prefit"``: ``estimator`` is already fitted and ``fit(X_val, y_val)`` tunes
          the offsets on the validation set it is given; nothing is fitted. In a search
          (``GridSearchCV`` over ``max_accuracy_drop``, say), which clones it unfitted,
          pass it as ``sklearn.frozen.FrozenEstimator(estimator)``.
    refit : bool, default=True
        Refit the estimator on all of X after tuning. ``False`` keeps the estimator fitted
        on the training part and requires a single split (a float ``cv``, or one split).
        Not used with ``cv="prefit"``.
    n_jobs : int, default=None
        Folds fitted in parallel (joblib; in threads for an HDF5 dataset, which does not
        pickle); ``None`` means 1.
    random_state : int, RandomState instance or None, default=None
        Shuffles the split of a float ``cv``; unused otherwise.
    store_cv_results : bool, default=False
        Keep the held-out decision values in ``cv_results_``, to tune other objectives or
        bounds with :func:`tune_class_offsets` without refitting.
    max_sweeps : int, default=50
        Most sweeps of the coordinate ascent over the classes.
    n_candidates : int, default=128
        Offsets tried per class and sweep when there are more distinct thresholds (see
        :func:`tune_class_offsets`).

    Attributes
    ----------
    estimator_ : estimator instance
        The classifier used to predict: refitted on all of X, fitted on the training part
        (``refit=False``), or ``estimator`` itself (``cv="prefit"``).
    offsets_ : ndarray of shape (n_classes,)
        Offsets added to the estimator's decision values, centred (mean 0) unless
        centring would move a sample on an exact tie (see :class:`OffsetTuning`).
    classes_ : ndarray of shape (n_classes,)
    best_score_ : float
        The objective on the held-out decision values with the offsets.
    base_score_ : float
        The objective on the held-out decision values without offsets.
    accuracy_drop_ : float
        Overall accuracy lost on the held-out data by the offsets (negative: gained).
    n_sweeps_ : int
        Sweeps of the coordinate ascent.
    cv_results_ : dict of ndarray
        Only with ``store_cv_results=True``: ``"decision_function"`` (n_rows, n_classes)
        held-out decision values, ``"y"`` (n_rows,) each row's class as a column of
        ``classes_``, ``"index"`` (n_rows,) each row's sample in X (to pick its
        ``sample_weight``). With K-fold cv the rows are the samples in order.
    n_features_in_ : int
        Defined when the estimator defines it.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined when the estimator defines it.

    See Also
    --------
    tune_class_offsets : The search, on decision values computed elsewhere.
    sklearn.model_selection.TunedThresholdClassifierCV : Tuned decision threshold of a
        binary classifier.

    Notes
    -----
    With decision values z_i ∈ R^K held out from the model that produced them, the
    offsets solve::

        max_b  score(y, argmax_k (z_ik + b_k))
        s.t.   acc(argmax z) − acc(argmax (z + b)) ≤ max_accuracy_drop

    approximately: deterministic coordinate ascent from b = 0, over the classes in the
    order of ``classes_``, reaches a point that no single offset among those tried can
    improve (every midpoint where a class has at most ``n_candidates`` + 1 distinct
    thresholds, a subset beyond that, where a finer offset can still gain a little; see
    :func:`tune_class_offsets`; another order of the classes, such as the same labels as
    text, can reach another such point), and on the held-out data the objective is never
    lower than without offsets and the bound holds. The offsets
    only see held-out predictions of the training data; the data passed to ``predict``
    or ``score`` later play no part in them. ``sample_weight`` goes to the estimator's
    ``fit`` (indexed per fold) and weights the held-out samples in the objective and the
    bound; other fit parameters go to ``fit`` only.

    Adding b_k to the logit of class k multiplies the odds of class k by exp(b_k): the
    offsets act as a tuned class prior. They leave the learned features and weights
    untouched, so they correct where the decision boundaries sit between classes, not how
    well the classes are separated. :meth:`predict_proba` applies them through the
    estimator's own link from decision values to probabilities where its probabilities
    show it, row by row: softmax(z + b) for a softmax model (LogisticRegression,
    MR2LinearClassifier), σ(z + b) normalised for one-vs-rest sigmoids
    (OneVsRestClassifier(LogisticRegression()), SGDClassifier(loss="log_loss")); there
    ``predict`` and the argmax of ``predict_proba`` agree, and with zero offsets it is the
    estimator's own (but on a row whose sigmoids all underflow, which scikit-learn makes
    uniform, or all zero for OneVsRestClassifier, NaN before scikit-learn 1.7: there it is
    those sigmoids normalised in log space, whose argmax is ``predict``'s). For another
    estimator it is softmax(log p + b), a class prior on its probabilities, whose argmax
    can differ from ``predict`` (as SVC's own can).

    Cost: ``n_folds + 1`` fits of the estimator (none with ``cv="prefit"``, one with
    ``refit=False``), plus the search: 0.1 to 0.3 s per sweep for 50,000 held-out samples
    and 100 classes, 10 to 20 sweeps on strongly biased logits.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from sklearn.linear_model import LogisticRegression
    >>> from sklearn.model_selection import train_test_split
    >>> from mr2_probe import TunedOffsetsClassifierCV
    >>> from mr2_probe.metrics import worst_class_accuracy
    >>> X, y = load_digits(return_X_y=True)
    >>> X_train, X_test, y_train, y_test = train_test_split(
    ...     X / 16, y, stratify=y, random_state=0
    ... )
    >>> probe = LogisticRegression(C=0.01, max_iter=1000)
    >>> tuned = TunedOffsetsClassifierCV(probe, max_accuracy_drop=0.005)
    >>> tuned = tuned.fit(X_train, y_train)
    >>> tuned.offsets_.shape
    (10,)
    >>> bool(tuned.best_score_ > tuned.base_score_ and tuned.accuracy_drop_ <= 0.005)
    True
    >>> plain = probe.fit(X_train, y_train)
    >>> round(worst_class_accuracy(y_test, plain.predict(X_test)), 3)
    0.674
    >>> round(worst_class_accuracy(y_test, tuned.predict(X_test)), 3)
    0.837
    """

    # Under metadata routing ``groups`` is not this estimator's own: it goes where the
    # splitter and the estimator ask for it (an outer router needs no request for it here).
    __metadata_request__fit = {"groups": metadata_routing.UNUSED}

    _parameter_constraints: dict = {
        "estimator": [_DecidesOnceFitted()],
        "scoring": [StrOptions(set(OBJECTIVES)), callable],
        # A fraction of the accuracy, in [0, 1) as accuracy_front's offset_bounds: 5 passed.
        "max_accuracy_drop": [Interval(Real, 0, 1, closed="left"), None],
        "cv": [
            "cv_object",
            StrOptions({"prefit"}),
            Interval(RealNotInt, 0.0, 1.0, closed="neither"),
        ],
        "refit": ["boolean"],
        "n_jobs": [Integral, None],
        "random_state": ["random_state"],
        "store_cv_results": ["boolean"],
        "max_sweeps": [Interval(Integral, 1, None, closed="left")],
        "n_candidates": [Interval(Integral, 2, None, closed="left")],
    }

    def __init__(
        self,
        estimator,
        *,
        scoring="worst_class",
        max_accuracy_drop=None,
        cv=5,
        refit=True,
        n_jobs=None,
        random_state=None,
        store_cv_results=False,
        max_sweeps=50,
        n_candidates=128,
    ):
        self.estimator = estimator
        self.scoring = scoring
        self.max_accuracy_drop = max_accuracy_drop
        self.cv = cv
        self.refit = refit
        self.n_jobs = n_jobs
        self.random_state = random_state
        self.store_cv_results = store_cv_results
        self.max_sweeps = max_sweeps
        self.n_candidates = n_candidates

    # The inner estimator's parameters are validated by its own fit.
    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y, sample_weight=None, groups=None, **fit_params):
        """Fit the estimator on each fold, tune the offsets, refit on all of X.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data, or with ``cv="prefit"`` the validation data; anything the
            estimator accepts.
        y : array-like of shape (n_samples,)
            Labels of any type.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the held-out samples in the objective and the accuracy bound, and
            passed to the estimator's ``fit``, indexed per fold, where it takes them (it
            names ``sample_weight``, or is a search over an estimator that does). A
            Pipeline takes them as ``<step>__sample_weight`` in ``fit_params``; without
            it, or for an estimator without them, a warning says the fit is unweighted.
            Under scikit-learn's metadata routing
            (``sklearn.set_config(enable_metadata_routing=True)``) they weight the
            objective and the bound all the same, and go to the estimator's ``fit`` (or a
            Pipeline step's) as its ``set_fit_request`` says.
        groups : array-like of shape (n_samples,), default=None
            Group labels for a group splitter as ``cv`` (GroupKFold and the like), given
            to its ``split``, and, indexed per fold, to the estimator's ``fit`` where it
            names a ``groups`` parameter (MR2LinearClassifierCV; not GridSearchCV or a
            Pipeline, whose ``fit`` takes ``**params``). Under metadata routing they go
            where the splitter's and the estimator's requests say.
        **fit_params : dict
            Passed to the estimator's ``fit``, indexed per fold; under metadata routing,
            where the requests say.

        Returns
        -------
        self : TunedOffsetsClassifierCV
        """
        with whole_or_unchanged(self):
            return self._fit(X, y, sample_weight, groups, fit_params)

    def _fit(self, X, y, sample_weight, groups, fit_params):
        if y is None:
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None."
            )
        check_h5_open(X=X, y=y, sample_weight=sample_weight, groups=groups, **fit_params)
        # Per-sample parameters are read into memory: the folds index them with the
        # repeated rows of a bootstrap, which h5py refuses (X is read row by row, _rows).
        groups = groups[...] if is_h5_dataset(groups) else groups
        # (on a GPU, or requiring grad: the splitter reads NumPy)
        groups = numpy_if_tensor(groups, "groups")
        fit_params = {k: v[...] if is_h5_dataset(v) else v for k, v in fit_params.items()}
        if is_torch_tensor(X):  # before the folds index it, with torch's own error
            check_dense_tensor(X, type(self).__name__)
        if is_h5_dataset(X) or is_torch_tensor(X):
            # An HDF5 dataset of an empty dataspace (h5py.Empty, shape None) or a scalar
            # one: indexable's len() gave scikit-learn's TypeError, "Expected sequence or
            # array-like", where an MR² probe names the shape it needs; one of 1 or 3
            # dimensions (a tensor's too) was named by a fold's shape ((40,) of 60 rows).
            check_2d(X)
        X, y = indexable(X, numpy_if_tensor(y, "y"))
        # (NaN among object labels named as the estimator names it, not a TypeError from
        # sorting the classes; None and pd.NA first, as missing labels: it fails on pd.NA)
        check_no_missing_labels(y)
        y = _check_y(y, estimator=self)
        if not len(y):
            raise ValueError(
                "Found array with 0 sample(s) (shape=(0,)) while a minimum of 1 is required."
            )
        shape = getattr(X, "shape", None)
        if self.cv != "prefit" and shape is not None and len(shape) == 2 and not shape[1]:
            # (named by a fold's shape, (150, 0) of 225 rows; a prefitted estimator names
            # the number of features it expects)
            raise ValueError(
                f"Found array with 0 feature(s) (shape={tuple(shape)}) while a minimum of 1 "
                f"is required by {type(self).__name__}."
            )
        check_classification_targets(y)
        # What is fitted here: itself (cv="prefit") or a clone (a fitted search's searches
        # again; a FrozenEstimator's is itself).
        fitted_here = self.estimator if self.cv == "prefit" else clone(self.estimator)
        if not _decides(self.estimator):
            # Taken by the estimator parameter's check for a search's sake (of refit=False,
            # or fitted on a choice without decision values): named before any fit, as it
            # decides here.
            _check_decides(fitted_here)
        # (a BaggingClassifier of a fitted search of the stack bags it; a clone of it, whose
        # search is unfitted, not)
        _check_baggable(fitted_here)
        _check_members_predict(fitted_here)
        _check_candidates_decide(fitted_here)
        _check_per_class_decision(self.estimator, len(np.unique(y)))
        # (on a GPU, or requiring grad: NumPy reads neither)
        sample_weight = numpy_if_tensor(sample_weight, "sample_weight")
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, y, ensure_non_negative=True)
        if not isinstance(self.scoring, str):  # a scorer that cannot work, before any fit
            classes = None if self.cv == "prefit" else np.unique(y)  # else the estimator's
            scoring_function(self.scoring, sample_weight is not None, classes, y, sample_weight)
        if self.cv == "prefit":
            decision, y_index, index = self._prefit_decision(X, y, fit_params)
        else:
            fit_params, split_params = self._route(sample_weight, groups, fit_params)
            decision, y_index, index = self._cv_decision(X, y, fit_params, split_params)
        result = tune_class_offsets(
            decision,
            y_index,
            self.scoring,
            self.max_accuracy_drop,
            classes=self.classes_,
            sample_weight=None if sample_weight is None else sample_weight[index],
            max_sweeps=self.max_sweeps,
            n_candidates=self.n_candidates,
        )
        self._take_tuning(result)
        if self.store_cv_results:
            self.cv_results_ = {"decision_function": decision, "y": y_index, "index": index}
        elif hasattr(self, "cv_results_"):
            del self.cv_results_  # a previous fit's, not this one's
        for name in ("n_features_in_", "feature_names_in_"):
            if hasattr(self.estimator_, name):
                setattr(self, name, getattr(self.estimator_, name))
            elif hasattr(self, name):
                delattr(self, name)
        return self

    def _take_tuning(self, result) -> None:
        """The fitted attributes of a :func:`tune_class_offsets` result."""
        self.offsets_ = result.offsets
        self.best_score_ = result.score
        self.base_score_ = result.base_score
        self.accuracy_drop_ = result.accuracy_drop
        self.n_sweeps_ = result.n_sweeps

    def _route(self, sample_weight, groups, fit_params) -> tuple[dict, dict]:
        """The parameters of the estimator's ``fit`` and of the splitter's ``split``.

        Under scikit-learn's metadata routing, as the requests say (``sample_weight``
        weights the objective either way). Otherwise ``sample_weight`` goes where ``fit``
        names it, ``groups`` to the splitter and to a ``fit`` that names them."""
        if routing_enabled():
            given = {"sample_weight": sample_weight, "groups": groups} | fit_params
            routed = process_routing(
                self, "fit", **{key: value for key, value in given.items() if value is not None}
            )
            return routed.estimator.fit, routed.splitter.split
        if sample_weight is not None and _fit_takes_sample_weight(self.estimator):
            fit_params = {**fit_params, "sample_weight": sample_weight}
        elif sample_weight is not None and not any(
            key.endswith("__sample_weight") for key in fit_params
        ):
            warnings.warn(
                f"{type(_fitted_inside(self.estimator)).__name__}.fit does not take "
                "sample_weight: the weights weight the offsets' objective and the "
                "accuracy bound, not the estimator's fit (a Pipeline takes them as "
                "<step>__sample_weight).",
                UserWarning,
                stacklevel=5,  # _route, _fit, fit, scikit-learn's _fit_context, the caller
            )
        if groups is not None and has_fit_parameter(self.estimator, "groups"):
            # A search inside that names them (MR2LinearClassifierCV) splits by them
            # too. Not a fit of **params (a Pipeline refuses an unrouted groups).
            fit_params = {**fit_params, "groups": groups}
        return fit_params, {"groups": groups}

    def get_metadata_routing(self):
        """Get metadata routing of this object.

        Please check :ref:`User Guide <metadata_routing>` on how the routing mechanism
        works. ``sample_weight`` is also this estimator's own: the weights weight the
        held-out samples in the objective and the accuracy bound.

        Returns
        -------
        routing : MetadataRouter
            The routes of ``fit``'s metadata to the estimator's ``fit`` and the
            splitter's ``split``.
        """
        return (
            MetadataRouter(owner=self)
            .add_self_request(self)
            .add(
                estimator=self.estimator,
                method_mapping=MethodMapping().add(caller="fit", callee="fit"),
            )
            .add(
                splitter=self.cv,
                method_mapping=MethodMapping().add(caller="fit", callee="split"),
            )
        )

    def _prefit_decision(self, X, y, fit_params):
        """Decision values of the fitted estimator on the validation set (X, y)."""
        if fit_params:
            raise ValueError(
                f"cv='prefit' fits nothing, so the fit parameters {sorted(fit_params)} "
                "would be ignored. Fit the estimator with them first, or use another cv "
                "(sample_weight is accepted: it weights the validation samples)."
            )
        try:
            check_is_fitted(self.estimator)
        except NotFittedError as exc:
            raise NotFittedError(
                "When cv='prefit', the estimator must already be fitted. Fit it on "
                "training data first, or let this estimator fit it with cv=5. A search or "
                "cross-validation (GridSearchCV, cross_validate) fits a clone of this "
                "estimator, whose estimator is an unfitted copy: wrap the fitted one in "
                "sklearn.frozen.FrozenEstimator, which stays fitted through clones."
            ) from exc
        self.estimator_ = self.estimator
        self.classes_ = np.asarray(self.estimator_.classes_)
        # Its columns are of its classes, whatever y holds: 3 pairwise columns passed as one
        # per class where y held 2 of its 3 classes.
        _check_per_class_decision(self.estimator_, len(self.classes_))
        sorter = np.argsort(self.classes_)
        try:
            position = np.searchsorted(self.classes_, y, sorter=sorter)
        except TypeError:  # labels of another kind than classes_ (strings against numbers)
            known = set(self.classes_.tolist())
            unknown = list(dict.fromkeys(label for label in y.tolist() if label not in known))
        else:
            y_index = sorter[np.clip(position, 0, len(self.classes_) - 1)]
            unknown = np.unique(y[self.classes_[y_index] != y]).tolist()
        if unknown:
            raise ValueError(
                f"y has classes {unknown[:10]}{' ...' if len(unknown) > 10 else ''} that the "
                f"prefitted estimator does not know (its classes_ are {self.classes_.tolist()})."
            )
        decision = _decision(self.estimator_, X, self.classes_)
        return decision, y_index, np.arange(len(y))

    def _cv_decision(self, X, y, fit_params, split_params):
        """Out-of-fold decision values; fits estimator_ as refit asks."""
        self.classes_, y_index = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(
                "Tuning offsets needs samples of at least 2 classes in the data, but the "
                f"data contains only one class: {plain(self.classes_[0])!r}."
            )
        splits = offsets_splits(
            self.cv, X, y, random_state=self.random_state, split_params=split_params
        )
        check_training_folds(y_index, self.classes_, splits)
        if not self.refit and len(splits) > 1:
            raise ValueError(
                f"refit=False keeps the estimator of a single split, but cv has "
                f"{len(splits)} splits. Use refit=True, a float cv such as 0.2, or one split."
            )
        # h5py's objects do not pickle: the folds of an HDF5 dataset run in threads, which
        # share it (in worker processes they failed with "Could not pickle the task").
        shared = "sharedmem" if is_h5_dataset(X) else None
        folds = Parallel(n_jobs=self.n_jobs, require=shared)(
            delayed(_fold_decision)(
                clone(self.estimator), X, y, train, test, fit_params, self.classes_, not self.refit
            )
            for train, test in splits
        )
        index = np.concatenate([test for _, test in splits])
        order = np.argsort(index, kind="stable")  # K-fold: back to the order of X
        decision = np.concatenate([fold for fold, _ in folds])[order]
        index = index[order]
        if self.refit:
            self.estimator_ = clone(self.estimator).fit(X, y, **fit_params)
            # (a search on all of X may choose what no fold's did: refused now, not by
            # predict)
            _check_decides(self.estimator_)
        else:
            self.estimator_ = folds[0][1]
        return decision, y_index[index], index

    def _offset_decision(self, X) -> tuple[np.ndarray, np.dtype]:
        """Decision values with the offsets, shape (n_samples, n_classes), in float64 as
        the offsets were tuned on them, and the dtype of the estimator's own."""
        check_is_fitted(self, "offsets_")
        decision, dtype = _decision_and_dtype(self.estimator_, X, self.classes_)
        return decision + self.offsets_, dtype

    def decision_function(self, X):
        """Decision values of the estimator plus the offsets.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        decision : ndarray of shape (n_samples, n_classes), or (n_samples,) for two
            classes (z1 − z0, positive for ``classes_[1]``). Of the estimator's dtype
            where it is float32 (a model fitted on float32 features), else float64:
            added in float64 and rounded once (see :meth:`predict`).
        """
        decision, dtype = self._offset_decision(X)
        decision = decision[:, 1] - decision[:, 0] if decision.shape[1] == 2 else decision
        return decision.astype(dtype, copy=False)

    def predict(self, X):
        """Class of the largest decision value plus offset.

        Computed in float64, as the offsets were tuned: the estimator's decision values
        (exact in float64) plus the offsets, whose argmax ``best_score_`` scored on the
        held-out data. (The float32 values that :meth:`decision_function` returns for a
        float32 model are that sum rounded, which can tie two classes that it orders.)

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        y_pred : ndarray of shape (n_samples,)
        """
        decision, _ = self._offset_decision(X)
        return self.classes_[decision.argmax(1)]

    def score(self, X, y, sample_weight=None):
        """Mean accuracy of :meth:`predict` on ``(X, y)``, as ClassifierMixin's."""
        check_h5_open(X=X, y=y, sample_weight=sample_weight)  # h5py's words otherwise
        check_no_missing_labels(y, "y", "score")  # (a list's NaN among text: the class 'nan')
        # (tensors NumPy cannot read, on a GPU or requiring grad, as an MR² probe's score)
        y = numpy_if_tensor(y, "y")
        # (weights near the largest float summed to inf in accuracy_score: NaN)
        sample_weight = summable_weights(numpy_if_tensor(sample_weight, "sample_weight"))
        return super().score(X, y, sample_weight=sample_weight)

    @available_if(_inner_has("predict_proba"))
    def predict_proba(self, X):
        """Probabilities with the offsets, through the estimator's link where it is
        softmax's or one-vs-rest sigmoids' (see Notes), else softmax(log p + offsets_).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        proba : ndarray of shape (n_samples, n_classes)
            Of the dtype of the estimator's probabilities where it is float32, else
            float64 (computed in float64 either way).
        """
        log_proba, dtype = self._log_proba(X)
        return softmax(log_proba, axis=1).astype(dtype, copy=False)

    @available_if(_inner_has("predict_proba"))
    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        log_proba : ndarray of shape (n_samples, n_classes)
            Of :meth:`predict_proba`'s dtype.
        """
        log_proba, dtype = self._log_proba(X)
        return log_softmax(log_proba, axis=1).astype(dtype, copy=False)

    def _log_proba(self, X) -> tuple[np.ndarray, np.dtype]:
        """Unnormalised log-probabilities with the offsets, row by row: the decision values
        plus the offsets through the estimator's link where its probabilities show it to
        be softmax's or normalised one-vs-rest sigmoids', else its log-probabilities plus
        the offsets. (Row by row, so that a row's probabilities do not depend on the others
        given with it.) In float64, and the dtype of the estimator's probabilities
        (:func:`_returned_dtype`)."""
        check_is_fitted(self, "offsets_")
        # (Before scikit-learn 1.7 a one-vs-rest row whose sigmoids all underflow is 0 / 0,
        # NaN with a RuntimeWarning: such a row is read below, its probabilities finite.)
        with np.errstate(invalid="ignore"):
            proba = self.estimator_.predict_proba(X)
        proba = np.asarray(numpy_if_tensor(proba, "predict_proba's output"))
        dtype = _returned_dtype(proba)
        proba = proba.astype(np.float64)
        z = _decision(self.estimator_, X, self.classes_)
        out = np.empty_like(z)
        # (float32 probabilities, or a decision function rounded apart from them, agree
        # to these tolerances; the links themselves differ by far more.)
        alike = functools.partial(np.isclose, rtol=1e-4, atol=1e-6)
        softmaxes = softmax(z, axis=1)
        softmax_rows = alike(softmaxes, proba).all(1)
        sigmoids = expit(z)
        total = sigmoids.sum(1, keepdims=True)
        # scikit-learn's one-vs-rest rows whose sigmoids all underflow are uniform
        # (SGDClassifier's) or all zero (OneVsRestClassifier's, all NaN before scikit-learn
        # 1.7 (0 / 0): read as another link's, every probability was NaN).
        sigmoids = np.divide(sigmoids, total, out=np.full_like(z, 1 / z.shape[1]), where=total > 0)
        zeros = (total[:, 0] == 0) & ((proba == 0).all(1) | np.isnan(proba).all(1))
        sigmoid_rows = alike(sigmoids, proba).all(1) | zeros
        # A saturated row (one probability near 1, the others below atol) is alike under
        # both links; its small probabilities tell them apart by orders of magnitude (a
        # one-vs-rest row's 2e-7 is softmax's 4e-16), which read as softmax's made
        # predict_log_proba 20 nats off the estimator's own with no offsets.
        both = softmax_rows & sigmoid_rows
        if both.any():
            gaps = [_log_gap(q[both], proba[both]) for q in (softmaxes, sigmoids)]
            softmax_rows[both] = gaps[0] <= gaps[1]
        sigmoid_rows &= ~softmax_rows
        out[softmax_rows] = z[softmax_rows] + self.offsets_
        out[sigmoid_rows] = log_expit(z[sigmoid_rows] + self.offsets_)
        other = ~(softmax_rows | sigmoid_rows)
        if other.any():
            if hasattr(self.estimator_, "predict_log_proba"):  # (finite where p underflows)
                log_proba = self.estimator_.predict_log_proba(X)
                log_proba = numpy_if_tensor(log_proba, "predict_log_proba's output")
                log_proba = np.asarray(log_proba, dtype=np.float64)
            else:
                with np.errstate(divide="ignore"):
                    log_proba = np.log(proba)
            out[other] = log_proba[other] + self.offsets_
        return out, dtype

    def __sklearn_tags__(self):
        # The estimator's inputs, as scikit-learn's meta-estimators take them: a selector
        # reads allow_nan (SequentialFeatureSelector refused NaN that the estimator fits).
        tags = super().__sklearn_tags__()
        inner = get_tags(self.estimator).input_tags
        tags.input_tags.sparse = inner.sparse
        tags.input_tags.allow_nan = inner.allow_nan
        return tags
