"""Nona's flow side: query DAGs of real torch models (``torch.fx``); serving them is ``tasks.serving``'s job."""
