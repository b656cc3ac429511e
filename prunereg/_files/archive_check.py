"""A torch file's zip archive judged by its directory before torch reads a byte of its data.

``torch.save`` writes a zip archive of stored (uncompressed) entries, so a
torch file's entries take the room they declare. An archive with compressed
entries cannot come from ``torch.save``, and it may be a zip bomb: a few
megabytes that torch would inflate into gigabytes of memory. Such archives are
refused, as are archives whose entries declare more than the file holds or
more than this machine's memory, archives whose directory cannot be read (so
their sizes cannot be checked), and TorchScript archives (which are no state
dicts, and which ``torch.load(weights_only=True)`` refuses after a warning).
"""

from __future__ import annotations

import os
import zipfile
from typing import BinaryIO

from prunereg._disk.errors import CheckpointError, quoted
from prunereg._text import describe

ZIP_MAGIC = b"PK\x03\x04"


def check_torch_archive(handle: BinaryIO, path: str | os.PathLike[str]) -> None:
    """Raise :class:`CheckpointError` for a zip archive that ``torch.save`` cannot have written.

    Files that are no zip archive (torch's legacy format, or garbage) are left
    to ``torch.load`` to judge. A zip archive whose directory cannot be read
    here is refused: torch's own reader is more lenient (it skips a malformed
    extra field, say) and would inflate entries whose sizes were never
    checked. ``handle`` is left at the file's start.
    """
    handle.seek(0)
    if handle.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
        handle.seek(0)
        return
    try:
        with zipfile.ZipFile(handle) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, NotImplementedError) as error:
        raise CheckpointError(
            f"cannot read {quoted(path)} as a torch file (truncated or not a torch file?): "
            f"its zip directory cannot be read ({describe(error)}), so the sizes of its entries cannot be "
            "checked; refusing to load it"
        ) from error
    finally:
        handle.seek(0)
    if any(entry.filename.endswith("/constants.pkl") for entry in entries):  # torch.jit.save's mark
        raise CheckpointError(
            f"{quoted(path)} is a TorchScript archive, not a state dict: "
            "save its state_dict() with torch.save, or export it to safetensors"
        )
    size = os.fstat(handle.fileno()).st_size
    for entry in entries:
        if entry.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(
                f"{quoted(path)} is not a torch file: its entry {entry.filename!r} is compressed "
                f"({_compression_name(entry.compress_type)}), which torch.save never does; refusing to inflate it"
            )
        if entry.file_size != entry.compress_size or entry.header_offset + entry.compress_size > size:
            raise CheckpointError(
                f"{quoted(path)} is not a torch file: "
                f"its entry {entry.filename!r} declares more bytes than the file holds"
            )
    declared = sum(entry.file_size for entry in entries)
    if declared > size:  # entries overlapping each other, the trick of non-recursive zip bombs
        raise CheckpointError(
            f"{quoted(path)} is not a torch file: its entries declare {declared:,} bytes in a file of {size:,}"
        )
    memory = physical_memory()
    if memory is not None and declared > memory:
        raise CheckpointError(
            f"{quoted(path)} declares {_gib(declared)} of data, more than this machine's {_gib(memory)} of memory"
        )


def physical_memory() -> int | None:
    """This machine's memory in bytes, or ``None`` where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _compression_name(method: int) -> str:
    names = {zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}
    return names.get(method, f"method {method}")


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"
