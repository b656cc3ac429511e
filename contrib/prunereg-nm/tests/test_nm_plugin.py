"""prunereg-nm as a plugin: found through its entry point, listed without importing torch."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import prunereg


def test_registered_under_its_package() -> None:
    info = prunereg.info("nm_sparsity")
    assert (info.kind, info.plugin, info.package) == ("global", "nm", "prunereg-nm")
    assert info.version == version("prunereg-nm")
    assert prunereg.info("nm:nm_sparsity") == info


def test_get_returns_the_class() -> None:
    from prunereg_nm import NMSparsity
    from prunereg_nm.method import NMSparsity as Defined

    assert prunereg.get("nm_sparsity") is NMSparsity is Defined
    assert issubclass(NMSparsity, prunereg.BasePruningMethod)


def test_import_and_listing_do_not_import_torch() -> None:
    code = (
        "import sys, prunereg, prunereg_nm; "
        "assert 'nm_sparsity' in prunereg.list_methods(); "
        "loaded = [m for m in ('torch', 'prunereg_nm.method') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
