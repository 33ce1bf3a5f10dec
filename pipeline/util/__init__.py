"""The bottom layer: small pure helpers every other layer may use.

Nothing here imports another ``pipeline`` package (``tests/test_layers.py``).
"""
