"""What runs in a trial's own process (and the worker parent's guard before it forks one):
the runner, the context a trial sees, the device, telemetry and the memory guard. The only
place TensorFlow is imported; it never touches the study storage."""
