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


def _float_space(bounds: str) -> str:
    return spec_text(space=f'[space.x]\ntype = "float"\n{bounds}')


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
    "misspelt param type": (
        spec_text(space='[space.x]\ntpye = "float"\nlow = 0\nhigh = 1'),
        "space.x.tpye: unknown key (did you mean type?)",
    ),
    "misspelt param key": (
        spec_text(space='[space.x]\ntype = "float"\nlwo = 0\nhigh = 1'),
        "space.x.lwo: unknown key (did you mean low?)",
    ),
    "param without type": (
        spec_text(space="[space.x]\nlow = 0\nhigh = 1"),
        "space.x: missing required key type (float, int or categorical)",
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
    "misspelt tracker": (
        spec_text() + "[tracking]\ntensorbord = true\n",
        "tracking.tensorbord: unknown key (did you mean tensorboard?)",
    ),
    "tracker's unknown key": (
        spec_text() + '[tracking.mlflow]\nuri = "sqlite:///m.db"\n',
        "tracking.mlflow.uri: unknown key",
    ),
    "unknown sampler": (spec_text(study=GOOD["study"] + '\nsampler = "magic"'), "study.sampler"),
    "bad sampler args": (
        spec_text(study=GOOD["study"] + "\nsampler_args = { nonsense = 1 }"),
        "study.sampler_args:",
    ),
    "sampler count below its range": (
        spec_text(
            study=GOOD["study"] + '\nsampler = "tpe"\nsampler_args = { n_startup_trials = -1 }'
        ),
        "study.sampler_args.n_startup_trials: -1 is out of range: 0 to",
    ),
    "sampler candidates of none": (
        spec_text(
            study=GOOD["study"] + '\nsampler = "tpe"\nsampler_args = { n_ei_candidates = 0 }'
        ),
        "study.sampler_args.n_ei_candidates: 0 is out of range: 1 to",
    ),
    "sampler count of a wrong type": (
        spec_text(study=GOOD["study"] + '\nsampler_args = { n_startup_trials = "ten" }'),
        "study.sampler_args.n_startup_trials: 'ten' is not an int",
    ),
    "sampler flag that is no bool": (
        spec_text(study=GOOD["study"] + '\nsampler = "tpe"\nsampler_args = { multivariate = 3 }'),
        "study.sampler_args.multivariate: 3 is not a bool",
    ),
    "sampler weight at 0": (
        spec_text(study=GOOD["study"] + '\nsampler = "tpe"\nsampler_args = { prior_weight = 0.0 }'),
        "study.sampler_args.prior_weight: 0.0 must be above 0",
    ),
    "sampler argument a spec cannot give": (
        spec_text(study=GOOD["study"] + '\nsampler = "tpe"\nsampler_args = { gamma = 3 }'),
        "study.sampler_args.gamma: takes a Callable",
    ),
    "random seed that is no int": (
        spec_text(study=GOOD["study"] + '\nsampler = "random"\nsampler_args = { seed = 2.5 }'),
        "study.sampler_args.seed: 2.5 is not an int",
    ),
    "nsga2 population of one": (
        spec_text(
            study=GOOD["study"] + '\nsampler = "nsga2"\nsampler_args = { population_size = 1 }'
        ),
        "study.sampler_args.population_size: 1 is out of range: 2 to",
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
    # Values past what Optuna, the storage or the clocks hold (issue 38, row 5): each ended
    # the driver with exit 4 after the study existed, or was taken without a word.
    "infinite high": (
        _float_space("low = 0\nhigh = inf"),
        "space.x.high: Input should be a finite",
    ),
    "NaN low": (_float_space("low = nan\nhigh = 1"), "space.x.low: Input should be a finite"),
    "range overflowing a float": (
        _float_space("low = -1e308\nhigh = 1e308"),
        "space.x: high - low overflows a float",
    ),
    "negative float step": (
        _float_space("low = 0\nhigh = 1\nstep = -1.0"),
        "space.x.step: Input should be greater than 0",
    ),
    "float step past float resolution": (
        _float_space("low = 0\nhigh = 1\nstep = 1e-300"),
        "space.x: step gives over 2**53 values",
    ),
    "int bound past 2**53": (
        spec_text(space='[space.x]\ntype = "int"\nlow = 0\nhigh = 9223372036854775807'),
        "space.x.high: Input should be less than or equal to 9007199254740992",
    ),
    "choice given twice": (
        spec_text(space='[space.x]\ntype = "categorical"\nchoices = [1, 1]'),
        "space.x.choices: 1 is given twice",
    ),
    "choices 1 and true": (
        spec_text(space='[space.x]\ntype = "categorical"\nchoices = [1, true]'),
        "space.x.choices: True is given twice",
    ),
    "NaN choice": (
        spec_text(space='[space.x]\ntype = "categorical"\nchoices = [1.0, nan]'),
        "space.x.choices.1: Input should be a finite number",
    ),
    "NaN goal": (spec_text(study=GOOD["study"] + "\ngoal = nan"), "study.goal: Input should be a"),
    "n_trials past the storage's trial numbers": (
        spec_text(study='name = "s"\nn_trials = 1_000_000_000_000_000_000\nmetric = "score"'),
        "study.n_trials: Input should be less than or equal to 2147483647",
    ),
    "max_in_flight 2**63 - 1": (
        spec_text(study=GOOD["study"] + "\nmax_in_flight = 9223372036854775807"),
        "study.max_in_flight: Input should be less than or equal to 2147483647",
    ),
    "infinite outage limit": (
        spec_text(study=GOOD["study"] + "\noutage_limit_s = inf"),
        "study.outage_limit_s: Input should be a finite number",
    ),
    "grace past the clocks": (
        spec_text(trial=GOOD["trial"] + "\nprune_grace_s = 1e300"),
        "trial.prune_grace_s: Input should be less than or equal to 1000000000",
    ),
    "memory limit past 64 bits of bytes": (
        spec_text(trial=GOOD["trial"] + "\nmemory_limit_mb = 9223372036854775807"),
        "trial.memory_limit_mb: Input should be less than or equal to 2147483647",
    ),
    "infinite enqueued value": (
        spec_text() + "[[enqueue]]\nx = inf\n",
        "enqueue.0.x: Input should be a finite number",
    ),
    "grid over an int range it would list": (
        spec_text(
            study=GOOD["study"] + '\nsampler = "grid"',
            space='[space.x]\ntype = "int"\nlow = 0\nhigh = 100_000_000',
        ),
        "space.x: sampler 'grid' lists every value",
    ),
    "space name past the storage's column": (
        spec_text(space=f'[space.{"x" * 600}]\ntype = "float"\nlow = 0\nhigh = 1'),
        "a param name of 600 characters; the storage holds at most 512",
    ),
    **{
        f"pruner {pruner} with {args}": (
            spec_text(study=GOOD["study"] + f'\npruner = "{pruner}"\npruner_args = {{ {args} }}'),
            f"study.pruner_args.{expected}",
        )
        for pruner, args, expected in [
            ("hyperband", "min_resource = 0", "min_resource: 0 is out of range: 1 to"),
            ("hyperband", "reduction_factor = 1", "reduction_factor: 1 is out of range: 2 to"),
            ("hyperband", "bootstrap_count = -1", "bootstrap_count: -1 is out of range: 0 to"),
            ("hyperband", "max_resource = -3", "max_resource: -3 is out of range: 1 to"),
            ("hyperband", "reduction_factor = 2.5", "reduction_factor: 2.5 is not an int"),
            ("hyperband", "min_resource = 4, max_resource = 2", "max_resource: 2 is below"),
            ("successive_halving", 'min_resource = "all"', "min_resource: 'all': use a number"),
            ("successive_halving", "min_resource = 2.5", "min_resource: 2.5 is not a str or int"),
            ("median", "n_startup_trials = 2.5", "n_startup_trials: 2.5 is not an int"),
            ("median", "interval_steps = 0", "interval_steps: 0 is out of range: 1 to"),
        ]
    },
}


BAD_ARGS = {
    "missing spec file": (["nonexistent.toml"], "cannot read the spec"),
    "workers without local": (["{spec}", "--workers", "2"], "--workers needs --local"),
    "zero workers": (["{spec}", "--local", "--workers", "0"], "expected a positive integer"),
    "negative n-trials": (["{spec}", "--n-trials", "-3"], "expected a positive integer"),
    "local and broker": (["{spec}", "--local", "--broker", "redis://x"], "exclude each other"),
    "unknown flag": (["{spec}", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    "n-trials past the storage's trial numbers": (
        ["{spec}", "--n-trials", str(10**30)],
        "expected a positive integer up to 2147483647",
    ),
    "NaN goal": (["{spec}", "--goal", "nan"], "expected a finite number, got 'nan'"),
    "outage limit past the clocks": (
        ["{spec}", "--outage-limit", "1e300"],
        "expected a positive number up to 1e+09",
    ),
}
