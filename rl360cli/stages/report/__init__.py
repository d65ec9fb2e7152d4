"""`rl360 report`: a run's page (HTML beside PNG charts, in the run folder), and the readings of
`metrics.jsonl` that the page and the live view share (`series.py`)."""
