"""What the loader reads: the :mod:`~.protocol` every source implements, and the sources.

:mod:`~.indexed` (windows, documents, records by index), :mod:`~.temporal` (random frame
windows of temporal records), and :mod:`~.storage_kinds`, which builds the right source
for a storage from its ``kind``. Mixtures, sources made of sources, live in
:mod:`rangestream.loader.mixing`.
"""
