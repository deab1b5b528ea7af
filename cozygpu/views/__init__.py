"""The read model's floor: the kinds a decision reads, their views, and the one Snapshot kept by events.

``specs`` names the cache kinds the read model and the webhooks read;
``decode`` turns their JSON into the model's typed views; ``live`` builds the
Snapshot from them and keeps it current event by event. It sits above
``cozygpu.cache`` (the only reader of watch streams) and below the behaviour
(``cozygpu.binder``, ``cozygpu.admission``, ``cozygpu.commands``).
"""
