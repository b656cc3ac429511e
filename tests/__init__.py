"""prunereg's test suite, grouped as the package is: a failure names its subsystem."""
