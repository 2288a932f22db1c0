"""Rewrite mode's review, driven by Pilot on a scripted backend: step through the changes, accept some and
reject others, and save exactly those; an original changed on disk meanwhile is never overwritten."""

from __future__ import annotations

import os
import stat

import pytest
from fakes import FakeBackend
from pilot import make_app, reviewed, until

from specchat.ui.rewrite import RewriteScreen

ORIGINAL = "The cat sat on teh mat. It was happy.\n\nThe dog barked loudly at night.\n"
REWRITE = "The cat sat on the mat. It was very happy indeed.\n\nThe dog barked at night."


async def test_changes_accepted_and_rejected_one_by_one_are_saved_exactly(tmp_path):
    doc = tmp_path / "notes.md"
    doc.write_text(ORIGINAL)
    app = make_app(tmp_path, FakeBackend(answer=REWRITE), rewrite_file=doc)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await reviewed(pilot, app)
        assert len(screen.review.changes) == 3 and screen.current == 0
        await pilot.press("ctrl+y", "ctrl+n")  # accept the first, reject the second (each moves on)
        await until(pilot, lambda: screen.current == 2, "the third change")
        assert "1 rejected" in str(app.screen.query_one("#rewrite-status").render())
        shown = app.screen.query_one("#result").text
        assert shown == "The cat sat on the mat. It was happy.\n\nThe dog barked at night.\n"  # as it stands
        await pilot.press("ctrl+up", "ctrl+up", "ctrl+n")  # back to the first, and reject it after all
        await until(pilot, lambda: screen.review.accepted == [False, False, True], "the first rejected")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: (tmp_path / "notes.rewritten.md").exists(), "the save")
    assert (tmp_path / "notes.rewritten.md").read_text() == "The cat sat on teh mat. It was happy.\n\nThe dog barked at night.\n"
    assert doc.read_text() == ORIGINAL


async def test_a_rewrite_cut_short_is_said_and_accepting_it_as_written_keeps_the_rest(tmp_path):
    doc = tmp_path / "notes.md"
    doc.write_text(ORIGINAL)
    app = make_app(tmp_path, FakeBackend(answer="The cat sat on the mat. It was happy."), rewrite_file=doc)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await reviewed(pilot, app)
        assert screen.review.accepted == [True, False]
        assert "stopped before the end of the document or of a part" in str(screen.query_one("#rewrite-status").render())
        assert screen.query_one("#result").text == "The cat sat on the mat. It was happy.\n\nThe dog barked loudly at night.\n"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: (tmp_path / "notes.rewritten.md").exists(), "the save")
    assert (tmp_path / "notes.rewritten.md").read_text() == ORIGINAL.replace("teh", "the")


async def test_an_original_changed_on_disk_is_not_overwritten_and_the_review_still_saves_apart(tmp_path):
    doc = tmp_path / "notes.md"
    doc.write_text(ORIGINAL)
    app = make_app(tmp_path, FakeBackend(answer=REWRITE), rewrite_file=doc)
    async with app.run_test(size=(140, 40)) as pilot:
        await reviewed(pilot, app)
        # Changed while the overwrite waits for its confirmation: refused at the last moment.
        await pilot.press("ctrl+w")
        await until(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen", "the confirmation")
        changed = ORIGINAL + "A line another editor saved meanwhile.\n"
        doc.write_text(changed)
        await pilot.press("y")
        await until(pilot, lambda: any("changed on disk" in n.message for n in app._notifications), "the refusal")
        await pilot.press("ctrl+w")  # and asked again, refused at once
        await until(pilot, lambda: sum("changed on disk" in n.message for n in app._notifications) == 2, "again")
        assert isinstance(app.screen, RewriteScreen)
        assert doc.read_text() == changed  # the other program's save is not lost
        await pilot.press("ctrl+s")
        await until(pilot, lambda: (tmp_path / "notes.rewritten.md").exists(), "the save apart")
    assert (tmp_path / "notes.rewritten.md").read_text() == REWRITE + "\n"


async def overwritten(pilot, app) -> None:
    """Ctrl+W and y: the original overwritten with the review as it stands."""
    await pilot.press("ctrl+w")
    await until(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen", "the confirmation")
    await pilot.press("y")
    await until(pilot, lambda: any("Overwrote" in n.message for n in app._notifications), "the overwrite")


CRLF = ORIGINAL.replace("\n", "\r\n").encode()


@pytest.mark.parametrize("linked", [False, True], ids=["file", "symlink"])
async def test_rejecting_every_change_and_overwriting_leaves_the_file_exactly_as_it_was(tmp_path, linked):
    (tmp_path / "docs").mkdir()
    target = tmp_path / "docs" / "notes.md"
    target.write_bytes(CRLF)
    target.chmod(0o644)
    doc = tmp_path / "docs" / "link.md" if linked else target
    if linked:
        doc.symlink_to(target.name)
    app = make_app(tmp_path, FakeBackend(answer=REWRITE), rewrite_file=doc)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await reviewed(pilot, app)
        await pilot.press("alt+n")
        await until(pilot, lambda: not any(screen.review.accepted), "every change rejected")
        await overwritten(pilot, app)
    assert target.read_bytes() == CRLF and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert doc.is_symlink() == linked
    assert sorted(os.listdir(tmp_path / "docs")) == ["link.md", "notes.md"] if linked else ["notes.md"]


async def test_a_change_accepted_in_a_symlinked_crlf_document_changes_the_target_and_that_line(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "notes.md"
    target.write_bytes(CRLF)
    target.chmod(0o644)
    doc = tmp_path / "notes.md"
    doc.symlink_to(target)
    app = make_app(tmp_path, FakeBackend(answer=REWRITE), rewrite_file=doc)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await reviewed(pilot, app)
        await pilot.press("alt+n", "ctrl+y")  # reject them all, then accept the first ("teh" to "the")
        await until(pilot, lambda: screen.review.accepted == [True, False, False], "the first accepted")
        await overwritten(pilot, app)
    assert doc.is_symlink() and doc.resolve() == target
    assert target.read_bytes() == CRLF.replace(b"teh", b"the") and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert os.listdir(tmp_path / "real") == ["notes.md"]


async def test_a_document_the_user_may_not_write_is_refused_in_one_line_and_kept(tmp_path):
    if os.name != "posix" or os.geteuid() == 0:
        pytest.skip("root may write any file: a read-only document needs an ordinary user to refuse it")
    doc = tmp_path / "notes.md"
    doc.write_bytes(CRLF)
    doc.chmod(0o444)
    app = make_app(tmp_path, FakeBackend(answer=REWRITE), rewrite_file=doc)
    async with app.run_test(size=(140, 40)) as pilot:
        await reviewed(pilot, app)
        await pilot.press("ctrl+w")
        await until(pilot, lambda: app.screen.__class__.__name__ == "ConfirmScreen", "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: any("could not overwrite" in n.message for n in app._notifications), "the refusal")
        [refusal] = [n.message for n in app._notifications if "could not overwrite" in n.message]
        assert refusal == f"could not overwrite {doc}: Permission denied; it is unchanged"
    assert doc.read_bytes() == CRLF and stat.S_IMODE(doc.stat().st_mode) == 0o444
