"""Helpers and fixtures shared by the test suite (importable as ``support``)."""
