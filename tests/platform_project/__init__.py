"""The platform project of the outbox tests (tests/test_client_outbox.py): settings and the platform code."""
