"""Asks spread over processes (`[study] ask_processes`).

One driver asks every trial's params, and TPE's ask (a few milliseconds past its bounded
history, `trialq.driver.sampling.history`) is most of what a trial costs it: about 110 trials
a second on one core, where 1,000 GPUs of 10-second trials want 100. With `ask_processes = N`, N
processes draw the next trials' params beside the driver, each from its own copy of the
study kept current by the driver (`replica`); the driver only adopts what they drew into
the study it alone writes (`pool`). Nothing about the study's single writer changes: the
ask processes never reach the storage or the broker.

- `protocol`: what the driver and an ask process say to each other.
- `changes`: which trials changed since the driver last told the ask processes.
- `replica`: an ask process's copy of the study, and its asks.
- `asker`: an ask process's loop (`python -m trialq.driver.asking.asker`).
- `pool`: the driver's side: the processes, their asks, and adopting one.
"""
