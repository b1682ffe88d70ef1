"""Trial entrypoints for the framework tests: a tiny Lightning fit with trialq's callback."""

from __future__ import annotations

from typing import Any

from trialq import TrialContext


def lightning_fit(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """A linear model on random data, `epochs` epochs, one validation each, logging
    `val_loss`; reports and prunes through `trialq.lightning.TrialCallback`."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trialq.lightning import TrialCallback, resume_path

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = pl.Trainer(
        max_epochs=int(params["epochs"]), callbacks=[TrialCallback(trial, monitor="val_loss")],
        accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    loader = DataLoader(data, batch_size=16)
    trainer.fit(_linear_module(), loader, loader, ckpt_path=resume_path(trial))
    return {"val_loss": float(trainer.callback_metrics["val_loss"])}


def _module() -> Any:
    import lightning.pytorch as pl
    import torch
    from torch.nn import functional

    class Linear(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, index: int) -> Any:
            return functional.mse_loss(self.layer(batch[0]), batch[1])

        def validation_step(self, batch: Any, index: int) -> None:
            self.log("val_loss", functional.mse_loss(self.layer(batch[0]), batch[1]))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Linear


def _linear_module() -> Any:
    return _module()()
