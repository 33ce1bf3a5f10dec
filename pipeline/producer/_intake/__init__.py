"""What runs in the caller's task: ``send``, ``send_nowait``, ``send_many``,
``send_batch`` and ``producer.input``; validation, buffer memory, and acceptance.

A record is *accepted* here (the ledger gives it an id) and from then on gets exactly
one outcome. ``intake.py`` holds ``send()`` and the open burst, ``bulk.py`` the bulk
calls, ``input.py`` ``producer.input``, ``normalize.py`` the field rules and sizes,
``send_path.py`` which ``send`` a producer gets (the C ``Sender`` or ``Intake.send``).
"""
