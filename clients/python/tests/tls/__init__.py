"""The TLS and authentication tests (see conftest.py)."""
