"""What runs in a trial's own process: the runner, the context a trial sees, its frameworks,
checkpoints, artifacts and the memory guard around it. The only place TensorFlow is imported;
it never touches the study storage. The worker's shell around it is `trialq.worker`; what
trialq knows of GPUs is `trialq.gpu`."""
