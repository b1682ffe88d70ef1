"""`python -m trialq ...` is the `trialq` command."""

from trialq.cli import trialq_main

raise SystemExit(trialq_main())
