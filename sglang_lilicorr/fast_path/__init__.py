"""The proposal pipeline (pipeline.py: logits -> top-K/logsumexp -> head -> walk -> draft ids, as a plan says) and the
head's serving select (select.py) with constants folded from the head (constants.py)."""
