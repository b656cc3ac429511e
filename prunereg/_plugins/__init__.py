"""Plugins: the hook, the registry of methods, loading entry points in isolation.

- :mod:`.isolation`: running plugin code so that it cannot end, silence or corrupt the program;
- :mod:`.kinds`: the kinds of methods, each naming the contract its classes subclass (no torch);
- :mod:`.hookspec`: the hook a plugin implements;
- :mod:`.registry`: names to method classes, resolved lazily (no torch);
- :mod:`.loading`: entry points found, loaded once, in a deterministic order.
"""
