"""The ``rangestream`` command line: demo, inspect, verify and gc."""
