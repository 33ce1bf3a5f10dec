"""The protocol's guards, and the state each one exists for.

One `Guard` per guard of the retry-ordering protocol that a deterministic test
pins (docs/architecture.md, "Guards and the schedules that need them"): where it
is (module, function, and a line of its source, `marker`, which
``tests/explore/test_probes.py`` finds there, so the table follows the code), the
test that pins it, and the name `probes.py` marks when a run puts the protocol in
that guard's state. A sweep reports the guards it never reached; the CI sweep
must reach every ``required`` one (``tests/explore/test_explorer.py``).

A guard is *reached* when its state occurs, not merely when its line runs: e.g.
"fresh level-0 messages wait in their level's buffer while the chaser is out"
is reached when fresh messages arrive at a partition producer whose chaser is
out, which is when dropping the guard would let them overtake.
"""

from __future__ import annotations

from dataclasses import dataclass

PP = "pipeline/producer/_stages/partition_producer.py"
BP = "pipeline/producer/_stages/broker_producer.py"
ACC = "pipeline/producer/_stages/accumulator.py"
IDEM = "pipeline/producer/_stages/idempotence.py"


@dataclass(frozen=True, slots=True)
class Guard:
    name: str  # what probes.py marks
    file: str
    function: str  # qualname
    marker: str  # a line of the function's source (stripped), where the guard acts
    test: str  # the deterministic test (or regression) that pins it
    what: str  # the state it exists for
    # False: reported, but the CI sweep need not reach it (the reason in `what`).
    required: bool = True


GUARDS: tuple[Guard, ...] = (
    # -- the partition producer: the watermark rules --------------------------------
    Guard("fresh-wait-while-chaser-out", PP, "PartitionProducer._handle",
          "self._levels.setdefault(0, []).extend(items)  # type: ignore[arg-type]",
          "tests/producer/test_watermark_rules.py::test_fresh_messages_wait_while_the_chaser_is_out",
          "fresh level-0 messages arrive while the chaser is out (hwm > 0)"),
    Guard("below-hwm-waits-in-its-level", PP, "PartitionProducer._handle",
          "self._levels.setdefault(level, []).append(item)",
          "tests/producer/test_watermark_rules.py::test_a_message_below_hwm_waits_in_its_level",
          "a retried unit comes back below the watermark"),
    Guard("gathered-go-down-the-old-path", PP, "PartitionProducer._raise_watermark",
          "self._flush_out()",
          "tests/producer/test_watermark_rules.py::"
          "test_stragglers_of_the_old_path_go_before_later_messages",
          "a bounce arrives in a pass that gathered fresh messages for the old broker "
          "producer"),
    Guard("retry-at-two-levels", PP, "PartitionProducer._raise_watermark",
          "self.hwm = level",
          "tests/scenarios/test_guards.py::test_each_retry_backs_off_twice_as_long",
          "a partition fails again while its first retry is under way (level 2)"),
    Guard("leave-with-chaser", PP, "PartitionProducer._leave_with_chaser",
          "self._raise_watermark(self.hwm + 1, retry=False)",
          "tests/scenarios/test_guards.py::test_retries_disabled_leader_ping_pong",
          "the partition producer leaves a broker producer that gave up (leader_changed)"),
    Guard("kept-below-the-watermark-after-a-give-up", PP, "PartitionProducer._leave_with_chaser",
          "self._held[:0] = self._out",
          "tests/producer/test_watermark_rules.py::"
          "test_after_a_give_up_what_was_kept_goes_after_the_old_paths_stragglers",
          "a give-up is heard in a pass that gathered messages for that broker producer"),
    Guard("give-up-reported-after-we-left", PP, "PartitionProducer._tick",
          "if self.bp is not None:",
          "tests/producer/test_watermark_rules.py::"
          "test_a_give_up_reported_after_we_left_needs_no_second_chaser",
          "leader_changed reaches a partition producer that already left (a chaser is "
          "out, none must follow). Not required: the old broker producer must give up on "
          "stragglers handed over with the chaser, which needs their deadline to fall in "
          "the zero-time window between the raise and the chaser's return",
          required=False),
    Guard("held-messages-expire", PP, "PartitionProducer._expire",
          "self._held = split(self._held)",
          "tests/producer/test_watermark_rules.py::test_messages_held_back_expire_at_their_deadline",
          "messages waiting for a leader or a backoff reach their deadline"),
    Guard("held-back-levels-expire", PP, "PartitionProducer._expire",
          "self._levels[level] = split(buf)",
          "tests/producer/test_watermark_rules.py::test_messages_held_back_expire_at_their_deadline",
          "messages held back below the watermark reach their deadline. Not required: the "
          "levels hold messages only between a raise and the chaser's return, which the "
          "fake's broker producers answer within one instant; the unit test stubs them",
          required=False),
    Guard("full-broker-input-delays-the-chaser", PP, "PartitionProducer._tick",
          "await bp.inbox.send(item)",
          "tests/producer/test_watermark_rules.py::"
          "test_a_full_broker_input_delays_the_chaser_but_never_drops_it",
          "a hand-off or a chaser meets a full broker producer inbox"),
    Guard("retry-while-the-main-loop-is-busy", PP, "PartitionProducer._wake",
          "self._woken = True",
          "tests/producer/test_watermark_rules.py::"
          "test_a_retry_handed_over_while_the_main_loop_is_busy_is_not_lost",
          "a broker producer hands retries over while the partition producer is not "
          "waiting for its inbox"),
    Guard("reattach-waits-for-fresh-metadata", PP, "PartitionProducer._tick",
          "if self.bp is None and self._held and now >= self._backoff_until and "
          "self._metadata_fresh:",
          "tests/scenarios/test_guards.py::test_reattach_waits_for_metadata_fresher_than_the_failure",
          "the backoff is over but no metadata fresher than the failure has come"),
    Guard("chaser-returns", PP, "PartitionProducer._handle",
          "self._flush_retry_buffers()",
          "tests/scenarios/test_guards.py::test_retries_disabled_leader_ping_pong",
          "a chaser comes back: the held-back levels go out top-down"),
    # -- the broker producer -------------------------------------------------------------
    Guard("arrival-at-a-retrying-partition-goes-back", BP, "BrokerProducer._accept",
          "self._maybe_bounce(item.tp, part)",
          "tests/scenarios/test_guards.py::"
          "test_a_batch_arriving_after_its_partitions_bounce_goes_back_too",
          "a hand-off reaches a partition that is retrying here"),
    Guard("several-failed-batches-bounce-in-order", BP, "BrokerProducer._maybe_bounce",
          "items: list[SealedBatch | ProducerMessage] = [*part.failed, *part.sealed, *part.msgs]",
          "tests/scenarios/test_regressions.py::test_2619_no_reordering_when_a_pipelined_batch_fails",
          "several batches of a partition failed in flight and go back together"),
    Guard("waiting-units-bounce-without-spending-a-retry", BP, "BrokerProducer._maybe_bounce",
          "unit._retries += 1  # type: ignore[union-attr]",
          "tests/scenarios/test_guards.py::test_waiting_behind_a_failed_batch_spends_no_retry",
          "queued batches or messages go back behind a failed one"),
    Guard("give-up-the-leader-answered-ends-the-retry-state", BP, "BrokerProducer._gave_up",
          "part.retrying = None",
          "tests/scenarios/test_guards.py::"
          "test_retries_disabled_transient_error_does_not_kill_the_partition",
          "everything failed here after an answer of the leader itself"),
    Guard("give-up-that-may-have-lost-the-leader", BP, "BrokerProducer._gave_up",
          "self._sinks.retry_sink(tp).leader_changed()",
          "tests/scenarios/test_broker_rules.py::"
          "test_a_give_up_that_may_have_lost_the_leader_sends_the_next_message_to_the_new_one",
          "everything failed here after an error that says the leader may be gone"),
    Guard("failed-batch-expires-before-its-partitions-flights", BP, "BrokerProducer._expire",
          "while part.failed and part.failed[0]._deadline <= now:",
          "tests/scenarios/test_epoch_rules.py::"
          "test_a_failed_batch_expires_at_its_own_deadline_before_its_partitions_flights",
          "a failed batch waits for its partition's other flights past its deadline"),
    Guard("in-flight-batch-expires", BP, "BrokerProducer._expire",
          "flight.expired.add(tp)",
          "tests/scenarios/test_broker_rules.py::"
          "test_a_batch_in_flight_expires_at_its_own_deadline_not_its_requests",
          "a batch in flight reaches its deadline"),
    Guard("flusher-waits-for-a-free-slot", BP, "BrokerProducer._next_wake",
          "wake = self._acc.next_wake(slot_free)",
          "tests/scenarios/test_guards.py::test_flusher_waits_for_a_free_request_slot_without_spinning",
          "every request slot is taken while a partition is ready"),
    Guard("flusher-waits-while-sealing-is-paused", BP, "BrokerProducer._flusher",
          "self._flusher_until = until = self._next_wake(slot_free and not paused)",
          "tests/explore/regressions/flusher-busy-loop.json",
          "messages wait for their linger while sealing is paused for a new epoch"),
    Guard("after-append-answer-makes-the-fate-unknown", BP, "BrokerProducer._handle_partition",
          "if code in MAYBE_WRITTEN:",
          "tests/explore/regressions/after-append-error-then-bump-duplicate.json",
          "an answer Kafka also gives once the batch is in the log"),
    Guard("out-of-order-explained", BP, "BrokerProducer._handle_partition",
          "self._schedule_bounce(part, batch, cause)",
          "tests/scenarios/test_idempotence.py",
          "a pipelined batch answered OUT_OF_ORDER behind a failed one"),
    Guard("too-large-batch-split", BP, "BrokerProducer._handle_partition",
          "halves = split_batch(batch, n, first_bytes, self._config)",
          "tests/scenarios/test_kafka_semantics.py::test_too_large_batch_is_split_and_delivered",
          "a batch of several records over the topic's own limit"),
    # -- the accumulator -------------------------------------------------------------------
    Guard("several-batches-of-a-partition-in-flight", ACC, "Accumulator.sendable",
          "return part.in_flight < self._per_partition",
          "tests/scenarios/test_regressions.py::test_2619_no_reordering_when_a_pipelined_batch_fails",
          "a second batch of a partition goes out while one is in flight"),
    Guard("flush-ignores-linger", ACC, "Accumulator.ready",
          "flushing",
          "tests/scenarios/test_guards.py::test_flush_sends_at_once_and_linger_holds_otherwise",
          "flush() makes a partition ready before its linger ends"),
    Guard("full-batch-does-not-wait-for-linger", ACC, "Accumulator.ready",
          "or part.nbytes >= self._batch_cap",
          "tests/scenarios/test_guards.py::test_a_full_batch_does_not_wait_for_linger",
          "a full batch is ready before its linger ends"),
    Guard("batch-capped-at-max-message-bytes", ACC, "Accumulator.__init__",
          "self._batch_cap = min(config.batch_bytes, config.max_message_bytes)",
          "tests/explore/regressions/batch-over-max-message-bytes.json",
          "more than max_message_bytes queued for a partition with batch_bytes above it"),
    Guard("retried-batch-restamped-after-a-bump", ACC, "Accumulator.restamp",
          "seq = idem.take_sequence(tp, record_count(batch.messages))",
          "tests/scenarios/test_epoch_rules.py",
          "a retried batch of an older epoch goes out again"),
    Guard("batch-of-unknown-fate-not-restamped", ACC, "Accumulator.restamp",
          "return False",
          "tests/scenarios/test_guards.py::test_a_batch_of_unknown_fate_is_not_restamped_after_a_bump",
          "a batch that may have been written meets a new epoch"),
    # -- idempotence -------------------------------------------------------------------------
    Guard("failed-batch-starts-a-new-epoch", IDEM, "Idempotence.batch_failed",
          "self.request_bump(f\"{reason} on {tp.topic}[{tp.partition}] after the batch took \"",
          "tests/explore/regressions/idempotent-fatal-error-gap.json",
          "a sealed batch of the current epoch fails for good"),
    Guard("epoch-bumped", IDEM, "Idempotence.run",
          "self._start_epoch(self.producer_id, self.producer_epoch + 1, bumped_locally=True)",
          "tests/scenarios/test_idempotence_rules.py",
          "a recovery bumps the epoch"),
    Guard("new-producer-id-in-a-recovery", IDEM, "Idempotence.run",
          "pid, epoch = await self._obtain_id()",
          "tests/scenarios/test_idempotence_rules.py",
          "a recovery takes a new producer id"),
    Guard("epoch-fenced-takes-a-new-id", IDEM, "Idempotence.epoch_fenced",
          "self._need_new_id = True",
          "tests/scenarios/test_idempotence_rules.py",
          "a broker fences the current epoch"),
)

BY_NAME = {g.name: g for g in GUARDS}
