"""scikit-learn's estimator checks, on the regimes of the estimator and the offsets."""

import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.utils.estimator_checks import parametrize_with_checks

from mr2_probe import MR2LinearClassifier, MR2LinearClassifierCV, TunedOffsetsClassifierCV

# About 300 checks: the full suite runs them, the quick one (-m "not slow") does not.
pytestmark = pytest.mark.slow

LINEAR = MR2LinearClassifier(device="cpu")
# The checks fit tiny data sets in one minibatch per epoch: a larger step and fewer epochs
# keep them fast (they check the interface, not how far Adam gets).
COMPACT = MR2LinearClassifier(
    c_bar=2.0, lam=0.5, p=3, learning_rate=3e-2, max_iter=40, random_state=0, device="cpu"
)
COSINE = MR2LinearClassifier(head="cosine", device="cpu")
TILTED = MR2LinearClassifier(class_tilt=2.0, device="cpu")
# Two values and three folds: the checks exercise the search, not the length of its path.
SEARCH = MR2LinearClassifierCV(Cs=[0.1, 10.0], cv=3, device="cpu")
# A fast inner estimator: the checks exercise the meta-estimator, not the probe.
OFFSETS = TunedOffsetsClassifierCV(LogisticRegression(), cv=3)

# One expected failure in all, with its reason. (COMPACT passes the sample-weight check:
# its data fit one minibatch, so integer weights and repeated rows give the same steps.)
EXPECTED_FAILED_CHECKS = {
    id(COSINE): {
        "check_class_weight_classifiers": (
            "a cosine head has no intercept and sees only directions: on data spread "
            "around the origin it cannot predict one class everywhere, which the check "
            "asks of class_weight={0: 1000, 1: 1e-4}"
        ),
    },
}


# COMPACT's 40 epochs keep the checks fast, short of convergence on some of their data.
@pytest.mark.filterwarnings(
    "ignore:adam did not converge in max_iter=40:sklearn.exceptions.ConvergenceWarning"
)
@parametrize_with_checks(
    [LINEAR, COMPACT, COSINE, TILTED, SEARCH, OFFSETS],
    expected_failed_checks=lambda est: EXPECTED_FAILED_CHECKS.get(id(est), {}),
)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
