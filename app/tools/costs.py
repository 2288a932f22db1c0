"""`specchat costs`: this machine's decode cost curve for a pair, as auto sees it."""

from __future__ import annotations

from specchat.loader import ModelChoice, load_pair
from specchat.models.fetch import Progress


def run_costs(choice: ModelChoice, remeasure: bool, progress: Progress | None = None) -> int:
    pair = load_pair(choice, progress)
    curve = pair.curve(fresh=remeasure)
    one = curve.verify_s[0]
    print(f"{pair.target.name}, {pair.target.n_threads} threads: verifying n positions, in ms and in single steps")
    for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32):
        print(f"  n={n:2d}  {1000 * curve.verify_s[n - 1]:7.1f} ms  {curve.verify_s[n - 1] / one:5.2f}x")
    if pair.draft is not None:
        print(f"draft {pair.draft.name}: {1000 * curve.draft_s:.1f} ms per token, "
              f"{curve.draft_s / one:.2f}x a target step")
    return 0
