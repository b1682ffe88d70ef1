"""Two samplers compared seed by seed from `parallel_search`'s records.

    python -m benchmarks.paired RECORD.json [RECORD.json ...] --a gp --b default [--k 16]
        [--budget 50] [--gap-from tpe-installed]

For each objective the records hold both for, at `--k` in flight and `--budget` trials: the
medians of each, and the median of the per-seed differences a - b with its 90% bootstrap
interval (the seeds drawn again with replacement, 1,000 times; lower is better, so an
interval wholly above 0 is "a worse beyond noise"). With `--gap-from`, the share of that
sampler's 1 -> k loss that each of a and b wins back (`parallel_search.gap_share`). The last
line counts the objectives where a is worse and better beyond noise, with the median shares.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from benchmarks.parallel_search import BOOTSTRAP_DRAWS, gap_share


def interval(differences: list[float], seed: int = 0) -> tuple[float, float]:
    """The 5th and 95th percentiles of the median over bootstrap draws of the seeds."""
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(rng.choices(differences, k=len(differences)))
        for _ in range(BOOTSTRAP_DRAWS)
    )
    return medians[BOOTSTRAP_DRAWS // 20], medians[BOOTSTRAP_DRAWS - BOOTSTRAP_DRAWS // 20 - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.paired", description=__doc__)
    parser.add_argument("records", nargs="+", type=Path)
    parser.add_argument("--a", required=True)
    parser.add_argument("--b", required=True)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--budget", type=int, default=50)
    parser.add_argument("--gap-from", default=None)
    args = parser.parse_args(argv)
    scores: dict[tuple[str, str, int, int], float] = {}
    for record in args.records:
        try:
            runs = json.loads(record.read_text())["runs"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parser.error(f"{record}: not a parallel_search record ({type(exc).__name__}: {exc})")
        for run in runs:
            value = run["scores"].get(str(args.budget))
            if value is not None:
                scores[(run["objective"], run["variant"], run["k"], run["seed"])] = value
    objectives = sorted({key[0] for key in scores})
    held = {(v, k) for (_, v, k, _) in scores}
    for variant in (args.a, args.b):
        if (variant, args.k) not in held:
            parser.error(f"no runs of {variant!r} at k={args.k} and {args.budget} trials")
    print(f"{'objective':<16}{args.a:>12} {args.b:>12}   {args.a} - {args.b} [90%]   shares")
    worse, better, shares_of = [], [], []
    for objective in objectives:
        seeds = sorted(
            s for (o, v, k, s) in scores if (o, v, k) == (objective, args.a, args.k)
            and (objective, args.b, args.k, s) in scores
        )  # fmt: skip
        if not seeds:
            continue
        a = [scores[(objective, args.a, args.k, s)] for s in seeds]
        b = [scores[(objective, args.b, args.k, s)] for s in seeds]
        differences = [x - y for x, y in zip(a, b, strict=True)]
        low, high = interval(differences)
        worse += [objective] if low > 0 else []
        better += [objective] if high < 0 else []
        shares = _shares(scores, objective, seeds, args)
        if isinstance(shares, list):
            shares_of.append(shares)
        shown = ", ".join(f"{x:.2f}" for x in shares) if isinstance(shares, list) else shares
        print(
            f"{objective:<16}{statistics.median(a):>12.4g} {statistics.median(b):>12.4g}   "
            f"{statistics.median(differences):+.3g} [{low:+.3g}, {high:+.3g}]   {shown}"
        )
    counted = f"{args.a} worse than {args.b} beyond noise on {len(worse)}, better on {len(better)}"
    if shares_of:
        a_share, b_share = (statistics.median(column) for column in zip(*shares_of, strict=True))
        counted += (
            f"; median shares {a_share:.2f}, {b_share:.2f} ({len(shares_of)} objectives with a gap)"
        )
    print(counted)
    return 0


def _shares(
    scores: dict[tuple[str, str, int, int], float],
    objective: str,
    seeds: list[int],
    args: argparse.Namespace,
) -> list[float] | str:
    """Each one's share (a's, b's) of `--gap-from`'s 1 -> k loss won back, or why none."""
    if args.gap_from is None:
        return ""
    cells = [
        {s: v for s in seeds if (v := scores.get((objective, variant, k, s))) is not None}
        for variant, k in ((args.gap_from, 1), (args.gap_from, args.k))
    ]
    if any(len(cell) < len(seeds) for cell in cells):
        return "no gap measured"
    by_seed = [{s: scores[(objective, v, args.k, s)] for s in seeds} for v in (args.a, args.b)]
    shares = [gap_share([*cells, ours], seeds) for ours in by_seed]
    found = [share for share in shares if share is not None]
    return found if len(found) == len(shares) else "no gap"


if __name__ == "__main__":
    raise SystemExit(main())
