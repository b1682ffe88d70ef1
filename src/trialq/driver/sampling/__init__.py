"""The driver's samplers: which one `auto` builds (`rule`), the arguments each takes (`args`),
and the wrappers around Optuna's (`distinct`, `gp`, `taking_turns`, `oom_constraint`) with the
bounded history TPE reads (`history`)."""
