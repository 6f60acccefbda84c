"""The quality benchmark's synthetic data does what its table claims to show."""

import json
import re

import pytest
from sklearn.linear_model import LogisticRegression

from tests._scripts import load_benchmark


@pytest.fixture(scope="module")
def quality():
    return load_benchmark("quality")


@pytest.mark.parametrize("kind, sign", [("spread", 1), ("norm", -1)])
@pytest.mark.slow
def test_margins_follow_difficulty_only_when_spread_drives_it(quality, kind, sign):
    X, X_test, y, y_test = quality.synthetic_features(10, kind)
    erm = LogisticRegression(C=0.03, max_iter=500).fit(X, y)
    rho = quality.margin_tracking(X, y, X_test, y_test, erm.predict(X_test))
    # Spread-driven: the paper's γ ranks classes as their error does. Norm-driven: γ grows
    # with the mean norm, which makes a class *easier*, so γ ranks them backwards.
    assert sign * rho["moment"] > 0.8
    if kind == "spread":
        assert rho["spread"] > 0.8


def test_every_method_gets_the_same_budget(quality):
    methods = quality.build_methods([0.001, 0.01, 0.1])
    assert {len(m.configs) for m in methods.values()} == {3}
    assert set(quality.SYNTHETIC_METHODS) <= set(methods)
    summaries, reference = quality.run_seed(
        *_tiny(quality), {n: methods[n] for n in quality.SYNTHETIC_METHODS[:2]}, 0, {}
    )
    assert set(summaries) == set(quality.SYNTHETIC_METHODS[:2])
    for summary in summaries.values():
        assert 0.5 < summary["overall"] <= 1 and summary["worst"] <= summary["hard"]
        assert summary["config"]["C"] in (0.001, 0.01, 0.1)


def _tiny(quality):
    X, X_test, y, y_test = quality.synthetic_features(4, "spread", n_features=8)
    return X[:600], y[:600], X_test, y_test


@pytest.mark.parametrize(
    "argv, message",
    [
        # "tilt + offsets" starts from "tilt"'s choice: a KeyError after hours of fits.
        (["--levers", "--methods", "offsets"], "--methods applies to the MR² table"),
        (["--methods", "nothing"], r"--methods \['nothing'\] names none of the methods"),
        # The synthetic data sets run a subset: a cosine method ran nothing, silently.
        (["--methods", "cosine"], r"--methods \['cosine'\] names none of the methods of --dat"),
    ],
)
def test_a_method_filter_that_cannot_run_is_refused_before_any_work(quality, capsys, argv, message):
    with pytest.raises(SystemExit):
        quality.main(["--data", "synthetic", *argv])
    assert re.search(message, capsys.readouterr().err)


def test_undefined_figures_print_a_dash_and_write_null(quality, tmp_path, capsys):
    """Two classes leave the medium group empty, and both classes' errors are 0 (ρ of a
    constant ranking): they printed 'nan ± nan' and '+nan', and --out held NaN (no JSON)."""
    out = tmp_path / "quality.json"
    with pytest.warns(Warning, match="constant"):  # scipy's: ρ is not defined
        quality.main(["--data", "synthetic", "--classes", "2", "--kinds", "norm", "--seeds",
                      "0", "--methods", "ERM", "--out", str(out)])  # fmt: skip

    def refuse(constant):
        raise ValueError(f"{constant} is no JSON")

    results = json.loads(out.read_text(), parse_constant=refuse)["synthetic K=2, norm"]
    assert results["seeds"][0]["ERM (LogisticRegression, std)"]["medium"] is None
    assert results["margin_error_spearman"] == {"moment": None, "spread": None}
    printed = capsys.readouterr().out
    assert "nan" not in printed
    assert "| 100.00 ± 0.00 | – | 100.00 ± 0.00 |" in printed
    assert "| synthetic K=2, norm | – | – |" in printed
    assert not list(tmp_path.glob("*.tmp"))


def test_synthetic_data_ignore_a_file_where_fmnist_s_cache_would_be(
    quality, tmp_path, monkeypatch, capsys
):
    """--data synthetic reads no cache: ./runs/cache a file refused it ('--cache takes a
    folder'), an option it was not given and does not take."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "cache").write_text("not a folder")

    def made(*args, **kwargs):  # the first work after the checks
        raise RuntimeError("the data were made")

    monkeypatch.setattr(quality, "synthetic_features", made)
    with pytest.raises(RuntimeError, match="the data were made"):
        quality.main(["--data", "synthetic", "--classes", "2", "--seeds", "0"])
    assert "--cache" not in capsys.readouterr().err
