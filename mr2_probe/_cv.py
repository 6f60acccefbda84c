"""MR2LinearClassifierCV: the probe with its L2 strength (or logit scale) chosen by
cross-validation along a warm-started path, the features uploaded once."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import warnings
from decimal import Decimal
from numbers import Integral, Real

import numpy as np
import sklearn
import torch
import torch.nn.functional as F
from sklearn.base import _fit_context
from sklearn.exceptions import FitFailedWarning, UndefinedMetricWarning
from sklearn.metrics import check_scoring, get_scorer, get_scorer_names, make_scorer
from sklearn.model_selection import check_cv
from sklearn.utils import metadata_routing
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.fixes import parse_version
from sklearn.utils.metadata_routing import (
    MetadataRouter,
    MethodMapping,
    _raise_for_params,
    process_routing,
)
from sklearn.utils.parallel import Parallel, delayed
from sklearn.utils.validation import _check_method_params, _check_sample_weight, check_is_fitted
from tqdm.auto import tqdm

from ._batched import BatchedPath, FoldBatch, HeldOut
from ._classifier import MR2LinearClassifier, _class_stats
from ._data import (
    H5Source,
    StoredRows,
    check_h5_open,
    check_no_missing_labels,
    cv_folds,
    empty_fold,
    is_torch_tensor,
    numpy_if_tensor,
    routing_enabled,
    summable_weights,
    whole_or_unchanged,
)
from ._device import default_torch_modes, to_numpy, to_tensor
from ._fit_errors import FitDivergedError, _dtype_name, _range_suspects
from ._h5 import one_line
from ._head import open_pair
from ._path import BISECT_GRIDS, FoldPath, HeldOutLogits, bisect_search
from ._prediction import both_class_logits
from ._solvers import SolverResult, gradient_unit
from ._stacklevel import _outside_stacklevel
from ._stats import entry_variance, intercept_scale, overall_mean
from .metrics import classwise_scorers

_SKLEARN = parse_version(sklearn.__version__).release[:2]

# The class-wise scorers of mr2_probe.metrics that ``scoring`` accepts by name (beside
# scikit-learn's own, which it gives too).
CLASSWISE_SCORERS = {
    name: scorer for name, scorer in classwise_scorers().items() if name not in get_scorer_names()
}


def check_classwise_scoring(estimator, scoring):
    """A scorer for ``scoring``: a scikit-learn name or callable, or a class-wise name (a
    copy, as scikit-learn's ``get_scorer`` gives one: a request set on it stays there)."""
    if isinstance(scoring, str) and scoring in CLASSWISE_SCORERS:
        scoring = copy.deepcopy(CLASSWISE_SCORERS[scoring])
    return check_scoring(estimator, scoring)


class MR2LinearClassifierCV(MR2LinearClassifier):
    """MR2LinearClassifier with C (or the cosine head's scale) chosen by cross-validation.

    The counterpart of :class:`~sklearn.linear_model.LogisticRegressionCV`: for each fold
    it solves along a path of values, from strong to weak regularisation, each solution
    starting from the previous one, and scores every solution on the held-out rows; the
    value with the best score summed over folds is refitted on all the data. The features
    go to the device once per ``fit``; a fold's training rows are indexed there (read
    from an HDF5 dataset as the solver asks for them, never held whole), and the class
    statistics, which do not depend on C, are computed once per fold.

    For the linear head (``lam=0``, in memory or an HDF5 dataset, tilted or not, two classes
    as the one row of the binomial model) each fold's L-BFGS keeps its memory from one C to
    the next, corrected for the change of penalty, which is exact for the L2 penalty: each
    C then starts from the last solution with the curvature measured so far. The cosine head (any
    number of classes, same conditions) runs on the same solver, its memory carried to a
    next scale within a factor of 4 of the last scale that formed pairs. On a GPU, or on a
    CPU with n_folds × n_classes ≤ 256, the folds are also solved as one batched problem:
    every evaluation multiplies X once by all the folds' weights, the held-out rows taking
    part with weight zero, and L-BFGS runs in lock-step over the folds (each stopping on its
    own). Elsewhere each fold's path is solved on its own.

    Parameters
    ----------
    Cs : int, array-like of float or "bisect", default=10
        The values searched. An int n means ``np.logspace(-4, 4, n)``, as in
        LogisticRegressionCV; ``np.inf`` among them is no penalty. ``"bisect"`` is CLIP's
        parametric binary search: a coarse grid of 10⁻⁶ … 10⁶ every two decades, then the
        spacing halved around the best value (its neighbours on either side evaluated)
        down to 8 steps per decade, 15 values or fewer. **With** ``head="cosine"`` **the
        values are logit scales**, not C: the cosine head has no penalty, so its searched
        quantity is ``scale`` (an int n then means ``np.logspace(0, 3, n)``, scales 1 to
        1000, and ``"bisect"`` starts from 1, 10, 100, 1000), and a projection
        (``lam > 0``) is penalised with C = 1.
    cv : int, cross-validation generator or iterable, default=None
        As in LogisticRegressionCV: ``None`` is 5-fold, an int is the number of
        stratified folds (:func:`~sklearn.model_selection.check_cv`).
    scoring : str, callable or None, default=None
        Held-out score to maximise: a scikit-learn scorer name or callable, or a class-wise
        scorer of :mod:`mr2_probe.metrics` by name (``"worst_class"``, ``"hard_tercile"``,
        ``"class_std"``). ``None`` is accuracy. Scorers see the held-out logits computed on
        the device (a callable is given a stand-in estimator whose input is the logits,
        not the probe and X); ``sample_weight`` weights the score when the metric accepts it.
        With two classes, a metric of a positive class (``"precision"``, ``"recall"``,
        ``"f1"``, ``"average_precision"``) scores the last of ``classes_``, as
        LogisticRegressionCV does, whatever the labels are (GridSearchCV's scorers take
        ``pos_label=1``); for another, pass
        ``make_scorer(recall_score, pos_label=...)``.
    refit : bool, default=True
        Refit on all the data at the best value, starting from the folds' mean solution
        (with a learned projection, ``lam > 0``, from a fit's own start, as
        :class:`MR2LinearClassifier` at that value). ``False`` keeps the mean of each
        fold's best coefficients, and ``C_`` is then the mean of each fold's best value.
    n_jobs : int, default=None
        Folds solved in parallel threads (joblib), whatever joblib backend is active (a
        process backend, loky or dask, would fill copies of the paths): the device
        tensors are shared, and torch releases the GIL in its kernels. Folds solved as one
        batched problem (see above) use torch's own threads instead.
    c_bar, lam, p, head, fit_intercept, difficulty
        As in :class:`MR2LinearClassifier`.
    scale : float, default=64.0
        Unused: the linear head has no logit scale and the cosine head searches it.
    tau, projection_rank, solver, max_iter, tol, batch_size, learning_rate, \
n_iter_no_change, class_weight, class_tilt, random_state
        As in :class:`MR2LinearClassifier`; ``class_weight="balanced"`` is computed on all
        the data, as in LogisticRegressionCV.
    verbose : int, default=0
        A progress bar over the path's solutions when positive, named by the objective as
        :class:`MR2LinearClassifier`'s are ("ERM CV path", "tilted MR2 CV path", ...).
    device
        As in :class:`MR2LinearClassifier`.

    Attributes
    ----------
    C_ : float
        The chosen value (the chosen logit scale for the cosine head), as
        LogisticRegressionCV's ``C_`` with ``use_legacy_attributes=False``.
    scale_ : float
        The same value, under the name that fits the cosine head.
    Cs_ : ndarray of shape (n_Cs,)
        The values evaluated, increasing and each once, the order of the columns of
        ``scores_``, ``coefs_paths_`` and ``n_iter_`` (LogisticRegressionCV keeps ``Cs`` as
        given); with ``"bisect"``, those the search visited.
    scores_ : dict
        Class label → ndarray (n_folds, n_Cs), the held-out scores, the same array for
        every class (one label, the positive class, for two classes), as in
        LogisticRegressionCV. NaN where a value's fit diverged on that fold, or where the
        scorer is undefined on its held-out rows (see Notes).
    coefs_paths_ : dict
        Class label → ndarray (n_folds, n_Cs, n_dof): that class's coefficients along each
        fold's path, the intercept last when there is one (one label for two classes).
    class_accuracy_path_ : ndarray of shape (n_folds, n_Cs, n_classes)
        Held-out accuracy of each class along each path (NaN where a fold holds out no
        sample of the class, or none of positive weight), weighted by ``sample_weight``:
        every class-wise curve, whatever ``scoring`` chose (under metadata routing too,
        whatever the scorer requests).
    n_iter_ : ndarray of shape (1, n_folds, n_Cs)
        Solver iterations (or epochs) along each path: 0 where a value's start, the
        previous solution, already met ``tol``.
    classes_, coef_, intercept_, projection_, margins_, class_stats_, p_, solver_, head_, \
loss_curve_, class_losses_, tilt_weights_, n_features_in_, feature_names_in_, device_
        Of the refitted model, as in :class:`MR2LinearClassifier` (``projection_`` is None
        and ``loss_curve_``, ``class_losses_``, ``tilt_weights_`` are absent with
        ``refit=False``; ``margins_`` and ``class_stats_`` are then those of all the
        data).

    Notes
    -----
    Each fold solves, for values v_1 < … < v_n, the objective of
    :class:`MR2LinearClassifier` at C = v_j (scale = v_j for a cosine head) from the
    solution at v_{j-1}; the choice is argmax_j Σ_folds score(fold, v_j), ties going to the
    value listed first in ``Cs`` as in LogisticRegressionCV. A score that is not finite (a
    scorer undefined on a fold's held-out rows) ranks last, with GridSearchCV's warning;
    where no value's sum is finite (with ``refit=False``: some fold's every score) ``fit``
    raises a ValueError, where the first value was chosen without a word. For
    the linear head described above, L-BFGS also keeps its memory from v_{j-1}, each pair (s, y)
    corrected to y + (1/v_j − 1/v_{j-1})/S · s on W's entries, which makes it exact at v_j
    (the penalty is quadratic); a bisection's new value starts from the solution at the
    nearest value solved. The cosine head described above does the same, its pairs
    carried unchanged (in the coordinates of its rows at unit norm) while v_j is within a
    factor of 4 of the last scale that formed pairs (older ones, formed further away,
    can stay among them), and dropped beyond. Elsewhere, from j = 3
    on, the start is the solutions at v_{j-2} and v_{j-1} extrapolated linearly in log v (a
    predictor step, which the solver corrects), except for a cosine head or a learned
    projection, which start from the solution at v_{j-1} itself. For the convex problems
    (a linear head without projection) none of these changes the solution, only where the
    solver starts. The cosine head's problem is not convex and, at large scales, flat:
    its path can end at other solutions than independent fits at the same scales (a
    start that already meets ``tol`` stays where it is), and choose another scale than
    a GridSearchCV over :class:`MR2LinearClassifier` would.

    With ``c_bar=None``, ``lam=0``, ``class_tilt=0`` and the same ``Cs`` and ``cv`` it
    solves the problems of multinomial LogisticRegressionCV (lbfgs) and chooses as it does.

    A value whose fit diverges on a fold (a minibatch solver with a projection at a C too
    small for its ``learning_rate``, say) is recorded as failed, as GridSearchCV records a
    failed candidate: NaN in ``scores_``, ``coefs_paths_`` and ``class_accuracy_path_`` on
    that fold, 0 in ``n_iter_``, never chosen, and a FitFailedWarning with the first
    error; the next value starts cold. ``fit`` raises that error only when no value can be
    chosen: none fitted on every fold (with ``refit=False``: on some fold, none fitted);
    and, as GridSearchCV, when the refit at the chosen value fails. An error in the data
    (features too large for their dtype, say) fails the search at once.

    References
    ----------
    B. Zhu et al., "Reducing Class-Wise Performance Disparity via Margin Regularization",
    ICLR 2026. A. Radford et al., "Learning Transferable Visual Models From Natural
    Language Supervision", ICML 2021 (appendix A.3: the parametric binary search).

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from mr2_probe import MR2LinearClassifierCV
    >>> X, y = load_digits(return_X_y=True)
    >>> clf = MR2LinearClassifierCV(Cs=[0.01, 0.1, 1.0], cv=3, device="cpu").fit(X / 16, y)
    >>> clf.scores_[0].shape
    (3, 3)
    >>> float(clf.C_) in clf.Cs_
    True
    >>> clf.score(X / 16, y) > 0.95
    True
    """

    _parameter_constraints: dict = {
        **{
            key: value
            for key, value in MR2LinearClassifier._parameter_constraints.items()
            if key not in ("C", "warm_start")
        },
        "Cs": [Interval(Integral, 1, None, closed="left"), "array-like", StrOptions({"bisect"})],
        "cv": ["cv_object"],
        "scoring": [
            StrOptions(set(get_scorer_names()) | set(CLASSWISE_SCORERS)),
            callable,
            None,
        ],
        "refit": ["boolean"],
        "n_jobs": [Integral, None],
    }

    def __init__(
        self,
        Cs=10,
        *,
        cv=None,
        scoring=None,
        refit=True,
        n_jobs=None,
        c_bar=1.0,
        lam=0.0,
        p=None,
        head="linear",
        fit_intercept=True,
        difficulty="moment",
        scale=64.0,
        tau=None,
        projection_rank=None,
        solver="auto",
        max_iter=100,
        tol=1e-4,
        batch_size=256,
        learning_rate=3e-3,
        n_iter_no_change=5,
        class_weight=None,
        class_tilt=0.0,
        random_state=None,
        verbose=0,
        device="auto",
    ):
        self.Cs = Cs
        self.cv = cv
        self.scoring = scoring
        self.refit = refit
        self.n_jobs = n_jobs
        self.c_bar = c_bar
        self.lam = lam
        self.p = p
        self.head = head
        self.fit_intercept = fit_intercept
        self.difficulty = difficulty
        self.scale = scale
        self.tau = tau
        self.projection_rank = projection_rank
        self.solver = solver
        self.max_iter = max_iter
        self.tol = tol
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.n_iter_no_change = n_iter_no_change
        self.class_weight = class_weight
        self.class_tilt = class_tilt
        self.random_state = random_state
        self.verbose = verbose
        self.device = device

    # Under metadata routing ``groups`` is not this estimator's own: it goes to a splitter
    # that asks for it (an outer router needs no request for it here).
    __metadata_request__fit = {"groups": metadata_routing.UNUSED}
    # score's sample_weight is the scorer's alone, as LogisticRegressionCV's **score_params
    # are from scikit-learn 1.9 on: a request of this estimator's own for it was required,
    # and did nothing. Before 1.9 LogisticRegressionCV's own request is what an outer
    # router reads (unset, it refuses the weights, asking for set_score_request), and so is
    # this one's: marked unused there, a scorer's request for them was dropped silently.
    if _SKLEARN >= (1, 9):
        __metadata_request__score = {"sample_weight": metadata_routing.UNUSED}

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None, groups=None, **params):
        """Search along each fold's path, then refit at the best value.

        Parameters
        ----------
        X : array-like, DataFrame, torch.Tensor or h5py.Dataset of shape \
                (n_samples, n_features)
        y : array-like of shape (n_samples,)
        sample_weight : array-like of shape (n_samples,), default=None
        groups : array-like of shape (n_samples,), default=None
            Group labels for a group splitter as ``cv`` (``GroupKFold``), passed to its
            ``split`` as GridSearchCV passes them. Under metadata routing, ``groups`` go
            to a splitter that asks for them, and ``sample_weight`` weights the held-out
            scores only where the scorer asks for them, as in LogisticRegressionCV.
        **params : dict
            Only under metadata routing: metadata for the scorer, as its requests say
            (``set_score_request(groups=True)``, or an alias such as
            ``set_score_request(sample_weight="score_weight")``), per-sample ones indexed to
            each fold's held-out rows, as LogisticRegressionCV routes them.

        Returns
        -------
        self : MR2LinearClassifierCV
        """
        _raise_for_params(params, self, "fit")
        # (one on a GPU, or requiring grad, failed where the held-out scores take them)
        sample_weight = numpy_if_tensor(sample_weight, "sample_weight")
        with default_torch_modes(), whole_or_unchanged(self):
            values = self._check_Cs()
            solver = self._check_solver()
            if not self.refit and self.head == "cosine" and self.lam > 0:
                raise ValueError(
                    "refit=False averages the folds' coefficients, which a cosine head with a "
                    "projection (lam > 0) cannot be reduced to; use refit=True or lam=0."
                )
            scorer = check_classwise_scoring(HeldOutLogits(), self.scoring)
            data = self._prepare(X, y, sample_weight)
            if self.head == "cosine" and not isinstance(values, str):
                top = torch.finfo(data.dtype).max  # a scale the logits cannot hold
                if values.max() > top:
                    raise ValueError(
                        f"Cs holds the logit scale {values.max():g}, beyond the range of "
                        f"{_dtype_name(data.dtype)}, in which X is computed (up to {top:g}): "
                        "its fits would overflow. Search scales of a usual order of magnitude."
                    )
            check_h5_open(groups=groups, **params)  # h5py's words from the splitter otherwise
            score_params, split_params = self._route_fit(sample_weight, groups, params)
            # The scorer's metadata (its weights, and under routing whatever its requests
            # name) and the class accuracies' weights (the sample weights, whatever the
            # scorer takes).
            rows = np.empty((len(data.y_index), 0))
            score_params = {k: numpy_if_tensor(v, k) for k, v in score_params.items()}
            score_weight, accuracy_weight = (
                None if weight is None else _check_sample_weight(weight, rows)
                for weight in (score_params.get("sample_weight"), sample_weight)
            )
            if score_weight is not None:
                score_params["sample_weight"] = score_weight
            weights = score_params, accuracy_weight
            labels = self.classes_[data.y_index]
            cv = check_cv(self.cv, labels, classifier=True)
            split_params = {k: numpy_if_tensor(v, k) for k, v in split_params.items()}
            folds = cv_folds(cv, X, labels, **split_params)  # X as given, as GridSearchCV splits it
            score = _Scorer(scorer, self.classes_)
            # The fits weigh rows by sample_weight and class_weight, the scorers by
            # sample_weight alone, where they take it (else every held-out row counts).
            for part, weight, why in (
                ("training", data.sample_weight, "nothing can be fitted"),
                (
                    "held-out",
                    score_weight if score.weighted else None,
                    "no candidate can be scored",
                ),
            ):
                for f, fold in enumerate(folds):
                    rows = fold[part == "held-out"]
                    if not len(rows):
                        raise empty_fold(f, part)
                    if weight is not None and not weight[rows].sum() > 0:
                        raise ValueError(
                            f"The {part} rows of fold {f} have no sample weight: {why} on "
                            "them. Give their samples positive weights or use "
                            "other folds."
                        )
            if self._batches_folds(data, solver):
                groups = self._batched_paths(data, folds, weights)
                paths = [path for group in groups for path in group.paths]
                report = functools.partial(self._report, solver, data.dtype)
                # The test on c̄ times the gradient, as fit_lbfgs's (see gradient_unit).
                tol = self.tol / gradient_unit(self.c_bar, self.head == "linear")

                def run(new, bar):
                    Parallel(n_jobs=self.n_jobs, require="sharedmem")(
                        delayed(group.run)(
                            new, score, bar, max_iter=self.max_iter, tol=tol, report=report
                        )
                        for group in groups
                    )
            else:
                if isinstance(data.source, H5Source):  # (each fold reads only its own rows)
                    data.source.check_finite_pass(type(self).__name__)
                paths = [self._fold_path(data, train, test, weights) for train, test in folds]

                def run(new, bar):
                    Parallel(n_jobs=self.n_jobs, require="sharedmem")(
                        delayed(path.run)(new, self._path_solver(solver), score, bar)
                        for path in paths
                    )

            desc = f"{self._objective()} CV path"  # (ERM: a search of cross-entropy)
            with tqdm(disable=not self.verbose, desc=desc, leave=False) as bar:

                def evaluate(new):
                    bar.total = (bar.total or 0) + len(new) * len(paths)
                    run(new, bar)
                    return np.mean([[path.steps[float(v)].score for v in new] for path in paths], 0)

                if isinstance(values, str):
                    bisect_search(evaluate, BISECT_GRIDS[self.head])
                else:
                    evaluate(values)
            self._store_path(paths)
            self._check_scores(self._check_failures(paths))
            if self.refit:
                self._refit(data, solver, paths)
            else:
                self._average_folds(data, solver)
            self.n_iter_ = self._path_n_iter
            return self

    def _route_fit(self, sample_weight, groups, params) -> tuple:
        """The held-out scorer's metadata (over all rows) and the splitter's ``split``
        parameters.

        Under scikit-learn's metadata routing, as the requests say, as LogisticRegressionCV
        routes them: ``sample_weight`` and any other metadata (``groups``, an alias) to the
        scorer where it asks for them (a scorer that leaves the request of metadata given
        unset refuses them, scikit-learn's error), ``groups`` to a splitter that asks for
        them. ``sample_weight`` weights the fits either way. Otherwise the weights weight
        the scores too, and ``groups`` go to the splitter."""
        if not routing_enabled():
            score = {} if sample_weight is None else {"sample_weight": sample_weight}
            return score, ({} if groups is None else {"groups": groups})
        given = {"sample_weight": sample_weight, "groups": groups, **params}
        routed = process_routing(
            self, "fit", **{key: value for key, value in given.items() if value is not None}
        )
        return dict(routed.scorer.score), routed.splitter.split

    def get_metadata_routing(self):
        """Get metadata routing of this object.

        Please check :ref:`User Guide <metadata_routing>` on how the routing mechanism
        works. ``sample_weight`` is also this estimator's own: the weights weight the fits.

        Returns
        -------
        routing : MetadataRouter
            The routes of ``fit``'s metadata to the splitter's ``split`` and the scorer,
            and of ``score``'s to the scorer, as in LogisticRegressionCV.
        """
        return (
            MetadataRouter(owner=self)
            .add_self_request(self)
            .add(splitter=self.cv, method_mapping=MethodMapping().add(caller="fit", callee="split"))
            .add(
                scorer=self._routing_scorer(),
                method_mapping=MethodMapping()
                .add(caller="fit", callee="score")
                .add(caller="score", callee="score"),
            )
        )

    def _routing_scorer(self):
        """The scorer whose requests routing reads: ``scoring``'s, accuracy's for None."""
        if self.scoring is None:
            return get_scorer("accuracy")
        return check_classwise_scoring(self, self.scoring)

    def score(self, X, y, sample_weight=None, **params):
        """The ``scoring`` option's score of the fitted model on ``(X, y)`` (accuracy when
        ``scoring`` is None), as LogisticRegressionCV scores, so that a search or
        ``cross_val_score`` over this estimator reads the metric it was tuned for. Under
        metadata routing ``sample_weight`` and ``params`` go to the scorer as its requests
        say; otherwise ``params`` are refused."""
        _raise_for_params(params, self, "score")
        # (a scoring was told the classes_ of a fit that never ran: an AttributeError)
        check_is_fitted(self)
        check_h5_open(X=X, y=y, sample_weight=sample_weight)
        check_no_missing_labels(y, "y", "score")  # (a list's NaN among text: the class 'nan')
        kwargs = {} if sample_weight is None else {"sample_weight": sample_weight}
        if routing_enabled() and (sample_weight is not None or params):
            given = {**kwargs, **params}
            kwargs = dict(process_routing(self, "score", **given).scorer.score)
        kwargs = {key: numpy_if_tensor(value, key) for key, value in kwargs.items()}
        if "sample_weight" in kwargs:  # (weights near the largest float scored NaN)
            kwargs["sample_weight"] = summable_weights(kwargs["sample_weight"])
        if self.scoring is None:
            return super().score(X, y, sample_weight=kwargs.get("sample_weight"))
        y = numpy_if_tensor(y, "y")
        # The folds' positive class; the classes are those of (X, y), as scikit-learn's.
        scorer = with_labels(check_classwise_scoring(self, self.scoring), self.classes_, False)
        if not _takes_sample_weight(scorer):
            kwargs.pop("sample_weight", None)
        estimator = self
        if is_torch_tensor(X):
            # The metrics take NumPy, and predict_proba of a CUDA tensor is one: the logits,
            # computed on X's device, are scored on the host, as the search scored them.
            X = both_class_logits(to_numpy(self._logits(self._validate_predict_data(X))))
            estimator = HeldOutLogits(self.classes_)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            score = scorer(estimator, X, y, **kwargs)
        # scikit-learn's "ROC AUC score is not defined" for a class absent from y: the
        # weighted one-vs-rest AUC gave that class weight 0 and returned the others' mean
        # (1.0 on iris without a class), where the unweighted one is NaN and raises.
        said_undefined = any(
            issubclass(w.category, UndefinedMetricWarning) and "is not defined" in str(w.message)
            for w in caught
        )
        self._check_defined(score, y, said_undefined)
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
        return score

    def _check_defined(self, score, y, said_undefined: bool = False) -> None:
        """Refuse a NaN score of data lacking some of three or more classes, or one the
        metric warned is not defined there (``said_undefined``). A metric of probabilities
        is told every class, so that log loss and one-vs-one AUC score such data; one that
        is still undefined there (one-vs-rest AUC: NaN, or weighted, the mean of the
        classes present) raises, as LogisticRegressionCV's score raises for want of the
        classes' columns. (With two classes both return scikit-learn's NaN for data of one
        class.)"""
        try:
            undefined = bool(np.isnan(score)) or said_undefined
        except (TypeError, ValueError):
            return
        if not undefined or len(self.classes_) < 3:
            return
        missing = self.classes_[~np.isin(self.classes_, np.asarray(y))]
        if len(missing):
            raise ValueError(
                f"The score of scoring={self.scoring!r} is not defined on y lacking "
                f"{len(missing)} of the {len(self.classes_)} classes of the fit "
                f"({missing[:5].tolist()}{', ...' if len(missing) > 5 else ''}): score data "
                "holding every class, or choose a scoring defined without them (such as "
                "'neg_log_loss')."
            )

    def _check_Cs(self):
        if isinstance(self.Cs, str):
            return self.Cs
        if isinstance(self.Cs, Integral):
            # Logit scales below 1 leave every softmax near uniform: a fit there stops at
            # its start, the gradient below tol, and would be scored as if trained.
            return (
                np.logspace(0, 3, self.Cs) if self.head == "cosine" else np.logspace(-4, 4, self.Cs)
            )
        # Numbers only: strings ("0.1", from a command line) were read as numbers, and "a"
        # failed in NumPy's words; booleans as 0 and 1.
        values = np.asarray(self.Cs)
        numeric = values.dtype.kind in "iuf"
        values = values.astype(float) if numeric else values
        # C = inf is no penalty, as in scikit-learn; a logit scale must be finite.
        top = np.inf if self.head == "linear" else np.finfo(float).max
        if (
            not numeric
            or values.ndim != 1
            or not len(values)
            or not np.all((values > 0) & (values <= top))
        ):
            name = "positive C values (np.inf: no penalty)"
            if self.head == "cosine":
                name = "positive, finite logit scales"
            raise ValueError(
                f"The 'Cs' parameter of {type(self).__name__} must be an int, 'bisect' or a "
                f"non-empty 1-D array of {name}. Got {self.Cs!r} instead."
            )
        return np.unique(values)

    def _fold_path(self, data, train, test, weights):
        """The path of one fold; ``weights`` are the scorer's and the class accuracies'
        over all rows (or None)."""
        fold = data.subset(train)
        head = self._new_head(fold, scale=1.0)
        initial = None if head.has_projection else self._statistics(head, fold)
        score_params, accuracy_weight = _held_out_weights(weights, test, len(data.y_index))
        if isinstance(data.source, H5Source):  # read again at each value, never held whole
            blocks = functools.partial(data.row_blocks, test)
        else:  # copied to the device once
            held_out = list(data.row_blocks(test))

            def blocks():
                return held_out

        return FoldPath(
            fold, blocks, data.y_index[test], score_params, accuracy_weight, head, initial
        )

    # The folds of a plain linear or cosine head are solved by the batched L-BFGS of
    # _batched.py, with its memory carried along the path. On a GPU, and on a CPU while the
    # folds' logits together stay narrow (n_folds × n_classes columns), all folds form one
    # batch: one product over all rows reads X once instead of once per fold. Elsewhere
    # each fold is a batch of one, on its own training rows. ``_batch_folds`` overrides the
    # choice (True: one batch; False: one per fold).
    _BATCH_MAX_COLUMNS_CPU = 256
    _batch_folds = None

    def _batches_folds(self, data, solver) -> bool:
        """Whether the folds' paths run on the batched L-BFGS: a linear or cosine head
        without projection (lam = 0), by L-BFGS; an HDF5 store is read in blocks
        (:class:`~mr2_probe._data.StoredRows`), the same arithmetic as in memory."""
        return solver == "lbfgs" and self.lam == 0

    def _one_batch(self, data, n_folds) -> bool:
        if self._batch_folds is not None:
            return bool(self._batch_folds)
        return data.device.type == "cuda" or n_folds * data.n_classes <= self._BATCH_MAX_COLUMNS_CPU

    def _batched_paths(self, data, folds, weights) -> list[BatchedPath]:
        """One :class:`BatchedPath` of all folds (held-out rows weighted zero), or one per
        fold on its own training rows (``weights`` as :meth:`_fold_path` takes them)."""

        stored = isinstance(data.source, H5Source)  # read in blocks, never held whole

        def held_out(test):
            score_params, accuracy_weight = _held_out_weights(weights, test, len(data.y_index))
            X = functools.partial(data.row_blocks, test) if stored else data.rows(test)
            return HeldOut(X, data.y_index[test], score_params, accuracy_weight)

        cosine = self.head == "cosine"

        def fold_parts(train):
            """A fold's sample weights over all rows (zero off ``train``), inverse margins,
            feature mean and start: its statistics over all rows with the held-out ones
            weighted zero, so that nothing is copied. A cosine head starts at the fold's
            class prototypes, a linear one at zero."""
            fold = data.masked(train)
            head = self._new_head(fold)
            stats, margins = self._statistics(head, fold)[:2]
            if cosine:
                head.init_weight_from_means(stats.mean)
            start = head.weight.detach().flatten() if cosine else None
            center, scale = overall_mean(stats), intercept_scale(stats)
            variance = entry_variance(stats)
            return fold.source.w, margins.reciprocal(), center, scale, variance, start

        def batch(X, y, parts):
            weights, inv_gamma, centers, scales, variances = (
                torch.stack(part) for part in list(zip(*parts, strict=True))[:5]
            )
            if not self.fit_intercept or cosine:
                centers = scales = variances = None
            tilt, pinned = float(self.class_tilt), not cosine and data.n_classes == 2
            k = data.n_classes
            return FoldBatch(
                X, y, weights, inv_gamma, centers, k, cosine, tilt, pinned, scales, variances,
                self.c_bar,
            )  # fmt: skip

        def start(parts):
            return torch.stack([part[5] for part in parts]) if cosine else None

        X, y = (StoredRows(data) if stored else data.source.X), data.source.y
        if self._one_batch(data, len(folds)):
            parts = [fold_parts(train) for train, _ in folds]
            fold_batch = batch(X, y, parts)
            held = [held_out(test) for _, test in folds]
            return [BatchedPath(fold_batch, held, start=start(parts))]

        def own_rows(train):
            """The fold's training rows, copied when its path runs and dropped after (an
            HDF5 store's read in blocks as the solver asks for them)."""

            def rows():
                if stored:
                    index = to_tensor(np.asarray(train, dtype=np.int64), data.device)
                    return StoredRows(data, train), y[index]
                source = data.subset(train).source
                return source.X, source.y

            return rows

        paths = []
        for train, test in folds:
            parts = fold_parts(train)
            index = to_tensor(np.asarray(train, dtype=np.int64), data.device)
            # X and y come from own_rows while the path runs; until then, none. Each copied
            # row has its own weight (fold_parts' weights count a repeated row m times).
            own = [(data.source.w[index], *parts[1:])]
            empty = batch(X[:0], y[:0], own)
            paths.append(BatchedPath(empty, [held_out(test)], own_rows(train), start(own)))
        return paths

    def _report(self, solver, dtype, value, weight_sum, n_iter, stop, largest):
        """A batched fold's solver outcome at ``value`` (C, or the cosine head's scale), its
        training rows' weights summing to ``weight_sum``: warns as a fold's own fit would."""
        largest *= gradient_unit(self.c_bar, self.head == "linear")  # in fit_lbfgs's units
        result = SolverResult(n_iter, stop == "tol", largest_gradient=largest, stop=stop)
        if not result.converged:  # (the suspects are named in a warning only)
            # The cosine head penalises only a projection (lam > 0), at C = 1.
            cosine = (1.0 if self.lam > 0 else np.inf, value)
            C, scale = cosine if self.head == "cosine" else (value, None)
            result.range_suspects = _range_suspects(
                C, self.c_bar, weight_sum, self.class_tilt, scale, dtype, stop == "stalled"
            )
        self._warn_if_short(result, solver, dtype)

    def _path_solver(self, solver):
        """The solve step of one value of the path (C, or the cosine head's scale)."""

        def solve(head, data, value, cold, initial):
            C = value
            if self.head == "cosine":
                head.scale, C = value, 1.0
            result = self._solve(
                head, data, solver, C, initial=initial, init_cosine=cold, verbose=0
            )
            return result, self._export(head, result, solver, data.dtype)

        return solve

    def _store_path(self, paths):
        self.Cs_ = np.array(sorted(paths[0].steps))
        steps = [[path.steps[v] for v in self.Cs_] for path in paths]
        scores = np.array([[s.score for s in row] for row in steps])  # (n_folds, n_Cs)
        coefs = np.array([[s.coef for s in row] for row in steps])  # (folds, Cs, rows, dof)
        keys = self.classes_[1:] if len(self.classes_) == 2 else self.classes_
        self.scores_ = {key: scores.copy() for key in keys}
        self.coefs_paths_ = {key: coefs[:, :, k] for k, key in enumerate(keys)}
        self.class_accuracy_path_ = np.array([[s.class_accuracy for s in row] for row in steps])
        self._path_n_iter = np.array([[[s.n_iter for s in row] for row in steps]])
        self._coefs = coefs

    def _check_failures(self, paths) -> str:
        """Raises where no value can be chosen because fits failed (every value on some
        fold with refit=False, some fold at every value with refit=True); else a
        FitFailedWarning names the values that failed, which score NaN. Returns what
        :meth:`_check_scores` says of them beside NaN scores ("" where none failed)."""
        failed = np.array([[v in path.failures for v in self.Cs_] for path in paths])
        self._failed = failed  # (n_folds, n_Cs), for _best
        if not failed.any():
            return ""
        fold, value = np.argwhere(failed)[0]
        blocked = failed.all(1).any() if not self.refit else failed.any(0).all()
        if blocked and not self.refit:  # the fold without a value to choose
            fold, value = np.flatnonzero(failed.all(1))[0], 0
        error, name = paths[fold].failures[self.Cs_[value]], self._value_name()
        if blocked:
            where = "on one fold" if not self.refit else "on some fold"
            raise FitDivergedError(
                f"Every value of Cs failed {where}, so none can be chosen; at {name}="
                f"{self.Cs_[value]:g} on fold {fold}: {error}"
            ) from error
        first = f"at {name}={self.Cs_[value]:g} on fold {fold}: {one_line(error)}"
        warnings.warn(
            f"{failed.sum()} of {failed.size} fits failed, their scores set to NaN and "
            f"never chosen: {name}={self._where(failed)}. The first error, {first}",
            FitFailedWarning,
            stacklevel=_outside_stacklevel(),
        )
        return f"the fits at {name}={self._where(failed)} failed (the first error, {first})"

    def _where(self, mask: np.ndarray) -> str:
        """The values and folds where ``mask`` (n_folds, n_Cs) is set: "0.01 (fold 0), 1
        (folds 0, 2)"."""
        return ", ".join(
            f"{v:g} (fold{'s' if n > 1 else ''} {', '.join(map(str, np.flatnonzero(column)))})"
            for v, column, n in zip(self.Cs_, mask.T, mask.sum(0), strict=True)
            if n
        )

    def _check_scores(self, failures: str = "") -> None:
        """Warn, in GridSearchCV's words, where held-out scores of fits that did not fail
        are not finite (a scorer undefined on a fold's held-out rows: one-vs-rest ROC AUC
        where they lack a class); those values rank last. Raise where no value can be
        chosen for them: with refit=True, no value's sum over the folds is finite (a fold
        that scores NaN everywhere spoiled them all, and the first value was chosen without
        a word); with refit=False, some fold has no finite score at any value. The fits
        that failed, their scores NaN too, are named beside them (``failures``, as
        :meth:`_check_failures` says them), in an error after its cure."""
        scores = next(iter(self.scores_.values()))  # (n_folds, n_Cs)
        undefined = ~np.isfinite(scores) & ~self._failed
        if not undefined.any():
            return
        name = self._value_name()
        everywhere = np.flatnonzero((~np.isfinite(scores)).all(1))  # folds of no score
        blocked = (~np.isfinite(scores.sum(0))).all() if self.refit else len(everywhere)
        scoring = "accuracy" if self.scoring is None else self.scoring
        if blocked:
            where = "summed over the folds" if self.refit else f"on fold {everywhere[0]}"
            # The cure before the values and the failed fits' error, of any length: an
            # error cut to one line (mr2-probe's, at 1,000 characters) keeps it.
            raise ValueError(
                f"No value of Cs has a defined held-out score {where}, so none can be "
                "chosen. A scorer is undefined on held-out rows that lack a class "
                "(one-vs-rest ROC AUC, say): pass folds whose held-out rows hold every class "
                "(fewer splits, or a StratifiedKFold), or a scoring defined without them "
                f"(such as 'neg_log_loss'). Here scoring={scoring!r} gave no finite score "
                f"at {name}={self._where(undefined)}"
                + (f"; besides, {failures}." if failures else ".")
            )
        failures = f", and {failures}" if failures else ""
        warnings.warn(
            f"One or more of the test scores are non-finite: {np.mean(scores, 0)}. Those "
            f"values rank last; scoring={scoring!r} gave a non-finite score at "
            f"{name}={self._where(undefined)}{failures}.",
            UserWarning,
            stacklevel=_outside_stacklevel(),
        )

    def _value_name(self) -> str:
        """The name of the searched value: the cosine head's scale, or C."""
        return "scale" if self.head == "cosine" else "C"

    def _chosen(self, value):
        self.C_ = self.scale_ = float(value)

    def _best(self, scores: np.ndarray, failed: np.ndarray) -> np.ndarray:
        """Index in ``Cs_`` of the best of ``scores`` (…, n_Cs) among the values whose fits
        did not fail (``failed``, of the same shape; _check_failures leaves one at least),
        scores that are not finite ranked last (+inf too: a scorer's undefined value, not
        a best one). Ties go, as in LogisticRegressionCV's argmax, to the value
        listed first in ``Cs`` (the smallest for an int or ``"bisect"``), though ``Cs_``
        is sorted."""
        if isinstance(self.Cs, Integral | str):
            order = np.arange(len(self.Cs_))
        else:  # Cs_ holds the sorted unique values of Cs: each one's first position in it
            order = np.unique(np.asarray(self.Cs, dtype=float), return_index=True)[1]
        finite = np.where(~np.isfinite(scores) | failed, -np.inf, scores)  # (+inf too)
        top = (finite == finite.max(-1, keepdims=True)) & ~failed
        return np.argmin(np.where(top, order, np.inf), axis=-1)

    def _refit(self, data, solver, paths):
        scores = next(iter(self.scores_.values())).sum(0)
        best = int(self._best(scores, self._failed.any(0)))
        self._chosen(self.Cs_[best])
        head = self._new_head(data, scale=self.C_)
        cold = head.has_projection
        if not cold:
            mean = self._coefs[:, best].mean(0)  # (rows, dof)
            bias = mean[:, -1] if head.bias is not None else None
            weight = mean[:, : self.n_features_in_]
            if len(weight) < head.weight.shape[0]:
                # Two classes are exported as one row, coef_1 − coef_0 = s·(ŵ₁ − ŵ₀); a
                # two-class cosine head has both rows (loaded as is, both got that
                # difference: a start where every sample scores the two classes alike).
                # Its rows start with that difference: at ∓ it, they were opposite, a
                # stationary point that the refit never left (open_pair).
                difference = torch.as_tensor(weight[0], device=head.weight.device)
                cos = difference.norm() / (2 * self.C_)
                weight = open_pair(torch.stack([-difference, difference]), cos)[0]
            elif self.head == "cosine":
                # The folds' coef_ are s·ŵ: rows of norm s, whose gradient in W is 1/s
                # times that of unit rows, so the first round's test on tol took another
                # precision than the folds' fits (at s = 10⁻⁴ the refit moved away from the
                # start that every fold had kept). The objective ignores the norms.
                weight = F.normalize(torch.as_tensor(weight, device=head.weight.device), dim=1)
            head.load({"weight": weight, "bias": bias})
        C = 1.0 if self.head == "cosine" else self.C_
        try:
            result = self._solve(head, data, solver, C, init_cosine=cold)
            self._finish(head, result, solver, data)
        except FitDivergedError as error:  # as GridSearchCV's refit, it fails the search
            raise FitDivergedError(
                f"The refit on all the data at the chosen {self._value_name()}={self.C_:g} "
                f"failed, though the folds' fits there did not: {error}"
            ) from error

    def _average_folds(self, data, solver):
        for name in ("loss_curve_", "class_losses_", "tilt_weights_"):  # no refit: none
            if hasattr(self, name):
                delattr(self, name)
        scores = next(iter(self.scores_.values()))
        best = self._best(scores, self._failed)  # (n_folds,)
        self._chosen(np.mean(self.Cs_[best]))
        mean = self._coefs[np.arange(len(best)), best].mean(0)  # (rows, dof)
        d = self.n_features_in_
        self.coef_ = mean[:, :d]
        self.intercept_ = mean[:, d] if mean.shape[1] > d else np.zeros(len(mean), mean.dtype)
        self.projection_ = None
        head = self._new_head(data, scale=self.C_)
        stats, margins = self._statistics(head, data)[:2]
        self.margins_ = to_numpy(margins)
        self.class_stats_ = _class_stats(stats, self.p_, self.difficulty, data.weight_scale)
        self.solver_, self.device_, self.head_ = solver, str(data.device), self.head


def _held_out_weights(weights: tuple, test, n_samples: int) -> tuple:
    """The scorer's metadata (a dict over all ``n_samples`` rows, the per-sample ones
    indexed as scikit-learn's searches index them) and the class accuracies' weights (None
    or over all rows) of the held-out rows ``test``."""
    score_params, accuracy_weight = weights
    if score_params:
        rows = np.empty((n_samples, 0))
        score_params = _check_method_params(rows, score_params, indices=test)
    return score_params, None if accuracy_weight is None else accuracy_weight[test]


def _takes_sample_weight(scorer) -> bool:
    """Whether a scorer's metric (or a plain callable scorer itself) takes
    ``sample_weight``, by name or ``**kwargs``; True when its signature cannot be read."""
    try:
        parameters = inspect.signature(getattr(scorer, "_score_func", scorer)).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "sample_weight" or p.kind is p.VAR_KEYWORD for p in parameters)


def with_labels(scorer, classes, every_class: bool = True):
    """``scorer`` with two classes scoring the last as the positive one, whatever the labels
    are, as LogisticRegressionCV scores (scikit-learn's metrics default to ``pos_label=1``,
    the first class of labels {1, 2} and no class of {0.5, 1.5} or of strings); a
    ``pos_label`` the scorer was made with (or its functools.partial binds) is kept. With
    ``every_class``, also told every class: a fold's held-out rows may lack one, so metrics
    that take the labels are given all of them, as LogisticRegressionCV gives them. Metrics
    of probabilities or decision values (log loss, Brier score) are always told them: their
    columns are every class's."""
    func = getattr(scorer, "_score_func", None)
    parameters = inspect.signature(func).parameters if func is not None else {}
    kwargs = dict(getattr(scorer, "_kwargs", {}))
    # What a functools.partial binds is the scorer's own too (its pos_label="a" and
    # labels=[1, 2] were replaced by the last class and every class)
    bound = func.keywords if isinstance(func, functools.partial) else {}
    # A metric of probabilities or decision values needs every class, one per column.
    columns = getattr(scorer, "_response_method", "predict") != "predict"
    if (every_class or columns) and "labels" in parameters and "labels" not in bound:
        kwargs.setdefault("labels", classes)
    # (also a metric without labels: average_precision_score, before scikit-learn 1.7
    # brier_score_loss, whose pos_label=1 scored class 1 of {1, 2} and failed on strings)
    # An averaged set-wise metric, make_scorer(f1_score, average="macro"), has none, as
    # scikit-learn's "f1_macro" (the last class was ignored with a warning in every fold,
    # "pos_label (set to 2) is ignored", and pos_label=1 fails on strings).
    # (a partial's own default is the average it binds: its metric's tells it set-wise)
    metric = func.func if isinstance(func, functools.partial) else func
    own = inspect.signature(metric).parameters.get("average") if func is not None else None
    average = kwargs.get("average", getattr(parameters.get("average"), "default", None))
    averaged = getattr(own, "default", None) == "binary" and average != "binary"
    if len(classes) == 2 and "pos_label" in parameters and "pos_label" not in bound:
        kwargs.setdefault("pos_label", None if averaged else classes[-1])
    if kwargs == getattr(scorer, "_kwargs", {}):
        return scorer
    return make_scorer(
        func, greater_is_better=scorer._sign == 1, response_method=scorer._response_method,
        **kwargs,
    )  # fmt: skip


class _Scorer:
    """Scores held-out logits with a scikit-learn scorer, weighted when it can be."""

    def __init__(self, scorer, classes) -> None:
        scorer = with_labels(scorer, classes)
        self.scorer, self.estimator, self.classes = scorer, HeldOutLogits(classes), classes
        self.weighted = _takes_sample_weight(scorer)

    def __call__(self, z, y_index, params) -> float:
        """The score of held-out logits ``z``; ``params`` the scorer's metadata of those
        rows (its weights passed where the metric takes them)."""
        kwargs = dict(params or {})
        if not self.weighted:
            kwargs.pop("sample_weight", None)
        score = self.scorer(self.estimator, z, self.classes[y_index], **kwargs)
        if hasattr(score, "item"):  # a NumPy scalar, or an array of one value
            with contextlib.suppress(ValueError):
                score = score.item()
        if not isinstance(score, (Real, Decimal)):  # (a Decimal is no Real, but a number)
            # (in GridSearchCV's words: float() raised "only 0-dimensional arrays can be
            # converted" or "argument must be a string or a real number, not 'NoneType'")
            raise ValueError(
                f"scoring must return a number, got {score!r} ({type(score)}) instead. "
                f"(scorer={self.scorer!r})"
            )
        return float(score)
