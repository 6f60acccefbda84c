"""benchmarks/bench_minibatch.py's table of whole fits."""

from tests._scripts import load_benchmark


def test_the_peer_rows_print_no_loss_instead_of_nan(monkeypatch, capsys):
    """LogisticRegression keeps no loss curve: its loss column printed 'nan'."""
    module = load_benchmark("bench_minibatch")

    def run_here(kind, params, seed, C, standardize):  # the peer's rows fitted in this process
        if kind.startswith("logistic"):
            return module.fit_row(kind, params, seed, C, standardize)
        return dict(seconds=1.0, n_iter=7, converged=True, accuracy=0.9, loss=0.25, dynamo=False)

    monkeypatch.setattr(module, "run_fresh", run_here)
    module.main(["--no-steps", "--seeds", "0"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if "  " in line]
    peer = [row for row in rows if row[0].startswith("LogisticRegression")]
    ours = [row for row in rows if row[0] in ("previous:", "current")]
    assert len(peer) == 2 and len(ours) == 3
    assert all(row[-2] == "-" for row in peer)  # loss, then dynamo
    assert all(row[-2] == "0.2500" for row in ours)


def test_the_previous_solver_row_fits_with_the_arguments_the_estimator_passes(monkeypatch):
    """The estimator passes its solvers an ``objective`` (the progress bar's name): the
    previous solver's stand-in refused it, and every run of the table failed there."""
    from mr2_probe import _classifier

    module = load_benchmark("bench_minibatch")
    # fit_row installs the previous solver in the estimator's module: undone after the test
    monkeypatch.setattr(_classifier, "fit_minibatch", _classifier.fit_minibatch)
    params = {**module.PREVIOUS, "max_iter": 3}
    row = module.fit_row("previous", params, 0, 1.0, False)
    assert row["n_iter"] == 3 and 0 < row["accuracy"] <= 1
