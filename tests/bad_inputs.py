"""Bad specs and bad arguments, each with the text its one-line error must contain.

Shared by the unit tests and the fault suite's table."""

from __future__ import annotations

GOOD = {
    "study": 'name = "s"\nn_trials = 3\nmetric = "score"',
    "trial": 'entrypoint = "trials:quadratic"',
    "space": '[space.x]\ntype = "float"\nlow = 0\nhigh = 1',
}


def spec_text(**tables: str) -> str:
    parts = {**GOOD, **tables}
    return f"[study]\n{parts['study']}\n[trial]\n{parts['trial']}\n{parts['space']}\n"


BAD_SPECS = {
    "study name leaving the spec's folder": (
        spec_text(study='name = "../../escape"\nn_trials = 3'),
        "study.name: '../../escape': use letters, digits",
    ),
    "study name with a path separator": (
        spec_text(study='name = "a/b"\nn_trials = 3'),
        "study.name: 'a/b': use letters, digits",
    ),
    "study name that is no file name": (
        spec_text(study=f'name = "{"x" * 300}"\nn_trials = 3'),
        "study.name: String should have at most 128 characters",
    ),
    "unknown key": (spec_text(study=GOOD["study"] + "\nbogus = 1"), "study.bogus: unknown key"),
    "misspelt key": (
        spec_text(study='name = "s"\nn_trails = 3'),
        "study.n_trails: unknown key (did you mean n_trials?)",
    ),
    "misspelt table": (
        spec_text() + '[trail]\nqueue = "gpu"\n',
        "trail: unknown key (did you mean trial?)",
    ),
    "wrong type": (spec_text(study='name = "s"\nn_trials = "many"'), "study.n_trials"),
    "missing n_trials": (spec_text(study='name = "s"'), "study.n_trials: missing required key"),
    "low > high": (
        spec_text(space='[space.x]\ntype = "float"\nlow = 2\nhigh = 1'),
        "space.x: low (2.0) must not be greater than high (1.0)",
    ),
    "empty choices": (
        spec_text(space='[space.x]\ntype = "categorical"\nchoices = []'),
        "space.x.choices",
    ),
    "unknown param type": (
        spec_text(space='[space.x]\ntype = "complex"\nlow = 0'),
        "space.x: type must be one of float, int, categorical",
    ),
    "log with low <= 0": (
        spec_text(space='[space.x]\ntype = "float"\nlow = 0\nhigh = 1\nlog = true'),
        "space.x: log = true needs low > 0",
    ),
    "entrypoint module missing": (
        spec_text(trial='entrypoint = "no_such_module_xyz:train"'),
        "trial.entrypoint: no module named 'no_such_module_xyz'",
    ),
    "entrypoint function missing": (
        spec_text(trial='entrypoint = "trials:no_such_function"'),
        "trial.entrypoint: trials has no function 'no_such_function'",
    ),
    "entrypoint not callable": (
        spec_text(trial='entrypoint = "trials:NOT_CALLABLE"'),
        "trial.entrypoint: trials:NOT_CALLABLE is not callable",
    ),
    "entrypoint malformed": (
        spec_text(trial='entrypoint = "trials.quadratic"'),
        "trial.entrypoint: expected 'module:function'",
    ),
    "entrypoint file missing": (
        spec_text(trial='entrypoint = "missing.py:train"'),
        "trial.entrypoint: file",
    ),
    "no search space": (spec_text(space=""), "no search space"),
    "unknown sampler": (spec_text(study=GOOD["study"] + '\nsampler = "magic"'), "study.sampler"),
    "bad sampler args": (
        spec_text(study=GOOD["study"] + "\nsampler_args = { nonsense = 1 }"),
        "study.sampler_args:",
    ),
    "bad pruner args": (
        spec_text(study=GOOD["study"] + "\npruner_args = { nonsense = 1 }"),
        "study.pruner_args:",
    ),
    "both direction and directions": (
        spec_text(study=GOOD["study"] + '\ndirection = "minimize"\ndirections = ["minimize"]'),
        "give direction or directions, not both",
    ),
    "multi-objective without metrics": (
        spec_text(study='name = "s"\nn_trials = 3\ndirections = ["minimize", "maximize"]'),
        "needs metrics",
    ),
    "negative timeout": (spec_text(trial=GOOD["trial"] + "\ntimeout_s = -1"), "trial.timeout_s"),
    "timeout beyond the visibility timeout": (
        spec_text(trial=GOOD["trial"] + "\ntimeout_s = 100000"),
        "trial.timeout_s: 100000 s plus grace needs TRIALQ_VISIBILITY_TIMEOUT_S",
    ),
    "bad queue name": (spec_text(trial=GOOD["trial"] + '\nqueue = "a b"'), "trial.queue"),
    "not TOML": ("[study\nname=", "not valid TOML"),
    "grid over floats": (
        spec_text(study=GOOD["study"] + '\nsampler = "grid"'),
        "space.x: the grid",
    ),
}


BAD_ARGS = {
    "missing spec file": (["nonexistent.toml"], "cannot read the spec"),
    "workers without local": (["{spec}", "--workers", "2"], "--workers needs --local"),
    "zero workers": (["{spec}", "--local", "--workers", "0"], "expected a positive integer"),
    "negative n-trials": (["{spec}", "--n-trials", "-3"], "expected a positive integer"),
    "local and broker": (["{spec}", "--local", "--broker", "redis://x"], "exclude each other"),
    "unknown flag": (["{spec}", "--frobnicate"], "unrecognized arguments: --frobnicate"),
}
