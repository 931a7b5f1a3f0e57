"""Runnable examples quoted by the README; ``tests/integration/test_examples.py`` runs each."""
