"""Shared by tests/, bench/ and blackbox/: the process supervisor (processes.py); a local HTTP server on a
thread for the tests' receivers and stubs (local_server.py)."""
