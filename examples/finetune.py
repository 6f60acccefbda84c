"""Fine-tune a small backbone end to end with the MR² loss, then compare class by class.

Run ``python examples/finetune.py`` (seconds on a CPU, no download). The same MLP backbone
and cosine head, from the same initial weights, is trained on half of scikit-learn's digits
twice: with plain cross-entropy (``MR2Loss(c_bar=None, lam=0)``, ERM) and with the MR² loss
(class margins plus the compactness loss on the backbone's features). The per-class test
accuracies are then compared, groups fixed by the ERM model.

The defaults are the paper's (``c_bar=2, lam=0.5``, p = 3 on unit-norm features) with the
compactness temperature τ = 1 of ``MR2Loss``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from mr2_probe import MR2Loss
from mr2_probe.report import classwise_report


class Net(nn.Module):
    """A two-layer MLP backbone φ and a cosine head; forward returns (logits, φ).

    The head scores cos(w_k, φ) times a fixed scale, as CLIP-style heads do; the MR² loss
    then measures its statistics on unit-norm φ (``normalize=True``, p = 3).
    """

    def __init__(
        self, n_inputs: int, n_classes: int, width: int = 64, n_features: int = 32, scale=16.0
    ):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Linear(n_inputs, width), nn.ReLU(), nn.Linear(width, n_features), nn.ReLU()
        )
        self.weight = nn.Parameter(torch.randn(n_classes, n_features) / n_features**0.5)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.backbone(x)  # (B, d)
        cosine = F.normalize(features, dim=1) @ F.normalize(self.weight, dim=1).T  # (B, K)
        return self.scale * cosine, features


def train(net: Net, criterion: MR2Loss, X, y, epochs: int, seed: int) -> Net:
    """Minibatch Adam on (X, y); the loss sees the logits, the features and the targets."""
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    net.train()
    criterion.train()  # training mode: the loss updates its running class statistics
    for _ in range(epochs):
        for batch in torch.randperm(len(y), generator=generator).split(64):
            logits, features = net(X[batch])
            loss = criterion(logits, features, y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return net


@torch.no_grad()
def predict(net: Net, X: torch.Tensor) -> np.ndarray:
    net.eval()
    return net(X)[0].argmax(1).numpy()


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15, help="training epochs (default: 15)")
    parser.add_argument(
        "--c-bar", type=float, default=2.0, help="mean MR² margin (default: 2, the paper's)"
    )
    parser.add_argument(
        "--lam", type=float, default=0.5, help="compactness weight (default: 0.5, the paper's)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="train/test split and training seed (default: 0)"
    )
    parser.add_argument("--per-class", action="store_true", help="add the per-class table")
    args = parser.parse_args(argv)
    # One line, as argparse's own refusals: --epochs 0 reported two untrained networks,
    # the others ended in a traceback.
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")
    if not 0 < args.c_bar < float("inf"):
        parser.error(f"--c-bar must be a positive finite number, got {args.c_bar:g}")
    if not 0 <= args.lam < float("inf"):
        parser.error(f"--lam must be a finite number >= 0, got {args.lam:g}")
    if not 0 <= args.seed < 2**32:  # NumPy's seeds, as train_test_split takes them
        parser.error(f"--seed must be between 0 and 2**32 - 1, got {args.seed}")

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X / 16.0, y, test_size=0.5, stratify=y, random_state=args.seed
    )
    X_train, X_test = (torch.as_tensor(a, dtype=torch.float32) for a in (X_train, X_test))
    y_train_t = torch.as_tensor(y_train)
    n_classes = len(np.unique(y))

    losses = {
        "ERM (cross-entropy)": MR2Loss(n_classes, 32, c_bar=None, lam=0.0),
        f"MR2 (c_bar={args.c_bar:g}, lam={args.lam:g})": MR2Loss(
            n_classes, 32, c_bar=args.c_bar, lam=args.lam, p=3.0, normalize=True
        ),
    }
    predictions = {}
    for name, criterion in losses.items():
        torch.manual_seed(args.seed)  # the same initial weights for both runs
        net = train(
            Net(X.shape[1], n_classes), criterion, X_train, y_train_t, args.epochs, args.seed
        )
        predictions[name] = predict(net, X_test)

    print(
        f"digits, MLP fine-tuned {args.epochs} epoch{'s' if args.epochs != 1 else ''}: "
        f"{len(y_train)} train / {len(y_test)} test images"
    )
    report = classwise_report(predictions, y_test)
    print(report.to_text(per_class=args.per_class))
    return report


if __name__ == "__main__":
    main()
