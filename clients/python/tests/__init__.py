"""The Python SDK's tests (see conftest.py)."""
