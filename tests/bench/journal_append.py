"""Journal append: toolbus's SQLite journal against the eventsourcing library's SQLite recorder.

Both write the same payloads to their own file in one directory, with the same durability
(WAL, `synchronous=FULL`), alternating block by block. A toolbus command is its commands row
plus its event row (plus indexes); the eventsourcing recorder gets the same two JSON documents
as two stored events of one originator (`same payloads`), and, as a stricter second baseline,
only the event (`events only`). Rates are commands per second; each block's rate counts
everything that happened in it, checkpoints included.

Those two put every event in one eventsourcing stream (one originator), whose index is only
ever appended to. toolbus also indexes each event by its own stream (the file), which is what
`history` and `audit --path` walk. A third baseline gives eventsourcing that too: the same
payloads, each file an originator (`per-file streams`), as an event-sourced editor would store
them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from tests.bench.context import Context
from tests.bench.report import Figure
from tests.bench.stats import median
from toolbus.bus import Caller, CommandRecord, DocumentSaved
from toolbus.bus.events import encode_event_data
from toolbus.journal import SqliteJournal
from toolbus.journal.rows import Outcome

BATCH_SIZE = 100


class EventsourcingRecorder:
    """eventsourcing's `SQLiteApplicationRecorder`, its connections made durable (`FULL`)."""

    def __init__(self, path: Path) -> None:
        from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

        self.datastore = SQLiteDatastore(str(path), pool_size=1)
        create = self.datastore.pool._create_connection

        def durable_connection() -> Any:
            connection = create()
            connection._sqlite_conn.execute("PRAGMA synchronous = FULL")
            return connection

        self.datastore.pool._create_connection = durable_connection  # type: ignore[method-assign]
        self.recorder = SQLiteApplicationRecorder(self.datastore)
        self.recorder.create_table()
        self.originator = uuid.uuid4()
        self.versions: dict[uuid.UUID, int] = {}

    def synchronous(self) -> int:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute("PRAGMA synchronous")
            return int(cursor.fetchone()[0])

    def insert(self, payloads: list[tuple[str, bytes]], streams: list[str] | None = None) -> None:
        """Store the payloads, in one stream, or each in the stream `streams` names."""
        from eventsourcing.persistence import StoredEvent

        stored = []
        for index, (topic, state) in enumerate(payloads):
            originator = uuid.uuid5(uuid.NAMESPACE_URL, streams[index]) if streams else self.originator
            version = self.versions[originator] = self.versions.get(originator, 0) + 1
            stored.append(StoredEvent(originator_id=originator, originator_version=version, topic=topic, state=state))
        self.recorder.insert_events(stored)

    def close(self) -> None:
        self.datastore.close()


def _commands() -> Iterator[Outcome]:
    """Editor saves over 50 files: the commonest mutating command."""
    caller = Caller(agent="bench", department="bench", client_name="bench", session_id="s1")
    index = 0
    while True:
        path = f"/home/dev/project/src/file{index % 50}.py"
        record = CommandRecord(
            tool="saveDocument", arguments={"filePath": path}, caller=caller, received_ns=time.time_ns()
        )
        event = DocumentSaved(
            path=path,
            written_blob=f"{index:064x}",
            bytes_written=1000 + index % 500,
            replaced_blob=f"{index + 1:064x}",
            disk_changed=False,
            reloaded=False,
        )
        yield Outcome(record, "ok", events=(event,))
        index += 1


_command_json = msgspec.json.Encoder()


def _payloads(outcome: Outcome, *, with_command: bool) -> list[tuple[str, bytes]]:
    """The documents toolbus stores for a command, as eventsourcing stored events."""
    payloads = [(f"toolbus:{type(e).__name__}", encode_event_data(e)) for e in outcome.events]
    if with_command:
        command = _command_json.encode(
            {
                "tool": outcome.record.tool,
                "arguments": outcome.record.arguments,
                "caller": outcome.record.caller,
                "received_ns": outcome.record.received_ns,
                "status": outcome.status,
            }
        )
        payloads.insert(0, ("toolbus:Command", command))
    return payloads


def _rate(count: int, block: Callable[[], None]) -> float:
    started = time.perf_counter()
    block()
    return count / (time.perf_counter() - started)


def run(ctx: Context) -> None:
    folder = ctx.scratch / "append"
    folder.mkdir()
    journal = SqliteJournal(folder / "toolbus.db", synchronous="FULL")
    same = EventsourcingRecorder(folder / "eventsourcing-same.db")
    events_only = EventsourcingRecorder(folder / "eventsourcing-events.db")
    per_file = EventsourcingRecorder(folder / "eventsourcing-per-file.db")
    try:
        durability = {
            "toolbus_synchronous": journal.run_sync(lambda c: c.execute("PRAGMA synchronous").fetchone()[0]),
            "eventsourcing_synchronous": same.synchronous(),
        }
        per_block = max(ctx.options.calls // 2, 50)
        for batch in (1, BATCH_SIZE):
            rates = _measure(ctx, journal, same, events_only, per_file, batch, per_block)
            _report(ctx, batch, rates, durability)
    finally:
        journal.close()
        same.close()
        events_only.close()
        per_file.close()


def _measure(
    ctx: Context,
    journal: SqliteJournal,
    same: EventsourcingRecorder,
    events_only: EventsourcingRecorder,
    per_file: EventsourcingRecorder,
    batch: int,
    transactions: int,
) -> dict[str, list[float]]:
    commands = _commands()
    if batch > 1:
        transactions = max(transactions // 10, 10)

    def toolbus_block() -> None:
        for _ in range(transactions):
            outcomes = [next(commands) for _ in range(batch)]
            journal.run_sync(partial(journal.record_many_sync, outcomes=outcomes))

    def recorder_block(
        recorder: EventsourcingRecorder, with_command: bool, per_file: bool = False
    ) -> Callable[[], None]:
        def block() -> None:
            for _ in range(transactions):
                payloads: list[tuple[str, bytes]] = []
                streams: list[str] = []
                for _ in range(batch):
                    outcome = next(commands)
                    documents = _payloads(outcome, with_command=with_command)
                    payloads += documents
                    streams += [outcome.events[0].stream] * len(documents)
                recorder.insert(payloads, streams if per_file else None)

        return block

    blocks = {
        "toolbus": toolbus_block,
        "eventsourcing_same_payloads": recorder_block(same, True),
        "eventsourcing_events_only": recorder_block(events_only, False),
        "eventsourcing_per_file_streams": recorder_block(per_file, True, per_file=True),
    }
    rates: dict[str, list[float]] = {name: [] for name in blocks}
    order = list(blocks)
    for name in order:  # warm-up: tables, caches, the first checkpoint
        blocks[name]()
    for round_index in range(ctx.options.rounds):
        shift = round_index % len(order)
        for name in order[shift:] + order[:shift]:
            rates[name].append(_rate(transactions * batch, blocks[name]))
    return rates


def _report(ctx: Context, batch: int, rates: dict[str, list[float]], durability: dict[str, Any]) -> None:
    toolbus = rates["toolbus"]
    same = rates["eventsourcing_same_payloads"]
    events_only = rates["eventsourcing_events_only"]
    per_file = rates["eventsourcing_per_file_streams"]
    ratio_same = median([t / s for t, s in zip(toolbus, same, strict=True)])
    ratio_events = median([t / s for t, s in zip(toolbus, events_only, strict=True)])
    ratio_per_file = median([t / s for t, s in zip(toolbus, per_file, strict=True)])
    mode = "one command per transaction" if batch == 1 else f"{batch} commands per transaction"
    ctx.report.add(
        Figure(
            key=f"journal.append_{'single' if batch == 1 else 'batched'}",
            summary=f"{mode}: toolbus {median(toolbus):,.0f}/s vs eventsourcing {median(same):,.0f}/s "
            f"(same payloads): ratio {ratio_same:.2f}; events only {median(events_only):,.0f}/s: "
            f"ratio {ratio_events:.2f}; per-file streams {median(per_file):,.0f}/s: ratio {ratio_per_file:.2f}",
            target="ratio >= 1.0 (toolbus not slower)",
            met=ratio_same >= 1.0,
            measured={"commands_per_s": median(toolbus), "ratio_same_payloads": ratio_same}
            | {"ratio_events_only": ratio_events, "ratio_per_file_streams": ratio_per_file}
            | {"commands_per_transaction": batch},
            baseline={
                "same_payloads_commands_per_s": median(same),
                "events_only_commands_per_s": median(events_only),
                "per_file_streams_commands_per_s": median(per_file),
            }
            | durability,
            note="judged against the same payloads (command + event documents) in one stream; events only is"
            " stricter; per-file streams gives eventsourcing toolbus's per-file index",
        )
    )
