"""The driver's copy of the Optuna storage and its writes: the only code that touches
Optuna's tables."""
