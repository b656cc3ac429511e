"""The project itself: docs examples, the layering, the reliability promises, the benchmarks."""
