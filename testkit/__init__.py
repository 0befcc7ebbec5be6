"""Shared by tests/, bench/ and blackbox/: the process supervisor (processes.py)."""
