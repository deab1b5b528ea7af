"""The controller process: flags, logs, probes and metrics, ordered start and stop, leader election.

Layer 5 of the house (STYLE.md): it imports the cache, the kube boundary and
the model, and wires the binder and admission in as they land. See
``controller.py`` for the start order and ``docs/controller.md`` for people.
"""
