"""prunereg-rotate as a plugin: found through its entry point, listed without importing torch."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

import prunereg


@pytest.mark.parametrize(
    ("name", "kind", "module"),
    [("channel_affine", "recovery", "prunereg_rotate.recovery"), ("mean_abs_sp", "shrink", "prunereg_rotate.shrink")],
)
def test_registered_under_its_package(name: str, kind: str, module: str) -> None:
    info = prunereg.info(name)
    assert (info.kind, info.plugin, info.package) == (kind, "rotate", "prunereg-rotate")
    assert info.version == version("prunereg-rotate")
    assert prunereg.info(f"rotate:{name}") == info
    assert prunereg.get(name).__module__ == module


def test_the_package_names_its_public_api() -> None:
    import prunereg_rotate
    from prunereg_rotate.recovery import ChannelAffine
    from prunereg_rotate.rotation import RotationReport, rotate
    from prunereg_rotate.shrink import MeanAbsSP

    assert prunereg_rotate.ChannelAffine is ChannelAffine is prunereg.get("channel_affine")
    assert prunereg_rotate.MeanAbsSP is MeanAbsSP is prunereg.get("mean_abs_sp")
    assert (prunereg_rotate.rotate, prunereg_rotate.RotationReport) == (rotate, RotationReport)
    with pytest.raises(AttributeError, match="no attribute 'slice'"):
        prunereg_rotate.slice  # noqa: B018


def test_import_and_listing_do_not_import_torch() -> None:
    code = (
        "import sys, prunereg, prunereg_rotate; "
        "assert {'channel_affine', 'mean_abs_sp'} <= set(prunereg.list_methods()); "
        "loaded = [m for m in sys.modules if m == 'torch' or m.startswith('prunereg_rotate.')]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
