"""MR2Loss: the MR² objective as a module for end-to-end fine-tuning."""

from __future__ import annotations

import inspect
import math
import numbers
from functools import partial

import torch
from torch import distributed as dist
from torch import nn

from ._device import unit_rows
from ._losses import compactness_loss, compactness_term, margin_cross_entropy, tilted_class_risk
from ._stats import (
    DIFFICULTIES,
    ClassMoments,
    ClassStats,
    _check_class_indices,
    _update_moments,
    centred_sum,
    check_tensors,
    compactness_tau,
    float32_at_least,
    mean_spread,
    moments_margins,
    moments_statistics,
)


def _number(name: str, value, optional: bool = False) -> float | None:
    """``value`` as a float (a NumPy number or a 0-d tensor too), or a TypeError naming
    the parameter; None where None has a meaning."""
    if value is None and optional:
        return None
    wrong = TypeError(f"{name} must be a number{' or None' if optional else ''}, got {value!r}.")
    if value is None or isinstance(value, str | bytes | bool):
        raise wrong
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several
        raise wrong from None


def _saved_centred_sum(saved) -> torch.Tensor:
    """``moment_m2`` of sums saved before it was kept (``saved``: buffer name → tensor, or
    None), derived from them as that version computed the spread."""
    return centred_sum(ClassMoments(**{n: saved(f"moment_{n}") for n in ClassMoments._fields}))


class MR2Loss(nn.Module):
    """MR² loss for training a backbone: margin cross-entropy plus λ·compactness.

    Class statistics are tracked as exponential moving averages of each class's first and
    second moments, weighted by sample counts (:class:`ClassMoments`): a batch that holds
    a single sample of a class still adds that sample's ‖φ‖² to the class, so a_k and s̄
    do not depend on how many samples of a class a batch holds. In L2 (p = 2) the mean,
    a_k and the spread are unbiased; for p ≠ 2 the L_p spread is estimated from the
    deviations from the running mean (see :func:`moments_statistics`). The statistics are
    updated in training mode without synchronising with the host; the margins and s̄ are
    derived from them and carry no gradient. Under DistributedDataParallel, ``sync_stats=True``
    folds in the union of every rank's batch, as SyncBatchNorm does for its statistics:
    every rank then holds the same statistics, margins and class weights, those one
    process would hold if it saw the whole global batch. Without it each rank keeps the
    statistics of its own batches. A batch with a non-finite feature (on any rank, when
    synchronised) is left out of the running moments, and a class whose batch loss is not
    finite out of the class losses that the tilt tracks. The running sums stay in float32
    at least, with their values, when the module is cast to half precision; the margin
    cross-entropy of half-precision logits is computed, and returned, in float32 (as
    autocast runs cross_entropy), and logits that are not floating point are refused. Targets are
    class indices of any integer dtype (no soft targets, label smoothing or
    ``ignore_index``: leave the samples out of the batch); a batch that is refused (wrong
    shapes, targets out of range) leaves the statistics as they were. The state dict
    records the ``p`` and ``normalize`` that the statistics were measured with (buffers
    ``stats_p`` and ``stats_normalize``); ``load_state_dict`` into a module built with
    others raises and loads none of its statistics (torch may have loaded other modules'
    by then).

    Parameters
    ----------
    n_classes : int
    n_features : int
        Dimension of the representation φ passed to ``forward``.
    c_bar : float or None, default=1.0
        Mean margin; ``None`` gives plain cross-entropy (γ ≡ 1).
    lam : float, default=0.5
        Weight of the compactness loss.
    p : float or None, default=None
        Order p >= 1 of the norm of the class statistics (``inf``: the largest absolute
        entry). ``None`` means 3 when ``normalize`` (under p = 2 every
        unit-norm class has a_k = 1, hence the same margin; p = 3 is the paper's choice for
        normalised features) and 2 otherwise, as :class:`MR2LinearClassifier` chooses for
        its cosine head.
    rho : float, default=0.9
        Decay of a class's running moments each time a batch holds that class. A ``rho``
        that the statistics' dtype rounds to 1 (0.99999999 in float32) is refused when a
        batch is folded in: nothing would decay. Keep the statistics in float64
        (``criterion.double()``) for such a decay.
    tau : float or None, default=1.0
        Temperature of the compactness loss, the paper's form by default (s̄ a statistic,
        not differentiated). ``None`` uses τ = 2 s̄ (s̄ floored at the rounding of the
        squared distances, and at 10⁻¹²), a scale-free temperature, and differentiates
        through s̄ and τ as :class:`MR2LinearClassifier` does: by way of the batch's own
        mean within-class spread m (s̄·m/m₀, m₀ = m's value, on each rank's own batch
        under ``sync_stats``), so that the loss's value is unchanged and its gradient has
        no component along a common scale of the features. Before, with s̄ and τ held,
        shrinking every feature lowered the loss, and a backbone's features shrank
        towards zero.
    normalize : bool, default=False
        Measure statistics on L2-normalised φ (cosine heads).
    difficulty : {"moment", "spread"}, default="moment"
        What the margins grow with: ``"moment"`` is the paper's a_k = ‖μ_k‖_p² + msd_k,
        ``"spread"`` is msd_k alone (see :class:`MR2LinearClassifier`).
    class_tilt : float, default=0.0
        Tilt t ≥ 0 of the class risk (see :class:`MR2LinearClassifier`). ``0`` is the plain
        batch mean. With ``t > 0`` each class's mean loss L_k is tracked as an EMA of its
        batch means (decay ``rho``; a class's first batch sets it), π_k is the share of
        class k among the samples seen so far, and a batch's loss weights sample i by
        q_{y_i} / π_{y_i}, q = softmax(t·L + log π) (:meth:`class_weights`): the batch's
        estimate of Σ_k q_k·L_k, whose gradient is that of the tilted risk
        (1/t)·log Σ_k π_k·exp(t·L_k) at the current weights — the online form of
        class-level group DRO. A class not seen in training weighs 1 (an evaluation counts
        it as the plain mean does).
    sync_stats : bool, default=False
        In training, sum each batch's statistics (and, with a tilt, its class losses)
        across the processes of ``process_group`` with ``torch.distributed.all_reduce``
        (three collectives per training batch, two without a tilt). Every process of the
        group must then call the loss in training mode for every batch, as
        DistributedDataParallel's backward requires anyway. Without an initialised
        process group (a single process) it changes nothing.
    process_group : torch.distributed.ProcessGroup or None, default=None
        The group to synchronise over with ``sync_stats``; ``None`` is the default group.

    Notes
    -----
    Before the first training batch there are no statistics: the loss is then the margin
    cross-entropy alone (no tilt, no compactness term), as in a validation pass before
    training.

    Examples
    --------
    >>> import torch
    >>> from mr2_probe import MR2Loss
    >>> criterion = MR2Loss(n_classes=3, n_features=8, c_bar=1.0, lam=0.5)
    >>> features = torch.randn(12, 8, requires_grad=True)
    >>> logits = features @ torch.randn(8, 3)
    >>> loss = criterion(logits, features, torch.arange(12) % 3)
    >>> loss.backward()
    >>> criterion.margins().shape
    torch.Size([3])
    """

    # 2: stats_p holds p exactly; a state of version 1 holds it rounded to float32, whatever
    # the dtype it was cast to (.double()), and is compared so.
    _version = 2

    def __init__(
        self,
        n_classes: int,
        n_features: int,
        c_bar: float | None = 1.0,
        lam: float = 0.5,
        p: float | None = None,
        rho: float = 0.9,
        tau: float | None = 1.0,
        normalize: bool = False,
        difficulty: str = "moment",
        class_tilt: float = 0.0,
        sync_stats: bool = False,
        process_group=None,
    ) -> None:
        super().__init__()
        for name, count in (("n_classes", n_classes), ("n_features", n_features)):
            if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 1:
                raise ValueError(f"{name} must be an int >= 1, got {count!r}.")
        n_classes, n_features = int(n_classes), int(n_features)
        c_bar, tau, p = (_number(n, v, optional=True) for n, v in (("c_bar", c_bar),
                         ("tau", tau), ("p", p)))  # fmt: skip
        lam, rho, class_tilt = (_number(n, v) for n, v in (("lam", lam), ("rho", rho),
                                ("class_tilt", class_tilt)))  # fmt: skip
        for name, value in (("normalize", normalize), ("sync_stats", sync_stats)):
            if isinstance(value, str | bytes) or value not in (True, False):  # 1, np.bool_
                raise TypeError(f"{name} must be True or False, got {value!r}.")
        normalize = bool(normalize)
        if not (math.isfinite(class_tilt) and class_tilt >= 0):
            raise ValueError(f"class_tilt must be a finite number >= 0, got {class_tilt}.")
        if c_bar is not None and not (math.isfinite(c_bar) and c_bar > 0):
            raise ValueError(f"c_bar must be a finite number > 0, or None, got {c_bar}.")
        if not (math.isfinite(lam) and lam >= 0):
            raise ValueError(f"lam must be a finite number >= 0, got {lam}.")
        if tau is not None and not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"tau must be a finite number > 0, or None, got {tau}.")
        p = (3.0 if normalize else 2.0) if p is None else p
        if not p >= 1:  # NaN too; inf is the maximum norm
            raise ValueError(f"p must be a number >= 1 (inf included), got {p}.")
        if difficulty not in DIFFICULTIES:
            raise ValueError(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}.")
        if not 0 <= rho < 1:
            raise ValueError(f"rho must be in [0, 1), got {rho}.")
        self.n_classes, self.c_bar, self.lam, self.p = n_classes, c_bar, lam, p
        self.rho, self.tau, self.normalize = rho, tau, normalize
        self.difficulty = difficulty
        self.class_tilt = float(class_tilt)
        self.sync_stats, self.process_group = bool(sync_stats), process_group
        self.register_buffer("running_class_loss", torch.zeros(n_classes))
        # Integer counts (as BatchNorm's num_batches_tracked): module.to(torch.bfloat16)
        # leaves them exact, where a bfloat16 count stops growing at 256 per step of 1.
        self.register_buffer("class_samples", torch.zeros(n_classes, dtype=torch.long))
        for name, value in ClassMoments.zeros(n_classes, n_features)._asdict().items():
            self.register_buffer(f"moment_{name}", value)
        for name, value in self._recorded().items():
            self.register_buffer(name, value)

    def extra_repr(self) -> str:
        """The arguments that differ from their defaults, as nn.Linear's repr shows its."""
        n_features = self.moment_sum.shape[-1]
        shown = [f"n_classes={self.n_classes}", f"n_features={n_features}"]
        parameters = inspect.signature(type(self).__init__).parameters
        defaults = {name: parameters[name].default for name in ("c_bar", "lam", "p", "rho",
                    "tau", "normalize", "difficulty", "class_tilt", "sync_stats")}  # fmt: skip
        defaults["p"] = 3.0 if self.normalize else 2.0  # what p=None resolves to
        shown += [f"{name}={getattr(self, name)!r}" for name, default in defaults.items()
                  if getattr(self, name) != default]  # fmt: skip
        return ", ".join(shown)

    def _recorded(self, device=None) -> dict:
        """What the sums are measured with (dev_p is in L_p, and φ normalised or not), saved
        with them as buffers on ``device`` (default: torch's): read with another p or
        normalize they would give other statistics. p in float64, exactly (in float32, which
        kept it before, p = 1e39 was inf, as p = inf is), but on MPS, which has no float64;
        normalize in float32 (averaging models subtracts buffers, which bool ones refuse)."""
        # (torch.empty's device is torch's default: torch.get_default_device() of torch < 2.6
        # fails after torch.set_default_device(None))
        device = torch.empty(()).device if device is None else torch.device(device)
        exact = torch.float32 if device.type == "mps" else torch.float64
        return {
            "stats_p": torch.full((), self.p, dtype=exact, device=device),
            "stats_normalize": torch.tensor(float(self.normalize), device=device),
        }

    def _apply(self, fn, recurse=True):
        # The running sums stay float32 at least when the module is cast to half precision
        # (module.half(), model.to(torch.float16)): a float16 sum of ‖φ‖² passes 65504
        # within a few batches, and every margin becomes NaN.
        # The values are kept too: rounded to half precision on the way, sums past 65504
        # became inf (float16), and a bfloat16 mean read as a shift made spreads of 0.16
        # into 37.
        # p is moved in float32 (MPS has no float64) and written again, exactly, where it
        # went: cast with the module (module.float()), it was rounded to float32.
        names = [f"moment_{n}" for n in ClassMoments._fields] + ["running_class_loss"]
        before = {name: self._buffers[name] for name in names}
        self._buffers["stats_p"] = self._buffers["stats_p"].float()
        super()._apply(fn, recurse)
        device = self._buffers["stats_p"].device
        self._buffers["stats_p"] = self._recorded(device)["stats_p"]
        for name in names:
            buffer = self._buffers[name]
            if buffer.dtype in (torch.float16, torch.bfloat16):
                kept = before[name].to(buffer.device)
                self._buffers[name] = kept if kept.dtype.itemsize >= 4 else kept.float()
        return self

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):  # fmt: skip
        m2 = f"{prefix}moment_m2"
        if m2 not in state_dict and f"{prefix}moment_sum_sq" in state_dict:
            state_dict[m2] = _saved_centred_sum(lambda name: state_dict.get(prefix + name))
        # Sums measured with another p or normalize are refused, and nothing is loaded (a
        # state saved before these were recorded is taken as this module's).
        wrong = []
        count = state_dict.get(f"{prefix}moment_count")
        device = count.device if isinstance(count, torch.Tensor) else None
        # p in float32, any dtype: a state of version 1, or of no version (its _metadata lost
        # to a dict copy or safetensors, as torch's BatchNorm reads it: the first) where it
        # holds a finite float32 value (an exact p = 1e39 is no inf).
        version = local_metadata.get("version")
        for name, ours in self._recorded(device).items():
            saved = state_dict.setdefault(prefix + name, ours).detach()
            # Compared as saved: a p kept in float32 (saved before it was kept exactly, or
            # on MPS) with this module's rounded to float32; a flag saved as a bool as one.
            if saved.is_meta:  # no value to compare (a state of a module built on meta)
                state_dict[prefix + name] = saved.to(ours.dtype)
                continue
            state_dict[prefix + name] = self._recorded(saved.device)[name]  # exactly ours
            if name == "stats_p":  # an averaged p = inf (AveragedModel: inf + w·(inf − inf))
                saved = torch.where(saved.isnan(), math.inf, saved)
            held = bool((saved.float() == saved).all() and saved.isfinite().all())
            old = version < 2 if version is not None else held
            dtype = torch.float32 if old and saved.is_floating_point() else saved.dtype
            if saved.shape != () or not bool(saved.cpu().to(dtype) == ours.cpu().to(dtype)):
                value = saved.tolist()  # (a flag as the flag it is: saved as a number)
                value = bool(value) if name == "stats_normalize" else value
                wrong.append(f"{name.removeprefix('stats_')}={value!r}")
        if wrong:
            error_msgs.append(
                f"the class statistics of {prefix.rstrip('.') or type(self).__name__} were "
                f"measured with {', '.join(wrong)}, and this module measures them with "
                f"p={self.p!r}, normalize={self.normalize!r}: build it with the saved "
                "settings to load them"
            )
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)  # fmt: skip

    def __setstate__(self, state):
        # A module pickled whole (torch.save(module)) before these attributes existed.
        super().__setstate__(state)
        self.__dict__.setdefault("sync_stats", False)
        self.__dict__.setdefault("process_group", None)
        if "moment_m2" not in self._buffers:
            self._buffers["moment_m2"] = _saved_centred_sum(self._buffers.get)
        device = self._buffers["moment_count"].device
        for name, value in self._recorded(device).items():
            self._buffers.setdefault(name, value)
        self._buffers["stats_p"] = self._recorded(device)["stats_p"]  # rounded before: exact

    def moments(self) -> ClassMoments:
        """The running sums (buffers ``moment_*``, saved in the state dict)."""
        return ClassMoments(*(getattr(self, f"moment_{name}") for name in ClassMoments._fields))

    @property
    def initialised(self) -> torch.Tensor:
        """Classes seen in training so far (K,), boolean."""
        return self.moment_count > 0

    def stats(self) -> ClassStats:
        """Current class statistics of φ (see :func:`moments_statistics`)."""
        return moments_statistics(self.moments(), self.p)

    def margins(self) -> torch.Tensor:
        """Current margins γ (K,); classes not seen yet get c̄."""
        if self.c_bar is None:
            return torch.ones_like(self.moment_count)
        self._check_c_bar(self.moment_sum.dtype)
        return moments_margins(
            self.moments(), self.c_bar, self.p, self.difficulty, self.initialised
        )

    def _check_c_bar(self, *dtypes: torch.dtype) -> None:
        """Refuse a c̄ beyond the normal numbers of the dtypes in which the margins (about c̄
        each) are computed and divide the logits: in float32, c̄ = 1e-300 made every margin
        0 and the loss NaN, and c̄ = 1e39 every margin inf and the cross-entropy log K,
        without a gradient. (A Python comparison: no synchronisation.)"""
        for dtype in dtypes:
            info = torch.finfo(dtype)
            if self.c_bar is not None and not info.tiny <= self.c_bar <= info.max:
                rounded = "0, and the loss NaN" if self.c_bar < 1 else "inf, and the loss flat"
                raise ValueError(
                    f"c_bar={self.c_bar:g} is out of the range of {str(dtype)[6:]}, in which "
                    f"MR2Loss's margins divide the logits (its normal numbers, from "
                    f"{info.tiny:.3g} to {info.max:.3g}): they would round to {rounded}. Use "
                    "a c_bar of a usual order of magnitude (1.0, say), or compute in float64 "
                    "(criterion.double(), float64 logits)."
                )

    def _check_compactness(self, dtype: torch.dtype) -> None:
        """Refuse a τ that ``dtype`` (the distances', float32 at least) rounds to 0 or to a
        subnormal number, or a λ that it rounds to inf: in float32, τ = 1e-300 divided the
        distances by 0, and λ = 1e300 multiplied the compactness loss by inf; either loss
        was inf."""
        info = torch.finfo(dtype)
        for name, value, wrong in (
            ("tau", self.tau, self.tau is not None and self.tau < info.tiny),
            ("lam", self.lam, self.lam > info.max),
        ):
            if wrong:
                raise ValueError(
                    f"{name}={value:g} is out of the range of {str(dtype)[6:]}, in which "
                    "MR2Loss computes its compactness loss (its normal numbers, from "
                    f"{info.tiny:.3g} to {info.max:.3g}): the loss would be inf. Use a {name} "
                    "of a usual order of magnitude, or compute in float64 (float64 features)."
                )

    def s_bar(self) -> torch.Tensor:
        """s̄: the mean L2 spread over the classes seen (each class's spread unbiased, as the
        class docstring says: the estimator's is the plain mean over a class's rows)."""
        return mean_spread(self.stats())

    def _class_share(self) -> torch.Tensor:
        """π: each class's share of the samples seen so far (K,)."""
        samples = self.class_samples.to(self.running_class_loss.dtype)
        return samples / samples.sum().clamp_min(1)

    def class_weights(self) -> torch.Tensor:
        """The tilt's class weights q = softmax(t·L + log π) (K,); classes not seen get 0
        (all of them before the first training batch). L and π are tracked only in
        training batches with ``class_tilt`` ≠ 0 (at t = 0 no class loss is computed, nor
        summed across processes): with t = 0 throughout, every weight stays 0, and a tilt
        switched on later starts them from its first batch."""
        return self._class_weights(self._class_share())

    def _class_weights(self, share: torch.Tensor) -> torch.Tensor:
        # With t at most the dtype's largest number, and where t·L overflows, relative to
        # the largest loss of a class seen (the weights do not change): t·L overflowed
        # (t = 1e300 in float32 is inf), and every weight, and the loss, was NaN. (Only
        # there: elsewhere the shift rounded the weights otherwise, in their last bits.)
        loss = self.running_class_loss
        tilt = min(self.class_tilt, torch.finfo(loss.dtype).max)
        top = torch.where(share > 0, loss, 0).amax()  # (losses are >= 0)
        loss = loss - torch.where(torch.isfinite(tilt * top), 0, top)
        weights = tilted_class_risk(loss, share, tilt)[1]
        return torch.where(share > 0, weights, torch.zeros_like(weights))

    def _tilt_ratio(self) -> torch.Tensor:
        """q_k / π_k, the weight of a sample of class k in the tilted batch loss (K,); 1 for a
        class not seen in training, which an evaluation then counts as the plain mean does."""
        share = self._class_share()
        ratio = self._class_weights(share) / share.clamp_min(torch.finfo(share.dtype).tiny)
        return torch.where(share > 0, ratio, torch.ones_like(ratio))

    def _all_reduce(self):
        """A sum across the group's processes in place, or None for nothing to sum with."""
        if not (self.sync_stats and dist.is_available() and dist.is_initialized()):
            return None
        if dist.get_world_size(self.process_group) == 1:
            return None
        return partial(dist.all_reduce, group=self.process_group)

    @torch.no_grad()
    def _update_class_loss(self, loss: torch.Tensor, target: torch.Tensor) -> None:
        """Fold one batch's per-class mean losses into their EMA (no host sync)."""
        # index_add_, not bincount: on CUDA bincount sizes its output on the host. Counts
        # and sums in one tensor of the running loss's dtype (float32 at least), to be
        # reduced at once: counts are exact in it up to 2^24 samples of a class per batch.
        batch = self.running_class_loss.new_zeros(2, self.n_classes)
        batch[0].index_add_(0, target, torch.ones_like(loss, dtype=batch.dtype))
        batch[1].index_add_(0, target, loss.to(batch.dtype))
        all_reduce = self._all_reduce()
        if all_reduce is not None:
            all_reduce(batch)
        count, total = batch[0].round().to(self.class_samples.dtype), batch[1]
        mean = total / count.clamp_min(1).to(total.dtype)
        present = (count > 0) & torch.isfinite(mean)  # a non-finite loss leaves the EMA alone
        keep = torch.where(self.class_samples > 0, mean.new_tensor(self.rho), 0.0)
        keep = torch.where(present, keep, torch.ones_like(keep))  # (K,)
        blended = self.running_class_loss * keep + (1 - keep) * mean
        self.running_class_loss.copy_(torch.where(present, blended, self.running_class_loss))
        # π counts the samples whose losses the EMA took in, and only those.
        self.class_samples.add_(torch.where(present, count, 0))

    @torch.no_grad()
    def update(self, features: torch.Tensor, target: torch.Tensor) -> None:
        """Fold one batch into the running statistics (features (B, d), targets (B,))."""
        # Checked as forward checks them: a target out of range or features of another
        # width failed inside index_add_ ("index out of range in self").
        self._fold(features, self._check_batch(None, features, target))

    def _check_rho(self, *dtypes: torch.dtype) -> None:
        """Refuse a ρ that ``dtypes`` (the running statistics') round to 1: in float32,
        ρ = 0.99999999 was 1.0, and nothing decayed, without a word. (A Python comparison:
        no synchronisation.)"""
        for dtype in dtypes:
            if self.rho > 0 and torch.tensor(self.rho, dtype=dtype).item() == 1:
                raise ValueError(
                    f"rho={self.rho!r} rounds to 1 in {str(dtype)[6:]}, in which MR2Loss keeps "
                    "its running statistics: nothing would decay. Use a rho at most "
                    f"{1 - torch.finfo(dtype).eps / 2!r}, or keep the statistics in float64 "
                    "(criterion.double())."
                )

    @torch.no_grad()
    def _fold(self, features: torch.Tensor, target: torch.Tensor) -> None:
        """:meth:`update` of a batch checked by :meth:`_check_batch` (int64 targets)."""
        self._check_rho(self.moment_sum.dtype, self.running_class_loss.dtype)
        phi = unit_rows(features) if self.normalize else features
        phi = phi.to(self.moment_sum.dtype)
        moments = _update_moments(  # the batch checked: its targets' range read once
            self.moments(), phi, target, self.rho, self.p, all_reduce=self._all_reduce()
        )
        # A batch with a non-finite feature (an overflowed mixed-precision step) is left
        # out, as GradScaler skips its step: folded in, it would make every later loss NaN.
        finite = torch.stack([torch.isfinite(v).all() for v in moments]).all()
        for name, value in moments._asdict().items():
            buffer = getattr(self, f"moment_{name}")
            buffer.copy_(torch.where(finite, value, buffer))

    def _check_batch(self, logits, features, target) -> torch.Tensor:
        """The batch's targets as int64, once its shapes (and, on the CPU, where this costs
        no synchronisation, its targets' range) are checked: before anything is updated.
        ``logits`` None: :meth:`update`'s batch, features and targets alone."""
        check_tensors(type(self).__name__, logits=logits, features=features, target=target)
        d = self.moment_sum.shape[-1]
        if logits is None:  # update: features and targets alone
            if features.ndim != 2 or features.shape[1] != d or target.shape != features.shape[:1]:
                raise ValueError(
                    f"MR2Loss was made for {d} features: update takes features (B, {d}) and "
                    f"targets (B,); got shapes {tuple(features.shape)} and {tuple(target.shape)}."
                )
        elif (
            logits.ndim != 2 or features.ndim != 2 or target.ndim != 1
            or logits.shape[1] != self.n_classes or features.shape[1] != d
            or not len(target) == len(logits) == len(features)
        ):  # fmt: skip
            raise ValueError(
                f"MR2Loss was made for {self.n_classes} classes and {d} features: it takes "
                f"logits (B, {self.n_classes}), features (B, {d}) and targets (B,); got shapes "
                f"{tuple(logits.shape)}, {tuple(features.shape)} and {tuple(target.shape)}."
            )
        if logits is not None and not logits.is_floating_point():
            # (torch.finfo's TypeError, "requires a floating point input type", said nothing
            # of the logits; cross_entropy refuses them too)
            raise TypeError(
                f"logits must be floating point, got {logits.dtype}: they are a model's "
                "outputs, which the cross-entropy differentiates. Pass them as the model "
                "computes them, or cast them (logits.float())."
            )
        # Float targets were truncated to classes, without a word; the range on the CPU.
        _check_class_indices(target, self.n_classes, "target")
        return target.long()

    def forward(
        self, logits: torch.Tensor, features: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        """Loss for a batch: logits (B, K), representation φ (B, d), targets (B,)."""
        target = self._check_batch(logits, features, target)
        # The margin cross-entropy in float32 at least, as autocast runs cross_entropy: in
        # float16, z / γ passed 65504 (logits of 9 at c̄ = 1e-4) and the loss was NaN.
        logits = float32_at_least(logits)
        self._check_c_bar(self.moment_sum.dtype, logits.dtype)  # before the batch is folded
        if self.lam > 0:
            self._check_compactness(torch.promote_types(features.dtype, torch.float32))
        if self.training:
            self._fold(features.detach(), target)
        margins = self.margins().to(logits.dtype)
        if self.class_tilt == 0:
            loss = margin_cross_entropy(logits, target, margins)
        else:
            each = margin_cross_entropy(logits, target, margins, reduction="none")  # (B,)
            if self.training:
                self._update_class_loss(each.detach(), target)
            # In the statistics' dtype at least (float32 at least): a rare class's q/π
            # (7e4) is inf in float16; float64 losses stay float64.
            ratio = self._tilt_ratio()
            dtype = torch.promote_types(each.dtype, ratio.dtype)
            loss = (each.to(dtype) * ratio[target].to(dtype)).mean()
        if self.lam > 0:
            phi = unit_rows(features) if self.normalize else features
            # s̄ and τ in the statistics' dtype (float32), as the distances are: in float16
            # 2·s̄ overflows once the features' norms pass about 128.
            stats = self.stats()
            s_bar = mean_spread(stats)
            if self.tau is None:
                tau = compactness_tau(stats).clamp_min(2e-12)
                compact = compactness_term(phi, target, None, s_bar, tau, self.n_classes)
            else:
                compact = compactness_loss(phi, target, s_bar, self.tau)
            # Before the first training batch there is no spread to compare with (an
            # evaluation then): no compactness term, without a synchronisation.
            compact = torch.where(self.initialised.any(), compact, torch.zeros_like(compact))
            loss = loss + self.lam * compact
        return loss
