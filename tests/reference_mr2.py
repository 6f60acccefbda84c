"""Straightforward per-class loop forms of the MR² formulas, to check the vectorised ones,
and the cosine head's previous solver, the peer of its tests and of bench_cosine.py.

Deliberately slow and literal: one Python loop per class and per sample.
"""

import torch


def class_statistics_loop(features, labels, n_classes, p):
    means, msd, msd_l2, counts = [], [], [], []
    for k in range(n_classes):
        members = features[labels == k]
        mu = members.mean(0)
        dists_p = [torch.linalg.vector_norm(row - mu, ord=p) ** 2 for row in members]
        dists_2 = [torch.linalg.vector_norm(row - mu, ord=2) ** 2 for row in members]
        means.append(mu)
        msd.append(torch.stack(dists_p).mean())
        msd_l2.append(torch.stack(dists_2).mean())
        counts.append(float(len(members)))
    return torch.stack(means), torch.stack(msd), torch.stack(msd_l2), torch.tensor(counts)


def margins_loop(means, msd, c_bar, p):
    n_classes = len(msd)
    a = [torch.linalg.vector_norm(means[k], ord=p) ** 2 + msd[k] for k in range(n_classes)]
    roots = [a_k ** (1 / 3) for a_k in a]
    total = sum(roots)
    return torch.stack([c_bar * n_classes * r / total for r in roots])


def margin_ce_loop(logits, target, margins):
    losses = []
    for i in range(len(target)):
        z = logits[i] / margins[target[i]]
        losses.append(-torch.log_softmax(z, 0)[target[i]])
    return torch.stack(losses).mean()


def compactness_loop(features, target, s_bar, tau):
    per_class = {}
    for i in range(len(target)):
        total = torch.zeros((), dtype=features.dtype)
        for j in range(len(target)):
            if j != i and target[j] == target[i]:
                d = torch.sum((features[i] - features[j]) ** 2)
                total = total + torch.exp((d - 2 * s_bar) / tau)
        per_class.setdefault(int(target[i]), []).append(torch.log1p(total))
    return torch.stack([torch.stack(v).mean() for v in per_class.values()]).mean()


def cosine_lbfgs_before(X, y, scale, margins, tol, max_iter):
    """The cosine head as the estimator solved it before its closed form: autograd
    gradients, 10 L-BFGS pairs, one run, the test on tol in W. X unit-norm (NumPy).

    Returns the logit weights s·W/‖W‖ (NumPy) and the iterations run.
    """
    import torch.nn.functional as F

    from mr2_probe._losses import margin_cross_entropy

    X, y = torch.as_tensor(X), torch.as_tensor(y)
    margins = torch.as_tensor(margins, dtype=X.dtype)
    W = torch.zeros(len(margins), X.shape[1], dtype=X.dtype).index_add_(0, y, X)
    W = F.normalize(W, dim=1).requires_grad_(True)
    optimizer = torch.optim.LBFGS(
        [W],
        lr=1,
        max_iter=max_iter,
        max_eval=4 * max_iter,
        tolerance_grad=tol,
        tolerance_change=64 * torch.finfo(torch.float64).eps,
        history_size=10,
        line_search_fn="strong_wolfe",
    )

    def closure():
        optimizer.zero_grad()
        loss = margin_cross_entropy(scale * X @ F.normalize(W, dim=1).T, y, margins)
        loss.backward()
        return loss

    optimizer.step(closure)
    return (scale * F.normalize(W.detach(), dim=1)).numpy(), optimizer.state[W]["n_iter"]
