"""Training: regenerate data with the target, train the drafter and a head, export drafts (commands/train.py)."""
