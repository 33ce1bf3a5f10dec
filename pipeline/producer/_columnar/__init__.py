"""Records as rows of columns: the path that moves no Python object per record.

One name per concept:

* **row**: one record inside columns (``protocol.columnar.Columns``);
* **burst** (``RowBurst``, ``burst.py``): the columns consecutive ``send()`` calls
  fill, row by row, until the dispatcher takes them; its rows' handles are
  ``RowDelivery``;
* **chunk** (``RowChunk``, ``rows.py``): the ledger's entry for rows accepted
  together (a ``send_batch`` chunk, or a sealed burst);
* **run** (``RowRun``, ``rows.py``): the part of a chunk that moves through the stages
  as one unit: one topic, then (after the topic producer) one partition and at most
  one batch, sealed into one RecordBatch;
* ``row_outcomes.py``: where each row of a burst ended up (its run, its offset);
  ``partitioning.py``: murmur2 over a key column, and grouping rows by partition.
"""
