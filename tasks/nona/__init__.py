"""Nona's flow side: the evaluation's torch models, their ``torch.fx`` DAGs timed operator by operator, and the
command that writes the simulator's profile; serving them is ``tasks.serving``'s job.

- ``models``: GPT2, DenseNet121, VGG16, AlexNet and ResNet18 as plain torch modules (Table II's classes)
- ``dags``: ``fx_dag`` (one task per operator, measured thread CPU seconds, activation bytes per edge)
- ``profile``: ``python -m tasks.nona.profile`` writes ``gpu/sim/nona/profile_cpu.json``
"""
