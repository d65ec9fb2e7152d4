"""The cluster state file: one JSON document every stage reads, written only through named transitions.

- `schema`: statuses and record types (the document's shape), and the check a read makes.
- `store`: `StateFile`: the file, its lock, atomic writes, migrations of older schema versions.
- `queries`: typed reads (`run(doc, id)`, `live_components(doc, run=...)`, ...): no one else indexes the document.
- `transitions`: every write, by name (`start_run`, `record_component`, `stop_active_runs`, ...).
- `recovery`: the transitions of a Slurm tier's recovery from a lost node.
- `images`: the node image caches' records and their transitions.
"""
