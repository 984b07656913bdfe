"""Importable app modules for worker subprocesses, and the helpers tests use to drive them."""
