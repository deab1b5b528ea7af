"""The typed API floor: the one place behaviour code goes through to read an object's JSON or to build a write.

- ``meta``: an object's metadata (name, namespace, key, resourceVersion,
  generation, finalizers, deletion, labels, owners) and its ``spec`` and
  ``status`` sections, read without a ``KeyError`` whatever a client wrote;
- ``times``: RFC 3339 in and out (one format for every timestamp we write);
- ``conditions``: one condition merge (a transition time moves only when the
  status does; ``observedGeneration`` when the caller knows it) and one
  comparison;

The model's typed views are built from JSON in ``cozygpu.views.decode``;
``binder/`` and ``admission/`` read raw JSON only through these modules
(``tests/api/test_floor.py`` keeps it so).
"""
