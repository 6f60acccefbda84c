"""MR2LinearClassifier: a scikit-learn linear probe with MR² margin regularization."""

from __future__ import annotations

import functools
import warnings
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions

from ._convergence import _ConvergenceMessageMixin
from ._data import H5Source, as_given, whole_or_unchanged
from ._device import default_torch_modes, to_numpy
from ._fit_errors import (
    _EXTREME,
    FitDivergedError,
    _overflow_error,
    _overflow_message,
    _range_suspects,
    _scale_underflow,
    _weight_suspects,
)
from ._fit_inputs import _FitInputsMixin
from ._head import ProbeHead
from ._prediction import _PredictMixin
from ._solvers import SGD_STABLE, MarginSpec, fit_lbfgs, fit_minibatch, refresh_statistics
from ._stacklevel import _outside_stacklevel
from ._stats import DIFFICULTIES, class_difficulty
from ._warm_start import _fingerprint, _WarmStartMixin

# Beyond this class_tilt a fit that stops short of tol is told that the tilt is why.
_STEEP_TILT = 10.0


def _class_stats(stats, p, difficulty, weight_scale=1.0):
    """``class_stats_``: the statistics that gave the margins, as NumPy; ``weight_scale``
    (:class:`FitData`'s) makes the counts the class weights as given."""
    # In float64 whatever the weights (weights of 1e-42, the cosine head's taken relative to
    # the largest, are beyond float32's normal numbers): one dtype, whatever their values.
    count = to_numpy(stats.count).astype(np.float64) * weight_scale
    return {
        "mean": to_numpy(stats.mean),
        "msd": to_numpy(stats.msd),
        "msd_l2": to_numpy(stats.msd_l2),
        "count": count,
        "difficulty": to_numpy(class_difficulty(stats, p, difficulty)),
    }


class MR2LinearClassifier(
    _PredictMixin,
    _FitInputsMixin,
    _WarmStartMixin,
    _ConvergenceMessageMixin,
    ClassifierMixin,
    BaseEstimator,
):
    """Linear or cosine probe trained with MR² margin regularization.

    Each class k gets a logit margin γ_k that grows with the spread of its features, so
    that classes which are hard to separate are asked for larger logit gaps; an optional
    compactness loss pulls same-class representations together through a learnable
    projection. Training uses CUDA when present; the fitted model is plain NumPy.

    Parameters
    ----------
    c_bar : float or None, default=1.0
        Mean margin c̄ > 0. ``None`` disables the margins (plain cross-entropy).
    lam : float, default=0.0
        Weight λ ≥ 0 of the compactness loss. ``lam > 0`` adds a learnable projection P
        between the features and the head (φ = P·x, P initialised to the identity) and
        trains with minibatches; ``lam = 0`` keeps the problem convex for a linear head.
        The projection, its penalty and the default τ are this library's (see Notes).
    p : float or None, default=None
        Order p ≥ 1 of the norm of the class statistics (``np.inf``: the largest absolute
        entry). ``None`` means 3 for the cosine head (with unit-norm features every class
        has a_k = 1 under p = 2) and 2 otherwise.
    head : {"linear", "cosine"}, default="linear"
        ``"linear"``: z = W·φ + b. ``"cosine"``: z = scale · cos(w_k, φ), no intercept;
        as in ``F.normalize``, norms below 1e-12 count as 1e-12, so a zero row has logits
        0 and a row nearly zero (norm under 1e-12) logits scaled down with its norm.
    C : float, default=1.0
        Inverse strength of the L2 penalty ½‖W‖² / (C·S), S the sum of sample weights, as
        in :class:`~sklearn.linear_model.LogisticRegression`; ``np.inf``: no penalty
        (scikit-learn's replacement for ``penalty=None``). The cosine head is invariant
        to ‖W‖ and is not penalised; a projection is penalised by ½‖P − I‖² / (C·S)
        (½(‖A‖² + ‖B‖²) / (C·S) for a low-rank one).
    fit_intercept : bool, default=True
        Whether the linear head has a bias. Ignored by the cosine head.
    difficulty : {"moment", "spread"}, default="moment"
        What the margins grow with. ``"moment"`` is the paper's a_k = ‖μ_k‖_p² + msd_k;
        ``"spread"`` is msd_k alone, the spread around the class mean, which does not
        change when every feature is shifted by the same vector.
    scale : float, default=64.0
        Logit scale of the cosine head (an inverse temperature).
    tau : float or None, default=None
        Temperature τ of the compactness loss; ``None`` uses τ = 2 s̄, which makes the loss
        independent of the scale of the features (s̄ floored at the rounding of the squared
        distances, when every class is copies of one row).
    projection_rank : int or None, default=None
        Rank r of the residual of the projection, P = I + A·B (A: d×r, B: r×d), at most
        the number of features. ``None`` learns a full d×d matrix. Only used when
        ``lam > 0``.
    solver : {"auto", "lbfgs", "adam", "sgd"}, default="auto"
        ``"lbfgs"``: full-batch L-BFGS, exact and deterministic, for ``lam = 0`` (on CUDA
        the class sums use atomic scatter-adds, so two runs may differ in the last bits).
        ``"adam"`` / ``"sgd"``: minibatch optimisers (SGD with Nesterov momentum 0.9),
        with a step size that falls tenfold at each plateau of the epoch loss (see
        ``n_iter_no_change``). ``"auto"`` picks ``"lbfgs"`` when ``lam = 0`` and
        ``"adam"`` otherwise.
    max_iter : int, default=100
        L-BFGS iterations, or epochs for the minibatch solvers. L-BFGS may also stop at
        4 × ``max_iter`` function evaluations (its line searches), and says so. ``0``
        keeps the starting point (with a ConvergenceWarning unless it meets ``tol``):
        zeros, the previous solution with ``warm_start``, or for the cosine head the class
        means' directions, a nearest-class-mean classifier.
    tol : float, default=1e-4
        L-BFGS: converged when the largest entry of the gradient of the objective falls
        below ``tol``, measured in the coordinates the solver works in. For a linear head
        with an intercept these re-parametrise the intercept around the weighted feature
        mean m (b' = b + W·m, the same objective, better conditioned): the gradient in b'
        is the original one, and in the original coordinates the gradient in W may be up
        to (1 + max_j |m_j|)·``tol`` (a bound of 13 × ``tol`` on digits' raw pixels; 2.2 ×
        ``tol`` measured there). Where the power of two σ_b nearest the centred features'
        RMS entry is 16 or more (an RMS above about 11.3), the intercept is further taken
        as b' / σ_b, so that one step size fits it and the weights (features of scale 10⁶
        stalled far from the optimum): its test is then σ_b times stricter. With margins
        the linear head's test is on c̄ times the gradient, that in W / c̄ and b / c̄, in
        which c̄ is a rescaling of C (see Notes): a fit stops where the one at ``c_bar=1``
        and C / c̄² does (on the gradient in W, c̄ = 10⁴ met ``tol`` at its zero start,
        silently). For the
        cosine head the gradient is taken in the unit class directions W / ‖W‖ (row by
        row), so the test does not depend on the norms the rows drift to.
        Minibatch solvers: an epoch improves when its mean loss is below the best so far
        by more than ``tol`` times that best (a relative tolerance).
    batch_size : int, default=256
        Minibatch size (minibatch solvers). With ``lam > 0`` it also sets the compactness
        loss's strength: each sample's term sums over the same-class samples of its batch
        (on digits / 16, at P = I, the term is 0.07 at 2, 1.1 at 32, 3.3 at 256 and 5.3 for the
        whole training set in one batch), so tune ``lam`` at the ``batch_size`` you
        fit with; with no class twice in a batch it does nothing. A step with at most 2²⁴
        multiply-adds (B·d·(d + n_classes + B), B the smaller of ``batch_size`` and the
        number of samples; d ≲ 150 at 256) runs on one CPU thread, which is faster than
        torch's intra-op threads at that size.
    learning_rate : float, default=3e-3
        Initial step size of the minibatch solvers.
    n_iter_no_change : int, default=5
        Epochs without improvement (see ``tol``) that make a plateau. At the first and
        second plateaus the step size is divided by 10; the third ends the fit, converged.
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes, multiplied into ``sample_weight`` as in LogisticRegression.
    class_tilt : float, default=0.0
        Tilt t ≥ 0 of the class risk. ``0`` is the usual weighted mean of the per-sample
        losses. ``t > 0`` replaces it by the tilted class risk
        (1/t)·log Σ_k π_k·exp(t·L_k) of the per-class mean losses L_k, which leans on the
        classes whose loss is high: t → ∞ approaches the worst class's loss (class-level
        group DRO). See Notes for how it composes with the margins and the weights; the
        linear head's problem stays convex, and L-BFGS solves it in closed form.
    warm_start : bool, default=False
        Reuse the previous solution as the starting point of the next ``fit``, which must
        have the same number of features and of classes (else a ValueError, as
        LogisticRegression's). A head fitted with ``lam=0`` starts a fit with ``lam > 0``
        from its rows, the projection at P = I (where the two fits agree); a change of
        ``head``, of ``projection_rank``, or from ``lam > 0`` back to ``lam=0`` starts
        afresh. ``coef_`` and ``intercept_`` assigned (another model's, or to an estimator
        never fitted) are the start instead, as in LogisticRegression: the head's rows and
        intercept (a two-class cosine head's rows ∓ ``coef_``), a projection at P = I.
    random_state : int, RandomState instance or None, default=None
        Seeds the minibatch order and the low-rank projection's initialisation, through a
        local ``torch.Generator``.
    verbose : int, default=0
        Show a progress bar when positive, named by what the fit minimises and its solver:
        "ERM lbfgs" for plain cross-entropy (``c_bar=None``, ``lam=0``), "MR2 lbfgs" or
        "MR2 adam" with margins or a compactness loss, each prefixed "tilted " where
        ``class_tilt`` is not 0 ("tilted ERM lbfgs": tilted cross-entropy, no margins).
    device : str or torch.device, default="auto"
        Where to train: ``"auto"`` is the device of a torch-tensor X, else CUDA when
        present, else the CPU.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
    coef_ : ndarray of shape (1, n_features) or (n_classes, n_features)
        Weights on the input features (projection folded in; for the cosine head, the
        scaled unit class directions times P). For the linear head the decision function
        is ``X @ coef_.T + intercept_``; for the cosine head it is not: it is
        ``X @ coef_.T / ‖P·x‖`` (‖x‖ without a projection), row by row.
    intercept_ : ndarray of shape (1,) or (n_classes,)
    projection_ : ndarray of shape (n_features, n_features) or None
        The learned projection P (``lam > 0``).
    margins_ : ndarray of shape (n_classes,)
        The margins γ used in training (all ones when ``c_bar=None``). With a projection
        (``lam > 0``) the statistics are recomputed at the start of every epoch: these are
        the margins the last epoch trained with. A class whose difficulty is 0 to rounding
        (a_k^{1/3} at most 10⁻⁶ of the largest: one sample, or copies of one row, under
        ``difficulty="spread"``) has no measured difficulty: it gets γ = c̄ and is left out
        of the normalisation, as a class without training weight is. Under
        ``difficulty="spread"`` so does a class whose spread msd_k is at most the dtype's
        epsilon times its second moment ‖μ_k‖_p² + msd_k (a bound on the rounding of copies
        of one row; in float32 a relative spread below about 3.5·10⁻⁴, which float64
        features resolve down to about 1.5·10⁻⁸).
    class_stats_ : dict of ndarray
        ``mean`` (K, d), ``msd`` (K,) in L_p, ``msd_l2`` (K,), ``count`` (K,) and
        ``difficulty`` a_k (K,) of the representation φ, as set by ``difficulty``: the
        statistics that gave ``margins_``.
    p_ : float
        The norm order used.
    head_ : str
        The head trained, which predictions use ("linear" or "cosine").
    solver_ : str
        The solver used.
    n_iter_ : int
        L-BFGS iterations or epochs run.
    loss_curve_ : list of float
        L-BFGS: the objective at the start, then after each iteration (``n_iter_ + 1``
        values; ``n_iter_`` is 0 when the start already meets ``tol``, as in
        LogisticRegression). Minibatch solvers: the mean
        loss of each epoch.
    class_losses_ : ndarray of shape (n_classes,)
        L_k at the solution: each class's weighted mean (margin) cross-entropy on the
        training data (NaN for a class whose training weight is 0).
    tilt_weights_ : ndarray of shape (n_classes,)
        The class weights q = softmax(t·L + log π) at the solution (they sum to 1): where
        the tilted objective leaned. With ``class_tilt=0`` they are the shares π_k.
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Defined only when X has string feature names.
    device_ : str
        The device the model was trained on.

    Notes
    -----
    **Defaults, and the evidence for them.** ``benchmarks/quality.py`` (README, "The MR²
    margins alone: when do they help a linear probe?") tunes every variant against tuned
    LogisticRegression on Fashion-MNIST × EfficientNet-Lite0 features at two resolutions.
    No variant gained a point on the hard tercile at both resolutions. The cosine head
    with p = 3 gained +1.2 points of worst-class accuracy at 64 and at 96 px, +0.1 to +0.5
    on the hard tercile, and lost nothing overall or on the easy classes; the linear
    head's margins on the raw features gained +0.1 to +0.7 (hard) and +0.6 to +1.1
    (worst).

    - ``c_bar=1.0``: margins on. For the linear head c̄ is an exact rescaling of C (and for
      the cosine head of ``scale``), so tune C (or ``scale``), not c̄.
    - ``lam=0.0``: on frozen features the compactness loss needs the learnable projection,
      minibatch training, and cost 0.5 to 1.0 point overall and 0.5 to 2.0 on the hard
      tercile (README, "The MR² margins alone: when do they help a linear probe?").
    - ``head="linear"``, ``p=None`` (2 linear, 3 cosine): the linear head keeps the problem
      convex and, with ``c_bar=None``, exactly LogisticRegression; ``head="cosine"`` on
      L2-normalised embeddings is the variant to try for the worst class. ``scale=64``
      is the value tuning chose most often (grid 16 to 128).
    - ``solver="auto"`` (L-BFGS for ``lam=0``): exact; Adam for 10 epochs (the paper's
      regime) was no better than L-BFGS (−0.3 overall; hard and worst within the seeds'
      spread).
    - ``learning_rate=3e-3``, ``n_iter_no_change=5``, the step size divided by 10 at each
      plateau: ``benchmarks/bench_minibatch.py --sweep``, the README's call on digits (demo
      split, five seeds), on the raw pixels and standardised with C = 0.05 as in the demo.
      The previous 1e-3 without a schedule (patience 10, absolute tol) took about 80 and 67
      epochs for 95.75% and 93.90% test accuracy; 3e-3 with patience 5 takes about 69 and
      80 (one standardised seed of five stops at ``max_iter``) for 96.62% and 94.22%, the
      best of the sweep on the raw pixels. Patience 3 is 24 to 31 epochs shorter and 0.2
      to 0.3 points less accurate; larger steps suit the standardised features (1e-2:
      94.8%, 3e-2: 95.4%) but cost 0.3 to 0.6 points on the raw pixels.
    - Adam's update is written out in place: ``torch.optim`` imports ``torch._dynamo`` on
      first use (1 to 3 s on a CPU machine). Small steps run on one CPU thread (see
      ``batch_size``): on the 2-core benchmark machine a digits-sized step took 2 ms on
      one thread, and from 1.5 to 440 ms on two as the machine's load varied. The
      compactness gradient through s̄ and τ costs a little more: 3.6 ms on one thread
      against 2.9 ms for the step before it (``bench_minibatch.py --seeds 0``, d = 64, on
      an idle machine, 2026-12-02).
    - ``difficulty="moment"``, the paper's a_k: the spread variant was no better (−0.3
      to −1.0 on the worst class).
    - No feature scaling inside the estimator (scikit-learn's convention): margins on the
      raw Lite0 features did as well as on standardised ones (+0.1 to +0.3 overall). Scale
      in a pipeline when features differ in scale, since the penalty depends on it.
    - ``C=1.0`` as in LogisticRegression; on 1280-dimensional features tuning chose C
      between 0.001 and 0.01.

    The objective, with S = Σ_i w_i and margins γ_k = c̄·K·a_k^{1/3} / Σ_j a_j^{1/3},
    a_k = ‖μ_k‖_p² + msd_k computed exactly from the whole training set::

        (1/S) Σ_i w_i CE(z_i / γ_{y_i}, y_i) + λ·mean_k mean_{i∈k} ℓ_s̄(i)
            + ½‖W‖² / (C·S)

    with ℓ_s̄(i) = log(1 + Σ_{j≠i, y_j=y_i} exp((‖φ_i − φ_j‖² − 2 s̄) / τ)), s̄ the mean L2
    spread over the classes present, computed once per epoch from the whole training set
    (τ = 2 s̄ by default). Both are functions of φ, and each step's gradient follows them
    (τ only when it is 2 s̄) through its batch's own mean within-class spread: with the
    default τ the loss depends on the distances relative to the spread, not on the scale
    of P (held constant, they let P shrink towards zero). With sample weights the
    compactness term counts a sample as w copies of itself (each partner's term times w_j,
    the class means weighted), as :func:`~mr2_probe.compactness_loss` does: a row of weight
    0 takes no part. Unlike the data term and the penalty (where scaling every weight is
    scaling C), it depends on the weights' overall scale: weights summing to 1 all but
    switch it off, and large ones strengthen it.

    **Class tilt.** Write the data term as Σ_k π_k·L_k, with S_k = Σ_{i∈k} w_i the weight
    of class k, π_k = S_k / S its share and L_k = Σ_{i∈k} w_i·CE(z_i / γ_k, y_i) / S_k its
    weighted mean margin cross-entropy. ``class_tilt=t`` replaces it by
    R_t = (1/t)·log Σ_k π_k·exp(t·L_k) (tilted ERM over classes, Li et al. 2021; t → ∞ is
    class-level group DRO, Sagawa et al. 2020). The margins γ enter through L_k;
    ``sample_weight`` and ``class_weight`` enter through w_i, hence through both L_k and
    π_k (``class_weight="balanced"`` makes π uniform, so the tilt then starts from the
    balanced mean). The penalty is unchanged. ∇R_t = Σ_k q_k·∇L_k with
    q = softmax(t·L + log π): the plain gradient with sample i weighted by q_{y_i} / S_{y_i}
    instead of 1 / S. The minibatch solvers take each step's q from running class losses,
    averages over about the last 32 samples of each class, or over its last pass where it
    has fewer (at the start, one exact pass).

    Margins and tilt act in training only: ``predict`` is the plain argmax of the logits.
    With ``c_bar=None``, ``lam=0`` and ``class_tilt=0`` the objective is that of
    multinomial LogisticRegression(C=C).

    **What is the paper's and what is this library's.** From the paper: the margins
    γ_k ∝ a_k^{1/3} with mean c̄ (Corollary 1), the margin cross-entropy CE(z / γ_y, y),
    and the form of the compactness loss ℓ_s̄. This library's: applying ℓ_s̄ to a learned
    projection P of frozen features (the paper applies it to fine-tuned backbone
    features), the penalty ½‖P − I‖² / (C·S) that anchors P, the default τ = 2 s̄ (the
    paper's τ is a constant), and the L2 penalty on W in scikit-learn's convention. So
    ``c_bar=2, lam=0.5, p=3`` uses the paper's values of c̄, λ and p, in this library's
    extension, not the paper's setting.

    X may be a NumPy array, a pandas DataFrame, a torch tensor (trained on its device, no
    copy to the CPU) or an ``h5py.Dataset`` (streamed in blocks, never loaded whole).

    References
    ----------
    B. Zhu et al., "Reducing Class-Wise Performance Disparity via Margin Regularization",
    ICLR 2026.

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from mr2_probe import MR2LinearClassifier
    >>> X, y = load_digits(return_X_y=True)
    >>> clf = MR2LinearClassifier(c_bar=1.0, C=0.1, max_iter=200, device="cpu").fit(X, y)
    >>> clf.margins_.shape
    (10,)
    >>> round(float(clf.margins_.mean()), 6)
    1.0
    >>> clf.score(X, y) > 0.95
    True
    """

    _parameter_constraints: dict = {
        "c_bar": [Interval(Real, 0, None, closed="neither"), None],
        "lam": [Interval(Real, 0, None, closed="left")],
        "p": [Interval(Real, 1, None, closed="both"), None],
        "head": [StrOptions({"linear", "cosine"})],
        "C": [Interval(Real, 0, None, closed="right")],
        "fit_intercept": ["boolean"],
        "difficulty": [StrOptions(set(DIFFICULTIES))],
        "scale": [Interval(Real, 0, None, closed="neither")],
        "tau": [Interval(Real, 0, None, closed="neither"), None],
        "projection_rank": [Interval(Integral, 1, None, closed="left"), None],
        "solver": [StrOptions({"auto", "lbfgs", "adam", "sgd"})],
        "max_iter": [Interval(Integral, 0, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
        "class_weight": [dict, StrOptions({"balanced"}), None],
        "class_tilt": [Interval(Real, 0, None, closed="left")],
        "warm_start": ["boolean"],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "device": [str, torch.device],
    }

    def __init__(
        self,
        c_bar=1.0,
        lam=0.0,
        p=None,
        head="linear",
        C=1.0,
        *,
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
        warm_start=False,
        random_state=None,
        verbose=0,
        device="auto",
    ):
        self.c_bar = c_bar
        self.lam = lam
        self.p = p
        self.head = head
        self.C = C
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
        self.warm_start = warm_start
        self.random_state = random_state
        self.verbose = verbose
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the probe.

        Parameters
        ----------
        X : array-like, DataFrame, torch.Tensor or h5py.Dataset of shape \
                (n_samples, n_features)
        y : array-like of shape (n_samples,)
            Labels of any type (strings too).
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples, times ``class_weight``'s: see the objective in the class
            docstring for where they enter (with ``lam > 0``, their overall scale too).

        Returns
        -------
        self : MR2LinearClassifier
        """
        with default_torch_modes(), whole_or_unchanged(self):
            solver = self._check_solver()
            data = self._prepare(X, y, sample_weight)
            head = self._new_head(data)
            warm = self._warm_state(data.n_classes)
            if warm is not None:
                head.load(warm)
            result = self._solve(head, data, solver, self.C, init_cosine=warm is None)
            self._finish(head, result, solver, data)
            return self

    def _objective(self) -> str:
        """What a fit minimises, as its progress bars name it: "ERM" for cross-entropy
        (``c_bar=None``, ``lam=0``), "MR2" with margins or a compactness loss, either one
        prefixed "tilted " where ``class_tilt`` is not 0."""
        objective = "ERM" if self.c_bar is None and self.lam == 0 else "MR2"
        return f"tilted {objective}" if self.class_tilt != 0 else objective

    def _resolved_solver(self) -> str:
        """The solver that ``solver="auto"`` stands for: L-BFGS at lam=0, else Adam."""
        return self.solver if self.solver != "auto" else ("lbfgs" if self.lam == 0 else "adam")

    def _check_solver(self):
        """The solver that ``solver="auto"`` stands for, checked against ``lam``."""
        solver = self._resolved_solver()
        if solver == "lbfgs" and self.lam > 0:
            raise ValueError(
                f"solver='lbfgs' requires lam=0, got lam={self.lam}: the compactness loss "
                "needs minibatches and per-epoch statistics. Use solver='auto', 'adam' or "
                "'sgd', or set lam=0."
            )
        if self.lam > 0 and self.batch_size < 2:
            # The compactness loss is over same-class pairs within a batch: a batch of one
            # has none, and any lam fitted as lam=0 did, without a word.
            raise ValueError(
                f"lam={self.lam} needs batch_size >= 2, got batch_size={self.batch_size}: the "
                "compactness loss compares samples of one class within a minibatch, and a "
                "batch of one holds no pair. Use a larger batch_size, or set lam=0."
            )
        return solver

    def _new_head(self, data, scale=None):
        """A fresh head for ``data`` (zero weights, P = I), on its device; ``scale``
        overrides the cosine head's logit scale."""
        rank = self.projection_rank
        if self.lam > 0 and rank is not None and rank > self.n_features_in_:
            # (accepted, it fitted worse than the full projection, at a greater cost: its B
            # starts random, penalised by about r / (2·C·S) at P = I)
            raise ValueError(
                f"projection_rank={rank} is more than the {self.n_features_in_} features: a "
                "residual of that rank is no more than a full projection. Use "
                f"projection_rank=None for a full one, or a rank of at most {self.n_features_in_}."
            )
        return ProbeHead(
            self.n_features_in_,
            data.n_classes,
            head=self.head,
            fit_intercept=self.fit_intercept,
            scale=self.scale if scale is None else scale,
            projection=self.lam > 0,
            projection_rank=self.projection_rank,
            dtype=data.dtype,
            device=data.device,
            generator=torch.Generator().manual_seed(data.seed),
        )

    def _margin_spec(self, n_classes):
        self.p_ = float(self.p if self.p is not None else (3 if self.head == "cosine" else 2))
        return MarginSpec(n_classes, self.p_, self.c_bar, self.tau, self.difficulty)

    def _statistics(self, head, data):
        """Exact statistics of the head's representation of ``data``, checked finite."""
        # Two passes over the data: the class means, then the spreads around them.
        initial = refresh_statistics(head, data.source, self._margin_spec(data.n_classes))
        if isinstance(data.source, H5Source):
            data.source.check_finite(type(self).__name__)
        stats, margins = initial[0], initial[1]
        if not bool(all(torch.isfinite(t).all() for t in stats)):
            suspects = _weight_suspects(data.weight_sum, data.dtype)
            what = "the class statistics (‖x‖²) overflow"
            raise ValueError(_overflow_message(what, data.dtype, suspects))
        if not bool(torch.isfinite(margins).all()):
            # Finite statistics: the margins (c̄·K times each class's share) overflow by
            # c_bar, or by a class mean whose squared norm alone leaves the range.
            suspects = []
            if self.c_bar is not None and self.c_bar > 1 / _EXTREME:
                suspects = [f"c_bar={as_given(self.c_bar)} (the margins average to it)"]
            raise ValueError(_overflow_message("the margins overflow", data.dtype, suspects))
        return initial

    def _solve(self, head, data, solver, C, *, initial=None, init_cosine=True, verbose=None):
        """Train ``head`` in place on ``data`` with inverse penalty ``C``; the solver's result.

        ``initial`` (:meth:`_statistics` of this head and data) is computed when not
        given; a search passes it along its path, since without a projection the
        statistics do not depend on the parameters. ``init_cosine`` starts a cosine head
        at the class means (a cold start).
        """
        spec = self._margin_spec(data.n_classes)
        if initial is None:
            initial = self._statistics(head, data)
        if init_cosine and self.head == "cosine":
            head.init_weight_from_means(initial[0].mean)
        head.open_pair()  # a warm start, or a class without a prototype, may be opposite
        verbose = self.verbose if verbose is None else verbose
        common = dict(
            initial=initial,
            weight_sum=data.weight_sum,
            C=C,
            max_iter=self.max_iter,
            tol=self.tol,
            tilt=float(self.class_tilt),
            verbose=verbose,
            objective=self._objective(),
        )
        scale = head.scale if self.head == "cosine" else None
        if scale is not None and scale < torch.finfo(data.dtype).tiny:
            raise _scale_underflow(scale, data.dtype)
        # A cosine head without a projection has no penalty: C and Σw play no part.
        penalised = np.inf if self.head == "cosine" and self.lam == 0 else C
        suspects_of = functools.partial(  # (after the fit: whether it stalled, too)
            _range_suspects,
            penalised,
            self.c_bar,
            data.weight_sum,
            self.class_tilt,
            scale,
            data.dtype,
            tau=self.tau if self.lam > 0 else None,
        )
        if solver == "lbfgs":
            try:
                result = fit_lbfgs(head, data.source, spec, **common)
            except RuntimeError as exc:
                # L-BFGS passes its step size to torch as a Python float; gradients as
                # large as the features make it overflow the dtype before any NaN shows.
                if "overflow" not in str(exc):
                    raise
                what = "L-BFGS's step overflows"
                raise _overflow_error(what, data.dtype, suspects_of()) from exc
        else:
            result = fit_minibatch(
                head,
                data.source,
                spec,
                lam=self.lam,
                solver=solver,
                learning_rate=self.learning_rate,
                batch_size=self.batch_size,
                n_iter_no_change=self.n_iter_no_change,
                generator=torch.Generator(device=data.device).manual_seed(data.seed),
                **common,
            )
        # (a usual c̄ is none of a stall on precision)
        suspects = suspects_of(stalled=result.stop == "stalled")
        result.range_suspects = suspects
        if result.stop == "diverged":
            curve = result.loss_curve
            if suspects:  # an extreme parameter, not the step size
                what = "the loss overflows"
                raise _overflow_error(what, data.dtype, suspects)
            rise = f"rising from {curve[0]:.3g} to {curve[-1]:.3g} in {len(curve)} epochs"
            if not np.isfinite(curve[0]):
                rise = "not finite from its first epoch on"
            projection = ""
            if head.has_projection:
                # Each step moves every entry of P by about learning_rate: its penalty
                # grows with the entries' number over C, whatever X is.
                low_rank = head.proj_a is not None
                entries = sum(p.numel() for p in (head.proj_full, head.proj_a, head.proj_b)
                              if p is not None)  # fmt: skip
                penalty = "½(‖A‖² + ‖B‖²), P = I + A·B," if low_rank else "½‖P − I‖²"
                rank = "a smaller projection_rank" if low_rank else "a projection_rank"
                # MR2LinearClassifierCV has no C of its own to raise where it searches the
                # cosine head's scale (its projection's C is 1).
                helps = f"a larger C, or {rank}," if "C" in self.get_params() else rank
                projection = (
                    f" (with lam > 0 the step also moves the projection's {entries} entries, "
                    f"whose penalty is {penalty} / (C·Σw) at C={C:g}: {helps} also helps)"
                )
            # The penalty's curvature 1/(C·Σw) times the step: beyond SGD_STABLE the
            # penalty alone diverges sgd (½‖W‖² of a linear head, a projection's ½‖P − I‖²).
            weight_sum = data.weight_sum
            stiff = self.learning_rate / (C * weight_sum)
            penalised = head.head == "linear" or head.has_projection
            if solver == "sgd" and penalised and stiff > SGD_STABLE:
                larger = self.learning_rate / (SGD_STABLE * weight_sum)  # C·Σw·SGD_STABLE = lr
                helps = f", or a C above {larger:.3g}" if "C" in self.get_params() else ""
                raise FitDivergedError(
                    f"Cannot fit: the sgd solver diverged, its epoch loss {rise}: the penalty "
                    f"/ (C·Σw), at C={C:g} and Σw={weight_sum:.4g}, alone has a curvature "
                    f"that, times learning_rate={self.learning_rate:g}, is {stiff:.3g}, beyond "
                    f"the {SGD_STABLE:.3g} within which SGD with Nesterov momentum converges. "
                    f"For the penalty alone, use a learning_rate below "
                    f"{SGD_STABLE * C * weight_sum:.3g}{helps}, and fit again."
                )
            raise FitDivergedError(
                f"Cannot fit: the {solver} solver diverged, its epoch loss {rise}: "
                f"learning_rate={self.learning_rate:g} is too large a step for these "
                f"features{projection}. Use a smaller learning_rate (or scale the "
                "features, e.g. StandardScaler) and fit again."
            )
        # Only then a synchronisation of its own; otherwise _export's check names the features.
        suspects = suspects_of(stalled=result.stop == "stalled", overflowed=True)
        if suspects and not all(bool(torch.isfinite(p).all()) for p in head.parameters()):
            what = "the fit produced non-finite coefficients"
            raise _overflow_error(what, data.dtype, suspects)
        return result

    def _export(self, head, result, solver, dtype):
        """The head's fitted state as NumPy, checked finite; warns if the solver stopped
        short of ``tol``."""
        state = head.export()
        fitted = [state["coef"], state["intercept"], to_numpy(result.margins)]
        if not all(np.isfinite(a).all() for a in fitted):
            what = "the fit produced non-finite coefficients"
            raise _overflow_error(what, dtype)
        self._warn_if_short(result, solver, dtype)
        return state

    def _warn_if_short(self, result, solver, dtype):
        """A ConvergenceWarning if the solver stopped short of ``tol``; its message is kept
        in ``_stop_reason`` (None for a fit that converged), for searches whose fits warn
        elsewhere."""
        self._stop_reason = None
        if not result.converged:
            message = self._convergence_message(result, solver, dtype)
            if self.class_tilt > _STEEP_TILT and not result.range_suspects:
                message += (
                    f" class_tilt={as_given(self.class_tilt)} makes the objective nearly the "
                    "largest class loss, which is not smooth where classes tie: the solver "
                    f"needs many steps or stalls there. Tilts up to {_STEEP_TILT:g} already move "
                    "the worst classes (see mr2_probe.front); use one of those."
                )
            self._stop_reason = message
            warnings.warn(message, ConvergenceWarning, stacklevel=_outside_stacklevel())

    def _finish(self, head, result, solver, data):
        state = self._export(head, result, solver, data.dtype)
        self._store(state, result, solver, data.device, data.weight_scale)

    def _store(self, state, result, solver, device, weight_scale=1.0):
        self.coef_ = state["coef"]
        self.intercept_ = state["intercept"]
        self.projection_ = state["projection"]
        self.margins_ = to_numpy(result.margins)
        self.class_stats_ = _class_stats(result.stats, self.p_, self.difficulty, weight_scale)
        self.n_iter_ = int(result.n_iter)
        self.loss_curve_ = list(result.loss_curve)
        self.class_losses_ = to_numpy(result.class_loss)
        self.tilt_weights_ = to_numpy(result.tilt_weights)
        self.solver_ = solver
        self.device_ = str(device)
        self.head_ = self.head
        self._head_state = {
            **{k: state[k] for k in ("weight", "bias", "proj_full", "proj_a", "proj_b")},
            "n_classes": len(self.classes_),
            "head": self.head,
            # coef_ and intercept_ assigned, or changed in place, start a warm fit instead
            "fingerprint": _fingerprint(self.coef_, self.intercept_),
        }
