"""A PyTorch trial: a small CNN on the 8x8 digits images scikit-learn ships (GPU or CPU).

Nothing is downloaded. It trains on `cuda` where PyTorch sees a GPU (the worker's share of
it: its cap is set by trialq before the trial starts), on the CPU otherwise; reports the
validation accuracy at every epoch and stops when the driver's pruner says so; with the
param `fit_batch_size` true, it finds the largest batch that fits its budget first
(`trial.fit_batch_size`, recorded on the trial); and once `trial.should_stop()` says yes it
saves its state in `trial.checkpoint_dir`, where the next attempt resumes from.
"""

from __future__ import annotations

from typing import Any

from trialq.errors import TrialPruned
from trialq.examples.digits import load_digits
from trialq.trial.context import TrialContext

EPOCHS = 12
SEED = 0
CHECKPOINT = "torch_digits.pt"


def train(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Train one CNN with `params`; its validation accuracy and loss, and its batch size."""
    import torch

    torch.manual_seed(SEED + trial.number)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    (x_train, y_train), (x_val, y_val) = _tensors(device)
    batch = _batch_size(params, trial, device, len(x_train))
    model = build_model(params).to(device)
    optimizer = _optimizer(params, model)
    first = _resume(trial, model, optimizer)
    accuracy, loss = 0.0, float("nan")
    epochs = int(params.get("epochs", EPOCHS))
    for epoch in range(first, epochs):
        _train_epoch(model, optimizer, x_train, y_train, batch)
        accuracy, loss = evaluate(model, x_val, y_val)
        trial.report(accuracy, epoch)
        if trial.should_prune():
            raise TrialPruned(f"pruned at epoch {epoch} with val_accuracy={accuracy:.4f}")
        if epoch + 1 < epochs and trial.should_stop():  # the last epoch's value is final
            _save(trial, model, optimizer, epoch + 1)
            break
    return {"val_accuracy": accuracy, "val_loss": loss, "batch_size": float(batch)}


def build_model(params: dict[str, Any]) -> Any:
    """Conv -> conv -> pool -> dense -> 10 logits."""
    from torch import nn

    filters = int(params.get("filters", 16))
    dense = int(params.get("dense_units", 64))
    return nn.Sequential(
        nn.Conv2d(1, filters, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(filters, filters, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(filters * 16, dense),
        nn.ReLU(),
        nn.Linear(dense, 10),
    )


def evaluate(model: Any, x: Any, y: Any) -> tuple[float, float]:
    """Accuracy and mean cross-entropy on (x, y)."""
    import torch
    from torch.nn import functional

    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = float(functional.cross_entropy(logits, y))
        accuracy = float((logits.argmax(dim=1) == y).float().mean())
    model.train()
    return accuracy, loss


def _tensors(device: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The digits as (N, 1, 8, 8) float tensors and int64 labels, on `device`."""
    import torch

    def pair(x: Any, y: Any) -> tuple[Any, Any]:
        images = torch.as_tensor(x).permute(0, 3, 1, 2).contiguous()
        return images.to(device), torch.as_tensor(y, dtype=torch.int64).to(device)

    (x_train, y_train), (x_val, y_val) = load_digits()
    return pair(x_train, y_train), pair(x_val, y_val)


def _train_epoch(model: Any, optimizer: Any, x: Any, y: Any, batch: int) -> None:
    import torch
    from torch.nn import functional

    order = torch.randperm(len(x), device=x.device)
    for start in range(0, len(x), batch):
        chosen = order[start : start + batch]
        optimizer.zero_grad(set_to_none=True)
        loss: Any = functional.cross_entropy(model(x[chosen]), y[chosen])
        loss.backward()
        optimizer.step()


def _batch_size(params: dict[str, Any], trial: TrialContext, device: Any, largest: int) -> int:
    """The param `batch_size`, or with `fit_batch_size` the largest batch (up to the
    training set) whose step fits, tried on a throwaway copy of the model."""
    if not params.get("fit_batch_size", False):
        return int(params.get("batch_size", 64))
    return trial.fit_batch_size(_step_at(params, device), start=32, max=largest)


def _step_at(params: dict[str, Any], device: Any) -> Any:
    """A try for `fit_batch_size`: one training step of a fresh model at a given size,
    nothing kept (the search frees what it left)."""
    import torch
    from torch.nn import functional

    def step(size: int) -> None:
        model = build_model(params).to(device)
        optimizer = _optimizer(params, model)
        x = torch.rand(size, 1, 8, 8, device=device)
        y = torch.randint(0, 10, (size,), device=device)
        loss: Any = functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    return step


def _optimizer(params: dict[str, Any], model: Any) -> Any:
    import torch

    rate = float(params.get("learning_rate", 1e-3))
    if params.get("optimizer", "adam") == "sgd":
        return torch.optim.SGD(model.parameters(), lr=rate, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=rate)


def _resume(trial: TrialContext, model: Any, optimizer: Any) -> int:
    """The epoch to start at: 0, or where an earlier attempt of this trial stopped."""
    import torch

    try:
        path = trial.checkpoint_dir / CHECKPOINT
    except RuntimeError:  # not run by a trialq worker with a checkpoint root
        return 0
    if not path.exists():
        return 0
    saved = torch.load(path, map_location="cpu")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return int(saved["epoch"])


def _save(trial: TrialContext, model: Any, optimizer: Any, next_epoch: int) -> None:
    import torch

    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "epoch": next_epoch}, trial.checkpoint_dir / CHECKPOINT)
