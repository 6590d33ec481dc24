"""Offload: side-effect records (a Kafka event, an analytics line) handed
from request threads to a sibling process, which journals and delivers
them at least once. One module per job, by the process that runs it:

- records: the record format (the C framing's one Python reader/writer);
- counters: the counters in shared memory, and offload_stats();
- producer: the worker's side (set-up of the C producer, drop logging);
- queue: the serving process's side (the queue, its settings, close-out);
- sinks: jsonl, Kafka, python: sinks;
- journal: the journal files (the only writer of them);
- spills: collecting the workers' spill files into the journal;
- sibling: the sibling's loop (reading the ring and spill files, delivering);
- sibling_process: the sibling process (entry points, signals, identity);
- priority: the sibling's share of the CPU (idle while it keeps up);
- disktrouble: failed writes to --offload-dir, counted and retried;
- supervisor: starting, restarting and stopping it (forked by the master,
  or spawned by a server without one).

docs/offload.md follows one record through them.
"""
