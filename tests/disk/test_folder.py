"""AtomicFolder: an output folder appears whole or not at all, never over a folder that appeared meanwhile."""

from __future__ import annotations

import errno
import os
import re
import stat
import tempfile
from pathlib import Path

import pytest

from prunereg._disk import folder as folder_module
from prunereg._disk.folder import AtomicFolder
from prunereg._disk.paths import TEMPORARY_PREFIX, TEMPORARY_SUFFIX


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _fill(folder: Path, text: str) -> None:
    (folder / "config.json").write_text(text)
    (folder / "sub").mkdir()
    (folder / "sub" / "weights.bin").write_text(text * 3)


def _content(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_folder_appears_only_when_the_block_ends(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with AtomicFolder(target) as staging:
        assert staging.parent == tmp_path and staging.is_dir() and not any(staging.iterdir())
        assert staging.name.startswith(TEMPORARY_PREFIX) and staging.name.endswith(TEMPORARY_SUFFIX)
        assert len(staging.name) == len(TEMPORARY_PREFIX) + 8 + len(TEMPORARY_SUFFIX)
        _fill(staging, "new")
        assert not target.exists()
    assert _content(target) == {"config.json": "new", "sub/weights.bin": "newnewnew"}
    assert _mode(target) == 0o777 & ~_umask()
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("failure", [RuntimeError("the method failed"), KeyboardInterrupt()])
def test_a_failure_leaves_nothing_behind(tmp_path: Path, failure: BaseException) -> None:
    with pytest.raises(type(failure)), AtomicFolder(tmp_path / "out"):
        staging = next(tmp_path.iterdir())
        _fill(staging, "partial")
        raise failure
    assert os.listdir(tmp_path) == []


def test_a_non_empty_folder_is_refused_before_any_work_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "mine.txt").write_text("keep me")
    folder = AtomicFolder(target)
    message = f"OUTPUT_DIR '{target}' exists and is not empty; pass --force to replace it"
    with pytest.raises(FileExistsError, match=f"^{message}$"):
        folder.check()
    with pytest.raises(FileExistsError), folder:
        pytest.fail("the block must not run")
    assert _content(target) == {"mine.txt": "keep me"} and os.listdir(tmp_path) == ["out"]


def test_an_empty_folder_counts_as_free(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    with AtomicFolder(target) as staging:
        _fill(staging, "new")
    assert _content(target)["config.json"] == "new" and os.listdir(tmp_path) == ["out"]


def test_a_folder_that_appears_meanwhile_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(FileExistsError, match="exists and is not empty; pass --force"), AtomicFolder(target) as staging:
        _fill(staging, "mine")
        target.mkdir()  # another run finished first
        (target / "config.json").write_text("theirs")
    assert _content(target) == {"config.json": "theirs"} and os.listdir(tmp_path) == ["out"]


@pytest.mark.parametrize("can_exchange", [True, False])
def test_replace_swaps_the_folders_and_keeps_the_old_permissions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, can_exchange: bool
) -> None:
    if not can_exchange:
        monkeypatch.setattr(folder_module, "exchange", lambda first, second: False)
    target = tmp_path / "out"
    target.mkdir()
    _fill(target, "old")
    (target / "stale.txt").write_text("from the old run")
    target.chmod(0o750)
    with AtomicFolder(target, replace=True) as staging:
        _fill(staging, "new")
        assert _content(target)["config.json"] == "old"
    assert _content(target) == {"config.json": "new", "sub/weights.bin": "newnewnew"}
    assert _mode(target) == 0o750 and os.listdir(tmp_path) == ["out"]


def test_replace_is_one_step_where_the_system_can_exchange(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing renames the old folder aside (a reader would see no folder for a moment) when exchange works."""
    target = tmp_path / "out"
    target.mkdir()
    _fill(target, "old")
    renamed: list[tuple[str, str]] = []
    real_rename = os.rename

    def recording_rename(source: str, destination: str) -> None:
        renamed.append((str(source), str(destination)))
        real_rename(source, destination)

    monkeypatch.setattr(folder_module.os, "rename", recording_rename)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir(), second.mkdir()
    if not folder_module.exchange(first, second):
        pytest.skip("this file system cannot exchange two paths")
    first.rmdir(), second.rmdir()
    with AtomicFolder(target, replace=True) as staging:
        _fill(staging, "new")
    assert renamed == [] and _content(target)["config.json"] == "new"


def test_replace_of_a_missing_folder_creates_it(tmp_path: Path) -> None:
    with AtomicFolder(tmp_path / "out", replace=True) as staging:
        _fill(staging, "new")
    assert _content(tmp_path / "out")["config.json"] == "new"


@pytest.mark.parametrize("replace", [False, True])
def test_a_file_or_a_symlink_at_the_target_is_refused_even_with_replace(tmp_path: Path, replace: bool) -> None:
    file, link = tmp_path / "file", tmp_path / "link"
    file.write_text("a file")
    (tmp_path / "real").mkdir()
    link.symlink_to(tmp_path / "real")
    with pytest.raises(NotADirectoryError, match=f"^OUTPUT_DIR '{file}' exists and is not a folder$"):
        AtomicFolder(file, replace=replace).check()
    with pytest.raises(NotADirectoryError, match=f"^OUTPUT_DIR '{link}' is a symlink; name the folder itself$"):
        AtomicFolder(link, replace=replace).check()
    assert file.read_text() == "a file" and link.is_symlink()


@pytest.mark.parametrize("replace", [False, True])
def test_the_input_folder_and_folders_holding_it_are_refused(tmp_path: Path, replace: bool) -> None:
    model = tmp_path / "models" / "dense"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    for target, where in ((model, "is"), (tmp_path / "models", "holds"), (tmp_path / "link", "is")):
        if target.name == "link":
            target.symlink_to(model)
        folder = AtomicFolder(target, replace=replace, keep={"MODEL_DIR": model})
        with pytest.raises(IsADirectoryError, match=f"^OUTPUT_DIR '{target}' {where} MODEL_DIR '{model}'; "):
            folder.check()
    assert (model / "config.json").read_text() == "{}"


def test_labels_and_hints_are_the_callers(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    folder = AtomicFolder(tmp_path / "out", label="output_dir", replace_hint="pass replace=True to replace it")
    with pytest.raises(FileExistsError, match=r"^output_dir '.*' exists and is not empty; pass replace=True to"):
        folder.check()


def test_a_missing_parent_folder_is_named(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "out"
    with pytest.raises(FileNotFoundError, match=f"^the folder holding OUTPUT_DIR '{target}' does not exist$"):
        AtomicFolder(target).check()


def test_a_parent_refusing_the_staging_folder_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(*_: object, **__: object) -> str:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    target = tmp_path / "out"
    with pytest.raises(OSError, match=f"^cannot write OUTPUT_DIR '{target}': Permission denied$"), AtomicFolder(target):
        pytest.fail("the block must not run")


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
        RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
    ],
)
def test_a_full_disk_in_the_block_is_named(tmp_path: Path, failure: Exception) -> None:
    target = tmp_path / "out"
    message = f"cannot write OUTPUT_DIR '{target}': the disk is full (No space left on device)"
    with pytest.raises(OSError, match=f"^{re.escape(message)}$") as raised, AtomicFolder(target) as staging:
        _fill(staging, "partial")
        raise failure
    assert raised.value.errno == errno.ENOSPC and raised.value.__cause__ is failure
    assert os.listdir(tmp_path) == []


def test_other_errors_in_the_block_pass_unchanged(tmp_path: Path) -> None:
    failure = OSError(errno.EIO, "the device broke")
    with pytest.raises(OSError) as raised, AtomicFolder(tmp_path / "out"):
        raise failure
    assert raised.value is failure


def test_require_free_space(tmp_path: Path) -> None:
    with AtomicFolder(tmp_path / "out") as staging:
        folder = AtomicFolder(tmp_path / "other")
        folder.require_free_space(1)
        with pytest.raises(OSError, match=r"the disk is full \(.* free, the result needs about 1000000000000.00 GB\)"):
            folder.require_free_space(10**21)
        (staging / "x").write_text("")
    assert (tmp_path / "out" / "x").exists()


def test_a_full_disk_found_inside_the_block_keeps_its_message(tmp_path: Path) -> None:
    folder = AtomicFolder(tmp_path / "out")
    with pytest.raises(OSError, match=r"free, the result needs about") as raised, folder:
        folder.require_free_space(10**21)
    assert raised.value.errno == errno.ENOSPC and str(raised.value).startswith("cannot write OUTPUT_DIR")
    assert os.listdir(tmp_path) == []


def test_a_target_name_of_255_bytes_works(tmp_path: Path) -> None:
    target = tmp_path / ("o" * 255)
    with AtomicFolder(target) as staging:
        _fill(staging, "new")
    assert os.listdir(tmp_path) == [target.name]
