"""Outcomes: the ledger that settles every accepted record exactly once
(``ledger.py``, with the ``Reporter`` of ``successes`` / ``errors``), and the
deliveries callers await (``delivery.py``: ``Delivery``, ``DeliveryGroup``,
``wait_all``)."""
