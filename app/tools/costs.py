"""`specchat costs`: this machine's decode cost curve for a pair, as auto sees it."""

from __future__ import annotations

from specchat.llama.model import Model
from specchat.models.fetch import Progress
from specchat.service.choices import ModelChoice
from specchat.service.loader import load_pair


def run_costs(choice: ModelChoice, remeasure: bool, progress: Progress | None = None) -> int:
    pair = load_pair(choice, progress)
    curve = pair.curve(fresh=remeasure)
    one = curve.verify_s[0]
    for line in pair.costs.provenance():
        print(line)
    print(f"{pair.target.name}, {pair.target.n_threads} threads: verifying n positions, in ms and in single steps")
    for n in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32):
        print(f"  n={n:2d}  {1000 * curve.verify_s[n - 1]:7.1f} ms  {curve.verify_s[n - 1] / one:5.2f}x")
    if pair.draft is not None:
        print(f"draft {pair.draft.name}: {1000 * curve.draft_s:.1f} ms per token, "
              f"{curve.draft_s / one:.2f}x a target step")
    if pair.mtp is not None:
        print(f"MTP layers: {1000 * curve.mtp_s:.1f} ms per token, {curve.mtp_s / one:.2f}x a target step")
    if pair.target.n_swa:
        print(_window_cache(pair.target))
    else:
        print(f"cache: {pair.target.cache_mib:.2f} MiB for the {pair.target.n_ctx}-token context")
    r, memory = curve.rollback, pair.target.memory.value
    if r is None:
        print(f"rollback ({memory}): a rejected guess is cut from the cache, at no cost")
    else:
        free = f"; up to {r.free_depth} positions come back free (llama.cpp's snapshots)" if r.free_depth else ""
        print(f"rollback ({memory}): saving the state {1000 * r.save_s:.2f} ms "
              f"({pair.target.session.stats.checkpoint_bytes / 1024:,.0f} KiB), restoring it {1000 * r.restore_s:.2f} ms, "
              f"then the kept tokens are decoded again{free}")
    return 0


def _window_cache(target: Model) -> str:
    """What keeping a sliding-window model's cache at full size costs: its caches as llama.cpp allocates
    them, full-size (what specchat uses: any rewind works) against window-sized (llama-server's default)."""
    small = Model(target.path, n_ctx=target.n_ctx, n_threads=target.n_threads, swa_full=False)
    small.close()
    return (f"cache: sliding window of {target.n_swa} tokens, kept at full size so that any rewind works: "
            f"{target.cache_mib:.1f} MiB for the {target.n_ctx}-token context, against {small.cache_mib:.1f} MiB "
            "for a window-sized one")
