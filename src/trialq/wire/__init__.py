"""What crosses between processes: the trial request and result, the report channel, worker
heartbeats, the name of every Redis key (`keys`), the dispatcher seam and the trial
entrypoint reference. Imported by the driver, the worker and the trial alike, so it imports
none of them."""
