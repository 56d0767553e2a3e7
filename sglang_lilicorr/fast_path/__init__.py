"""The proposal pipeline (pipeline.py, plan.py) and the head's serving select (select.py, constants.py)."""
