"""Straightforward per-class loop forms of the MR² formulas, to check the vectorised ones.

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
