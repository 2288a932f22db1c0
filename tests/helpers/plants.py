"""Bugs planted in the session's rewind, one line's worth each, for the tests that must catch them
(tests/llama/test_rollback.py at the logits, tests/llama/test_hybrid.py through the greedy check). Installed with
monkeypatch over `Session._snapshots_hold` and `Session._nearest_saved`."""

from __future__ import annotations

from specchat.llama.session import Checkpoint, Memory, Session

_nearest = Session._nearest_saved


def one_past_the_last_decode(self: Session, drop: int) -> bool:
    """llama.cpp's snapshots trusted one position further back than the last decode reaches. (Asking for
    one step more than the snapshots keep is no such bug: llama.cpp's seq_rm says no, and the session
    restores instead.)"""
    return self.memory is Memory.ROLLBACK and not self._rolled_back and drop <= min(self.rollback_depth,
                                                                                    self._last_decode)


def another_checkpoints_state(self: Session, n: int) -> Checkpoint | None:
    """The nearest saved position, with the state saved at the oldest one."""
    point = _nearest(self, n)
    oldest = min(self._checkpoints, key=lambda c: c.pos, default=None)
    return point if point is None or oldest is None else Checkpoint(point.pos, oldest.data)
