"""atomic_write changes a file's contents and nothing else about it: its mode, owner and group stay, a symlink
stays a link to the file that changes, and nothing is left beside it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from specchat.store.files import atomic_write


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("bits", [0o644, 0o755, 0o640], ids=oct)
def test_an_existing_file_keeps_its_permissions(tmp_path: Path, bits: int):
    path = tmp_path / "config.toml"
    path.write_text("old")
    path.chmod(bits)
    atomic_write(path, "new")
    assert path.read_text() == "new"
    assert mode(path) == bits
    assert os.listdir(tmp_path) == ["config.toml"]  # no temporary file left


def test_a_new_file_gets_the_mode_an_editor_would_give_it(tmp_path: Path):
    umask = os.umask(0o027)
    try:
        atomic_write(tmp_path / "notes.rewritten.md", "text")
    finally:
        os.umask(umask)
    assert mode(tmp_path / "notes.rewritten.md") == 0o640  # 0666 less the umask, not mkstemp's 0600


def test_a_symlink_is_written_through(tmp_path: Path):
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    target = tmp_path / "real" / "notes.md"
    target.write_text("old")
    target.chmod(0o644)
    link = tmp_path / "links" / "notes.md"
    link.symlink_to(Path("..") / "real" / "notes.md")
    atomic_write(link, "new")
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "real", "notes.md")
    assert target.read_text() == "new" and mode(target) == 0o644
    assert os.listdir(tmp_path / "links") == ["notes.md"] and os.listdir(tmp_path / "real") == ["notes.md"]


def test_bytes_are_written_as_they_are(tmp_path: Path):
    path = tmp_path / "doc.txt"
    atomic_write(path, b"\xef\xbb\xbfone\r\ntwo\rthree")
    assert path.read_bytes() == b"\xef\xbb\xbfone\r\ntwo\rthree"


def test_the_rename_is_made_durable_by_syncing_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    synced: list[str] = []
    fsync = os.fsync

    def recording(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    atomic_write(tmp_path / "notes.md", "text")
    assert synced == ["file", "folder"]


def test_a_failed_write_leaves_the_file_as_it_was_and_nothing_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "notes.md"
    path.write_text("old")

    def full(*args) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError):
        atomic_write(path, "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["notes.md"]


def test_a_file_the_user_may_not_write_is_not_replaced(tmp_path: Path):
    if os.name != "posix" or os.geteuid() == 0:
        pytest.skip("root may write any file: a read-only file needs an ordinary user to refuse it")
    path = tmp_path / "notes.md"
    path.write_text("old")
    path.chmod(0o444)
    with pytest.raises(PermissionError):
        atomic_write(path, "new")  # the folder would allow the rename; the file's own mode says no
    assert path.read_text() == "old" and mode(path) == 0o444 and os.listdir(tmp_path) == ["notes.md"]


def test_an_existing_file_keeps_its_owner_and_group(tmp_path: Path):
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("giving a file another user's ownership needs root")
    path = tmp_path / "notes.md"
    path.write_text("old")
    os.chown(path, 65534, 65534)  # nobody, nogroup: anyone but the writer
    atomic_write(path, "new")
    assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65534) and path.read_text() == "new"
