"""The registry, plugin loading and isolation, the built-in methods, the conformance kit, new-plugin."""
