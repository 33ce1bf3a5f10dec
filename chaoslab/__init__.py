"""Ordering-under-failure chaos on a 3-node Apache Kafka (``make chaos``, ``python -m chaoslab``).

Not part of the installed package: a tool beside ``bench/``. See ``chaoslab/__main__.py``.
"""
