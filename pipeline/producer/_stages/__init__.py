"""The four stages of sarama's AsyncProducer, in flow order, and what only they use.

::

    intake ──▶ dispatcher ──▶ topicProducer ──▶ partitionProducer ──▶ brokerProducer ──▶ Kafka
    (caller)   1 task         1 per topic       1 per partition        1 per broker
                                                      ▲                      │
                                                      └── RetrySink.retry ───┘  (never blocks)

Every stage makes its own inbox (a bounded trio memory channel) and hands out its
send side as ``stage.inbox``; only the stage reads ``stage._inbox``. The stages run
until cancelled: the producer's close flushes, then cancels them all at once, so no
stage closes another's inbox.

=====================  ===============  ======================  ============================  ===============================
stage                  one per          owns                    receives                      sends
=====================  ===============  ======================  ============================  ===============================
dispatcher             producer         its inbox               intake items (bursts, chunks, one list per topic, to topic
 (``dispatcher.py``)                                            runs, raw messages, marks)    producers' inboxes
topic producer         topic            its inbox               lists for its topic           one list per partition, to
 (``topic_producer``)                                                                         partition producers' inboxes
partition producer     partition        its inbox, its retry    its partition's lists;        ``Handoff`` / ``Fin`` to the
 (``partition_...``)                    deque                   retries (``RetrySink``)       leader's broker producer inbox
broker producer        broker           its inbox, its          ``Handoff`` / ``Fin`` from    ProduceRequests; retries back to
 (``broker_...``)                       ``Accumulator``         partition producers           partition producers
=====================  ===============  ======================  ============================  ===============================

Beside them: ``core.py`` (the composition root: the one module that builds and starts
stages), ``ports.py`` (the one lookup each stage is given to reach its neighbours),
``context.py`` (the services every stage shares), ``envelopes.py`` (what travels
between them), ``accumulator.py``, ``batches.py``, ``idempotence.py`` and
``partitioner.py``. ``docs/architecture.md`` tells the journey of one record through
them and is the one explanation of the retry-ordering protocol.
"""
