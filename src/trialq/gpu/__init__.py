"""What trialq knows of GPUs: the inventory NVML reports, how a worker's GPUs are shared out
among its trials (plans and shares), whose memory is whose (attribution and the probes), MPS,
the device a trial is handed, and telemetry. It imports nothing of trialq but `errors`, so the
worker's parent, its child and a trial can each use it without loading the others."""
