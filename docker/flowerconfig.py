"""Flower's configuration in the trialq cluster: a login whose password is a Compose or
Kubernetes secret file, so it never appears in a command line or an environment variable.
With a login set, Flower's HTTP API answers too (Flower 2.2 refuses /api/* without one)."""

import os
from pathlib import Path

_password_file = Path(os.environ.get("FLOWER_PASSWORD_FILE", "/run/secrets/flower_password"))
basic_auth = [f"{os.environ.get('FLOWER_USER', 'trialq')}:{_password_file.read_text().strip()}"]
