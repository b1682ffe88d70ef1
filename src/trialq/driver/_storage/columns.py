"""How long a name Optuna's tables hold: the study's name, a param's name.

PostgreSQL refuses a longer one when it is first written (SQLite stores it whole), and that
write is the first trial's: a space name past its column ended the run with a traceback and
left an empty study. The lengths are read from Optuna's own models, so a schema that
changes them changes the check.
"""

from __future__ import annotations

from collections.abc import Mapping


def name_columns() -> Mapping[str, int]:
    """What each kind of name is (`study name`, `param name`) and the most characters its
    column holds."""
    from optuna.storages._rdb import models

    return {
        "study name": models.StudyModel.study_name.type.length,
        "param name": models.TrialParamModel.param_name.type.length,
    }
