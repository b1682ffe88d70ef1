"""What runs in the `submit-study` process: the study, its samplers, the ask/tell loop and its
copy of the storage. It never imports TensorFlow, Celery or the trial side."""
