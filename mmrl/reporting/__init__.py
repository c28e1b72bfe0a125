"""What a run shows and writes: metrics.jsonl and the trackers (`metrics`), the console line and progress bar
(`console`), the end-of-run summary (`summary`) and saved samples (`samples`)."""
