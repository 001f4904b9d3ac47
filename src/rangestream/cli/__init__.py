"""The ``rangestream`` command line: demo, inspect (and more as storages grow)."""
