"""Recovery logs: a shard's local files, recorded into a journal and played back elsewhere.

Wire-compatible with Gazette's consumer/recoverylog (broker/protocol/recorded_op.proto).

- `ops`: recorded-op frames (fixed protobuf framing; a Write's content follows its frame),
  the CRC-32C op checksum, and `OpDecoder` (sans-IO; `CorruptLogError` names the offset).
- `fsm`: the FSM that picks the log's valid history by seq_no and chained checksum, and
  FSMHints (sans-IO). `segments`: merging hinted log segments.
- `recorder`: `Recorder`, which appends a directory's file operations to the log, every append
  checking the register `author=<its author>`; fenced, it raises RecorderFencedError.
- `player`: `Player`, which plays a log from hints into a directory, then either completes at
  the write head, hands the log off to a new author (an append that sets the `author`
  register, fencing the previous recorder), or tails it as a hot standby until asked to.
  It reads through `log_source` (`LogSource`: persisted fragments straight from their store's
  files, verified, the rest through the broker, read ahead into a bounded queue) and writes
  through `staged_files` (`StagedFiles`: files staged by fnode, written back as it plays,
  linked and synced at the end).

How a shard uses it (docs/architecture.md, Invariants; gazette_consumer/recovery.py does this for
every shard
whose spec has a recovery log; see stores/jsonfile.py for a store built on it):

- Primary: `play_and_handoff(client, hints, dir, author)` with the hints the previous primary
  stored (or `FSMHints(log=recovery_log(spec))` to read the whole log); then record with
  `Recorder(client, recovered.fsm, author, dir, write_head=recovered.write_head)`, and store
  `await recorder.build_hints()` after commits so that the next primary skips old history.
- Standby: `player = Player(client, hints, dir)`; run `player.play()` as a task (it sets
  `player.tailing` once caught up and keeps applying new ops); on promotion call
  `player.inject_handoff(author)` and await the task's `Recovered`, then record as above.
"""
