"""The async producer: sarama's four stages on trio channels.

Public names are re-exported from :mod:`pipeline`; modules here are one per stage.
"""
