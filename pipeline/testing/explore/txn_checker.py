"""The transactional invariants, judged on what a read_committed reader of the fake's
partitions sees (`txn_runner.committed_view`) and on what each producer was told.

A transaction's outcome is what its producer reported (`txn_runner`): committed,
aborted, failed (fenced or fatal before its commit), fenced at its commit, unknown
(the commit raised ``TransactionFatalError``: EndTxn went unanswered).

* X1 a committed transaction is whole: every record of it succeeded and is visible
  exactly once, in the partition and at the offset its delivery reports;
* X2 nothing of an aborted or failed transaction is visible, nor of one whose commit
  was fenced when it began after its producer's fence (a commit that began before the
  fence may have been applied, its answer lost: X3), and nothing visible that no
  transaction sent;
* X3 any other transaction (unknown outcome) is all or nothing;
* X4 no record is visible twice;
* X5 per partition, the visible records of one producer's committed transactions are
  in the order they were sent (transaction after transaction, record after record);
* X6 every accepted record got exactly one outcome (none settled twice, none pending
  or outstanding after the close, none later than its delivery deadline);
* X7 a producer initialised before another one of its transactional id (a successor,
  or the workload's next generation) that ends a transaction with records after that
  one initialised, once a request of its transaction reached a broker after that (which
  refuses it), reports ``ProducerFencedError``; none reports it unless another
  producer initialised after it, or (transaction version 1) a transaction outlived
  its ``transaction_timeout`` (the coordinator's abort bumps the epoch: docs/transactions.md);
* X8 every error a call raises is one of the documented classes
  (``TransactionAbortableError``, ``ProducerFencedError``, ``TransactionFatalError``,
  ``TransactionAbortedError``; ``TransactionStateError`` never, as the workload only
  makes the calls the state allows), and the close raises nothing else;
* X9 the consumer offset committed with the transactions is that of the last one
  whose commit took effect (never an aborted one's);
* X10 once the cluster is healed and settled, a transaction the workload commits
  commits (unless a successor ran meanwhile, or it outlived its timeout);
* X11 a call raises ``TransactionFatalError`` only when another producer of the id
  initialised after its producer (a fence Kafka may answer INVALID_TXN_STATE), its
  transaction outlived ``transaction_timeout``, or EndTxn got no answer while the
  cluster was still unhealed: never for a fault the producer outlasts;
* X12 a record of a transaction that had no outcome when ``abort_transaction()`` was
  called fails (the abort fails it wherever it waits, in flight too): none succeeds
  after the call, not even one a broker producer took for a request it had not
  written yet;
* X0 no call hangs, no transaction is left open after every producer closed and its
  timeout passed, no crash.
"""

from __future__ import annotations

from .checker import Violation, invariant_of
from .trace import Trace
from .txn_runner import Generation, TxnBook, TxnRecord

EPS = 1e-9


def _book(trace: Trace) -> TxnBook | None:
    book = trace.extra.get("txn")
    return book if isinstance(book, TxnBook) else None


@invariant_of("transactions")
def _health(trace: Trace) -> list[Violation]:
    out: list[Violation] = []
    if trace.crash:
        out.append(Violation("crash", trace.crash.strip().splitlines()[0][:300]))
    book = _book(trace)
    if book is None:
        return out
    out += [Violation("X0 hang", h) for h in book.hung[:2]]
    out += [Violation("X0 left open", o) for o in book.open_at_end[:2]]
    for g in book.generations:
        out += [Violation("X8 error class", f"{g.name}: {u}") for u in g.unexpected[:2]]
        if g.close_error:
            out.append(Violation("X8 close", f"{g.name}: {g.close_error}"))
        if g.double_settles or g.outstanding or g.pending:
            out.append(Violation("X6 outcomes", f"{g.name}: {g.double_settles} records settled "
                                 f"twice, {g.outstanding} outstanding and {g.pending} "
                                 "deliveries pending after the close"))
        if g.late:
            out.append(Violation("X6 late", f"{g.name}: {g.late} records settled after their "
                                 "delivery deadline"))
    return out


def _fenced_before(txn: TxnRecord, book: TxnBook) -> bool:
    """Its commit began after another producer of the id had initialised since its own
    (so the commit cannot have been applied)."""
    mine = _generation_of(txn, book)
    return any(g.ready_at >= 0 and mine is not None and g.opened_at > mine.ready_at
               and g.ready_at <= txn.end_called for g in book.generations)


def _generation_of(txn: TxnRecord, book: TxnBook) -> Generation | None:
    if txn.producer != "main":
        return next((g for g in book.generations if g.name == txn.producer), None)
    mains = [g for g in book.generations if g.name == "main"]
    return mains[txn.generation] if 0 <= txn.generation < len(mains) else None


@invariant_of("transactions")
def _abort_outcomes(trace: Trace) -> list[Violation]:
    """X12: nothing of a transaction succeeds after its abort was called."""
    book = _book(trace)
    if book is None:
        return []
    return [Violation("X12 success after abort",
                      f"{t.producer} transaction {t.seq} (generation {t.generation}): "
                      f"{t.succeeded_after_abort} of its {len(t.records)} records succeeded "
                      f"after abort_transaction() was called at {t.abort_called:.4f}")
            for t in book.txns if t.succeeded_after_abort][:2]


@invariant_of("transactions")
def _visibility(trace: Trace) -> list[Violation]:
    book = _book(trace)
    if book is None:
        return []
    out: list[Violation] = []
    owner: dict[bytes, tuple[TxnRecord, int]] = {}
    for txn in book.txns:
        for pos, record in enumerate(txn.records):
            owner[record[0]] = (txn, pos)
    seen: dict[bytes, list[tuple[int, int]]] = {}
    for p, visible in sorted(book.visible.items()):
        for offset, value in visible:
            seen.setdefault(value, []).append((p, offset))
            if value not in owner:
                out.append(Violation("X2 phantom", f"partition {p} offset {offset}: "
                                     f"{value[:20]!r} is no record of a transaction"))
    for value, where in seen.items():
        if len(where) > 1:
            out.append(Violation("X4 duplicate", f"{value[:20]!r} visible at {where}"))
    for txn in book.txns:
        name = f"{txn.producer} transaction {txn.seq} (generation {txn.generation})"
        shown = [r for r in txn.records if r[0] in seen]
        if txn.outcome == "committed":
            for value, partition, ok, offset, cause in txn.records:
                if not ok:
                    out.append(Violation("X1 failed record", f"{name} committed, but its record "
                                         f"{value[:20]!r} failed: {cause[:160]}"))
                elif value not in seen:
                    out.append(Violation("X1 lost", f"{name} committed, but its record "
                                         f"{value[:20]!r} is not visible"))
                elif (partition, offset) not in seen[value]:
                    out.append(Violation("X1 offset", f"{name}: record {value[:20]!r} reported "
                                         f"at {partition}/{offset}, visible at {seen[value]}"))
        elif txn.outcome in ("aborted", "failed") or (
                txn.outcome == "fenced" and _fenced_before(txn, book)):
            if shown:
                out.append(Violation("X2 aborted visible", f"{name} ended {txn.outcome} "
                                     f"({'; '.join(txn.errors)[:200] or 'no error'}), but "
                                     f"{len(shown)} of its {len(txn.records)} records are "
                                     f"visible, e.g. {shown[0][0][:20]!r}"))
        elif shown and len(shown) != len(txn.records):
            out.append(Violation("X3 atomic", f"{name} ({txn.outcome}): {len(shown)} of its "
                                 f"{len(txn.records)} records are visible"))
    out += _order(book, owner)
    return out[:6]


def _order(book: TxnBook, owner: dict[bytes, tuple[TxnRecord, int]]) -> list[Violation]:
    """X5: per partition and producer, visible records in (transaction, send) order."""
    out: list[Violation] = []
    for p, visible in sorted(book.visible.items()):
        last: dict[str, tuple[int, int, int]] = {}
        for offset, value in visible:
            if value not in owner:
                continue
            txn, pos = owner[value]
            key = (txn.seq, pos)
            before = last.get(txn.producer)
            if before is not None and key < before[:2]:
                out.append(Violation("X5 order", f"partition {p}: {txn.producer}'s record "
                                     f"{pos} of transaction {txn.seq} at offset {offset}, "
                                     f"after record {before[1]} of transaction {before[0]} "
                                     f"at {before[2]}"))
                break
            last[txn.producer] = (*key, offset)
    return out


@invariant_of("transactions")
def _fencing(trace: Trace) -> list[Violation]:
    book = _book(trace)
    if book is None:
        return []
    s = trace.schedule
    out: list[Violation] = []
    ready = [g for g in book.generations if g.ready_at >= 0]
    for g in ready:
        later = [a for a in ready if a.ready_at > g.ready_at]
        if later:
            first = min(a.ready_at for a in later)
            ends = [t for t, via, busy in g.calls
                    if t > first + EPS and busy and via in ("commit", "abort")]
            # (a transaction none of whose requests reached a broker after the takeover
            # ends without hearing of it, as the Java client's: nothing refused it)
            heard = any(at > first + EPS and (pid, epoch) in g.epochs
                        for at, pid, epoch in book.txn_requests)
            if ends and heard and not g.fenced:
                out.append(Violation("X7 not fenced", f"{g.name} (initialised at "
                                     f"{g.ready_at:.3f}) ended a transaction at {ends[0]:.3f}, "
                                     f"after another producer of its id initialised at "
                                     f"{first:.3f}, and never reported ProducerFencedError"))
        elif g.fenced and not (s.transaction_version < 2
                               and dict(s.options)["transaction_timeout"] < 60):
            out.append(Violation("X7 spurious fence", f"{g.name} reported ProducerFencedError "
                                 "though no producer of its id initialised after it"))
    return out


@invariant_of("transactions")
def _offsets(trace: Trace) -> list[Violation]:
    book = _book(trace)
    if book is None:
        return []
    possible: set[int] = set()
    committed: list[int] = []
    for t in book.txns:
        if t.offsets is None:
            continue
        if t.outcome == "committed":
            committed.append(t.offsets)
        if t.outcome not in ("aborted", "failed") and not (
                t.outcome == "fenced" and _fenced_before(t, book)):
            possible.add(t.offsets)
    got = book.committed_offset
    if got is None:
        return [Violation("X9 offsets", f"transactions committed offsets {committed}, none "
                          "is committed")] if committed else []
    if got not in possible or (committed and got < committed[-1]):
        return [Violation("X9 offsets", f"the committed offset is {got}; the transactions "
                          f"that committed offsets: {committed}, may have: {sorted(possible)}")]
    return []


@invariant_of("transactions")
def _liveness(trace: Trace) -> list[Violation]:
    book = _book(trace)
    if book is None:
        return []
    s = trace.schedule
    o = dict(s.options)
    settle = s.heal_at + o["max_block"] + o["delivery_timeout"] + 2 * o["request_timeout"] \
        + s.txn_marker_delay + 1.0
    successors = [g for g in book.generations if g.name != "main"]
    out: list[Violation] = []
    for txn in book.txns:
        if txn.producer != "main" or txn.wanted != "commit" or txn.begun_at < settle:
            continue
        if txn.end_called - txn.begun_at >= o["transaction_timeout"] - 0.5:
            continue
        if any(g.opened_at <= txn.end_called and (g.closed_at < 0 or g.closed_at >= txn.begun_at)
               for g in successors):
            continue
        if txn.outcome != "committed":
            out.append(Violation("X10 stuck", f"main transaction {txn.seq} began at "
                                 f"{txn.begun_at:.3f}, after healing, and ended {txn.outcome}: "
                                 f"{'; '.join(txn.errors)[:200]}"))
            break
    return out


@invariant_of("transactions")
def _fatal(trace: Trace) -> list[Violation]:
    """X11: a fatal error has a cause the producer could not outlast."""
    book = _book(trace)
    if book is None:
        return []
    s = trace.schedule
    o = dict(s.options)
    unanswered = o["transaction_timeout"] + o["request_timeout"]  # EndTxn's own bound
    out: list[Violation] = []
    for g in book.generations:
        for at, began, text in g.fatal:
            if any(a.opened_at > g.opened_at and a.opened_at <= at + EPS
                   for a in book.generations):
                continue  # a successor's fence
            if began >= 0 and at - began >= o["transaction_timeout"] - 0.5:
                continue  # the coordinator's timeout aborted it
            if "got no answer" in text and at - unanswered <= s.heal_at + EPS:
                continue  # the outage outlasted EndTxn's bound
            out.append(Violation("X11 fatal", f"{g.name} at {at:.3f}: {text[:240]}"))
            break
    return out
