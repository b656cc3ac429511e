"""prunereg-wanda as a plugin: found through its entry point, listed without importing torch."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import prunereg


def test_registered_under_its_package() -> None:
    info = prunereg.info("wanda")
    assert (info.kind, info.plugin, info.package) == ("global", "wanda", "prunereg-wanda")
    assert info.version == version("prunereg-wanda")
    assert prunereg.info("wanda:wanda") == info


def test_get_returns_the_class() -> None:
    from prunereg_wanda import WandaPruning

    assert prunereg.get("wanda") is WandaPruning
    assert issubclass(WandaPruning, prunereg.BasePruningMethod)


def test_import_and_listing_do_not_import_torch() -> None:
    code = (
        "import sys, prunereg, prunereg_wanda; "
        "assert 'wanda' in prunereg.list_methods(); "
        "loaded = [m for m in sys.modules if m == 'torch' or m.startswith('prunereg_wanda.')]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
